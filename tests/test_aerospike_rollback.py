"""A store that loses acknowledged writes (issue: Aerospike faults, part 3): a single node acknowledges a
write before it flushes it, and a crash in that window brings it back without them, its counters lower.
The rollback is forged here by writing the lower values back with the raw client (the emulator, and a real
server when IGNIS_TEST_AEROSPIKE is set); the fault suite sees real ones (test_aerospike_faults.py).

Checked: the process that saw the higher values counts the rollback (ignis_store_rollbacks_total) and logs it
once at ERROR with both values; allocation moves past the high mark, so no slot holds two messages; a process
that never saw them finds the slot taken by another message and moves past it too; the sweeper's pointers,
the fencing epoch and the store lease survive it; a purge (numbering afresh on purpose) is no rollback; the
records a rollback puts back below the marks (acks and claim stamps lost) are all delivered again within
one sweepDuration, each rollback is said once however many passes see it, and the figures end at zero."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aerospike
import pytest
from ignis_workers.shovel import Shovel
from ignis_workers.sweeper import Sweeper
from prometheus_client import REGISTRY

from ignis import Ignis, QueueSpec
from ignis.envelope import Envelope, now_ms
from ignis.errors import StoreUnavailable
from ignis.magazine import shard_for_key
from ignis.storage.aerospike import AerospikeStore
from ignis.storage.base import FIRE_POINTER, LOAD_POINTER, SWEEP_POINTERS, LeaseRecord, SlotRef


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
    store.client.put(store._ctx.meta_key(magazine, shard), {LOAD_POINTER: load, FIRE_POINTER: fire},
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


@pytest.mark.parametrize("settle", ["ack one", "ack batch", "nack batch"])
def test_a_late_settle_of_a_message_the_store_lost_leaves_the_newer_message_in_its_slot(
        backend, aero: AerospikeStore, settle: str) -> None:
    """The crash took claimed records and the pointer increments that allocated them; a producer that never saw
    those slots writes new messages there; the consumer that still holds the lost claims settles them."""
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="reused", handlerType="x", shards=1))
    q = ignis.queue("reused")
    for i in range(4):
        q.publish(f"m{i}".encode(), key="k")
    held = q.fire_many(4)
    assert [m.ref.slot for m in held] == [1, 2, 3, 4]
    for m in held:  # the server lost the records...
        aero.client.remove(aero._ctx.data_key(m.ref))
    set_pointers(aero, "reused", 0, 0, 0)  # ... and the increments
    with Ignis(backend.url) as fresh:  # a producer that never saw them
        newer = [fresh.queue("reused").publish(f"n{i}".encode(), key="k") for i in range(4)]
    assert [r.slot for r in newer] == [1, 2, 3, 4]  # the slots handed out again (nothing marked them)
    if settle == "ack one":
        for m in held:
            m.ack()
    elif settle == "ack batch":
        q.ack(held)
    else:
        q.nack(held, "rejected")
    assert stored_ids(aero, "reused") == [r.id for r in newer]  # not one of them deleted by a stale settle
    assert [m.id for m in q.fire_many(10)] == [r.id for r in newer]


def test_sweep_pointers_epochs_and_the_lease_survive_a_rollback(aero: AerospikeStore) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="swept", handlerType="x", shards=2))
    epoch = aero.next_epoch()
    aero.advance_sweep("swept", "main", epoch, {0: 40, 1: 7}, 5)
    assert aero.get_queue("swept").sweep_pointers("main") == {"SHARD_0": 40, "SHARD_1": 7}
    key = aero.key(aero._ctx.queue_set, "swept")
    aero.client.put(key, {SWEEP_POINTERS: {"SHARD_0": 12, "SHARD_1": 7}}, policy={"ttl": -2})  # the advance lost
    before = rollbacks("swept")
    # Taken as stored, so the sweep examines slots 12..39 again (issue 26); reported once, however often read.
    assert aero.get_queue("swept").sweep_pointers("main") == {"SHARD_0": 12, "SHARD_1": 7}
    assert aero.get_queue("swept").sweep_pointers("main") == {"SHARD_0": 12, "SHARD_1": 7}
    assert rollbacks("swept") - before == 1
    # The epoch counter lost its last increments: the next epoch is still above every one handed out.
    from ignis.storage.aerospike import EPOCH_BIN, EPOCH_KEY

    aero.client.put(aero.key(aero._ctx.system_set, EPOCH_KEY), {EPOCH_BIN: 1}, policy={"ttl": -1})
    assert aero.next_epoch() > epoch
    # The lease: this process saw generation 3; after the crash the store holds generation 1 of it.
    lease = LeaseRecord("me", 1, 1, 0.5)
    stored = aero.replace_lease("sweeper", lease, 0)
    for _ in range(2):
        stored = aero.replace_lease("sweeper", lease, stored.version)
    assert stored.version >= 3
    lease_key = aero.key(aero._ctx.system_set, "lease:sweeper")
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


# ---- what a rollback puts back below the marks (issue 26) ----------------------------------------------
SWEEP_S = 300


def put_back(store: AerospikeStore, ref: SlotRef, env: Envelope, fired_at: int | None, attempts: int) -> None:
    """A record the crash put back: as published (its ack lost), with its claim's stamp or without it."""
    bins = Envelope(env.payload, env.msg_id, env.loaded_at, codec=env.codec, key=env.key, fire_ts=fired_at,
                    attempts=attempts).to_bins()
    store.client.put(store._ctx.data_key(ref), bins, policy={"ttl": 3600, "exists": aerospike.POLICY_EXISTS_REPLACE})


