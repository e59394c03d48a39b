"""The chart's RBAC is what the code needs, found by running it: the operator (kopf) and the sweeper's
Kubernetes lease run against kmock's API emulator, every request they make is recorded, and each must
be allowed by the rendered Roles/ClusterRoles of their ServiceAccount — while every granted rule must
have been used by some request (nothing granted for nothing).

Discovery (/version, /api, /apis, /apis/GROUP/VERSION) is left out: Kubernetes grants it to every
authenticated user through the system:discovery ClusterRole."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kopf
import pytest
import pytest_asyncio
from chart_support import NAMESPACE, PROFILES, render
from ignis_operator.emulation import declare_resources, kube_configuration
from ignis_operator.handlers import GROUP, PLURAL, VERSION, OperatorConfig, OperatorContext
from ignis_operator.topics import TOPIC_PLURAL
from ignis_operator.wiring import build_registry, configure
from ignis_workers.election import KubeLease, LeaderElector
from kmock import KubernetesEmulator, ResourceInfo
from support.kmock_naming import NamingEmulator

from ignis.storage import open_store

pytest.importorskip("helm_python")
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    return {**kmock_options, "cls": NamingEmulator}  # kopf names its Events with generateName


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str  # with /subresource
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " (cluster-wide)"
        name = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{name}{where}"


def parse(method: str, path: str, params: Any) -> Call | None:
    """The RBAC attributes of one API request (None for discovery)."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = parts[1] if len(parts) > 1 else "", parts[3:]
    else:
        return None  # /version and the like
    if not rest:
        return None  # discovery of a group version
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
    watching = str(params.get("watch", "")).lower() in ("true", "1")
    verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(method) or (
        "watch" if watching else "get" if name else "list")
    return Call(verb, group, f"{resource}/{sub}" if sub else resource, namespace, name)


