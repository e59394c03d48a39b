#!/usr/bin/env bash
# Builds both images of the Dockerfile with podman and runs them the way the Helm chart runs its pods: a
# read-only root filesystem with a tmpfs /tmp, uid 10001, every capability dropped, no new privileges.
#
#   deploy/image/check.sh                                       # on the Dockerfile's pinned official base
#   IGNIS_CHECK_BASE=localhost/python:3.11-slim-trixie deploy/image/check.sh   # on a stand-in base
#                                                               # (deploy/image/stand-in-base.sh makes one)
# It checks:
#   1. both targets build (podman build --network host), and prints both sizes; ignismq must be <= 250 MB;
#   2. `ignis --version` from both images; the small one holds no JVM, Spark, pyarrow, compiler or build
#      leftovers; both run as 10001:10001;
#   3. `ignis up --demo` on a volume (the embedded lmdb store in /data) reports lost 0, and the spark image
#      reads that volume with a Spark job (`ignis pipeline stats --plot`: the JRE, pyspark, pyarrow, matplotlib);
#   4. with IGNIS_CHECK_KUBECONFIG (a kube-apiserver's kubeconfig that may apply CRDs) and
#      IGNIS_CHECK_AEROSPIKE (host:port/namespace): the operator and a sweeper from the small image (on the host's
#      network, their probes on 127.0.0.1) until an IgnisQueue applied with kubectl is Ready and the
#      sweeper holds its Lease; otherwise it says it skipped that part.
# Other settings: IGNIS_CHECK_TAG (tag of the images, default check), IGNIS_CHECK_BUILD_CA (a CA bundle
# for pip in the builder, e.g. behind a TLS-inspecting proxy; default $PIP_CERT), IGNIS_CHECK_NAMESPACE
# (Kubernetes namespace of part 4, default ignis-check; made if missing, left in place).
# Exit code 0: everything checked passed (or podman is absent: one line says the check was skipped).
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { printf 'check: %s\n' "$*"; }
fail() { printf 'check: FAILED: %s\n' "$*" >&2; exit 1; }

if ! command -v podman >/dev/null 2>&1; then
    say "SKIPPED: podman is not installed (Debian: apt-get install -y podman), so no image was built or run"
    exit 0
fi

TAG=${IGNIS_CHECK_TAG:-check}
SMALL=localhost/ignismq:$TAG
SPARK=localhost/ignismq-spark:$TAG
MAX_SMALL_MB=250
BASE=${IGNIS_CHECK_BASE:-$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)}
BUILD_CA=${IGNIS_CHECK_BUILD_CA:-${PIP_CERT:-}}
NAMESPACE=${IGNIS_CHECK_NAMESPACE:-ignis-check}

