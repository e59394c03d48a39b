"""The reconcile functions against a real store (the `store` fixture: lmdb, and aerospike when configured)."""

from __future__ import annotations

from typing import Any

import pytest
from ignis_operator.reconcile import (
    AGE_FIGURE,
    CONFLICT,
    FIGURES,
    INVALID_SPEC,
    OWNER_BIN,
    SYNCED,
    Owner,
    SyncResult,
    config_drift,
    figures_changed,
    figures_status,
    finalize_queue,
    parse_k8s_time,
    queue_figures,
    set_condition,
    spec_from_object,
    status_for,
    sync_queue,
)

from ignis import names
from ignis.errors import InvalidSpecError
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import CREATED_AT, Storage

OLD = Owner("uid-old", "shop/orders", 1_000)
NEW = Owner("uid-new", "other/orders", 2_000)


def spec(name: str = "orders", **fields: Any) -> QueueSpec:
    fields.setdefault("handlerType", "orders.v1")
    fields.setdefault("shards", 4)
    fields.setdefault("clientId", "shop")
    return QueueSpec.build(name=name, **fields)


def records(store: Storage, client_id: str = "shop") -> dict[str, dict[str, Any]]:
    view = store.with_client(client_id)
    return {r.name: r.bins for r in view.list_queues(active=None)}


def test_spec_from_object_defaults_client_id_to_namespace_and_reports_problems() -> None:
    assert spec_from_object("orders", "shop", {"handlerType": "h"}).client_id == "shop"
    assert spec_from_object("orders", "shop", {"handlerType": "h", "clientId": "billing"}).client_id == "billing"
    with pytest.raises(InvalidSpecError, match="shards=0"):
        spec_from_object("orders", "shop", {"handlerType": "h", "shards": 0})


def test_parse_k8s_time() -> None:
    assert parse_k8s_time("1970-01-01T00:00:01Z") == 1000
    assert parse_k8s_time(None) == 0


def test_sync_creates_registers_client_and_indexes(store: Storage) -> None:
    result = sync_queue(store, spec(), OLD)
    assert (result.ready, result.reason, result.created, result.client_id) == (True, SYNCED, True, "shop")
    bins = records(store)["orders"]
    assert {k: bins[k] for k in spec().config_bins()} == spec().config_bins()
    assert bins[OWNER_BIN] == OLD.as_bin()
    assert "shop" in store.list_clients()
    assert [r.name for r in store.with_client("shop").list_queues(active=True)] == ["orders"]


