"""The chart's operator RBAC on a real kube-apiserver, checked as `kubectl auth can-i` checks it (a
SubjectAccessReview per question, answered by the API server's own RBAC authorizer): the ServiceAccount may do what
test_rbac.py recorded the operator doing with queues and topics, and nothing next to it (no get, create, delete or
update of either kind, no finalizers subresource, no Secrets, nothing outside its namespaces when namespace-
scoped). Set IGNIS_TEST_KUBECONFIG to an admin kubeconfig; skipped otherwise.

The rendered Roles, ClusterRoles and bindings are created under names of this run's own (namespaces and cluster
objects carry its suffix) and removed at the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from chart_support import NAMESPACE, render
from support.live_kube import LiveCluster, needs_cluster

pytest.importorskip("helm_python")
pytestmark = [needs_cluster, pytest.mark.timeout(300)]

SERVICE_ACCOUNT = "ig-ignismq-operator"
# (verb, resource[/subresource]) the operator uses in a namespace it serves (tests/deploy/test_rbac.py records them)
USED = [("list", "ignisqueues.ignismq.io"), ("watch", "ignisqueues.ignismq.io"), ("patch", "ignisqueues.ignismq.io"),
        ("patch", "ignisqueues.ignismq.io/status"), ("list", "ignistopics.ignismq.io"),
        ("watch", "ignistopics.ignismq.io"), ("patch", "ignistopics.ignismq.io"),
        ("patch", "ignistopics.ignismq.io/status"), ("create", "events")]
NEVER = [("get", "ignistopics.ignismq.io"), ("create", "ignistopics.ignismq.io"),
         ("delete", "ignistopics.ignismq.io"), ("update", "ignistopics.ignismq.io"),
         ("update", "ignistopics.ignismq.io/status"), ("patch", "ignistopics.ignismq.io/finalizers"),
         ("get", "ignisqueues.ignismq.io"), ("create", "ignisqueues.ignismq.io"),
         ("delete", "ignisqueues.ignismq.io"), ("patch", "ignisqueues.ignismq.io/finalizers"),
         ("get", "secrets"), ("list", "namespaces"), ("patch", "events")]


class RbacCluster(LiveCluster):
    def __init__(self) -> None:
        super().__init__()
        self.release_ns = f"k8s-topics-rbac-{self.suffix}"
        self.created: list[tuple[str, str]] = []  # cluster-scoped (kind, name) to delete
        self.namespaces: list[str] = []

    def install(self, docs: list[dict[str, Any]]) -> None:
        """The chart's RBAC objects of `docs`: namespaced ones as they are (in this run's namespaces), cluster ones
        renamed with the run's suffix; the ServiceAccount subjects point at the run's release namespace."""
        for doc in docs:
            if doc["kind"] not in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
                continue
            doc = dict(doc)
            if doc["metadata"].get("namespace") == NAMESPACE:  # the release's (the sweeper's Role)
                doc["metadata"] = {**doc["metadata"], "namespace": self.release_ns}
            if doc["kind"].startswith("Cluster"):
                doc["metadata"] = {**doc["metadata"], "name": f"{doc['metadata']['name']}-{self.suffix}"}
                self.created.append((doc["kind"].lower(), doc["metadata"]["name"]))
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"] = {**doc["roleRef"], "name": f"{doc['roleRef']['name']}-{self.suffix}"}
            if "subjects" in doc:
                doc["subjects"] = [{**s, "namespace": self.release_ns} if s.get("namespace") == NAMESPACE else s
                                   for s in doc["subjects"]]
            self.run("create", "-f", "-", stdin=doc)

    def namespace(self, name: str) -> str:
        self.run("create", "namespace", name)
        self.namespaces.append(name)
        return name

    def can(self, verb: str, resource: str, namespace: str | None) -> bool:
        """The API server's answer to `kubectl auth can-i VERB RESOURCE --as=<the operator's ServiceAccount>`: the
        same SubjectAccessReview, with the group spelled out (can-i resolves it through discovery, and on a server
        without the IgnisTopic CRD would ask about `ignistopics.ignismq.io` in the core group instead)."""
        resource, _, sub = resource.partition("/")
        name, _, group = resource.partition(".")
        attributes = {"verb": verb, "group": group, "resource": name, **({"subresource": sub} if sub else {}),
                      **({"namespace": namespace} if namespace else {})}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": f"system:serviceaccount:{self.release_ns}:{SERVICE_ACCOUNT}",
                           "groups": ["system:serviceaccounts", f"system:serviceaccounts:{self.release_ns}",
                                      "system:authenticated"], "resourceAttributes": attributes}}
        answer = json.loads(self.run("create", "-o", "json", "-f", "-", stdin=review).stdout)["status"]
        return bool(answer.get("allowed"))

    def can_i(self, verb: str, resource: str, namespace: str) -> bool:
        """kubectl auth can-i itself (for a resource the server's discovery knows)."""
        done = self.run("auth", "can-i", verb, resource, "-n", namespace,
                        f"--as=system:serviceaccount:{self.release_ns}:{SERVICE_ACCOUNT}", check=False)
        answer = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        assert answer in ("yes", "no"), done.stdout + done.stderr
        return answer == "yes"

    def cleanup(self) -> None:
        for kind, name in reversed(self.created):
            self.run("delete", kind, name, "--ignore-not-found", check=False)
        for namespace in self.namespaces:  # (their Roles and RoleBindings go with them)
            self.remove_namespace(namespace)


@pytest.fixture
def cluster() -> Iterator[RbacCluster]:
    c = RbacCluster()
    try:
        c.namespace(c.release_ns)
        yield c
    finally:
        c.cleanup()


def test_cluster_wide_operator_may_do_what_it_uses_and_nothing_else(cluster: RbacCluster, chart: Any) -> None:
    cluster.install(render(chart))
    anywhere = f"k8s-topics-any-{cluster.suffix}"  # any namespace: a ClusterRole binding (it need not exist)
    assert [c for c in USED if not cluster.can(*c, anywhere)] == []
    assert [c for c in NEVER if cluster.can(*c, anywhere)] == []
    assert cluster.can("watch", "ignistopics.ignismq.io", None)  # the cluster-wide watch kopf runs
    assert cluster.can("list", "customresourcedefinitions.apiextensions.k8s.io", None)  # crdScanning (default on)
    # kubectl auth can-i agrees where discovery knows the resource (events, always)
    assert cluster.can_i("create", "events", anywhere) and not cluster.can_i("get", "secrets", anywhere)


def test_namespace_scoped_operator_may_act_in_its_namespaces_only(cluster: RbacCluster, chart: Any) -> None:
    shop, billing = (cluster.namespace(f"{n}-{cluster.suffix}") for n in ("shop", "billing"))
    cluster.install(render(chart, {"operator": {"watchNamespaces": [shop, billing]}}))
    for namespace in (shop, billing):
        assert [c for c in USED if not cluster.can(*c, namespace)] == [], namespace
        assert [c for c in NEVER if cluster.can(*c, namespace)] == [], namespace
    elsewhere = f"k8s-topics-other-{cluster.suffix}"
    assert [c for c in USED if cluster.can(*c, elsewhere)] == []
    assert not cluster.can("watch", "ignistopics.ignismq.io", None)  # no cluster-wide right at all
    assert not cluster.can("list", "customresourcedefinitions.apiextensions.k8s.io", None)