work=$(mktemp -d)
containers=()
volume=""
applied_queue=""
cleanup() {
    local c
    # an IgnisQueue left by a failure goes while its operator still runs (so its finalizer is released)
    [ -z "$applied_queue" ] || kubectl delete -n "$NAMESPACE" ignisqueue "$applied_queue" --ignore-not-found \
        --timeout 30s >/dev/null 2>&1 || true
    for c in "${containers[@]}"; do podman rm --force --volumes --time 10 "$c" >/dev/null 2>&1 || true; done
    [ -z "$volume" ] || podman volume rm --force "$volume" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# ---- the base, and a runtime this machine lets run it ---------------------------------------------------
if ! podman image exists "$BASE"; then
    say "pulling the base $BASE"
    podman pull --quiet "$BASE" >/dev/null \
        || fail "no base image $BASE: no registry? make a stand-in (deploy/image/stand-in-base.sh) and set IGNIS_CHECK_BASE"
fi
# crun refuses a host with hybrid cgroups (v1 controllers beside v2); and where the container manager may not
# raise resource limits (no CAP_SYS_RESOURCE) podman's defaults (nofile 1048576) fail, so ask for the
# limits this shell has (nproc at most podman's own 32768).
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
[ "$nofile" != unlimited ] || nofile=1048576
RUNTIME=()
LIMITS=()
refused=()
found=""
for limits in "" "nofile=$nofile:$nofile nproc=$nproc:$nproc"; do
    for runtime in "" runc; do
        RUNTIME=()
        [ -z "$runtime" ] || RUNTIME=(--runtime "$runtime")
        LIMITS=()
        for limit in $limits; do LIMITS+=(--ulimit "$limit"); done
        if podman "${RUNTIME[@]}" run --rm --network none "${LIMITS[@]}" "$BASE" true >"$work/probe" 2>&1; then
            found=yes
            break 2
        fi
        refused+=("${runtime:-the default runtime}${limits:+ with ulimits $limits}: $(tail -n 1 "$work/probe")")
    done
done
[ -n "$found" ] || fail "podman cannot run a container here: $(printf '%s; ' "${refused[@]}")"
say "podman $(podman version --format '{{.Client.Version}}'), runtime ${RUNTIME[1]:-default}${LIMITS[*]:+, ${LIMITS[*]}}"
for line in "${refused[@]}"; do say "  (refused: $line)"; done
podman() { command podman "${RUNTIME[@]}" "$@"; }

# ---- 1. build both targets ----------------------------------------------------------------------------
BUILD_ARGS=(--network host "${LIMITS[@]}")
[ -z "${IGNIS_CHECK_BASE:-}" ] || BUILD_ARGS+=(--build-arg "BASE_IMAGE=$BASE")
[ -z "$BUILD_CA" ] || BUILD_ARGS+=(--secret "id=build-ca,src=$BUILD_CA")
for target in ignismq ignismq-spark; do
    image=localhost/$target:$TAG
    start=$SECONDS
    if ! podman build "${BUILD_ARGS[@]}" --target "$target" --tag "$image" . >"$work/build-$target.log" 2>&1; then
        tail -n 40 "$work/build-$target.log" >&2
        fail "podman build --target $target on $BASE"
    fi
    say "built $image on $BASE in $((SECONDS - start)) s"
done
mb() { podman image inspect --format '{{.Size}}' "$1" | awk '{ printf "%d", $1 / 1000000 }'; }
small_mb=$(mb "$SMALL")
base_mb=$(mb "$BASE")
say "sizes: ignismq $small_mb MB, ignismq-spark $(mb "$SPARK") MB; the base $BASE $base_mb MB, so" \
    "IgnisMQ's layers are $((small_mb - base_mb)) MB of ignismq and $(($(mb "$SPARK") - base_mb)) MB of ignismq-spark"
[ "$small_mb" -le "$MAX_SMALL_MB" ] || fail "ignismq is $small_mb MB, over $MAX_SMALL_MB MB"

# ---- 2. as the chart runs them --------------------------------------------------------------------------
# The chart's securityContext, and its /tmp emptyDir (64Mi; a Spark job gets more).
SECURE=(--read-only --read-only-tmpfs=false --cap-drop ALL --security-opt no-new-privileges --user 10001:10001
        "${LIMITS[@]}")
tmp() { echo "--tmpfs=/tmp:rw,nosuid,nodev,size=$1,mode=1777"; }
SECURE_TMP=("${SECURE[@]}" "$(tmp 64m)")
for image in "$SMALL" "$SPARK"; do
    user=$(podman image inspect --format '{{.Config.User}}' "$image")
    [ "$user" = 10001:10001 ] || fail "$image runs as '$user', not 10001:10001"
    version=$(podman run --rm --network none "${SECURE_TMP[@]}" "$image" --version)
    say "$image: \`ignis --version\` = $version (user $user, read-only root, no capabilities)"
done
# What the small image must not hold: a JVM, Spark, pyarrow, a compiler, pip's cache, the builder's files.
podman run --rm --network none "${SECURE_TMP[@]}" --entrypoint python3 "$SMALL" -c '
import importlib.util, os, shutil, sys
found = [m for m in ("pyspark", "pyarrow", "matplotlib") if importlib.util.find_spec(m)]
found += [t for t in ("java", "gcc", "cc", "strip") if shutil.which(t)]
found += [p for p in ("/usr/lib/jvm", "/wheels", "/src", "/root/.cache/pip") if os.path.exists(p)]
sys.exit(f"in the small image: {found}" if found else 0)' || fail "$SMALL holds what it must not"
podman run --rm --network none "${SECURE_TMP[@]}" --entrypoint python3 "$SPARK" -c '
import pyarrow, pyspark; print(f"pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__}")' >"$work/spark-versions" \
    || fail "pyspark or pyarrow missing from $SPARK"
jre=$(podman run --rm --network none "${SECURE_TMP[@]}" --entrypoint java "$SPARK" -version 2>&1) \
    || fail "java -version in $SPARK: $jre"
jre=${jre%%$'\n'*}
say "$SPARK: $jre; $(cat "$work/spark-versions")"

# ---- 3. the demo on a volume, and a Spark job over it --------------------------------------------------
volume=ignis-check-data-$TAG-$$
podman volume create "$volume" >/dev/null
podman run --rm --network none "${SECURE_TMP[@]}" -v "$volume:/data" "$SMALL" up --demo -o json \
    >"$work/demo.json" 2>"$work/demo.err" || { tail -n 30 "$work/demo.err" >&2; fail "ignis up --demo"; }
python3 - "$work/demo.json" <<'PY' || fail "the demo lost messages or did not finish"
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"check: ignis up --demo on volume /data: published {doc['published']}, acked {doc['acked']}, "
      f"dead-lettered {doc['deadLettered']}, duplicates {doc['duplicates']}, lost {doc['lost']}, "
      f"finished {doc['finished']}, {doc['elapsedSeconds']} s")
