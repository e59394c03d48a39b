"""Shared helpers of the deployment tests: the chart rendered with real Helm (helm-python-sdk: Helm v4's
Go SDK in-process), the generator modules, the metric names the code exports."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "ignismq"
GENERATOR = ROOT / "deploy" / "generator"
sys.path.insert(0, str(GENERATOR))

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is a test dependency: pip install -e '.[test]'")

RELEASE = "ig"
NAMESPACE = "ignis"

# The value profiles every structural check runs over.
PROFILES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "monitoring": {
        "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                       "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                       "dashboards": {"namespace": "grafana"}},
        "networkPolicy": {"enabled": True, "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
    },
    "tls-auth": {
        "store": {"url": "aerospike://aerospike-0.aerospike.db:4333,aerospike-1.aerospike.db:4333/ignis",
                  "existingSecret": "aerospike-credentials", "tls": {"secretName": "aerospike-tls",
                                                                      "name": "aerospike.db", "mutual": True},
                  "options": {"retries": 5, "ackMode": "tombstone", "totalTimeoutMs": 3000}},
        "image": {"digest": "sha256:" + "a" * 64},
        "networkPolicy": {"enabled": True, "egress": {"store": {"ports": [4333]}}},
    },
    "namespace-scoped": {
        "operator": {"watchNamespaces": ["shop", "billing"]},
        "crds": {"enabled": False},
        "commonLabels": {"team": "platform"},
        "sweeper": {"replicas": 3, "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "sweeper"}}}]},
        "extraObjects": [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "{{ .Release.Name }}-extra"},
             "data": {"release": "{{ .Release.Name }}"}}],
    },
}


def render(chart: Any, values: dict[str, Any] | None = None, *, notes: bool = False) -> list[dict[str, Any]]:
    """Every object the chart renders (hooks included), in template order."""
    rendered = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            if notes:
                docs.append({"kind": "NOTES", "text": text})
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            yield f"Pod/{doc['metadata']['name']}", doc["spec"]


def exported_metric_names() -> set[str]:
    """Every sample name the code's prometheus_client collectors can export (counters with _total and
    _created, histograms with _bucket/_sum/_count, info metrics with _info)."""
    import ignis_operator.metrics  # noqa: F401  (registers the operator's metrics)
    import ignis_workers.metrics  # noqa: F401
    from prometheus_client import REGISTRY

    import ignis.metrics  # noqa: F401

    return set(REGISTRY._names_to_collectors)  # the registry's own index of every name it would expose
