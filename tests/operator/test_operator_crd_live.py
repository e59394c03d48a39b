"""The IgnisQueue and IgnisTopic admission tables on a real kube-apiserver (set IGNIS_TEST_KUBECONFIG to an admin
kubeconfig; skipped otherwise). The offline admission (admission.py) stands in for the API server in the other CRD
tests; this runs the same tables through the real one: the schema, defaulting, CEL rules and their cost budget.

Nothing shared is touched: both CRDs are installed under a group of this run's own (`<random>.k8stopics.test`),
their objects live in a namespace of its own, and everything is deleted at the end. Each case is a server-side dry
run (`kubectl create/apply --dry-run=server`): nothing is stored but the old objects of transition cases."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from admission import CRD_PATHS, ROOT
from support.live_kube import LiveCluster, needs_cluster
from test_operator_crd import INVALID as QUEUE_INVALID
from test_operator_crd import START_SAMPLES
from test_operator_crd import VALID as QUEUE_VALID
from test_operator_topic_crd import INVALID as TOPIC_INVALID
from test_operator_topic_crd import VALID as TOPIC_VALID

pytestmark = [needs_cluster, pytest.mark.timeout(600)]
PLURALS = {"IgnisQueue": "ignisqueues", "IgnisTopic": "ignistopics"}


class Cluster(LiveCluster):
    def __init__(self) -> None:
        super().__init__()
        self.group = f"t{self.suffix}.k8stopics.test"
        self.namespace = f"k8s-topics-crd-{self.suffix}"

    def crd(self, kind: str) -> dict[str, Any]:
        doc = yaml.safe_load(CRD_PATHS[kind].read_text(encoding="utf-8"))
        doc["spec"]["group"] = self.group
        doc["metadata"]["name"] = f"{doc['spec']['names']['plural']}.{self.group}"
        return doc

    def obj(self, doc: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        out = json.loads(json.dumps(doc))
        out["apiVersion"] = f"{self.group}/v1alpha1"
        out.setdefault("metadata", {})["namespace"] = self.namespace
        if name:
            out["metadata"]["name"] = name
        return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    c.run("create", "namespace", c.namespace)
    try:
        for kind in PLURALS:
            c.run("apply", "-f", "-", stdin=c.crd(kind))
        for plural in PLURALS.values():
            c.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/{plural}.{c.group}")
        yield c
    finally:
        for plural in PLURALS.values():  # (with their objects: the API server's own CRD finalizer)
            c.run("delete", "crd", f"{plural}.{c.group}", "--timeout=60s", check=False)
        c.remove_namespace(c.namespace)


def admitted(cluster: Cluster, doc: dict[str, Any], old: dict[str, Any] | None, index: int
             ) -> subprocess.CompletedProcess[str]:
    """The API server's answer to creating `doc` (or to changing `old` into it): a dry run either way."""
    if old is None:
        return cluster.run("create", "--dry-run=server", "-o", "json", "-f", "-", stdin=cluster.obj(doc), check=False)
    # A stored old object of a name of its own; server-side apply by one field manager, so the fields the new
    # manifest leaves out are removed, as a replace would (a custom resource cannot be replaced without its
    # resourceVersion).
    name = f"t{index}"
    cluster.run("apply", "--server-side", "--field-manager=tables", "-f", "-", stdin=cluster.obj(old, name))
    return cluster.run("apply", "--server-side", "--field-manager=tables", "--dry-run=server", "-o", "json", "-f", "-",
                       stdin=cluster.obj(doc, name), check=False)


VALID = [(i, *c) for i, c in enumerate(QUEUE_VALID + TOPIC_VALID)]
INVALID = [(100 + i, *c) for i, c in enumerate(QUEUE_INVALID + TOPIC_INVALID)]


@pytest.mark.parametrize(("index", "case", "doc", "old"), VALID, ids=[f"{c[2]['kind']}: {c[1]}" for c in VALID])
def test_valid_tables_on_the_api_server(cluster: Cluster, index: int, case: str, doc: dict[str, Any],
                                        old: dict[str, Any] | None) -> None:
    done = admitted(cluster, doc, old, index)
    assert done.returncode == 0, f"{case}: {done.stderr}"


@pytest.mark.parametrize(("index", "case", "doc", "old", "expected"), INVALID,
                         ids=[f"{c[2]['kind']}: {c[1]}" for c in INVALID])
def test_invalid_tables_on_the_api_server(cluster: Cluster, index: int, case: str, doc: dict[str, Any],
                                          old: dict[str, Any] | None, expected: list[tuple[str, str]]) -> None:
    """Refused, naming each field the offline admission names and, for a CEL rule, with its very message."""
    done = admitted(cluster, doc, old, index)
    assert done.returncode != 0, f"{case}: admitted"
    error = done.stderr
    assert "is invalid" in error or "Invalid value" in error or "Required value" in error, error
    for path, message in expected:
        if path:
            assert path in error, f"{case}: {path!r} not in {error}"
        if any(message == r["message"] for r in _rules(doc["kind"])):
            assert message in error, f"{case}: {message!r} not in {error}"