sys.exit(doc["lost"] != 0 or not doc["finished"])
PY
podman run --rm --network none "${SECURE[@]}" "$(tmp 512m)" \
    -e SPARK_LOCAL_IP=127.0.0.1 -v "$volume:/data" "$SPARK" \
    pipeline --master 'local[1]' stats up-demo -o json --plot /tmp/backlog.png >"$work/stats.json" 2>"$work/stats.err" \
    || { tail -n 30 "$work/stats.err" >&2; fail "ignis pipeline stats from $SPARK"; }
python3 - "$work/demo.json" "$work/stats.json" <<'PY' || fail "the Spark job's figures differ from the demo's"
import json, sys
demo, stats = (json.load(open(p)) for p in sys.argv[1:3])
dead = sum(m["stored"] for m in stats["magazines"] if m["magazine"] == "dead")
print(f"check: ignis pipeline stats (Spark, spark image) over the volume: {len(stats['magazines'])} magazine(s), "
      f"{dead} dead letter(s) (the demo: {demo['deadLettered']}), plot {stats.get('plot')}")
sys.exit(dead != demo["deadLettered"] or not stats.get("plot"))
PY

# ---- 4. the operator and a sweeper against a kube-apiserver and Aerospike ---------------------------------
if [ -z "${IGNIS_CHECK_KUBECONFIG:-}" ] || [ -z "${IGNIS_CHECK_AEROSPIKE:-}" ]; then
    say "SKIPPED the operator and sweeper against a cluster: set IGNIS_CHECK_KUBECONFIG (a kube-apiserver's" \
        "kubeconfig that may apply CRDs) and IGNIS_CHECK_AEROSPIKE (host:port/namespace of an Aerospike server)"
    say "PASSED (images, demo and Spark job; not the cluster part)"
    exit 0
