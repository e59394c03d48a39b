"""The kopf wiring end to end against the kmock API emulator: registration, finalizer, status patches,
events, timers, deletion policies, conflicts, outages."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from ignis_operator.handlers import FINALIZER, OperatorConfig
from kopf_harness import Harness, fast_config
from test_operator_scale import passes

from ignis.probes import ProbeServer
from ignis.queue import Queue
from ignis.spec import QueueSpec

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


@pytest.fixture
def operator_config() -> OperatorConfig:
    """Fast timers; a finalizer gives up on an unreachable store after half a second (only matters while
    the store is down, which only the outage tests arrange)."""
    return fast_config(finalizer_timeout_seconds=0.5)


def record(h: Harness, name: str, client_id: str = "ns1") -> dict | None:
    found = h.store.with_client(client_id).get_queue(name)
    return found.bins if found else None


def has_finalizer(h: Harness, name: str) -> bool:
    return FINALIZER in ((h.obj(name) or {}).get("metadata", {}).get("finalizers") or [])


async def test_create_syncs_record_sets_finalizer_and_status(harness: Harness) -> None:
    await harness.create("orders", shards=4, concurrency=2)
    await harness.until(lambda: harness.condition("orders").get("status") == "True", what="Ready=True")
    obj = harness.obj("orders")
    assert obj is not None
    assert FINALIZER in obj["metadata"]["finalizers"]
    status = obj["status"]
    assert status["observedGeneration"] == 1 and status["clientId"] == "ns1"
    synced = harness.condition("orders", type_="Synced")
    assert (synced["status"], synced["reason"]) == ("True", "Synced")
    bins = record(harness, "orders")
    assert bins is not None and (bins["shards"], bins["concurrency"], bins["active"]) == (4, 2, "true")
    assert "ns1" in harness.store.list_clients()


async def test_update_reaches_the_store_and_keeps_transition_time(harness: Harness) -> None:
    await harness.create("orders", shards=4)
    first = await harness.until(lambda: harness.condition("orders").get("lastTransitionTime"))
    await harness.edit("orders", shards=8)
    await harness.until(lambda: (record(harness, "orders") or {}).get("shards") == 8, what="shards=8 in the store")
    await harness.until(lambda: (harness.obj("orders") or {}).get("status", {}).get("observedGeneration") == 2,
                        what="observedGeneration 2")
    assert harness.condition("orders")["lastTransitionTime"] == first


async def test_invalid_spec_is_ready_false_with_one_warning_and_no_retries(harness: Harness) -> None:
    await harness.create("broken", shards=0)  # the emulator does not run the CRD schema: the handler must cope
    ready = await harness.until(lambda: harness.condition("broken").get("reason") == "InvalidSpec" and
                                harness.condition("broken"))
    assert ready["status"] == "False" and "shards=0" in ready["message"]
    await harness.until(lambda: harness.events("InvalidSpec"), what="a Warning event")
    reconciles = harness.ctx.states.snapshot()
    assert reconciles == {"ns1/broken": "InvalidSpec"}
    # one warning per generation: neither the watch events that follow (the finalizer's, the status's) nor a
    # resync adds another
    await asyncio.sleep(2.0)  # several resync periods
    warnings = harness.events("InvalidSpec")
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    assert record(harness, "broken") is None


async def test_figures_timer_fills_the_status(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: record(harness, "orders"))
    spec = QueueSpec.build(name="orders", handlerType="orders.v1", shards=2, clientId="ns1")
    queue = Queue(harness.store.with_client("ns1"), spec)
    queue.publish_many([b"a", b"b", b"c"])
    fired = queue.fire()
    assert fired is not None
    fired.nack("test")
    assert queue.fire() is not None  # one in flight
    status = await harness.until(lambda: (harness.obj("orders") or {}).get("status", {}).get("sidelined") == 1
                                 and harness.obj("orders")["status"], what="figures in status")
    assert (status["depth"], status["inFlight"], status["sidelined"], status["dead"]) == (1, 1, 1, 0)
    assert status["figuresTime"].endswith("Z")
    assert status["delayed"] == 0 and 0 <= status["oldestAgeSeconds"] < 30  # one message waits
    queue.ack(queue.fire_many(10))  # nothing waits: the age leaves the status (a null in the merge patch)
    status = await harness.until(lambda: (harness.obj("orders") or {}).get("status", {}).get("depth") == 0
                                 and harness.obj("orders")["status"], what="depth 0 written")
    assert "oldestAgeSeconds" not in status and status["inFlight"] == 1


async def test_resync_restores_a_deleted_record_and_reverts_edits(harness: Harness) -> None:
    await harness.create("orders", shards=4)
    await harness.until(lambda: record(harness, "orders"), what="the record created")
    # creation fully handled (a drift pass has run since): from now on only the drift pass writes the record
    await passes(harness, drift=1, figures=0)
    view = harness.store.with_client("ns1")
    view.apply_queue("orders", {"concurrency": 77}, 60)
    await harness.until(lambda: (record(harness, "orders") or {}).get("concurrency") == 1, what="edit reverted")
    await harness.until(lambda: harness.events("DriftRepaired"), what="a DriftRepaired event")
    view.delete_queue("orders")
    await harness.until(lambda: record(harness, "orders"), what="record restored")


async def test_delete_policy_delete_purges_and_releases(harness: Harness) -> None:
    await harness.create("orders", shards=2, deletionPolicy="Delete")
    await harness.until(lambda: record(harness, "orders"))
    spec = QueueSpec.build(name="orders", handlerType="orders.v1", shards=2, clientId="ns1")
    Queue(harness.store.with_client("ns1"), spec).publish(b"x")
    await harness.until(lambda: has_finalizer(harness, "orders"), what="finalizer")
    await harness.delete("orders")
    await harness.until(lambda: harness.obj("orders") is None, what="object released")
    assert record(harness, "orders") is None
    assert Queue(harness.store.with_client("ns1"), spec).stats().published == 0


async def test_delete_policy_retain_deactivates(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: has_finalizer(harness, "orders"), what="finalizer")
    await harness.until(lambda: record(harness, "orders"))
    await harness.delete("orders")
    await harness.until(lambda: harness.obj("orders") is None, what="object released")
    bins = record(harness, "orders")
    assert bins is not None and bins["active"] == "false"


async def test_two_objects_claiming_one_queue_the_newer_gets_conflict(harness: Harness) -> None:
    await harness.create("orders", "ns1", clientId="shared", created="2026-01-01T00:00:00Z", concurrency=1)
    await harness.until(lambda: harness.condition("orders", "ns1").get("status") == "True")
    await harness.create("orders", "ns2", clientId="shared", created="2026-02-01T00:00:00Z", concurrency=9)
    loser = await harness.until(lambda: harness.condition("orders", "ns2").get("reason") == "Conflict"
                                and harness.condition("orders", "ns2"))
    assert loser["status"] == "False" and "ns1/orders" in loser["message"]
    assert record(harness, "orders", "shared")["concurrency"] == 1  # type: ignore[index]
    # the loser going away must not touch the winner's queue
    await harness.delete("orders", "ns2")
    await harness.until(lambda: harness.obj("orders", "ns2") is None)
    assert record(harness, "orders", "shared")["active"] == "true"  # type: ignore[index]


async def test_other_namespaces_are_not_watched(harness: Harness) -> None:
    await harness.create("elsewhere", "ns3")
    await harness.create("orders", "ns1")
    await harness.until(lambda: record(harness, "orders"))
    await asyncio.sleep(0.5)
    assert record(harness, "elsewhere", "ns3") is None


async def test_store_outage_is_synced_false_then_recovers(harness: Harness) -> None:
    harness.outage.down = True
    await harness.create("orders", shards=2)
    synced = await harness.until(lambda: harness.condition("orders", type_="Synced").get("reason") ==
                                 "StoreUnavailable" and harness.condition("orders", type_="Synced"))
    assert synced["status"] == "False"
    harness.outage.down = False
    await harness.until(lambda: harness.condition("orders").get("status") == "True", what="recovery")
    assert record(harness, "orders") is not None


async def test_finalizer_released_when_the_store_stays_down(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: record(harness, "orders"))
    await harness.until(lambda: has_finalizer(harness, "orders"), what="finalizer")
    harness.outage.down = True
    await harness.delete("orders")
    await harness.until(lambda: harness.obj("orders") is None, what="finalizer released")
    (event,) = await harness.until(lambda: harness.events("FinalizerTimeout"), what="a FinalizerTimeout event")
    assert event["type"] == "Warning" and "clean up queue 'orders' by hand" in event["message"]
    harness.outage.down = False
    assert record(harness, "orders")["active"] == "true"  # type: ignore[index]  # policy not applied: said so


async def test_metrics_are_served_by_the_probe_server(harness: Harness) -> None:
    await harness.create("orders")
    await harness.until(lambda: record(harness, "orders"))
    with ProbeServer(host="127.0.0.1", port=0) as probes:
        text = urllib.request.urlopen(f"http://127.0.0.1:{probes.port}/metrics", timeout=10).read().decode()
    assert 'ignis_operator_reconciles_total{result="Synced"}' in text
    assert "ignis_operator_reconcile_duration_seconds_bucket" in text
    assert 'ignis_operator_queues{state="Synced"}' in text


async def test_client_id_change_is_refused_even_without_cel(harness: Harness) -> None:
    """Clusters without CEL admission (or an edit that slipped past it): the handler refuses too."""
    await harness.create("orders", clientId="alpha")
    await harness.until(lambda: harness.condition("orders").get("status") == "True")
    await harness.edit("orders", clientId="beta")
    ready = await harness.until(lambda: harness.condition("orders").get("reason") == "InvalidSpec"
                                and harness.condition("orders"))
    assert "clientId is immutable" in ready["message"]
    await asyncio.sleep(1.0)  # resyncs keep refusing
    assert harness.condition("orders")["reason"] == "InvalidSpec"
    assert record(harness, "orders", "beta") is None
    assert (harness.obj("orders") or {})["status"]["clientId"] == "alpha"
