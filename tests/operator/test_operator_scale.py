"""What an operator serving thousands of queues must not do, checked on the API emulator: write status when
nothing a user reads changed, log kopf's bookkeeping at INFO, make a deletion wait on a timer or a
background pass, let a background pass undo a deletion, log every retry of an outage."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from ignis_operator.handlers import FINALIZER, OperatorConfig
from ignis_operator.wiring import configure
from kopf_harness import Harness, fast_config

from ignis.queue import Queue
from ignis.spec import QueueSpec

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

WRITES = {"POST", "PATCH", "PUT", "DELETE"}


def writes(h: Harness, since: int = 0) -> list[Any]:
    """The operator's API writes (requests after index `since` of the emulator's log)."""
    out = []
    for request in list(h.emulator)[since:]:
        agent = request.headers.get("User-Agent", "")
        if str(request.method.value).upper() in WRITES and agent.startswith(("kopf/", "ignis-operator/")):
            out.append(request)
    return out


def ready(h: Harness, name: str, namespace: str = "ns1") -> bool:
    return h.condition(name, namespace).get("status") == "True"


async def passes(h: Harness, drift: int, figures: int) -> None:
    """Wait until this many more drift and figures passes have completed."""
    background = await h.until(lambda: h.ctx.background, what="the background passes")
    start = dict(background.passes)
    await h.until(lambda: background.passes["drift"] >= start["drift"] + drift
                  and background.passes["figures"] >= start["figures"] + figures, timeout=30,
                  what=f"{drift} drift and {figures} figures passes")


async def test_ready_status_carries_the_first_figures(harness: Harness) -> None:
    """DEPTH and SIDELINED show at Ready: the status write that makes an object Ready carries them."""
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    status_writes = [r.data["status"] for r in writes(harness)
                     if r.url.path.endswith("/ignisqueues/orders/status")]
    first_ready = next(s for s in status_writes
                       if any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions", [])))
    figures = (first_ready["depth"], first_ready["sidelined"], first_ready["inFlight"], first_ready["dead"])
    assert figures == (0, 0, 0, 0)
    assert first_ready["figuresTime"].endswith("Z")
    obj = harness.obj("orders") or {}
    assert FINALIZER in obj["metadata"]["finalizers"]  # the record only exists once the finalizer does


async def test_an_idle_operator_writes_nothing(harness: Harness) -> None:
    for name in ("orders", "audit", "events"):
        await harness.create(name, shards=2)
    await harness.until(lambda: all(ready(harness, n) for n in ("orders", "audit", "events")), what="Ready")
    await passes(harness, drift=1, figures=1)  # whatever the first passes had to do is done
    since = len(list(harness.emulator))
    await passes(harness, drift=3, figures=3)
    assert [f"{r.method.value} {r.url.path}" for r in writes(harness, since)] == []


async def test_figures_are_written_when_they_move_enough(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    queue = Queue(harness.store.with_client("ns1"), QueueSpec.build(name="orders", handlerType="orders.v1",
                                                                     shards=2, clientId="ns1"))
    queue.publish_many([b"m"] * 100)
    status = await harness.until(lambda: (harness.obj("orders") or {}).get("status", {}).get("depth") == 100
                                 and harness.obj("orders")["status"], what="depth 100 written")
    written = status["figuresTime"]
    queue.publish_many([b"m"] * 5)  # +5%: below the 10% threshold, not worth a write
    since = len(list(harness.emulator))
    await passes(harness, drift=0, figures=3)
    assert writes(harness, since) == []
    assert (harness.obj("orders") or {})["status"]["figuresTime"] == written
    queue.publish_many([b"m"] * 10)  # 115 against 100 written: +15%
    await harness.until(lambda: (harness.obj("orders") or {})["status"].get("depth") == 115, what="depth 115")


async def test_one_info_line_per_change_and_kopf_bookkeeping_at_debug(harness: Harness,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    await harness.edit("orders", shards=4)
    await harness.until(lambda: harness.condition("orders").get("observedGeneration") == 2, what="updated")
    await passes(harness, drift=2, figures=2)
    await harness.delete("orders")
    await harness.until(lambda: harness.obj("orders") is None, what="deleted")
    lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records
             if r.name.startswith(("kopf", "ignis_operator")) and r.levelno >= logging.INFO]
    assert lines == [
        ("ignis_operator.handlers", "INFO", "queue record created (2 shards)"),
        ("ignis_operator.handlers", "INFO", "queue record updated: shards 2 -> 4"),
        ("ignis_operator.handlers", "INFO", "queue 'orders' deactivated, data kept (deletionPolicy Retain)"),
    ], lines


async def test_handler_names_read_as_words(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="kopf")
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    await harness.delete("orders")
    await harness.until(lambda: harness.obj("orders") is None, what="deleted")
    kopf_lines = [r.getMessage() for r in caplog.records if r.name.startswith("kopf")]
    assert "Handler 'observe' succeeded." in kopf_lines
    assert not [line for line in kopf_lines if "<locals>" in line]
    from ignis_operator.handlers import OperatorContext
    from ignis_operator.wiring import build_registry

    registry = build_registry(OperatorContext(harness.store, fast_config()))
    ids = {h.id for h in registry._activities.get_all_handlers()} | {
        h.id for h in registry._watching.get_all_handlers()}
    assert ids == {"login", "start", "stop", "observe"}


async def test_no_timers_so_a_deletion_never_waits_on_one(tmp_path: Any) -> None:
    """kopf holds a deletion until an object's timers and daemons have stopped, re-checking a stopping one
    every `cancellation_polling` seconds (60 by default): the operator has none, and would not wait long."""
    import kopf
    from ignis_operator.handlers import OperatorContext
    from ignis_operator.wiring import build_registry

    from ignis.storage import open_store

    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    try:
        registry = build_registry(OperatorContext(store, fast_config()), cluster_login=False)
    finally:
        store.close()
    assert list(registry._spawning.get_all_handlers()) == []  # timers and daemons
    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.background.cancellation_polling <= 1 and settings.background.instant_exit_timeout is not None


@pytest.fixture
def two_workers(monkeypatch: pytest.MonkeyPatch) -> int:
    """kopf's per-object workers bounded to 2 (configure() reads WORKER_LIMIT when the operator starts)."""
    import ignis_operator.wiring as wiring

    monkeypatch.setattr(wiring, "WORKER_LIMIT", 2)
    return 2


