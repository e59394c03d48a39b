"""The elector state machine over both lease backends: the store lease (in-process, fast timings) and
a coordination.k8s.io/v1 Lease served by the kmock Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kmock
import pytest
from ignis_workers.election import KubeLease, LeaderElector, LeaseView, StoreLease
from kmock._internal.k8s import KubernetesEmulator

from ignis.storage import open_store

FAST = {"lease_duration": 1.5, "renew_deadline": 1.0, "retry_period": 0.1}


async def until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


class Campaign:
    """One elector running as a task, with its own stop event and a guarded work task to observe."""

    def __init__(self, backend: Any, identity: str) -> None:
        self.stop = asyncio.Event()
        self.work_cancelled = asyncio.Event()
        self.started = 0
        self.elector = LeaderElector(backend, identity, on_started=self._started, **FAST)
        self.task = asyncio.create_task(self.elector.run(self.stop, work=self._work))

    def _started(self) -> None:
        self.started += 1

    async def _work(self) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.work_cancelled.set()
            raise

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)


@pytest.fixture
def store(tmp_path):
    s = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    yield s
    s.close()


def test_timings_must_be_ordered(store):
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(StoreLease(store), "x", lease_duration=5, renew_deadline=6, retry_period=1)


@pytest.mark.asyncio
async def test_store_lease_one_leader_release_and_takeover(store):
    a = Campaign(StoreLease(store), "a")
    await until(a.elector.is_leading)
    b = Campaign(StoreLease(store), "b")
    await asyncio.sleep(0.5)
    assert not b.elector.is_leading() and a.elector.is_leading()
    assert store.get_lease("ignis-sweeper").holder == "a"
    started = time.monotonic()
    await a.halt()  # releases: b takes over within about one retry period
    assert a.work_cancelled.is_set() and store.get_lease("ignis-sweeper").holder in ("", "b")
    await until(b.elector.is_leading)
    assert time.monotonic() - started < 1.0
    lease = store.get_lease("ignis-sweeper")
    assert (lease.holder, lease.transitions) == ("b", 1)
    await b.halt()


@pytest.mark.asyncio
async def test_stolen_lease_cancels_guarded_work_at_once(store):
    a = Campaign(StoreLease(store), "a")
    await until(a.elector.is_leading)
    current = store.get_lease("ignis-sweeper")
    stolen = type(current)("thief", 0, 0, 60, current.transitions + 1)
    assert store.replace_lease("ignis-sweeper", stolen, current.version) is not None
    await asyncio.wait_for(a.work_cancelled.wait(), 2.0)  # the next renewal sees another holder
    assert not a.elector.is_leading()
    await a.halt()
    assert store.get_lease("ignis-sweeper").holder == "thief"  # not released: it was not ours


class FailingBackend:
    """Works until `broken`; then every call raises (the store or API server went away)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.broken = False

    async def read(self) -> LeaseView | None:
        if self.broken:
            raise ConnectionError("backend down")
        return await self.inner.read()

    async def write(self, lease: LeaseView, expected: LeaseView | None) -> LeaseView | None:
        if self.broken:
            raise ConnectionError("backend down")
        return await self.inner.write(lease, expected)


@pytest.mark.asyncio
async def test_renewal_failing_past_the_deadline_stops_leading(store):
    backend = FailingBackend(StoreLease(store))
    a = Campaign(backend, "a")
    await until(a.elector.is_leading)
    backend.broken = True
    broke = time.monotonic()
    await asyncio.wait_for(a.work_cancelled.wait(), 3.0)
    assert FAST["renew_deadline"] - 0.2 <= time.monotonic() - broke < FAST["renew_deadline"] + 1.0
    assert not a.elector.is_leading()
    backend.broken = False
    await until(a.elector.is_leading)  # it campaigns again and wins its own lease back
    assert a.started == 2
    await a.halt()


def test_is_leading_expires_by_itself_when_renewals_stall(store):
    """A paused process: no renewal ran, so it must not believe it still leads."""
    elector = LeaderElector(StoreLease(store), "a", **FAST)
    assert asyncio.run(elector.try_acquire_or_renew())
    elector._leading = True  # as the run loop would
    assert elector.is_leading()
    time.sleep(FAST["renew_deadline"] + 0.1)
    assert not elector.is_leading()


