# syntax=docker/dockerfile:1
# IgnisMQ images, one per role (docs/kubernetes/install.md):
#   ignismq        the library, the `ignis` CLI, the operator and the sweeper: no JVM, no Spark. The chart's
#                  pods use it. The default target: `podman build -t ignismq:0.1.0 .`
#   ignismq-spark  ignismq plus a JRE, pyspark and pyarrow: the pipeline jobs (`ignis pipeline ...`,
#                  spark-submit). `podman build --target ignismq-spark -t ignismq-spark:0.1.0 .`
# Both run as uid 10001 under a read-only root filesystem with every capability dropped: only /tmp (HOME)
# and the /data volume (the embedded lmdb store) are written to.
#
# The base: the official image, pinned by tag and digest (Renovate's and Dependabot's docker managers
# update the digest of a `tag@digest` default). This digest is the python:3.11.17-slim-trixie index of
# 2026-10-01 (linux/amd64 and arm64) as recorded by public builds that inspected it; it was not pulled from
# this repository's build machines, which reach no registry (they build on deploy/image/stand-in-base.sh).
# Another base: --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:... (or a local stand-in).
ARG BASE_IMAGE=python:3.11-slim-trixie@sha256:45037981b62b34b44602584fccbc4d884d5f7dc92c7ee86bb38a698a79fe1e51

# ---- builder: wheels for the project and every dependency (pyspark is published as a source
# distribution only, so it is built here), their debug sections stripped; nothing of this stage but /wheels
# reaches an image.
FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
# binutils: readelf and strip for strip-wheels.sh. DL3008 (pin apt versions): see ignismq-spark's JRE.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/image/strip-wheels.sh deploy/image/requirements-from-wheels.py /usr/local/bin/
WORKDIR /src
COPY pyproject.toml README.md ./
COPY ignis ./ignis
COPY operator ./operator
COPY workers ./workers
COPY pipeline ./pipeline
# Behind a TLS-inspecting proxy, give pip its CA bundle as a build secret (never stored in a layer):
#   podman build --secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt ...
# (wheel: `wheel pack` for strip-wheels.sh, beside any the base has; pip cannot replace a Debian-packaged one.)
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=build-ca \
    if [ -s /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
    && pip install --ignore-installed wheel==0.48.0 \
    && pip wheel --wheel-dir /wheels '.[spark]' \
    && strip-wheels.sh /wheels \
    && python /usr/local/bin/requirements-from-wheels.py /wheels

# ---- ignismq: what the operator, the sweeper and applications run.
FROM ${BASE_IMAGE} AS ignismq
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOME=/tmp \
    IGNIS_STORE=lmdb:///data
# From the builder's wheels only (--no-index), each checked against its sha256 in the requirement file
# (which stays as the record of what the image holds): no compiler, no cache, no source tree in this
# image. The modules are compiled at install time, as the read-only root filesystem keeps Python from
# doing it later.
COPY --from=builder /wheels/ignismq.txt /usr/local/share/ignismq/requirements.txt
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --require-hashes \
        --requirement /usr/local/share/ignismq/requirements.txt \
    && useradd --uid 10001 --user-group --home-dir /tmp --no-create-home --shell /usr/sbin/nologin ignis \
    && install -d -o 10001 -g 10001 -m 0750 /data
WORKDIR /tmp
USER 10001:10001
# The embedded default store (IGNIS_STORE) lives here when no aerospike:// URL is configured.
VOLUME ["/data"]
ENTRYPOINT ["ignis"]
CMD ["--help"]

# ---- ignismq-spark: adds the JRE Spark 4 runs on (17 or 21), pyspark and pyarrow.
FROM ignismq AS ignismq-spark
# Empty: the newest of 21 and 17 that the base's Debian offers (trixie has 21 (and 25), bookworm 17).
ARG JRE_VERSION=""
USER 0:0
# The slim bases delete /usr/share/man, where the JRE's post-install links java.1.gz: man1 must exist.
# DL3008 (pin apt versions): Debian's security updates replace a package's version and the archive drops
# the old one, so a pin would break the build at the next fix; the base's digest pins the release.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && jre="${JRE_VERSION}" \
    && for v in 21 17; do \
           case "$jre:$(apt-cache policy "openjdk-$v-jre-headless")" in (:*"Candidate: "[0-9]*) jre=$v ;; esac; \
       done \
    && if [ -z "$jre" ]; then echo "no openjdk-21/17-jre-headless in this base's Debian" >&2; exit 1; fi \
    && apt-get install -y --no-install-recommends "openjdk-$jre-jre-headless" \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt /var/log/dpkg.log \
    && ln -s "$(dirname "$(dirname "$(readlink -f /usr/bin/java)")")" /usr/lib/jvm/jre \
    && java -version
COPY --from=builder /wheels/ignismq-spark.txt /usr/local/share/ignismq/requirements-spark.txt
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --require-hashes \
        --requirement /usr/local/share/ignismq/requirements-spark.txt
ENV JAVA_HOME=/usr/lib/jvm/jre
USER 10001:10001

# A plain `podman build .` makes the small image.
FROM ignismq AS default
