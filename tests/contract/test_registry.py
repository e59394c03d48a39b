"""Contract: the queue registry (queue-metadata records) behaves the same on every backend."""

from __future__ import annotations

import pytest

from ignis import QueueSpec
from ignis.errors import InvalidInputError, QueueNotFound, StaleEpoch
from ignis.storage import LeaseRecord, Storage

CONFIG = QueueSpec.build(name="orders", handlerType="orders.v1", shards=8).config_bins()


def test_apply_creates_then_updates_config_without_clobbering_runtime_bins(store: Storage) -> None:
    assert store.apply_queue("orders", CONFIG, 3600) is True
    created = store.get_queue("orders")
    assert created is not None and created.active
    assert created.bins["handlerType"] == "orders.v1" and created.bins["shards"] == 8
    assert created.bins["sweepPointers"] == {} and created.bins["sweptCounter"] == 0
    created_at = created.created_at
    assert created_at > 0

    store.advance_sweep("orders", "main", store.next_epoch(), {0: 17, 3: 4}, 5)
    store.advance_sweep("orders", "sideline", store.next_epoch(), {1: 9}, 2)
    assert store.apply_queue("orders", {**CONFIG, "concurrency": 7, "shards": 16}, 3600) is False

    updated = store.get_queue("orders")
    assert updated is not None
    assert updated.bins["concurrency"] == 7 and updated.bins["shards"] == 16
    assert updated.created_at == created_at
    assert updated.sweep_pointers("main") == {"SHARD_0": 17, "SHARD_3": 4}
    assert updated.sweep_pointers("sideline") == {"SHARD_1": 9}
    assert updated.bins["sweptCounter"] == 5 and updated.bins["sidelineSwept"] == 2


def test_config_may_not_carry_runtime_bins(store: Storage) -> None:
    with pytest.raises(InvalidInputError, match="sweepPointers"):
        store.apply_queue("orders", {**CONFIG, "sweepPointers": {}}, 3600)
    assert store.get_queue("orders") is None


def test_list_by_active_flag_deactivate_and_reactivate(store: Storage) -> None:
    for name in ("b-queue", "a-queue", "c-queue"):
        store.apply_queue(name, CONFIG, 3600)
    assert [r.name for r in store.list_queues(True)] == ["a-queue", "b-queue", "c-queue"]
    assert store.list_queues(False) == []

    assert store.set_queue_active("b-queue", False) is True
    assert [r.name for r in store.list_queues(True)] == ["a-queue", "c-queue"]
    assert [r.name for r in store.list_queues(False)] == ["b-queue"]
    assert [r.name for r in store.list_queues(None)] == ["a-queue", "b-queue", "c-queue"]
    assert store.get_queue("b-queue").bins["handlerType"] == "orders.v1"  # deactivated, still readable

    store.apply_queue("b-queue", CONFIG, 3600)  # re-applying a manifest reactivates
    assert [r.name for r in store.list_queues(True)] == ["a-queue", "b-queue", "c-queue"]
    assert store.set_queue_active("missing", False) is False


def test_delete_queue(store: Storage) -> None:
    store.apply_queue("orders", CONFIG, 3600)
    assert store.delete_queue("orders") is True
    assert store.get_queue("orders") is None
    assert store.list_queues(None) == []
    assert store.delete_queue("orders") is False


def test_sweep_updates_are_fenced_and_forward_only(store: Storage) -> None:
    store.apply_queue("orders", CONFIG, 3600)
    old, new = store.next_epoch(), store.next_epoch()
    assert new > old

    store.advance_sweep("orders", "main", new, {0: 10}, 3)
    with pytest.raises(StaleEpoch):
        store.advance_sweep("orders", "main", old, {0: 50}, 40)  # a paused ex-leader wakes up
    record = store.get_queue("orders")
    assert record.sweep_pointers() == {"SHARD_0": 10} and record.bins["sweptCounter"] == 3

    store.advance_sweep("orders", "main", new, {0: 4}, 0)  # never backwards, even from the leader
    assert store.get_queue("orders").sweep_pointers() == {"SHARD_0": 10}
    store.advance_sweep("orders", "main", new, {}, 0)  # a fence-only write changes nothing else
    assert store.get_queue("orders").bins["sweptCounter"] == 3

    with pytest.raises(QueueNotFound):
        store.advance_sweep("missing", "main", new, {0: 1}, 1)