fi
command -v kubectl >/dev/null || fail "kubectl is needed for the cluster part (apt-get install -y kubernetes-client)"
kubectl() { command kubectl --kubeconfig "$IGNIS_CHECK_KUBECONFIG" "$@"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
probe() { python3 -c 'import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as r: print(r.status, r.read().decode().strip())
except Exception as exc: print("no answer:", exc); sys.exit(1)' "$1"; }

# The containers read one self-contained copy of the kubeconfig (its certificates inlined), owned by 10001.
kubectl config view --raw --flatten --minify >"$work/kubeconfig"
if [ "$(id -u)" = 0 ]; then chown 10001:10001 "$work/kubeconfig"; else podman unshare chown 10001:10001 "$work/kubeconfig"; fi
chmod 0400 "$work/kubeconfig"
say "cluster: $(kubectl version -o json 2>/dev/null | python3 -c 'import json, sys; print("kube-apiserver", json.load(sys.stdin)["serverVersion"]["gitVersion"])') at $(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}'); store aerospike://$IGNIS_CHECK_AEROSPIKE"

kubectl apply -f crds/ >/dev/null
kubectl wait --for condition=Established --timeout 60s crd/ignisqueues.ignismq.io >/dev/null
kubectl get namespace "$NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$NAMESPACE" >/dev/null

CLUSTER=(--network host "${SECURE_TMP[@]}" -v "$work/kubeconfig:/etc/ignis/kubeconfig:ro"
         -e KUBECONFIG=/etc/ignis/kubeconfig -e "IGNIS_STORE=aerospike://$IGNIS_CHECK_AEROSPIKE" -e IGNIS_FARM_ID=check)
operator_port=$(free_port)
sweeper_port=$(free_port)
identity=ignis-check-sweeper-$$
lease=ignis-check-sweeper
queue=check-$$
operator=ignis-check-operator-$$
sweeper=ignis-check-sweeper-$$
containers+=("$operator" "$sweeper")
podman run -d --name "$operator" "${CLUSTER[@]}" -e IGNIS_OPERATOR_PROBE_HOST=127.0.0.1 "$SMALL" \
    operator --namespace "$NAMESPACE" --port "$operator_port" --log-format json >/dev/null
podman run -d --name "$sweeper" "${CLUSTER[@]}" -e IGNIS_SWEEPER_LEASE=kubernetes \
    -e "IGNIS_SWEEPER_LEASE_NAME=$lease" -e "IGNIS_SWEEPER_LEASE_NAMESPACE=$NAMESPACE" \
    -e IGNIS_SWEEPER_PROBE_HOST=127.0.0.1 -e "IGNIS_SWEEPER_PROBE_PORT=$sweeper_port" "$SMALL" \
    sweeper --identity "$identity" --log-format json >/dev/null
logs() { for c in "$operator" "$sweeper"; do echo "--- $c"; podman logs --tail 15 "$c" 2>&1; done >&2; }
say "operator (--namespace $NAMESPACE, probes 127.0.0.1:$operator_port) and sweeper ($identity, Lease" \
    "$NAMESPACE/$lease, probes 127.0.0.1:$sweeper_port) started from $SMALL"

applied=$SECONDS
applied_queue=$queue
kubectl apply -n "$NAMESPACE" -f - >/dev/null <<YAML
apiVersion: ignismq.io/v1alpha1
kind: IgnisQueue
metadata:
  name: $queue
spec:
  handlerType: check.v1
  shards: 2
  deletionPolicy: Delete
YAML
kubectl wait -n "$NAMESPACE" --for condition=Ready --timeout 180s "ignisqueue/$queue" >/dev/null \
    || { logs; fail "IgnisQueue $NAMESPACE/$queue was not Ready within 180 s"; }
say "IgnisQueue $NAMESPACE/$queue Ready $((SECONDS - applied)) s after kubectl apply:" \
    "$(kubectl get -n "$NAMESPACE" ignisqueue "$queue" --no-headers | tr -s ' ')"
deadline=$((SECONDS + 120))
until [ "$(kubectl get -n "$NAMESPACE" lease "$lease" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" = "$identity" ]; do
    [ "$SECONDS" -lt "$deadline" ] || { logs; fail "the sweeper did not take Lease $NAMESPACE/$lease"; }
    sleep 1
done
say "Lease $NAMESPACE/$lease held by $identity"
say "operator /readyz: $(probe "http://127.0.0.1:$operator_port/readyz")" || { logs; fail "operator not ready"; }
say "sweeper /readyz: $(probe "http://127.0.0.1:$sweeper_port/readyz")" || { logs; fail "sweeper not ready"; }
# The queue record the operator wrote, read back from Aerospike by the small image's CLI.
podman run --rm --network host "${SECURE_TMP[@]}" -e "IGNIS_STORE=aerospike://$IGNIS_CHECK_AEROSPIKE" \
    -e IGNIS_FARM_ID=check "$SMALL" --client-id "$NAMESPACE" queue describe "$queue" -o json >"$work/queue.json" \
    || fail "ignis queue describe $queue"
python3 - "$work/queue.json" <<'PY' || fail "the queue record in Aerospike is not the applied spec"
import json, sys
doc = json.load(open(sys.argv[1]))
spec = doc["spec"]
print(f"check: in Aerospike: queue {doc['clientId']}/{doc['name']}: handlerType {spec['handlerType']}, "
      f"shards {spec['shards']}, active {doc['active']}")
sys.exit(spec["handlerType"] != "check.v1" or spec["shards"] != 2 or not doc["active"])
PY
kubectl delete -n "$NAMESPACE" ignisqueue "$queue" --timeout 120s >/dev/null || { logs; fail "deleting $queue"; }
applied_queue=""
for c in "$operator" "$sweeper"; do podman stop --time 30 "$c" >/dev/null; done
for c in "$operator" "$sweeper"; do
    code=$(podman inspect --format '{{.State.ExitCode}}' "$c")
    [ "$code" = 0 ] || { logs; fail "$c exited $code on SIGTERM"; }
done
say "queue deleted (deletionPolicy Delete), operator and sweeper stopped on SIGTERM with exit code 0"
say "PASSED"