def test_a_start_the_api_server_admits_is_one_the_operator_accepts(cluster: Cluster) -> None:
    """The real CEL engine (Go's RFC 3339 parser behind timestamp()) is never looser than ignis.spec.start_ms."""
    from ignis.spec import start_ms

    items = [cluster.obj({"kind": "IgnisQueue", "metadata": {"name": f"s{i}"},
                          "spec": {"handlerType": "h", "subscribe": {"topic": "events", "start": start}}})
             for i, start in enumerate(START_SAMPLES)]
    done = cluster.run("create", "--dry-run=server", "-f", "-", stdin={"apiVersion": "v1", "kind": "List",
                                                                        "items": items}, check=False)
    admitted = {int(line.split("/s")[1].split()[0]) for line in done.stdout.splitlines() if "created" in line}
    assert 0 < len(admitted) < len(START_SAMPLES), done.stdout + done.stderr
    loose = []
    for i in sorted(admitted):
        try:
            start_ms(START_SAMPLES[i])
        except ValueError:
            loose.append(START_SAMPLES[i])
    assert loose == []
    assert "2026-02-30T12:00:00Z" not in {START_SAMPLES[i] for i in admitted}


def _rules(kind: str) -> list[dict[str, Any]]:
    from admission import rules

    return [rule for _, rule in rules(kind)]


def test_the_examples_are_admitted_and_kubectl_get_shows_the_topic_columns(cluster: Cluster) -> None:
    for path in sorted((ROOT / "examples" / "topics").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            cluster.run("apply", "-f", "-", stdin=cluster.obj(doc))
    status = {"published": 12, "retained": 10, "retainedBytes": 2048, "subscriptions": 2,
              "subscriptionNames": ["telemetry-alerts", "telemetry-archive"],
              "conditions": [{"type": "Ready", "status": "True", "reason": "Synced", "message": "in sync",
                              "lastTransitionTime": "2026-11-29T00:00:00Z"}]}
    cluster.run("patch", f"ignistopics.{cluster.group}", "telemetry", "-n", cluster.namespace, "--subresource=status",
                "--type=merge", "-p", json.dumps({"status": status}))
    out = cluster.run("get", f"ignistopics.{cluster.group}", "telemetry", "-n", cluster.namespace).stdout.splitlines()
    assert out[0].split() == ["NAME", "SHARDS", "RETENTION", "MESSAGES", "SUBSCRIPTIONS", "READY", "REASON", "AGE"]
    assert out[1].split()[:7] == ["telemetry", "16", "86400", "10", "2", "True", "Synced"]
    wide = cluster.run("get", f"ignistopics.{cluster.group}", "telemetry", "-n", cluster.namespace, "-o", "wide").stdout
    assert "BYTES" in wide.splitlines()[0] and "2048" in wide.splitlines()[1]
    # status fields the operator writes survive (a structural schema prunes undeclared ones silently)
    stored = json.loads(cluster.run("get", f"ignistopics.{cluster.group}", "telemetry", "-n", cluster.namespace,
                                    "-o", "json").stdout)["status"]
    assert {k: stored[k] for k in status} == status
    queue = json.loads(cluster.run("get", f"ignisqueues.{cluster.group}", "telemetry-alerts", "-n",
                                   cluster.namespace, "-o", "json").stdout)
    assert queue["spec"]["subscribe"] == {"topic": "telemetry", "filter": "sensors/+/temp", "start": "latest"}
    sub = {"topic": "telemetry", "lag": 7, "expired": 1, "depth": 7}
    cluster.run("patch", f"ignisqueues.{cluster.group}", "telemetry-alerts", "-n", cluster.namespace,
                "--subresource=status", "--type=merge", "-p", json.dumps({"status": sub}))
    stored = json.loads(cluster.run("get", f"ignisqueues.{cluster.group}", "telemetry-alerts", "-n",
                                    cluster.namespace, "-o", "json").stdout)["status"]
    assert {k: stored.get(k) for k in sub} == sub
    header = cluster.run("get", f"ignisqueues.{cluster.group}", "telemetry-alerts", "-n",
                         cluster.namespace).stdout.splitlines()[0]
    columns = yaml.safe_load(CRD_PATHS["IgnisQueue"].read_text())["spec"]["versions"][0]["additionalPrinterColumns"]
    # `kubectl get iq` keeps its columns: a subscription's figures add none
    assert header.split() == ["NAME", *(c["name"].upper() for c in columns if not c.get("priority"))]