def test_sweep_pointers_of_512_shards_advance_in_one_call(store: Storage) -> None:
    # One pass of a 512-shard queue advances every shard at once; a real server refuses an expression
    # that grows faster than the number of shards, so this must be one small expression (or the like).
    store.apply_queue("wide", {**CONFIG, "shards": 512}, 3600)
    epoch = store.next_epoch()
    store.advance_sweep("wide", "main", epoch, {shard: 10 + shard for shard in range(0, 512, 2)}, 256)
    everything = {shard: 5 + shard % 7 if shard % 2 == 0 else 100 + shard for shard in range(512)}
    store.advance_sweep("wide", "main", epoch, everything, 512)  # even shards: 5..11 < 10 + shard, kept
    pointers = store.get_queue("wide").sweep_pointers("main")
    assert len(pointers) == 512
    assert all(pointers[f"SHARD_{shard}"] == (10 + shard if shard % 2 == 0 else 100 + shard) for shard in range(512))
    assert store.get_queue("wide").bins["sweptCounter"] == 768
    store.advance_sweep("wide", "sideline", epoch, {shard: 2 for shard in range(512)}, 0)
    assert store.get_queue("wide").sweep_pointers("sideline") == {f"SHARD_{s}": 2 for s in range(512)}
    with pytest.raises(StaleEpoch):
        store.advance_sweep("wide", "main", epoch - 1, {shard: 10_000 for shard in range(512)}, 1)
    assert store.get_queue("wide").sweep_pointers("main") == pointers


def test_epochs_are_monotonic_across_clients(store: Storage) -> None:
    other = store.with_client("other-app")
    epochs = [store.next_epoch(), other.next_epoch(), store.next_epoch()]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3


def test_clients_are_isolated(store: Storage) -> None:
    other = store.with_client("other-app")
    store.apply_queue("orders", CONFIG, 3600)
    assert other.get_queue("orders") is None
    assert other.list_queues(None) == []


def test_queue_record_expires_with_its_ttl(store: Storage) -> None:
    from support.polling import wait_for

    store.apply_queue("short-lived", CONFIG, 1)
    store.apply_queue("long-lived", CONFIG, 3600)
    # A TTL of 1 s lives between 1 and 2 s on Aerospike (void times in whole seconds): poll, bounded.
    wait_for(lambda: store.get_queue("short-lived") is None, timeout=5, what="the 1 s queue record to expire")
    assert [r.name for r in store.list_queues(None)] == ["long-lived"]


def test_clients_registry_is_idempotent_and_farm_wide(store: Storage) -> None:
    assert store.list_clients() == []
    store.register_client("billing")
    store.register_client("alpha")
    store.register_client("billing")
    assert store.list_clients() == ["alpha", "billing"]
    assert store.with_client("other").list_clients() == ["alpha", "billing"]  # farm-wide, not per client
    with pytest.raises(InvalidInputError, match="clientId"):
        store.register_client("Bad_Client!")


def test_lease_compare_and_set(store: Storage) -> None:
    assert store.get_lease("sweeper") is None
    first = LeaseRecord("pod-a", 1000, 1000, 15.0)
    assert store.replace_lease("sweeper", first, expected_version=1) is None  # no lease yet: version is 0
    held = store.replace_lease("sweeper", first, expected_version=0)
    assert held is not None and held.version == 1 and held.holder == "pod-a"
    assert store.get_lease("sweeper") == held

    # Two contenders read version 1; only the first write wins.
    renewed = store.replace_lease("sweeper", LeaseRecord("pod-a", 1000, 3000, 15.0), expected_version=1)
    stolen = store.replace_lease("sweeper", LeaseRecord("pod-b", 3000, 3000, 15.0, 1), expected_version=1)
    assert renewed is not None and renewed.version == 2 and stolen is None
    assert store.get_lease("sweeper").holder == "pod-a"
    assert store.get_lease("other-lease") is None
    assert held.expired(1000 + 15_000) and not held.expired(1000 + 14_999)