def test_every_handler_twice_gives_the_same_store_state(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    first = records(store)
    again = sync_queue(store, spec(), OLD)
    assert (again.created, again.diff, again.message) == (False, {}, "queue record in sync")
    assert records(store) == first
    finalize_queue(store, spec(), OLD)
    after_retain = records(store)
    done = finalize_queue(store, spec(), OLD)
    assert done.action == "Deactivated" and done.message.startswith("queue 'orders' deactivated")
    assert records(store) == after_retain
    finalize_queue(store, spec(deletionPolicy="Delete"), OLD)
    assert records(store) == {}
    done = finalize_queue(store, spec(deletionPolicy="Delete"), OLD)
    assert (done.action, done.message) == ("Untouched", "queue 'orders' has no record; nothing to do")


def test_runtime_bins_survive_an_update(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    view = store.with_client("shop")
    view.advance_sweep("orders", "main", view.next_epoch(), {0: 5, 2: 7}, swept=3)
    before = view.get_queue("orders")
    assert before is not None
    result = sync_queue(store, spec(shards=8, concurrency=7), OLD)
    assert result.diff == {"shards": (4, 8), "concurrency": (1, 7)}
    after = view.get_queue("orders")
    assert after is not None
    for runtime_bin in (CREATED_AT, "sweepPointers", "sweptCounter", "sweepEpoch"):
        assert after.bins[runtime_bin] == before.bins[runtime_bin], runtime_bin
    assert (after.bins["shards"], after.bins["concurrency"]) == (8, 7)


def test_shards_never_shrink_even_when_the_store_has_more(store: Storage) -> None:
    sync_queue(store, spec(shards=16), OLD)
    result = sync_queue(store, spec(shards=8), OLD)
    assert (result.ready, result.reason) == (False, INVALID_SPEC)
    assert "shards may grow, never shrink" in result.message and "16" in result.message
    assert records(store)["orders"]["shards"] == 16  # nothing written


def test_ordered_is_immutable_in_the_store(store: Storage) -> None:
    assert sync_queue(store, spec(ordered=True), OLD).ready
    assert records(store)["orders"]["ordered"] == 1
    result = sync_queue(store, spec(ordered=False, concurrency=5), OLD)
    assert (result.ready, result.reason) == (False, INVALID_SPEC)
    assert "ordered=false: ordered is immutable" in result.message
    assert records(store)["orders"]["concurrency"] == 1  # nothing written
    assert sync_queue(store, spec(ordered=True, concurrency=5), OLD).ready


def test_conflict_older_claim_wins(store: Storage) -> None:
    assert sync_queue(store, spec(), OLD).ready
    loser = sync_queue(store, spec(concurrency=9), NEW)
    assert (loser.ready, loser.reason) == (False, CONFLICT)
    assert "shop/orders" in loser.message
    assert records(store)["orders"]["concurrency"] == 1
    assert records(store)["orders"][OWNER_BIN]["uid"] == OLD.uid


def test_older_claim_takes_over_from_a_newer_holder(store: Storage) -> None:
    """The newer object synced first (e.g. the operator saw it first): the older one still wins."""
    sync_queue(store, spec(), NEW)
    assert sync_queue(store, spec(concurrency=3), OLD).ready
    assert sync_queue(store, spec(), NEW).reason == CONFLICT
    assert records(store)["orders"][OWNER_BIN]["uid"] == OLD.uid


def test_a_retained_deletion_releases_the_claim(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    finalize_queue(store, spec(), OLD)
    result = sync_queue(store, spec(), NEW)
    assert result.ready
    assert records(store)["orders"]["active"] == "true"


def test_claim_keeps_its_age_across_resyncs(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    sync_queue(store, spec(), Owner(OLD.uid, OLD.ref, 99_999))  # e.g. a manifest sync restarted
    assert records(store)["orders"][OWNER_BIN]["since"] == OLD.since_ms


def test_finalize_by_a_non_owner_leaves_the_queue_alone(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    done = finalize_queue(store, spec(deletionPolicy="Delete"), NEW)
    assert done.action == "Untouched" and "owned by shop/orders" in done.message
    assert records(store)["orders"]["active"] == "true"


def test_retain_deactivates_and_keeps_data(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    queue = Queue(store.with_client("shop"), spec())
    queue.publish(b"kept")
    finalize_queue(store, spec(), OLD)
    assert records(store)["orders"]["active"] == "false"
    assert queue.stats().depth == 1


def test_delete_removes_messages_sideline_dead_and_record(store: Storage) -> None:
    sync_queue(store, spec(deletionPolicy="Delete"), OLD)
    view = store.with_client("shop")
    queue = Queue(view, spec(deletionPolicy="Delete"))
    queue.publish_many([b"a", b"b", b"c"])
    message = queue.fire()
    assert message is not None
    message.nack("test")
    done = finalize_queue(store, spec(deletionPolicy="Delete"), OLD)
    assert done.action == "Deleted" and "deleted with 3 messages" in done.message
    assert records(store) == {}
    for magazine in ("orders", names.sideline_of("orders"), names.dead_of("orders")):
        assert all(p.load == 0 for p in view.pointers(magazine, 4).values()), magazine


def test_drift_is_reported_and_reverted(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    view = store.with_client("shop")
    view.apply_queue("orders", {"concurrency": 50, "handlerType": "hacked"}, 3600)  # someone edits the record
    result = sync_queue(store, spec(), OLD)
    assert result.diff == {"concurrency": (50, 1), "handlerType": ("hacked", "orders.v1")}
    assert records(store)["orders"]["concurrency"] == 1
    view.delete_queue("orders")  # someone deletes it
    restored = sync_queue(store, spec(), OLD)
    assert restored.created and "orders" in records(store)


def test_config_drift() -> None:
    assert config_drift({"a": 1, "b": 2}, {"a": 1, "b": 3}) == {"b": (2, 3)}
    assert config_drift(None, {"a": 1}) == {"a": (None, 1)}


def test_queue_figures(store: Storage) -> None:
    sync_queue(store, spec(), OLD)
    assert queue_figures(store, spec())[AGE_FIGURE] is None  # nothing waits
    queue = Queue(store.with_client("shop"), spec())
    queue.publish_many([b"1", b"2", b"3"])
    fired = queue.fire()
    assert fired is not None
    figures = queue_figures(store, spec())
    assert 0 <= figures.pop(AGE_FIGURE) < 30  # whole seconds
    assert figures == {"depth": 2, "inFlight": 1, "delayed": 0, "sidelined": 0, "dead": 0, "fullPercent": None}
    fired.nack("x")
    figures = queue_figures(store, spec())
    assert isinstance(figures.pop(AGE_FIGURE), int)
    assert figures == {"depth": 2, "inFlight": 0, "delayed": 0, "sidelined": 1, "dead": 0, "fullPercent": None}
    queue.ack(queue.fire_many(10))
    assert queue_figures(store, spec())[AGE_FIGURE] is None


def figures(age: int | None = None, **counts: int) -> dict[str, int | None]:
    return {**dict.fromkeys(FIGURES, 5), **counts, AGE_FIGURE: age}


@pytest.mark.parametrize(("written", "measured", "changed"), [
    (figures(None), figures(None), False),  # nothing waits, still: an idle queue is never rewritten
    (figures(None), figures(0), True),  # a message waits now
    (figures(40), figures(None), True),  # ... and no longer: the field goes
    (figures(0), figures(59), False),  # an age moving by less than AGE_CHANGE_SECONDS
    (figures(100), figures(160), True),
    (figures(1000), figures(1090), False),  # ... or by less than the percentage
    (figures(1000), figures(1100), True),
    (figures(100, depth=100), figures(100, depth=105), False),
    (figures(100, delayed=0), figures(100, delayed=1), True),  # delayed is a figure like the others
    ({"depth": 5}, figures(None), True),  # a figure never written
])
def test_figures_changed(written: dict[str, Any], measured: dict[str, int | None], changed: bool) -> None:
    assert figures_changed(written, measured) is changed


def test_figures_status_removes_the_age_when_nothing_waits() -> None:
    status = figures_status(figures(None))
    assert status[AGE_FIGURE] is None and set(status) == {*FIGURES, AGE_FIGURE, "fullPercent", "figuresTime"}
    assert status["fullPercent"] is None  # an unbounded queue: a null in the merge patch removes the field
    assert figures_status(figures(7))[AGE_FIGURE] == 7


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    first = set_condition(None, "Ready", True, SYNCED, "ok", now="2026-01-01T00:00:00Z", generation=1)
    same = set_condition(first, "Ready", True, SYNCED, "still ok", now="2026-02-02T00:00:00Z", generation=2)
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert (same[0]["message"], same[0]["observedGeneration"]) == ("still ok", 2)
    flipped = set_condition(same, "Ready", False, CONFLICT, "no", now="2026-03-03T00:00:00Z")
    assert (flipped[0]["status"], flipped[0]["lastTransitionTime"]) == ("False", "2026-03-03T00:00:00Z")


def test_status_for_sets_both_conditions_and_generation() -> None:
    status = status_for(SyncResult("q", "shop", False, CONFLICT, "taken"), None, 3)
    assert status["observedGeneration"] == 3 and status["clientId"] == "shop"
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["Ready"]["status"] == by_type["Synced"]["status"] == "False"
    assert by_type["Ready"]["reason"] == CONFLICT