def key_for(shard: int, shards: int) -> str:
    return next(k for k in (f"k{i}" for i in range(1000)) if shard_for_key(k, shards) == shard)


def rollback_lines(caplog: pytest.LogCaptureFixture) -> Counter[str]:
    """ERROR lines about a rollback, by what rolled back (record and counter)."""
    found: Counter[str] = Counter()
    for r in caplog.records:
        match = re.match(r"store rollback: the (.+) is -?\d+, but", r.getMessage())
        if r.levelno == logging.ERROR and match:
            found[match.group(1)] += 1
    return found


def redelivered(queue: str) -> float:
    return REGISTRY.get_sample_value("ignis_redelivered_total", {"queue": queue}) or 0.0


def test_records_a_rollback_put_back_below_the_marks_are_delivered_again(aero: AerospikeStore,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="back", handlerType="x", shards=2, sweepDurationSeconds=SWEEP_S,
                                shovel={"concurrency": 1, "intervalSeconds": 1}))
    q = ignis.queue("back")
    keys = [key_for(0, 2), key_for(1, 2)]
    for i in range(10):
        for key in keys:
            q.publish(f"m{i}-{key}".encode(), key=key)
    delivered: dict[SlotRef, Envelope] = {}
    while batch := q.fire_many(20):
        delivered.update({m.ref: m.envelope for m in batch})
        q.ack(batch)
    assert len(delivered) == 20
    offset = [SWEEP_S * 1000 + 1000]  # the sweeper's clock: acked slots are passed at once
    epoch = aero.next_epoch()
    sweeper = Sweeper(aero, epoch_source=lambda: epoch, clock=lambda: now_ms() + offset[0], threads=2)
    shovel = Shovel(aero, epoch_source=lambda: epoch)
    assert sweeper.sweep_queue(aero.client_id, "back").ok
    assert aero.get_queue("back").sweep_pointers("main") == {"SHARD_0": 11, "SHARD_1": 11}

    # The crash: shard 0 lost the last 7 claims and acks (slots 4..10 back, unstamped); shard 1 lost 3
    # allocations and 7 claims, and the acks of 4..7, whose claim stamps survived. The sweep pointers went back
    # to 4 on both shards.
    claimed_at = now_ms() - 1000
    # (before the forge: this process's watcher may see the pointers go back at once, in the background)
    before_redelivered, before_rollbacks = redelivered("back"), rollbacks("back")
    set_pointers(aero, "back", 0, 10, 3)
    set_pointers(aero, "back", 1, 7, 3)
    aero.client.put(aero.key(aero._ctx.queue_set, "back"), {SWEEP_POINTERS: {"SHARD_0": 4, "SHARD_1": 4}},
                    policy={"ttl": -2})
    lost = {}
    for ref, env in delivered.items():
        if ref.shard == 0 and 4 <= ref.slot <= 10:
            put_back(aero, ref, env, None, 0)
        elif ref.shard == 1 and 4 <= ref.slot <= 7:
            put_back(aero, ref, env, claimed_at, 1)
        else:
            continue
        lost[env.msg_id] = ref

    again: Counter[str] = Counter()
    offset[0] = 0  # the sweeper's clock is the real one from the crash on ...
    with caplog.at_level(logging.ERROR, logger="ignis.store"):  # (ERROR is logged at any level set)
        for n in range(40):
            for report in (sweeper.sweep_queue(aero.client_id, "back"), shovel.shovel_queue(aero.client_id, "back")):
                assert report.error is None, report
            while batch := q.fire_many(20):
                again.update(m.id for m in batch)
                assert all(m.attempts >= 2 for m in batch), batch  # each a redelivery
                q.ack(batch)
            stats = q.stats(in_flight=True)
            if set(again) >= set(lost) and (stats.in_flight, stats.depth, stats.sidelined) == (0, 0, 0):
                break
            if n == 0:
                offset[0] = SWEEP_S * 1000  # ... and then one sweepDuration passes
            time.sleep(0.5)
        for _ in range(3):  # later passes see nothing new to say
            sweeper.sweep_queue(aero.client_id, "back")
            q.fire_many(20)
    assert set(again) == set(lost), sorted(set(lost) - set(again))
    assert max(again.values()) == 1
    stats = q.stats(in_flight=True)
    assert (stats.in_flight, stats.depth, stats.sidelined) == (0, 0, 0), stats
    assert redelivered("back") - before_redelivered == len(lost)
    lines = rollback_lines(caplog)
    assert lines["main sweep pointer of back shard SHARD_0"] == 1, lines
    assert lines["main sweep pointer of back shard SHARD_1"] == 1, lines
    assert any(what.endswith("of back shard 0") for what in lines), lines
    assert any(what.endswith("of back shard 1") for what in lines), lines
    assert set(lines.values()) == {1}, lines  # once per record and counter
    assert rollbacks("back") - before_rollbacks == sum(lines.values())
    # Nothing published after the crash reused a slot below the marks.
    assert q.publish(b"after", key=keys[1]).slot > 10
