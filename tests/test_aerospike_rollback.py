"""A store that loses acknowledged writes (issue: Aerospike faults, part 3): a single node acknowledges a
write before it flushes it, and a crash in that window brings it back without them, its counters lower.
The rollback is forged here by writing the lower values back with the raw client (the emulator, and a real
server when IGNIS_TEST_AEROSPIKE is set); the fault suite sees real ones (test_aerospike_faults.py).

Checked: the process that saw the higher values counts the rollback (ignis_store_rollbacks_total) and logs it
once at ERROR with both values; allocation moves past the high mark, so no slot holds two messages; a process
that never saw them finds the slot taken by another message and moves past it too; the sweeper's pointers,
the fencing epoch and the store lease survive it; a purge (numbering afresh on purpose) is no rollback."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ignis import Ignis, QueueSpec
from ignis.errors import StoreUnavailable
from ignis.storage.aerospike_store import AerospikeStore
from ignis.storage.base import FIRE_POINTER, LOAD_POINTER, SWEEP_POINTERS, LeaseRecord


@pytest.fixture
def aero(backend) -> Iterator[AerospikeStore]:
    if backend.name == "lmdb":
        pytest.skip("Aerospike only: an lmdb commit is on disk before it returns (durability=fsync)")
    store = backend.open()
    yield store
    store.close()


def rollbacks(queue: str, magazine: str = "main") -> float:
    return REGISTRY.get_sample_value("ignis_store_rollbacks_total", {"queue": queue, "magazine": magazine}) or 0.0


def set_pointers(store: AerospikeStore, magazine: str, shard: int, load: int, fire: int) -> None:
    """What a crash before the flush leaves: the meta record as it was a few increments ago."""
    store.client.put(store._meta_key(magazine, shard), {LOAD_POINTER: load, FIRE_POINTER: fire},
                     policy={"ttl": -1})


def stored_ids(store: AerospikeStore, magazine: str, upto: int = 100) -> list[str]:
    return [env.msg_id for _, env in store.peek(magazine, 0, 1, upto)]


def test_a_load_pointer_that_went_back_is_detected_and_never_reuses_a_slot(aero: AerospikeStore,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="lost", handlerType="x", shards=1))
    q = ignis.queue("lost")
    first = [q.publish(f"m{i}".encode(), key="k").id for i in range(10)]
    set_pointers(aero, "lost", 0, 6, 0)  # the last four increments lost; their records survived
    before = rollbacks("lost")
    with caplog.at_level(logging.ERROR, logger="ignis.store"):
        more = [q.publish(f"n{i}".encode(), key="k") for i in range(3)]
    assert [r.slot for r in more] == [11, 12, 13]  # past the high mark, never slot 7
    assert stored_ids(aero, "lost") == first + [r.id for r in more]  # nothing overwritten
    assert rollbacks("lost") - before == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR and "rollback" in r.getMessage()]
    assert len(errors) == 1 and "shard 0" in errors[0].getMessage() and " 6" in errors[0].getMessage() \
        and "10" in errors[0].getMessage()
    got = q.fire_many(20)
    assert sorted(m.id for m in got) == sorted(first + [r.id for r in more])


def test_a_process_that_never_saw_the_lost_slots_finds_them_taken_and_moves_past(backend, aero: AerospikeStore
                                                                                ) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="taken", handlerType="x", shards=1))
    first = [ignis.queue("taken").publish(f"m{i}".encode(), key="k").id for i in range(10)]
    set_pointers(aero, "taken", 0, 6, 0)
    before = rollbacks("taken")
    with Ignis(backend.url) as fresh:  # a producer started after the crash: no marks at all
        q = fresh.queue("taken")
        more = [q.publish(f"n{i}".encode(), key="k") for i in range(3)]
        more += q.publish_many([b"p0", b"p1"], key="k")
    assert all(r.slot > 10 for r in more), [r.slot for r in more]
    assert stored_ids(aero, "taken") == first + [r.id for r in more]  # the ten survived, none overwritten
    assert rollbacks("taken") - before >= 1


def test_a_fire_pointer_that_went_back_does_not_deliver_claimed_messages_again(aero: AerospikeStore) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="fired", handlerType="x", shards=1))
    q = ignis.queue("fired")
    ids = [q.publish(f"m{i}".encode(), key="k").id for i in range(10)]
    taken = q.fire_many(6)
    q.ack(taken[:3])  # three acked, three in flight
    before = rollbacks("fired")
    set_pointers(aero, "fired", 0, 10, 2)  # the claims of slots 3..6 lost
    rest = []
    while batch := q.fire_many(10):
        rest += batch
    assert [m.id for m in rest] == ids[6:]  # slots 7..10 only: the lost claims are not handed out again
    assert rollbacks("fired") - before == 1
    assert q.main.pointers()[0].fire == 10


def test_sweep_pointers_epochs_and_the_lease_survive_a_rollback(aero: AerospikeStore) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="swept", handlerType="x", shards=2))
    epoch = aero.next_epoch()
    aero.advance_sweep("swept", "main", epoch, {0: 40, 1: 7}, 5)
    assert aero.get_queue("swept").sweep_pointers("main") == {"SHARD_0": 40, "SHARD_1": 7}
    key = aero.key(aero._queue_set, "swept")
    aero.client.put(key, {SWEEP_POINTERS: {"SHARD_0": 12, "SHARD_1": 7}}, policy={"ttl": -2})  # the advance lost
    before = rollbacks("swept")
    assert aero.get_queue("swept").sweep_pointers("main") == {"SHARD_0": 40, "SHARD_1": 7}  # handed on from the mark
    assert rollbacks("swept") - before == 1
    # The epoch counter lost its last increments: the next epoch is still above every one handed out.
    from ignis.storage.aerospike_store import EPOCH_BIN, EPOCH_KEY

    aero.client.put(aero.key(aero._system_set, EPOCH_KEY), {EPOCH_BIN: 1}, policy={"ttl": -1})
    assert aero.next_epoch() > epoch
    # The lease: this process saw generation 3; after the crash the store holds generation 1 of it.
    lease = LeaseRecord("me", 1, 1, 0.5)
    stored = aero.replace_lease("sweeper", lease, 0)
    for _ in range(2):
        stored = aero.replace_lease("sweeper", lease, stored.version)
    assert stored.version >= 3
    lease_key = aero.key(aero._system_set, "lease:sweeper")
    aero.client.remove(lease_key)
    aero.client.put(lease_key, {"holder": "someone", "acquired_ms": 1, "renewed_ms": 1, "duration_s": 0.5,
                                "transitions": 0}, policy={"ttl": -1})
    before = rollbacks("", "lease")
    with pytest.raises(StoreUnavailable, match="rollback"):
        aero.get_lease("sweeper")  # neither renewed nor taken for a lease duration: no second leader
    with pytest.raises(StoreUnavailable):
        aero.replace_lease("sweeper", lease, 1)
    assert rollbacks("", "lease") - before == 1
    time.sleep(0.6)
    assert aero.get_lease("sweeper").holder == "someone"  # then it starts afresh from what is stored


def test_a_purge_elsewhere_restarts_the_numbering_and_is_no_rollback(backend, aero: AerospikeStore) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="again", handlerType="x", shards=1))
    q = ignis.queue("again")
    [q.publish(f"old{i}".encode(), key="k") for i in range(8)]
    q.ack(q.fire_many(3))
    before = rollbacks("again")
    with Ignis(backend.url) as other:  # another process deletes the queue's messages and publishes anew
        other.store.purge_magazine("again")
        new = [other.queue("again").publish(f"new{i}".encode(), key="k").id for i in range(4)]
    mine = q.publish(b"mine", key="k")
    got: list[Any] = []
    while batch := q.fire_many(10):
        got += batch
    assert sorted(m.id for m in got) == sorted([*new, mine.id])
    assert rollbacks("again") == before
