"""The Helm chart, rendered and linted with real Helm (Helm v4's Go SDK through helm-python-sdk), every
object validated against the Kubernetes 1.32 schemas (kubernetes-validate, strict: unknown fields
fail) or, for custom resources, against their CRD's schema."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_support import (
    CHART_DIR,
    NAMESPACE,
    PROFILES,
    RELEASE,
    ROOT,
    by_kind,
    helm,
    one,
    pod_specs,
    render,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is a test dependency")

KUBE_VERSION = "1.32.0"
MONITORING_SCHEMAS = json.loads((ROOT / "tests/deploy/schemas/monitoring.coreos.com_v1.json").read_text())["schemas"]
CRD_SOURCE = yaml.safe_load((ROOT / "crds/ignisqueues.ignismq.io.yaml").read_text())
TOPIC_CRD_SOURCE = yaml.safe_load((ROOT / "crds/ignistopics.ignismq.io.yaml").read_text())
CRD_SOURCES = {crd["spec"]["names"]["kind"]: crd for crd in (CRD_SOURCE, TOPIC_CRD_SOURCE)}


def crd_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in crd["spec"]["versions"] if v["storage"])["schema"]["openAPIV3Schema"]


def validate_object(doc: dict[str, Any]) -> None:
    """Kubernetes 1.32 schemas for built-in kinds; the CRD's openAPIV3Schema for custom resources."""
    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    if group == "monitoring.coreos.com":
        # A validator made directly skips the meta-schema check, which rejects the Go-only regex
        # syntax of a few patterns (e.g. "^(?i)(abort|warn)?$") that Python cannot compile.
        jsonschema.Draft7Validator(MONITORING_SCHEMAS[doc["kind"]]).validate(doc)
        # The CRD schemas say metadata is an object; the API server also wants a name.
        assert doc["metadata"].get("name"), doc
    elif group == "ignismq.io":
        jsonschema.Draft7Validator(crd_schema(CRD_SOURCES[doc["kind"]])).validate(doc)
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


# ---- one source -------------------------------------------------------------------------------------
def test_generated_files_are_up_to_date() -> None:
    import generate

    assert generate.stale() == [], "run: python deploy/generator/generate.py"


@pytest.mark.parametrize("kind", ["IgnisQueue", "IgnisTopic"])
def test_the_crd_template_is_the_crds_directory_file(chart: Any, kind: str) -> None:
    source = CRD_SOURCES[kind]
    crds = {d["spec"]["names"]["kind"]: d for d in by_kind(render(chart), "CustomResourceDefinition")}
    assert set(crds) == set(CRD_SOURCES)  # every CRD of crds/, no other
    crd = crds[kind]
    assert crd["spec"] == source["spec"]  # identical schema, printer columns, CEL rules
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert by_kind(render(chart, {"crds": {"enabled": False}}), "CustomResourceDefinition") == []
    unkept = {d["spec"]["names"]["kind"]: d for d in by_kind(render(chart, {"crds": {"keep": False}}),
                                                              "CustomResourceDefinition")}
    assert "annotations" not in unkept[kind]["metadata"]