def grants(docs: list[dict[str, Any]], service_account: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(namespace or None for cluster-wide, rule) of every rule bound to the ServiceAccount."""
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    found = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account and s["namespace"] == NAMESPACE
                   for s in binding["subjects"]):
            continue
        scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role = roles[(ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])]
        found += [(scope, rule) for rule in role["rules"]]
    return found


def allows(scope: str | None, rule: dict[str, Any], call: Call) -> bool:
    if scope is not None and call.namespace != scope:
        return False  # a RoleBinding grants nothing outside its namespace, nor cluster-wide
    return ((call.group in rule["apiGroups"] or "*" in rule["apiGroups"])
            and (call.resource in rule["resources"] or "*" in rule["resources"])
            and (call.verb in rule["verbs"] or "*" in rule["verbs"])
            and (not rule.get("resourceNames") or call.name in rule["resourceNames"]))


def check(docs: list[dict[str, Any]], service_account: str, calls: set[Call]) -> None:
    bound = grants(docs, service_account)
    denied = [str(c) for c in calls if not any(allows(scope, rule, c) for scope, rule in bound)]
    assert denied == [], f"{service_account} lacks RBAC for {sorted(denied)}"
    for scope, rule in bound:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert any(c.group == group and c.resource == resource and c.verb == verb
                               and (scope is None or c.namespace == scope) for c in calls), \
                        f"{service_account} is granted {verb} {group}/{resource} in {scope or 'the cluster'}, unused"


OPERATOR_AGENTS = ("kopf/", "ignis-operator/")  # kopf's watch and handler patches; the operator's own client


def recorded(emulator: KubernetesEmulator, agent_prefix: str | tuple[str, ...]) -> set[Call]:
    calls = set()
    for request in list(emulator):
        if not request.headers.get("User-Agent", "").startswith(agent_prefix):
            continue  # the test's own requests
        call = parse(str(request.method.value).upper(), request.url.path, request.params)
        if call is not None:
            calls.add(call)
    return calls


# ---- operator ---------------------------------------------------------------------------------------
@pytest_asyncio.fixture
async def emulator(kmock: KubernetesEmulator) -> KubernetesEmulator:
    declare_resources(kmock)
    kmock.resources["coordination.k8s.io/v1/leases"] = ResourceInfo(
        kind="Lease", namespaced=True, verbs={"get", "create", "patch", "list", "watch"})
    return kmock


async def run_operator(emulator: KubernetesEmulator, tmp_path: Path, namespaces: list[str], scanning: bool) -> None:
    """A queue's life through the operator: create, update, Ready, delete (finalizer); and a topic's, with a
    subscription: created before its topic (TopicNotFound, retried), Ready, the topic's deletion waiting for it
    (InUse, written by a background pass), then both deleted."""
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    config = OperatorConfig(figures_interval_seconds=0.3, resync_interval_seconds=0.5, resync_jitter_seconds=0.1,
                            scanning=scanning)
    server = str(emulator.url).rstrip("/")
    registry = build_registry(OperatorContext(store, config, kube=kube_configuration(server)), cluster_login=False)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server, insecure=True)

    settings = kopf.OperatorSettings()
    configure(settings, scanning=scanning)
    settings.persistence.consistency_timeout = 0.2  # the emulator does not bump resourceVersion
    settings.watching.reconnect_backoff = 0.1
    thread_stop, thread_ready = threading.Event(), threading.Event()
    operator = kopf.operator(registry=registry, settings=settings, standalone=True, clusterwide=not namespaces,
                             namespaces=namespaces, stop_flag=thread_stop, ready_flag=thread_ready)
    thread = threading.Thread(target=asyncio.run, args=(operator,), daemon=True)
    thread.start()
    base = f"/apis/{GROUP}/{VERSION}/namespaces/shop/{PLURAL}"
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "uid-1", "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "spec": {"handlerType": "orders.v1", "shards": 2}}

    def obj() -> dict[str, Any]:
        for (resource, ns, name), o in emulator.objects.items():
            if resource.plural == PLURAL and ns == "shop" and name == "orders" and not o.deleted:
                return dict(o.raw)
        return {}

    async def until(check: Any, what: str) -> None:
        deadline = time.monotonic() + 30
        while not check():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    try:
        async with aiohttp.ClientSession(base_url=server) as session:
            await asyncio.to_thread(thread_ready.wait, 30)
            async with session.post(base, json=body) as resp:
                assert resp.status < 300
            await until(lambda: (obj().get("status") or {}).get("observedGeneration") == 1, "Ready")
            patch = {"metadata": {"generation": 2}, "spec": {"shards": 4}}
            async with session.patch(f"{base}/orders", json=patch,
                                     headers={"Content-Type": "application/merge-patch+json"}) as resp:
                assert resp.status < 300
            await until(lambda: (obj().get("status") or {}).get("observedGeneration") == 2, "updated")
            await asyncio.sleep(1.0)  # resync and figures timers run
            async with session.delete(f"{base}/orders") as resp:
                assert resp.status < 300
            await until(lambda: not obj(), "deleted (finalizer released)")
            await topic_life(session, emulator, until)
    finally:
        thread_stop.set()
        await asyncio.to_thread(thread.join, 30)
        store.close()


async def test_cluster_wide_operator_rbac_is_exactly_what_kopf_uses(emulator: KubernetesEmulator,
                                                                    chart: Any, tmp_path: Path) -> None:
    await run_operator(emulator, tmp_path, [], scanning=True)
    calls = recorded(emulator, OPERATOR_AGENTS)
    print("operator calls:", sorted(map(str, calls)))
    assert Call("watch", GROUP, PLURAL, None, None) in calls  # cluster-wide watch
    assert Call("watch", GROUP, TOPIC_PLURAL, None, None) in calls
    assert Call("patch", GROUP, f"{TOPIC_PLURAL}/status", "shop", "events") in calls
    assert Call("create", "", "events", "shop", None) in calls  # Normal and Warning Events
    assert not any(c.resource == "namespaces" for c in calls)  # cluster-wide kopf never lists namespaces
    check(render(chart), "ig-ignismq-operator", calls)
    with pytest.raises(AssertionError, match=r"lacks RBAC for .*customresourcedefinitions"):
        check(render(chart, {"operator": {"crdScanning": False}}), "ig-ignismq-operator", calls)


async def test_namespace_scoped_operator_makes_no_cluster_scoped_call(emulator: KubernetesEmulator,
                                                                       chart: Any, tmp_path: Path) -> None:
    await run_operator(emulator, tmp_path, ["shop", "billing"], scanning=False)
    calls = recorded(emulator, OPERATOR_AGENTS)
    assert [str(c) for c in calls if c.namespace is None] == []
    docs = render(chart, {"operator": {"watchNamespaces": ["shop", "billing"]}})
    bound = grants(docs, "ig-ignismq-operator")
    assert {scope for scope, _ in bound} == {"shop", "billing"}
    denied = [str(c) for c in calls if not any(allows(scope, rule, c) for scope, rule in bound)]
    assert denied == []
    used = {(c.group, c.resource, c.verb) for c in calls}
    granted = {(g, r, v) for _, rule in bound for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == used  # billing saw no queue: the same rules, used in shop


async def topic_life(session: aiohttp.ClientSession, emulator: KubernetesEmulator, until: Any) -> None:
    """A subscription applied before its topic, the topic, the topic's deletion while the subscription reads it,
    then the subscription's deletion and so the topic's."""
    queues, topics = (f"/apis/{GROUP}/{VERSION}/namespaces/shop/{plural}" for plural in (PLURAL, TOPIC_PLURAL))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def body(kind: str, name: str, uid: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "spec": spec,
                "metadata": {"name": name, "namespace": "shop", "uid": uid, "resourceVersion": "1",
                             "generation": 1, "creationTimestamp": stamp}}

    def find(plural: str, name: str) -> dict[str, Any]:
        for (resource, ns, nm), o in emulator.objects.items():
            if resource.plural == plural and ns == "shop" and nm == name and not o.deleted:
                return dict(o.raw)
        return {}

    def reason(plural: str, name: str) -> str | None:
        conditions = (find(plural, name).get("status") or {}).get("conditions") or []
        return next((c.get("reason") for c in conditions if c["type"] == "Ready"), None)

    subscription = body("IgnisQueue", "alerts", "uid-2", {"handlerType": "alerts.v1", "shards": 2,
                                                          "subscribe": {"topic": "events"}})
    async with session.post(queues, json=subscription) as resp:
        assert resp.status < 300
    await until(lambda: reason(PLURAL, "alerts") == "TopicNotFound", "subscription waits for its topic")
    async with session.post(topics, json=body("IgnisTopic", "events", "uid-3", {"shards": 2})) as resp:
        assert resp.status < 300
    await until(lambda: reason(PLURAL, "alerts") == "Synced" and reason(TOPIC_PLURAL, "events") == "Synced",
                "topic and subscription Ready")
    async with session.delete(f"{topics}/events") as resp:
        assert resp.status < 300
    await until(lambda: reason(TOPIC_PLURAL, "events") == "InUse", "the topic's deletion waits")
    async with session.delete(f"{queues}/alerts") as resp:
        assert resp.status < 300
    await until(lambda: not find(TOPIC_PLURAL, "events") and not find(PLURAL, "alerts"), "both deleted")


# ---- sweeper ----------------------------------------------------------------------------------------
async def test_sweeper_lease_rbac_is_exactly_what_the_elector_uses(emulator: KubernetesEmulator, chart: Any) -> None:
    from kubernetes_asyncio import client

    configuration = client.Configuration(host=str(emulator.url).rstrip("/"))
    async with client.ApiClient(configuration) as api:
        api.user_agent = "ignis-sweeper-test"
        elector = LeaderElector(KubeLease(api, NAMESPACE, "ignis-sweeper"), "sweeper-a",
                                lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)
        stop = asyncio.Event()
        task = asyncio.create_task(elector.run(stop))
        deadline = time.monotonic() + 10
        while not elector.is_leading():
            assert time.monotonic() < deadline, "never led"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.6)  # a few renewals
        stop.set()
        await asyncio.wait_for(task, 10)  # releases the lease on the way out
    calls = recorded(emulator, "ignis-sweeper-test")
    print("sweeper calls:", sorted(map(str, calls)))
    assert {c.verb for c in calls} == {"get", "create", "patch"}
    for values in ({}, PROFILES["namespace-scoped"]):
        check(render(chart, values), "ig-ignismq-sweeper", calls)
