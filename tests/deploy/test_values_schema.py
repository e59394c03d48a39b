"""values.schema.json refuses bad values files, each with the offending field named (Helm validates
values against it on install, upgrade, template and lint; helm-python-sdk runs the same validation)."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import PROFILES, helm

# (values, the JSON path Helm's error must name)
BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"bogus": True}, "additional properties 'bogus'"),
    ({"store": {"url": "lmdb:///data"}}, "/store/url"),
    ({"store": {"url": "aerospike://admin:secret@aerospike:3000/ignis"}}, "/store/url"),
    ({"store": {"password": "secret"}}, "/store"),
    ({"store": {"tls": {"secretName": "aerospike-tls"}}}, "/store/tls/name"),
    ({"store": {"options": {"ackMode": "fast"}}}, "/store/options/ackMode"),
    ({"store": {"options": {"retries": 1000}}}, "/store/options/retries"),
    ({"store": {"existingSecret": "Not_A_Name"}}, "/store/existingSecret"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"digest": "sha256:abc"}}, "/image/digest"),
    ({"operator": {"replicas": 2}}, "/operator/replicas"),
    ({"operator": {"watchNamespaces": ["Shop"]}}, "/operator/watchNamespaces/0"),
    ({"operator": {"logFormat": "xml"}}, "/operator/logFormat"),
    ({"operator": {"port": 70000}}, "/operator/port"),
    ({"sweeper": {"replicas": -1}}, "/sweeper/replicas"),
    ({"sweeper": {"threads": 0}}, "/sweeper/threads"),
    ({"sweeper": {"lease": {"durationSeconds": "15s"}}}, "/sweeper/lease/durationSeconds"),
    ({"sweeper": {"topologySpread": {"whenUnsatisfiable": "Maybe"}}}, "/sweeper/topologySpread/whenUnsatisfiable"),
    ({"sweeper": {"resources": {"limits": {"memory": "lots"}}}}, "/sweeper/resources/limits/memory"),
    ({"podSecurityContext": {"runAsUser": "root"}}, "/podSecurityContext/runAsUser"),
    ({"securityContext": {"seccompProfile": {"type": "Permissive"}}}, "/securityContext/seccompProfile/type"),
    ({"crds": {"enabled": "yes"}}, "/crds/enabled"),
    ({"monitoring": {"serviceMonitor": {"interval": "30 seconds"}}}, "/monitoring/serviceMonitor/interval"),
    ({"monitoring": {"runbookBaseUrl": "docs/runbook.md"}}, "/monitoring/runbookBaseUrl"),
    ({"monitoring": {"prometheusRule": {"thresholds": {"queueOldestMessageAgeSeconds": 0}}}},
     "/monitoring/prometheusRule/thresholds/queueOldestMessageAgeSeconds"),
    ({"monitoring": {"prometheusRule": {"thresholds": {"queueOldestMessageAgeSeconds": "15m"}}}},
     "/monitoring/prometheusRule/thresholds/queueOldestMessageAgeSeconds"),
    ({"monitoring": {"prometheusRule": {"thresholds": {"subscriptionOldestMessageAgeSeconds": 31536001}}}},
     "/monitoring/prometheusRule/thresholds/subscriptionOldestMessageAgeSeconds"),
    ({"monitoring": {"prometheusRule": {"thresholds": {"subscriptionOldestMessageAgeSeconds": 1.5}}}},
     "/monitoring/prometheusRule/thresholds/subscriptionOldestMessageAgeSeconds"),
    ({"monitoring": {"dashboards": {"label": "grafana dashboard"}}}, "/monitoring/dashboards/label"),
    ({"commonLabels": {"team": 7}}, "/commonLabels/team"),
    ({"networkPolicy": {"egress": {"store": {"ports": []}}}}, "/networkPolicy/egress/store/ports"),
    ({"operator": {"extraEnv": [{"value": "no name"}]}}, "/operator/extraEnv/0"),
]


def test_the_table_is_big_enough() -> None:
    assert len(BAD_VALUES) >= 15


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_bad_values_are_refused_naming_the_field(chart: Any, values: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart.validate_schema(values)
    assert field in str(refused.value), str(refused.value)
    with pytest.raises(helm.HelmError):  # an install/template refuses them the same way
        chart.render(values, name="ig", namespace="ignis")


@pytest.mark.parametrize("profile", PROFILES)
def test_the_test_profiles_are_valid(chart: Any, profile: str) -> None:
    chart.validate_schema(PROFILES[profile])


def test_every_default_value_is_declared_in_the_schema(chart: Any) -> None:
    """additionalProperties: false all the way down where the chart owns the shape: walking the defaults
    through the schema finds no undeclared key."""
    schema = chart.schema

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} accepts unknown keys"
            for key, sub in value.items():
                assert key in node["properties"], f"{path}/{key} is not in values.schema.json"
                walk(sub, node["properties"][key], f"{path}/{key}")

    walk(chart.values, schema, "")