def test_a_changed_crd_source_makes_the_check_fail(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import generate

    changed = tmp_path / "crd.yaml"
    changed.write_text((ROOT / "crds/ignisqueues.ignismq.io.yaml").read_text().replace("maximum: 512", "maximum: 513"))
    monkeypatch.setattr(generate, "CRD_SOURCE", changed)
    assert generate.CHART / "templates" / "crd-ignisqueues.yaml" in generate.stale()


def test_a_changed_topic_crd_source_makes_the_check_fail(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import generate

    changed = tmp_path / "ignistopics.ignismq.io.yaml"
    changed.write_text((ROOT / "crds/ignistopics.ignismq.io.yaml").read_text().replace("maximum: 512", "maximum: 513"))
    monkeypatch.setattr(generate, "TOPIC_CRD_SOURCE", changed)
    assert generate.stale() == [generate.CHART / "templates" / "crd-ignistopics.yaml"]


def test_chart_versions_follow_the_package() -> None:
    package = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["appVersion"] == package and meta["version"] == package


# ---- render, lint, validate ---------------------------------------------------------------------------
@pytest.mark.parametrize("profile", PROFILES)
def test_lint_is_clean(profile: str) -> None:
    report = helm.lint(str(CHART_DIR), PROFILES[profile], strict=True, namespace=NAMESPACE,
                       kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert problems == [], problems


@pytest.mark.parametrize("profile", PROFILES)
def test_every_object_validates_against_kubernetes_1_32_and_crd_schemas(chart: Any, profile: str) -> None:
    docs = render(chart, PROFILES[profile])
    assert docs
    for doc in docs:
        validate_object(doc)
        labels = doc["metadata"].get("labels") or {}
        extra = doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-extra")  # the user's own object
        assert extra or labels.get("app.kubernetes.io/instance") == RELEASE, \
            f"{doc['kind']}/{doc['metadata']['name']} lacks the standard labels"


def test_the_validation_catches_a_bad_object(chart: Any) -> None:
    """The schema check is not vacuous: a misspelt field fails it."""
    deployment = one(render(chart), "Deployment", "-sweeper")
    deployment["spec"]["replicaz"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(deployment)
    rule = one(render(chart, PROFILES["monitoring"]), "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "soon"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(rule)


@pytest.mark.parametrize("folder", ["queues", "topics"])
def test_example_queues_validate_against_the_rendered_crd(folder: str) -> None:
    kinds = set()
    for path in sorted((ROOT / "examples" / folder).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in CRD_SOURCES:
                validate_object(doc)
                kinds.add(doc["kind"])
    assert kinds == ({"IgnisQueue"} if folder == "queues" else {"IgnisQueue", "IgnisTopic"})


# ---- pod security -----------------------------------------------------------------------------------
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "runAsUser": 10001}


@pytest.mark.parametrize("profile", PROFILES)
def test_every_pod_meets_the_restricted_pod_security_standard(chart: Any, profile: str) -> None:
    pods = list(pod_specs(render(chart, PROFILES[profile])))
    assert {name.split("/")[0] for name, _ in pods} == {"Deployment", "Pod"}
    for name, spec in pods:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        tmp = next(v for v in spec["volumes"] if v["name"] == "tmp")
        assert "emptyDir" in tmp, name
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            for key, value in RESTRICTED_CONTAINER.items():
                assert sc.get(key) == value, f"{name} {container['name']}: {key}"
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), name
            assert sc.get("seccompProfile", psc["seccompProfile"]) == {"type": "RuntimeDefault"}, name
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"], name
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], name


def test_every_pod_runs_the_small_image(chart: Any) -> None:
    """The operator, the sweeper and the helm-test pod run the Dockerfile's `ignismq` target (no JVM, no
    Spark: tests/deploy/test_image.py ties the name to the target), tagged with the chart's appVersion."""
    app_version = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]
    pods = dict(pod_specs(render(chart)))
    assert len(pods) == 3
    for name, spec in pods.items():
        assert [c["image"] for c in spec["containers"]] == [f"ignismq:{app_version}"], name
    pinned = render(chart, {"image": {"repository": "registry.example.com/ignismq", "digest": "sha256:" + "b" * 64}})
    assert {c["image"] for _, spec in pod_specs(pinned) for c in spec["containers"]} == {
        "registry.example.com/ignismq@sha256:" + "b" * 64}


def test_security_contexts_are_overridable(chart: Any) -> None:
    docs = render(chart, {"podSecurityContext": {"runAsUser": 20002, "runAsNonRoot": True,
                                                 "seccompProfile": {"type": "RuntimeDefault"}}})
    assert {spec["securityContext"]["runAsUser"] for _, spec in pod_specs(docs)} == {20002}


# ---- the components ---------------------------------------------------------------------------------
def container(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]["containers"][0]


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def test_operator_deployment(chart: Any) -> None:
    docs = render(chart)
    op = one(docs, "Deployment", "-operator")
    assert op["spec"]["replicas"] == 1 and op["spec"]["strategy"] == {"type": "Recreate"}
    c = container(op)
    assert c["args"][:2] == ["operator", "--port=9090"] and "--log-format=json" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--namespace")]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    assert env(c)["IGNIS_OPERATOR_SCANNING"] == "true"
    assert op["spec"]["template"]["spec"]["serviceAccountName"] == f"{RELEASE}-ignismq-operator"
    service = one(docs, "Service", "-operator")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"] == op["spec"]["selector"]["matchLabels"]


def test_sweeper_deployment(chart: Any) -> None:
    docs = render(chart)
    sw = one(docs, "Deployment", "-sweeper")
    assert sw["spec"]["replicas"] == 2
    c = container(sw)
    assert c["args"][0] == "sweeper"
    variables = env(c)
    assert variables["IGNIS_SWEEPER_LEASE"] == "kubernetes"
    assert variables["IGNIS_SWEEPER_LEASE_NAMESPACE"] == NAMESPACE
    assert variables["IGNIS_SWEEPER_PROBE_PORT"] == "9090" == str(c["ports"][0]["containerPort"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    spread = sw["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                       "labelSelector": {"matchLabels": sw["spec"]["selector"]["matchLabels"]}}]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": sw["spec"]["selector"]}
    assert by_kind(render(chart, {"sweeper": {"replicas": 1}}), "PodDisruptionBudget") == []


def test_store_wiring_keeps_secrets_out_of_config_maps_and_notes(chart: Any) -> None:
    docs = render(chart, PROFILES["tls-auth"], notes=True)
    (notes,) = [d["text"] for d in docs if d["kind"] == "NOTES"]
    # the uninstall order (IgnisQueues first, while the operator can still release their finalizers)
    assert notes.index("kubectl delete iq --all -A") < notes.index("helm uninstall")
    assert "ignismq.io/finalizer" in notes and "stuck finalizers" in notes
    config = one(docs, "ConfigMap", "-config")["data"]
    assert config["IGNIS_STORE"] == PROFILES["tls-auth"]["store"]["url"]
    assert config["IGNIS_AEROSPIKE_TLS_NAME"] == "aerospike.db"
    assert config["IGNIS_AEROSPIKE_TLS_CAFILE"] == "/etc/ignis/tls/ca.crt"
    assert config["IGNIS_AEROSPIKE_TLS_CERTFILE"] == "/etc/ignis/tls/tls.crt"
    assert config["IGNIS_AEROSPIKE_RETRIES"] == "5" and config["IGNIS_AEROSPIKE_ACK_MODE"] == "tombstone"
    assert config["IGNIS_AEROSPIKE_TOTAL_TIMEOUT_MS"] == "3000"
    assert not any("USER" in k or "PASSWORD" in k for k in config)
    docs = [d for d in docs if d["kind"] != "NOTES"]
    for deployment in by_kind(docs, "Deployment"):
        c = container(deployment)
        variables = env(c)
        assert variables["IGNIS_AEROSPIKE_USER"] == {"secretKeyRef": {"name": "aerospike-credentials", "key": "user"}}
        assert variables["IGNIS_AEROSPIKE_PASSWORD"] == {
            "secretKeyRef": {"name": "aerospike-credentials", "key": "password"}}
        assert {"name": "store-tls", "mountPath": "/etc/ignis/tls", "readOnly": True} in c["volumeMounts"]
        volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "store-tls")
        assert volume["secret"]["secretName"] == "aerospike-tls"
        assert c["image"] == "ignismq@sha256:" + "a" * 64
    assert "aerospike-credentials" in notes and "password" not in notes.lower()
    assert by_kind(docs, "Secret") == []  # the chart never holds a credential


def test_namespace_scoped_mode_needs_no_cluster_scoped_rbac(chart: Any) -> None:
    docs = render(chart, PROFILES["namespace-scoped"])
    assert by_kind(docs, "ClusterRole") == [] and by_kind(docs, "ClusterRoleBinding") == []
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(docs, "Role")}
    assert roles == {("shop", f"{RELEASE}-ignismq-operator"), ("billing", f"{RELEASE}-ignismq-operator"),
                     (NAMESPACE, f"{RELEASE}-ignismq-sweeper")}
    c = container(one(docs, "Deployment", "-operator"))
    assert "--namespace=shop" in c["args"] and "--namespace=billing" in c["args"]
    assert env(c)["IGNIS_OPERATOR_SCANNING"] == "false"  # no Namespace or CRD watch: nothing cluster-wide
    for binding in by_kind(docs, "RoleBinding"):
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    spread = one(docs, "Deployment", "-sweeper")["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "topology.kubernetes.io/zone"


def test_common_labels_extra_objects_and_selectors(chart: Any) -> None:
    docs = render(chart, PROFILES["namespace-scoped"])
    extra = one(docs, "ConfigMap", "-extra")
    assert extra["metadata"]["name"] == f"{RELEASE}-extra" and extra["data"] == {"release": RELEASE}
    for doc in docs:
        if doc is not extra:
            assert doc["metadata"]["labels"]["team"] == "platform", doc["metadata"]["name"]
    for deployment in by_kind(docs, "Deployment"):
        assert "team" not in deployment["spec"]["selector"]["matchLabels"]  # selectors never change


def test_monitoring_objects(chart: Any) -> None:
    docs = render(chart, PROFILES["monitoring"])
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    for service in by_kind(docs, "Service"):
        labels = service["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
        assert labels["app.kubernetes.io/component"] in sm["spec"]["selector"]["matchExpressions"][0]["values"]
    pm = one(docs, "PodMonitor")
    assert pm["spec"]["selector"] == {"matchLabels": {"ignismq.io/metrics": "true"}}
    rule = one(docs, "PrometheusRule")
    plain = yaml.safe_load((ROOT / "deploy/prometheus/ignismq-rules.yaml").read_text())
    assert rule["spec"] == plain
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    assert {d["metadata"]["name"] for d in dashboards} == {f"{RELEASE}-ignismq-dashboard-overview",
                                                          f"{RELEASE}-ignismq-dashboard-topics",
                                                          f"{RELEASE}-ignismq-dashboard-operator"}
    for d in dashboards:
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert d["metadata"]["annotations"]["grafana_folder"] == "IgnisMQ"
        assert d["metadata"]["namespace"] == "grafana"
        (body,) = d["data"].values()
        assert json.loads(body)["title"].startswith("IgnisMQ")
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "NetworkPolicy"):
        assert by_kind(render(chart), kind) == [], f"{kind} must be opt-in"


def test_runbook_base_url_is_configurable(chart: Any) -> None:
    values = {"monitoring": {"prometheusRule": {"enabled": True}, "runbookBaseUrl": "https://wiki.example/ignis"}}
    rule = one(render(chart, values), "PrometheusRule")
    urls = {r["annotations"]["runbook_url"] for r in rule["spec"]["groups"][0]["rules"]}
    assert all(re.fullmatch(r"https://wiki\.example/ignis#ignis\w+", u) for u in urls), urls


def test_the_oldest_message_age_thresholds_are_set_in_the_values(chart: Any, tmp_path: Path) -> None:
    """The PrometheusRule carries monitoring.prometheusRule.thresholds.queueOldestMessageAgeSeconds and
    subscriptionOldestMessageAgeSeconds, each in its own rule: the template finds the generator's default text
    to replace (else a value would change nothing), promtool accepts the result, and nothing else of the rules
    changes."""
    import ignis_alerts

    alerts = {"queueOldestMessageAgeSeconds": "IgnisQueueOldestMessageTooOld",
              "subscriptionOldestMessageAgeSeconds": "IgnisSubscriptionOldestMessageTooOld"}
    assert set(alerts) == set(ignis_alerts.THRESHOLDS)
    plain = yaml.safe_load((ROOT / "deploy/prometheus/ignismq-rules.yaml").read_text())
    thresholds = {"queueOldestMessageAgeSeconds": 60, "subscriptionOldestMessageAgeSeconds": 7200}
    values = {"monitoring": {"prometheusRule": {"enabled": True, "thresholds": thresholds}}}
    spec = one(render(chart, values), "PrometheusRule")["spec"]
    for key, alert in alerts.items():
        expr, default = ignis_alerts.THRESHOLDS[key]
        (rule,) = [r for r in spec["groups"][0]["rules"] if r["alert"] == alert]
        assert rule["expr"] == expr(thresholds[key]) != expr(default), key
        rule["expr"] = expr(default)
    assert spec == plain
    assert chart.values["monitoring"]["prometheusRule"]["thresholds"] == {
        key: default for key, (_, default) in ignis_alerts.THRESHOLDS.items()}
    assert ignis_alerts.THRESHOLDS["queueOldestMessageAgeSeconds"][1] == ignis_alerts.OLDEST_AGE_DEFAULT_SECONDS
    rendered = tmp_path / "rules.yaml"
    rendered.write_text(yaml.safe_dump(one(render(chart, values), "PrometheusRule")["spec"]))
    promtool = shutil.which("promtool")
    if promtool is not None:
        result = subprocess.run([promtool, "check", "rules", str(rendered)], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_network_policy_opens_metrics_store_api_server_and_dns(chart: Any) -> None:
    docs = render(chart, PROFILES["tls-auth"])
    for policy in by_kind(docs, "NetworkPolicy"):
        ingress, egress = policy["spec"]["ingress"], policy["spec"]["egress"]
        assert ingress == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
        ports = [[p["port"] for p in rule["ports"]] for rule in egress]
        assert ports == [[4333], [443, 6443], [53, 53]]
    restricted = render(chart, PROFILES["monitoring"])
    frm = one(restricted, "NetworkPolicy", "-sweeper")["spec"]["ingress"][0]["from"]
    assert frm[0] == PROFILES["monitoring"]["networkPolicy"]["metricsFrom"][0]
    assert frm[1]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "test"  # helm test pod


def test_helm_test_pod_checks_both_components(chart: Any) -> None:
    pod = one(render(chart), "Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    assert args[1:] == [f"http://{RELEASE}-ignismq-operator.{NAMESPACE}.svc:9090/readyz",
                        f"http://{RELEASE}-ignismq-sweeper.{NAMESPACE}.svc:9090/readyz"]
    compile(args[0], "helm-test", "exec")  # the script is valid Python
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_notes_tell_how_to_apply_a_queue_and_find_dashboards(chart: Any) -> None:
    (notes,) = [d["text"] for d in render(chart, PROFILES["namespace-scoped"], notes=True) if d["kind"] == "NOTES"]
    assert "kind: IgnisQueue" in notes and "kubectl get iq -n shop" in notes
    assert "IgnisMQ overview" in notes and "helm test ig" in notes


def test_the_docs_install_values_work_as_written(chart: Any) -> None:
    text = (ROOT / "docs" / "kubernetes" / "install.md").read_text().split("# Install on Kubernetes", 1)[1]
    values = yaml.safe_load(text.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0])
    chart.validate_schema(values)
    docs = render(chart, values)
    assert {one(docs, "ConfigMap", "-config")["data"]["IGNIS_STORE"]} == {values["store"]["url"]}
    assert by_kind(docs, "ServiceMonitor") and by_kind(docs, "PrometheusRule")
    assert container(one(docs, "Deployment", "-sweeper"))["image"] == "registry.example.com/ignismq:0.1.0"