async def test_a_burst_larger_than_the_worker_limit_all_gets_ready(two_workers: int, harness: Harness) -> None:
    """The worker limit bounds the operator's memory in a create burst (10,000 at once); the objects beyond it
    wait their turn in kopf's queues and none is starved, also when deleted while waiting."""
    import kopf

    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.queueing.worker_limit == two_workers
    names = [f"burst{i:02d}" for i in range(6)]
    await asyncio.gather(*(harness.create(name, shards=1) for name in names))
    await harness.until(lambda: all(ready(harness, n) for n in names), timeout=60, what="all Ready")
    records = harness.store.with_client("ns1")
    assert all(records.get_queue(name).active for name in names)  # type: ignore[union-attr]
    await asyncio.gather(*(harness.delete(name) for name in names[:3]))
    await harness.until(lambda: all(harness.obj(n) is None for n in names[:3]), timeout=60, what="deleted")
    assert not any(records.get_queue(name).active for name in names[:3])  # type: ignore[union-attr]
    assert all(ready(harness, n) for n in names[3:])


class SlowStore:
    """A store (and its per-client views) whose bulk read of queue records, the drift pass's, blocks until
    released."""

    def __init__(self, inner: Any, loop: asyncio.AbstractEventLoop, gate: SlowGate | None = None) -> None:
        self._inner = inner
        self.gate = gate or SlowGate(loop)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def with_client(self, client_id: str) -> SlowStore:
        return SlowStore(self._inner.with_client(client_id), self.gate.loop, self.gate)

    def list_queues(self, active: bool | None = True) -> Any:
        if not self.gate.release.is_set():
            self.gate.loop.call_soon_threadsafe(self.gate.entered.set)
            self.gate.release.wait(30)
        return self._inner.list_queues(active)


class SlowGate:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entered = asyncio.Event()
        self.release = threading.Event()


@pytest.fixture
def operator_config() -> OperatorConfig:
    return fast_config()


async def test_a_deletion_does_not_wait_for_a_pass_and_a_pass_does_not_undo_it(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    slow = SlowStore(harness.ctx.store, asyncio.get_running_loop())
    harness.ctx.store = slow  # the next drift pass blocks in its bulk read, "orders" in its snapshot
    try:
        await asyncio.wait_for(slow.gate.entered.wait(), 10)
        harness.store.with_client("ns1").set_queue_active("orders", False)  # drift the pass would repair
        started = asyncio.get_running_loop().time()
        await harness.delete("orders")
        await harness.until(lambda: harness.obj("orders") is None, timeout=10, what="deleted while a pass runs")
        assert asyncio.get_running_loop().time() - started < 5
    finally:
        slow.gate.release.set()
        harness.ctx.store = slow._inner
    await passes(harness, drift=1, figures=0)
    record = harness.store.with_client("ns1").get_queue("orders")
    assert record is not None and record.bins["active"] == "false"  # Retain: the pass did not re-activate it


async def test_a_store_outage_is_one_warning_and_one_info(harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    harness.outage.down = True
    names = [f"q{i}" for i in range(5)]
    for name in names:
        await harness.create(name, shards=1)
    await harness.until(lambda: all(harness.condition(n, type_="Synced").get("reason") == "StoreUnavailable"
                                    for n in names), what="StoreUnavailable")
    await asyncio.sleep(1.5)  # several retries of each object (backoff 0.1 s to 0.5 s)
    harness.outage.down = False
    await harness.until(lambda: all(ready(harness, n) for n in names), what="all Ready after the outage")
    ours = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith(("ignis_operator", "kopf"))
            and r.levelno >= logging.WARNING]
    assert len(ours) == 1 and ours[0][0] == "WARNING" and ours[0][1].startswith("store unreachable: "), ours
    back = [r for r in caplog.records if r.getMessage().startswith("store reachable again")]
    assert len(back) == 1 and back[0].levelno == logging.INFO


async def test_a_deletion_during_a_store_outage_is_applied_when_the_store_is_back(harness: Harness) -> None:
    """The deletionPolicy is retried in the background while the store is down; once it is back the policy
    is applied and the operator itself removes the finalizer (a JSON patch on the resourceVersion the watch
    last showed)."""
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="Ready")
    harness.outage.down = True
    await harness.delete("orders")
    await harness.until(lambda: any(r.kind == "finalize" for r in harness.ctx.retries.values()), what="a retry")
    await asyncio.sleep(0.5)
    assert harness.obj("orders") is not None  # held by the finalizer while the policy cannot be applied
    harness.outage.down = False
    await harness.until(lambda: harness.obj("orders") is None, what="released once the store is back")
    record = harness.store.with_client("ns1").get_queue("orders")
    assert record is not None and record.bins["active"] == "false"
    releases = [r for r in writes(harness) if r.headers.get("User-Agent", "").startswith("ignis-operator/")
                and r.url.path.endswith("/ignisqueues/orders")]
    assert len(releases) == 1 and releases[0].data[1]["path"] == "/metadata/finalizers"