# ---- coordination.k8s.io/v1 Lease on the API emulator ---------------------------------------------------
class LeaseEmulator(KubernetesEmulator):
    """kmock's emulator stores objects as plain JSON; a real API server also keeps resourceVersion and
    answers 409 to a create of an existing object or to a patch whose metadata.resourceVersion is stale
    (optimistic concurrency). That is the contract the elector relies on, so this adds it around the
    emulator's own handling."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._cas = asyncio.Lock()
        self._versions: dict[tuple[str | None, str], int] = {}

    async def _handle(self, request: Any) -> Any:
        if request.resource is None or request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
            return await super()._handle(request)
        async with self._cas:
            meta = request.data.setdefault("metadata", {})
            key = (request.namespace or meta.get("namespace"), request.name or meta.get("name"))
            if request.action == kmock.action.CREATE and key in self._versions:
                return await self._conflict()  # already exists
            if request.action == kmock.action.UPDATE:
                sent = meta.get("resourceVersion")
                if key not in self._versions or sent != str(self._versions[key]):
                    return await self._conflict()
            self._versions[key] = self._versions.get(key, 0) + 1
            meta["resourceVersion"] = str(self._versions[key])
            return await super()._handle(request)

    async def _conflict(self) -> Any:
        import aiohttp.web

        return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                          "reason": "Conflict", "code": 409,
                                          "message": "the object has been modified"}, status=409)


async def kube_backend(server: Any) -> tuple[Any, KubeLease]:
    from kubernetes_asyncio import client

    config = client.Configuration(host=str(server.url).rstrip("/"))
    api = client.ApiClient(config)
    return api, KubeLease(api, "ignis", "ignis-sweeper")


@pytest.mark.asyncio
@pytest.mark.kmock(cls=LeaseEmulator)
async def test_kube_lease_compare_and_set(kmock):
    api, lease = await kube_backend(kmock)
    async with api:
        assert await lease.read() is None
        first = await lease.write(LeaseView("a", 1000, 1000, 15, 0, ""), None)
        assert first is not None and first.holder == "a" and first.version
        assert await lease.write(LeaseView("b", 1000, 1000, 15, 0, ""), None) is None  # exists: 409
        renewed = await lease.write(LeaseView("a", 1000, 2000, 15, 0, ""), first)
        assert renewed is not None and renewed.renewed_ms == 2000 and renewed.version != first.version
        assert await lease.write(LeaseView("b", 3000, 3000, 15, 1, ""), first) is None  # stale version
        current = await lease.read()
        assert (current.holder, current.renewed_ms, current.duration_s) == ("a", 2000, 15)


@pytest.mark.asyncio
@pytest.mark.kmock(cls=LeaseEmulator)
async def test_kube_lease_election_hand_over(kmock):
    api_a, lease_a = await kube_backend(kmock)
    api_b, lease_b = await kube_backend(kmock)
    async with api_a, api_b:
        a = Campaign(lease_a, "pod-a")
        await until(a.elector.is_leading)
        b = Campaign(lease_b, "pod-b")
        await asyncio.sleep(0.5)
        assert not b.elector.is_leading()
        started = time.monotonic()
        await a.halt()  # SIGTERM path: release, then the standby wins within a retry period or so
        assert a.work_cancelled.is_set()
        await until(b.elector.is_leading)
        assert time.monotonic() - started < 1.0
        current = await lease_b.read()
        assert (current.holder, current.transitions) == ("pod-b", 1)
        await b.halt()


# ---- what an outage of the lease backend looks like in the logs ----------------------------------------
class ApiDown:
    """A Kubernetes lease backend whose API server answers 503 (with headers and a body, as a real one
    does) while `down`."""

    what = "Kubernetes API"

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        self.calls += 1
        if self.down:
            exc = ApiException(status=503, reason="Service Unavailable")
            exc.headers = {"Audit-Id": "0f1e", "Cache-Control": "no-cache, private", "Content-Type": "application/json"}
            exc.body = ('{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
                        '"message":"etcdserver: leader changed","reason":"ServiceUnavailable","code":503}')
            raise exc

    async def read(self) -> LeaseView | None:
        self._check()
        return await self.inner.read()

    async def write(self, lease: LeaseView, expected: LeaseView | None) -> LeaseView | None:
        self._check()
        return await self.inner.write(lease, expected)


@pytest.mark.asyncio
async def test_an_api_outage_is_one_warning_line_and_one_info_line(store, caplog: pytest.LogCaptureFixture):
    import logging

    caplog.set_level(logging.DEBUG, logger="ignis_workers.election")
    backend = ApiDown(StoreLease(store))
    a = Campaign(backend, "a")
    await until(a.elector.is_leading)
    backend.down = True
    calls = backend.calls
    await asyncio.wait_for(a.work_cancelled.wait(), 3.0)  # renewals failed past the deadline
    await until(lambda: backend.calls >= calls + 15)  # and the campaign keeps knocking
    backend.down = False
    await until(a.elector.is_leading)
    await a.halt()
    records = [r for r in caplog.records if r.name == "ignis_workers.election"]
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING and "unreachable" in r.getMessage()]
    assert warnings == ["Kubernetes API unreachable: lease renewal failed: HTTP 503 Service Unavailable: "
                        "etcdserver: leader changed"]
    assert [r.getMessage() for r in records if "reachable again" in r.getMessage()] != []
    assert len([r for r in records if "reachable again" in r.getMessage() and r.levelno == logging.INFO]) == 1
    assert all("\n" not in r.getMessage() and "Audit-Id" not in r.getMessage() for r in records)
    assert not [r for r in records if r.levelno >= logging.ERROR]
