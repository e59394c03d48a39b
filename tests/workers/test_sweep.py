"""The sweep rules of DESIGN §4, each with a test that fails if the rule is broken. Backend-generic
(the `store` fixture) except where a test must forge a record state through lmdb internals."""

from __future__ import annotations

import threading

import ignis_workers.sweeper as sweeper_module
import pytest
from ignis_workers.sweeper import LeadershipLost, Sweeper
from support.races import paused_publish_write
from sweeper_helpers import FaultStore, PausingStore

from ignis import Ignis, names
from ignis.envelope import now_ms
from ignis.errors import StaleEpoch
from ignis.storage.base import SWEEP_POINTERS, SWEPT_COUNTER, SlotRef

SWEEP_S = 300


def sweeper(store, clock, **kw) -> Sweeper:
    epoch = store.next_epoch()
    return Sweeper(store, epoch_source=lambda: epoch, clock=clock, threads=4, **kw)


def pointer(store, queue: str, kind: str = "main", shard: int = 0) -> int | None:
    record = store.get_queue(queue)
    return record.sweep_pointers(kind).get(names.shard_label(shard))


def present(store, magazine: str, shard: int = 0, upto: int = 10_000) -> list[int]:
    return [ref.slot for ref, _ in store.peek(magazine, shard, 1, upto)]


def test_never_touches_unfired_or_recently_fired(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(10)])
    fired = q.fire_many(4)
    assert len(fired) == 4
    s = sweeper(store, clock)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.moved == 0 and report.ok
    assert present(store, q.name) == list(range(1, 11))
    assert q.sideline.pending() == 0
    # A sweepDuration later the fired ones are abandoned: swept; the unfired ones are above the fire
    # pointer and never looked at.
    clock.advance(SWEEP_S + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.main.moved == 4
    assert present(store, q.name) == list(range(5, 11))
    assert pointer(store, q.name) == 5  # the next slot to examine = fire pointer + 1
    assert all(env.fire_ts is None for _, env in store.peek(q.name, 0, 5, 10))
    assert sorted(env.msg_id for _, env in q.sideline.browse()) == sorted(m.id for m in fired)
    assert all(env.reason == "swept" for _, env in q.sideline.browse())


def test_stops_at_the_time_boundary(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(6)])
    t0 = clock.now
    store.claim(q.name, 0, 3, t0)  # slots 1-3 fired at t0
    store.claim(q.name, 0, 3, t0 + 200_000)  # slots 4-6 fired 200 s later
    clock.now = t0 + SWEEP_S * 1000 + 100_000  # cutoff = t0 + 100 s: between the two groups
    report = sweeper(store, clock).sweep_queue(store.client_id, q.name)
    assert report.main.moved == 3
    assert present(store, q.name) == [4, 5, 6]
    assert pointer(store, q.name) == 4


def test_acked_slots_are_passed_and_counter_counts_moves_only(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(5)])
    msgs = q.fire_many(5)
    q.ack([msgs[0], msgs[2], msgs[4]])
    clock.advance(SWEEP_S + 1)
    report = sweeper(store, clock).sweep_queue(store.client_id, q.name)
    assert (report.main.moved, report.main.examined) == (2, 5)
    record = store.get_queue(q.name)
    assert record.bins[SWEPT_COUNTER] == 2
    assert record.bins[SWEEP_POINTERS] == {"SHARD_0": 6}


def _two_step_publish_only(store) -> None:
    if not store.write_grace_ms:
        pytest.skip("lmdb allocates and writes a slot in one transaction: no slot ever waits for its write")


def test_a_claimed_slot_whose_write_has_not_landed_is_not_passed(store, declare, clock):
    # A consumer claims a slot between the publish's increment and its write, and dies; a sweep comes
    # in between. Passing the empty slot would leave the record, landing a moment later, behind the
    # sweep pointer for good: never delivered. The sweeper stops there instead, and sweeps it later.
    _two_step_publish_only(store)
    q = declare()
    q.publish(b"acked")
    q.fire().ack()  # slot 1: an ack's tombstone, which the sweep passes
    producer = Ignis(store).queue_for(q.spec)  # a handle of its own: one slot, nothing reserved ahead
    with paused_publish_write(store) as gate:
        publisher = threading.Thread(target=producer.publish, args=(b"late",))
        publisher.start()
        assert gate.reached.wait(10), "the publish never reached its record write"
        assert q.fire() is None  # slot 2 claimed, its record not there yet: awaited (then the consumer dies)
        assert q.main.pointers()[0].fire == 2
        clock.advance(SWEEP_S + 1)
        s = sweeper(store, clock)
        report = s.sweep_queue(store.client_id, q.name)
        assert report.ok and report.main.moved == 0
        assert pointer(store, q.name) == 2  # slot 1 passed, slot 2 not
        gate.release.set()
        publisher.join(10)
    assert present(store, q.name) == [2]  # landed, claimed by a consumer that is gone
    report = s.sweep_queue(store.client_id, q.name)  # unstamped: stamped now, the pointer stops there
    assert report.main.stamped == 1 and report.moved == 0 and pointer(store, q.name) == 2
    # No claim stamps it meanwhile (its claimer is gone): back to main's tail once no claim's stamp can be on
    # its way (the write grace, or UNCLAIMED_AFTER_MS), not one sweepDuration and a shovel later.
    from ignis_workers.sweeper import UNCLAIMED_AFTER_MS

    clock.advance(max(store.write_grace_ms, UNCLAIMED_AFTER_MS) / 1000 + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.main.moved == 1
    assert q.sideline.pending() == 0
    assert [env.payload for _, env in store.peek(q.name, 0, 3, 3)] == [b"late"]
    assert pointer(store, q.name) == 3


def test_a_missing_slot_is_passed_once_its_write_deadline_is_over(store, declare, clock):
    # A slot with no record and no tombstone (its publish failed) is a hole for good once the write
    # deadline of every slot below a fire pointer seen then is over: the sweep holds, then passes it.
    _two_step_publish_only(store)
    q = declare()
    q.publish_many([b"a", b"b", b"c"])
    a, _b, c = q.fire_many(3)
    q.ack([a, c])
    store._ctx.client.remove(store._ctx.data_key(SlotRef(q.name, 0, 2)))  # as if its write had never landed
    s = sweeper(store, clock)
    s.sweep_queue(store.client_id, q.name)
    assert pointer(store, q.name) == 2  # slot 1 (tombstone) passed; slot 2 may still be written
    clock.now += store.write_grace_ms
    report = s.sweep_queue(store.client_id, q.name)
    assert report.ok and report.main.moved == 0
    assert pointer(store, q.name) == 4  # the fire pointer seen a write deadline ago covers slots 2 and 3


def _unstamp(store, ref: SlotRef) -> None:
    """Forge a record below the fire pointer without fireTS (a write that landed after its slot was
    skipped as a hole) — lmdb writes load+data in one transaction, so only its internals can."""
    from ignis.storage.lmdb.records import _DATA_HEADER

    key = store._ctx.data_key(ref)
    with store._ctx.env.env.begin(write=True) as txn:
        raw = txn.get(key, db=store._ctx.data)
        expire_at, _, attempts = _DATA_HEADER.unpack_from(raw)
        txn.put(key, _DATA_HEADER.pack(expire_at, 0, attempts) + raw[_DATA_HEADER.size:], db=store._ctx.data)


def test_unstamped_record_is_stamped_not_swept_then_swept_one_sweep_duration_later(store, declare, clock, backend):
    if backend.name != "lmdb":
        pytest.skip("forges a record state through lmdb internals")
    q = declare()
    q.publish_many([b"a", b"b", b"c"])
    store.claim(q.name, 0, 3, clock.now - 10 * SWEEP_S * 1000)  # all three fired long ago
    _unstamp(store, SlotRef(q.name, 0, 2))
    s = sweeper(store, clock)
    report = s.sweep_queue(store.client_id, q.name)
    # slot 1 is abandoned: swept; slot 2 has no fireTS: stamped with now and it is the boundary of the
    # pointer; slot 3, abandoned too, is swept beyond it (the scan goes on past a stamp).
    assert (report.main.moved, report.main.stamped) == (2, 1)
    assert present(store, q.name) == [2]
    assert store.read([SlotRef(q.name, 0, 2)])[0].fire_ts == clock.now
    assert pointer(store, q.name) == 2
    # Not "fired at 0": a second sweep at the same time still leaves it alone.
    assert s.sweep_queue(store.client_id, q.name).moved == 0
    clock.advance(SWEEP_S - 1)
    assert s.sweep_queue(store.client_id, q.name).moved == 0
    clock.advance(2)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.main.moved == 1
    assert present(store, q.name) == []
    assert pointer(store, q.name) == 4


def _unclaim(store, ref: SlotRef) -> None:
    """Forge what a store rollback leaves below the fire pointer: the record with neither its claim's stamp
    nor its attempt (lmdb internals; on Aerospike tests/test_aerospike_rollback.py forges it for real)."""
    from ignis.storage.lmdb.records import _DATA_HEADER

    key = store._ctx.data_key(ref)
    with store._ctx.env.env.begin(write=True) as txn:
        raw = txn.get(key, db=store._ctx.data)
        expire_at = _DATA_HEADER.unpack_from(raw)[0]
        txn.put(key, _DATA_HEADER.pack(expire_at, 0, 0) + raw[_DATA_HEADER.size:], db=store._ctx.data)


@pytest.mark.parametrize("claimed_meanwhile", [False, True])
def test_a_record_whose_claim_the_store_lost_goes_back_to_main_as_a_redelivery(store, declare, clock, backend,
                                                                               claimed_meanwhile):
    """Issue 26: a record stamped by a sweep that no claim stamps since was claimed before a rollback took the
    claim away. It goes back to main's tail a few seconds later (not one sweepDuration), counted as delivered
    once; one a claim stamps after the sweep is a live claim, left alone until it is abandoned."""
    if backend.name != "lmdb":
        pytest.skip("forges a record state through lmdb internals")
    from ignis_workers.sweeper import UNCLAIMED_AFTER_MS

    q = declare()
    q.publish_many([b"a", b"b", b"c"])
    store.claim(q.name, 0, 3, clock.now - 10 * SWEEP_S * 1000)
    _unclaim(store, SlotRef(q.name, 0, 2))
    s = sweeper(store, clock)
    report = s.sweep_queue(store.client_id, q.name)
    assert (report.main.moved, report.main.stamped) == (2, 1)  # slots 1 and 3 abandoned; slot 2 stamped
    assert pointer(store, q.name) == 2
    if claimed_meanwhile:  # a claim's stamp lands after the sweep's: attempts + 1
        store.restamp([SlotRef(q.name, 0, 2)], clock.now + 100)
    clock.advance(UNCLAIMED_AFTER_MS / 1000 - 1)
    assert s.sweep_queue(store.client_id, q.name).moved == 0  # a claim's stamp may still come
    clock.advance(2)
    report = s.sweep_queue(store.client_id, q.name)
    if claimed_meanwhile:
        assert report.moved == 0 and present(store, q.name) == [2] and pointer(store, q.name) == 2
        return
    assert report.main.moved == 1
    assert present(store, q.name) == [4]  # re-homed to main's tail, unfired
    assert pointer(store, q.name) == 4
    assert q.sideline.pending() == 2
    (message,) = q.fire_many(5)
    assert (message.data, message.attempts) == (b"b", 2)  # a redelivery


def test_many_unstamped_records_in_a_shard_are_swept_one_sweep_duration_later_together(store, declare, clock,
                                                                                     backend):
    """Claims whose stamp never landed (a node came or went mid-claim) are stamped all in one pass, so the
    last of them is swept one sweepDuration after the pass, not one sweepDuration per record."""
    if backend.name != "lmdb":
        pytest.skip("forges a record state through lmdb internals")
    q = declare()
    q.publish_many([b"m%d" % i for i in range(40)])
    store.claim(q.name, 0, 40, clock.now - 10 * SWEEP_S * 1000)
    unstamped = list(range(3, 41, 3))  # 13 of them, between abandoned claims
    for slot in unstamped:
        _unstamp(store, SlotRef(q.name, 0, slot))
    s = sweeper(store, clock)
    report = s.sweep_queue(store.client_id, q.name)
    assert (report.main.stamped, report.main.moved) == (len(unstamped), 40 - len(unstamped))
    assert present(store, q.name) == unstamped
    clock.advance(SWEEP_S + 1)
    assert s.sweep_queue(store.client_id, q.name).main.moved == len(unstamped)
    assert present(store, q.name) == [] and pointer(store, q.name) == 41


def test_failed_move_keeps_originals_and_pointer_then_the_next_pass_moves_each_once(store, declare, clock):
    # A crash inside a move is all-or-nothing on lmdb; on Aerospike a move cut between its copy and its
    # delete is finished by the next one without a second copy (tests/test_aerospike_store.py).
    q = declare()
    q.publish_many([b"m%d" % i for i in range(5)])
    ids = {m.id for m in q.fire_many(5)}
    clock.advance(SWEEP_S + 1)
    faulty = FaultStore(store)
    faulty.fail["move"] = 1
    s = sweeper(faulty, clock)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.main.failed_shards == [0] and not report.ok
    assert present(store, q.name) == [1, 2, 3, 4, 5]  # originals kept
    assert pointer(store, q.name) in (None, 1)  # the pointer did not pass them
    assert q.sideline.pending() == 0
    report = s.sweep_queue(store.client_id, q.name)
    assert report.main.moved == 5 and report.ok
    assert present(store, q.name) == []
    sidelined = [env.msg_id for _, env in q.sideline.browse()]
    assert sorted(sidelined) == sorted(ids)  # each message once


def test_a_claim_its_holder_takes_over_during_the_pass_stops_the_pointer_until_it_is_abandoned_again(
        store, declare, clock):
    # Between the sweeper's read and its move, the holder stamps a claim again (a late write that landed,
    # a prefetched message handed out late). The move is refused; the pointer must stay at that slot, or
    # the claim could never be swept again if its holder then died (it would be stranded for good).
    import threading

    q = declare()
    q.publish_many([b"m%d" % i for i in range(3)])
    claimed = q.fire_many(3)
    clock.advance(SWEEP_S + 1)
    paused = PausingStore(store, "move")
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(r=sweeper(paused, clock).sweep_queue(
        store.client_id, q.name)))
    thread.start()
    assert paused.reached.wait(10), "the sweeper never reached its move"
    taken_over = claimed[1].ref
    [again] = store.restamp([taken_over], clock.now, False)  # its holder, alive, stamps it again
    assert again.envelope is not None
    paused.release.set()
    thread.join(30)
    assert outcome["r"].main.moved == 2
    assert present(store, q.name) == [taken_over.slot]
    assert pointer(store, q.name) == taken_over.slot  # not passed: the next passes look at it again
    report = sweeper(store, clock).sweep_queue(store.client_id, q.name)
    assert report.main.moved == 0 and pointer(store, q.name) == taken_over.slot  # young again: a boundary
    clock.advance(SWEEP_S + 1)  # its holder died without settling it: abandoned again
    report = sweeper(store, clock).sweep_queue(store.client_id, q.name)
    assert report.main.moved == 1 and present(store, q.name) == []
    assert sorted(env.msg_id for _, env in q.sideline.browse()) == sorted(m.id for m in claimed)


def test_rerun_changes_nothing(store, declare, clock):
    q = declare(shards=3)
    q.publish_many([b"m%d" % i for i in range(30)])
    q.ack(q.fire_many(5))
    q.fire_many(10)
    clock.advance(SWEEP_S + 1)
    q.fire_many(5)  # fired in real time, which the advanced test clock sees as abandoned too
    s = sweeper(store, clock)
    first = s.sweep_queue(store.client_id, q.name)
    assert first.main.moved == 15
    before = store.get_queue(q.name).bins
    side = sorted(env.msg_id for _, env in q.sideline.browse(1000))
    again = s.sweep_queue(store.client_id, q.name)
    assert again.moved == 0 and again.main.examined == 0
    assert store.get_queue(q.name).bins == before
    assert sorted(env.msg_id for _, env in q.sideline.browse(1000)) == side


def test_sideline_threshold_uses_twice_the_shovel_interval(store, declare, clock):
    q = declare(shovel={"concurrency": 1, "intervalSeconds": 1000})  # 2 x 1000 s > sweepDuration 300 s
    q.sideline.load([q.envelope(b"x"), q.envelope(b"y")])
    store.claim(q.sideline.name, 0, 1, clock.now)  # the shovel claimed slot 1 and (say) died
    s = sweeper(store, clock)
    clock.advance(SWEEP_S + 1)  # past sweepDuration but within 2 x shovelInterval: still in flight
    assert s.sweep_queue(store.client_id, q.name).sideline.moved == 0
    assert present(store, q.sideline.name) == [1, 2]
    clock.advance(2000 - SWEEP_S)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.sideline.moved == 1
    assert present(store, q.sideline.name) == [2, 3]  # re-appended at the sideline's tail
    assert pointer(store, q.name, "sideline") == 2
    tail = store.read([SlotRef(q.sideline.name, 0, 3)])[0]
    assert tail.fire_ts is None and tail.reason == "swept"


def test_sideline_threshold_uses_sweep_duration_when_smaller(store, declare, clock):
    q = declare(shovel={"concurrency": 1, "intervalSeconds": 10})
    q.sideline.load([q.envelope(b"x")])
    store.claim(q.sideline.name, 0, 1, clock.now)
    s = sweeper(store, clock)
    clock.advance(100)  # past 2 x shovelInterval, not past sweepDuration
    assert s.sweep_queue(store.client_id, q.name).sideline.moved == 0
    clock.advance(SWEEP_S)
    assert s.sweep_queue(store.client_id, q.name).sideline.moved == 1


def test_failure_on_one_shard_or_queue_does_not_stop_the_others(store, declare, clock):
    a = declare("alpha", shards=3)
    b = declare("beta", shards=1)
    for q in (a, b):
        q.publish_many([b"m%d" % i for i in range(9)])
        q.fire_many(9)
    clock.advance(SWEEP_S + 1)
    faulty = FaultStore(store)
    faulty.when["peek"] = lambda magazine, shard, *_: magazine == "alpha" and shard == 1
    reports = {r.queue: r for r in sweeper(faulty, clock).sweep_all()}
    assert reports["alpha"].main.failed_shards == [1]
    assert reports["alpha"].main.moved == 6  # shards 0 and 2
    assert reports["beta"].ok and reports["beta"].main.moved == 9
    assert present(store, "alpha", 1) != []


def test_sweep_all_covers_every_client(store, declare, clock):
    from ignis import Ignis, QueueSpec

    q = declare("alpha")
    other = Ignis(store.with_client("billing"))
    other.apply(QueueSpec.build(name="invoices", handlerType="x", shards=1, sweepDurationSeconds=300))
    qb = other.queue("invoices")
    for queue in (q, qb):
        queue.publish(b"p")
        queue.fire()
    # From the fires, not from the clock fixture: opening a client that creates its index takes about
    # 2 s on a real server, which must not leave a message short of abandoned.
    clock.now = now_ms()
    clock.advance(SWEEP_S + 1)
    reports = sweeper(store, clock).sweep_all()
    assert sorted((r.client_id, r.queue, r.moved) for r in reports) == [
        ("billing", "invoices", 1), (store.client_id, "alpha", 1)]


def test_stale_epoch_stops_the_sweep(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(4)])
    q.fire_many(4)
    clock.advance(SWEEP_S + 1)
    old = store.next_epoch()
    newer = store.next_epoch()
    store.advance_sweep(q.name, "main", newer, {}, 0)  # the new leader has written this queue
    with pytest.raises(StaleEpoch):
        Sweeper(store, epoch_source=lambda: old, clock=clock, threads=2).sweep_all()
    assert pointer(store, q.name) is None


def test_a_leader_paused_after_reading_a_batch_resumes_to_copy_and_delete_nothing(store, backend, declare, clock):
    # The old leader reads a batch and is paused right there (SIGSTOP, a long GC) before moving it; a new
    # leader takes over and sweeps the same range; then the old one resumes. Its moves are fenced in the
    # writes themselves: no second copy in the sideline, no delete, no pointer written.
    import threading

    q = declare()
    q.publish_many([b"m%d" % i for i in range(5)])
    ids = sorted(m.id for m in q.fire_many(5))
    clock.advance(SWEEP_S + 1)
    own = backend.open()  # the old leader's own connection
    try:
        paused = PausingStore(own, "move")
        old_epoch = store.next_epoch()
        old = Sweeper(paused, epoch_source=lambda: old_epoch, clock=clock, threads=1)
        outcome: dict = {}

        def run_old() -> None:
            try:
                outcome["report"] = old.sweep_queue(store.client_id, q.name)
            except StaleEpoch as exc:
                outcome["stale"] = exc

        thread = threading.Thread(target=run_old)
        thread.start()
        assert paused.reached.wait(10), "the old leader never reached its move"
        report = sweeper(store, clock).sweep_queue(store.client_id, q.name)  # the new leader, newer epoch
        assert report.main.moved == 5 and report.ok
        after_new = store.get_queue(q.name).bins
        sidelined = sorted(env.msg_id for _, env in q.sideline.browse(100))
        assert sidelined == ids
        paused.release.set()
        thread.join(30)
        assert "stale" in outcome, f"the old leader carried on: {outcome}"
        moves = paused.outcomes["move"]
        assert all(isinstance(r, StaleEpoch) or not any(r) for r in moves), moves  # moved nothing
        assert "delete" not in paused.calls and "load" not in paused.calls
        assert sorted(env.msg_id for _, env in q.sideline.browse(100)) == sidelined  # no extra copies
        assert present(store, q.name) == []
        assert store.get_queue(q.name).bins == after_new  # pointers and counters as the new leader left them
    finally:
        own.close()


def test_lost_guard_stops_before_the_next_batch(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(10)])
    q.fire_many(10)
    clock.advance(SWEEP_S + 1)
    batches = []

    def guard() -> bool:
        batches.append(1)
        return len(batches) <= 2

    s = sweeper(store, clock, batch_size=3, guard=guard)
    with pytest.raises(LeadershipLost):
        s.sweep_queue(store.client_id, q.name)
    assert pointer(store, q.name) == 7  # two batches of three done, then it stopped
    assert present(store, q.name) == [7, 8, 9, 10]


def test_batches_cover_a_long_range(store, declare, clock):
    q = declare()
    q.publish_many([b"m%d" % i for i in range(2500)])
    msgs = q.fire_many(2500)
    q.ack(msgs[:1200])
    clock.advance(SWEEP_S + 1)
    report = sweeper(store, clock).sweep_queue(store.client_id, q.name)
    assert (report.main.moved, report.main.examined) == (1300, 2500)
    assert q.sideline.pending() == 1300


def test_no_epoch_means_no_sweep(store, declare, clock):
    q = declare()
    q.publish(b"x")
    q.fire()
    clock.advance(SWEEP_S + 1)

    def no_epoch() -> int:
        raise LeadershipLost("not leading")

    with pytest.raises(LeadershipLost):
        Sweeper(store, epoch_source=no_epoch, clock=clock, threads=1).sweep_all()
    assert present(store, q.name) == [1]


# ---- subscriptions (ignis.topics) ----------------------------------------------------------------------
def subscription(store, name: str = "subs", **fields):
    from ignis import QueueSpec, TopicSpec

    client = Ignis(store)
    client.apply(TopicSpec.build(name="feed", shards=1))
    client.apply(QueueSpec.build(name=name, handlerType=name, shards=1, sweepDurationSeconds=300,
                                 subscribe={"topic": "feed", **fields}))
    return client.topic("feed"), client.refresh(name)


def test_a_subscription_claim_never_acked_is_swept_to_its_sideline_and_shovelled_back(store, clock):
    topic, q = subscription(store)
    topic.publish_many([b"a", b"b", b"c"], subject="x")
    held = q.fire()
    assert held is not None and held.payload == b"a"
    s = sweeper(store, clock)
    assert s.sweep_queue(store.client_id, q.name).moved == 0  # not yet a sweepDuration
    clock.advance(SWEEP_S + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.moved == 1 and report.ok, report
    assert pointer(store, q.name, "cursor") == 2  # past the swept claim; b and c were never claimed
    [(_, env)] = q.sideline.browse()
    assert (env.payload, env.msg_id, env.reason, env.subject) == (b"a", held.id, "swept", "x")
    assert store.read([held.ref]) == [None]  # its claim settled; the message stays the topic's
    held.ack()  # the consumer's late ack: its claim is gone, and the sidelined copy stays for redelivery
    assert [env.msg_id for _, env in q.sideline.browse()] == [held.id]
    assert sorted(m.payload for m in [q.fire(), q.fire()]) == [b"b", b"c"]


def test_a_slot_a_crashed_claimer_passed_is_claimed_by_the_sweep_and_delivered_again(store, clock):
    """Aerospike: a claimer that moved the cursor and stopped before writing its claim records leaves slots with no
    claim; past the write deadline the sweep claims those its filter selects, and one sweepDuration later they go
    to the sideline for redelivery: never lost. (lmdb claims are one transaction: nothing to find.)"""
    if not store.write_grace_ms:
        pytest.skip("a claim here is one transaction: a cursor never passes a slot without its claim")
    topic, q = subscription(store, filter="keep/#")
    topic.publish_many([b"k1"], subject="keep/1")
    topic.publish_many([b"skip"], subject="other")
    cursor = names.cursor_of(q.name, "feed")
    store._topics._advance(cursor, 0, 2, 2)  # the claimer's first step only: slots 1 and 2 passed, no claims
    s = sweeper(store, clock)
    clock.advance(store.write_grace_ms / 1000 + 1)
    s.sweep_queue(store.client_id, q.name)  # (the fire pointer as seen now: settled one grace later)
    clock.advance(store.write_grace_ms / 1000 + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.stamped == 1 and report.ok, report
    assert q.fire() is None  # claimed by the sweep, not handed out
    clock.advance(SWEEP_S + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.moved == 1
    assert [env.payload for _, env in q.sideline.browse()] == [b"k1"]  # the filter's one; "skip" was never its


def late_claims_store(backend, monkeypatch):
    """A store whose subscription claims write their records a second late (Aerospike); skips where a claim is one
    transaction (lmdb: a cursor never passes a slot without its claim record)."""
    monkeypatch.setenv("IGNIS_AEROSPIKE_CLAIM_WRITE_DELAY_MS", "1000")
    store = backend.open()
    if not store.write_grace_ms:
        store.close()
        pytest.skip("a claim here is one transaction: a cursor never passes a slot without its claim")
    return store


def test_a_claim_record_its_dead_claimer_still_owed_is_made_by_the_sweep_counted_once_and_swept_on_time(
        backend, clock, monkeypatch):
    """Aerospike writes a subscription's claim records late (claim_write_delay_ms) unless an ack came first: a
    consumer that dies in between leaves its slots as a claimer stopped after its cursor's move does. Past the
    write deadline the sweep claims them, stamped with the cursor's last move (it passed them no later), so they
    are swept one sweepDuration after their claim rather than after the sweep found them, and counted as one
    delivery (a consumer that died of the message must still reach its maxDeliveries). The sweep here finds them
    long after the deadline (its clock runs ahead), as a sweeper that was down would."""
    store = late_claims_store(backend, monkeypatch)
    topic, q = subscription(store)
    topic.publish_many([b"a"], subject="x")
    claimed_at = now_ms()
    held = q.fire()
    assert held is not None
    deferred = store._shared.deferred
    assert deferred is not None and list(deferred.pending) == [store._ctx.data_key(held.ref)]
    deferred.pending.clear()  # the process dies: what it owed is never written
    s = sweeper(store, clock)
    clock.advance(100)
    s.sweep_queue(store.client_id, q.name)  # (the fire pointer as seen now: settled one write deadline later)
    clock.advance(100)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.stamped == 1 and report.cursor.moved == 0 and report.ok, report
    clock.now = claimed_at + SWEEP_S * 1000 - 2000  # (not yet one sweepDuration after the claim)
    assert s.sweep_queue(store.client_id, q.name).cursor.moved == 0
    clock.now = claimed_at + SWEEP_S * 1000 + 2000  # (one after the claim; one after the stamp's sweep is 200 s on)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.moved == 1, report
    [(_, env)] = q.sideline.browse()
    assert (env.payload, env.msg_id, env.attempts) == (b"a", held.id, 1)
    store.close()


def a_dead_claimers_slot_before_a_written_claim(backend, monkeypatch):
    """A subscription (of a store whose claim records are written late) holding two claims: "a", whose claimer died
    owing its record, and after it "b", another consumer's, its record written. (store, the subscription)"""
    store = late_claims_store(backend, monkeypatch)
    topic, q = subscription(store)
    topic.publish_many([b"a", b"b"], subject="x")
    dead = q.fire()
    assert dead is not None and dead.payload == b"a"
    store._shared.deferred.pending.clear()  # its claimer dies owing the record
    alive = q.fire()
    assert alive is not None and alive.payload == b"b"
    store.write_claims([alive.ref])
    return store, q


def test_a_slot_a_dead_claimer_owed_is_not_passed_for_an_older_claim_after_it(backend, clock, monkeypatch):
    """A claim moves the cursor first and writes its records last (on Aerospike up to claim_write_delay_ms later):
    a slot with no record before another consumer's claim record is no sign of a settled slot, however old that
    claim. A sweeper that just took over (no fire pointer of its own seen a write deadline ago) passed such a slot
    when the claim after it was old enough, and the message its dead claimer held was never delivered again
    (the process kill test, 2 runs in 60)."""
    store, q = a_dead_claimers_slot_before_a_written_claim(backend, monkeypatch)
    s = sweeper(store, clock)
    clock.advance(100)  # the new leader: both claims older than a write deadline, nothing of its own seen yet
    for _ in range(3):
        s.sweep_queue(store.client_id, q.name)
        clock.advance(store.write_grace_ms / 1000 + 1)
    clock.advance(SWEEP_S)
    s.sweep_queue(store.client_id, q.name)
    assert sorted(env.payload for _, env in q.sideline.browse()) == [b"a", b"b"]
    store.close()


def test_passes_a_fraction_of_a_second_apart_still_claim_a_slot_a_dead_claimer_owed(backend, clock, monkeypatch):
    """The fire pointers a sweeper remembers span the write deadline however often its passes come. It kept the last
    64 passes: 0.25 s apart they reached back 16 s, less than Aerospike's deadline (21 s), so no slot ever counted
    as settled, a slot a dead claimer owed stopped the cursor's sweep pointer for good, and neither its message nor
    the claims after it were ever swept (the process kill test, whose sweepers pass every 0.2 s, 2026-12-01)."""
    store, q = a_dead_claimers_slot_before_a_written_claim(backend, monkeypatch)
    s = sweeper(store, clock)
    for _ in range(2 * store.write_grace_ms // 250):  # two write deadlines of passes, 0.25 s apart
        s.sweep_queue(store.client_id, q.name)
        clock.advance(0.25)
    assert q.sideline.browse() == []  # (not a sweepDuration yet)
    clock.advance(SWEEP_S)
    s.sweep_queue(store.client_id, q.name)
    assert sorted(env.payload for _, env in q.sideline.browse()) == [b"a", b"b"]
    store.close()


def test_acked_subscription_claims_are_passed_never_claimed_again_and_their_tombstones_dropped(store, clock):
    """Acked claims are settled slots to the sweep, not slots a crashed claimer left unclaimed: passed, never
    stamped and delivered again a sweepDuration later. What the acks left (tombstones, on Aerospike Community
    Edition) is deleted once the pointer passed it, so ten subscriptions do not store ten traces per message for
    the topic's retention."""
    topic, q = subscription(store)
    topic.publish_many([b"a", b"b", b"c"], subject="x")
    for m in q.fire_many(3):
        m.ack()
    cursor = names.cursor_of(q.name, "feed")
    refs = [SlotRef(cursor, 0, slot) for slot in (1, 2, 3)]
    left_by_acks = store.settled(refs)
    s = sweeper(store, clock)
    for _ in range(2):  # the fire pointer seen, then known settled one write deadline later
        clock.advance(store.write_grace_ms / 1000 + 1)
        report = s.sweep_queue(store.client_id, q.name)
        assert report.cursor.stamped == 0 and report.ok, report
    assert pointer(store, q.name, "cursor") == 4
    assert store.settled(refs) == [False] * 3  # (tombstones where acks leave them: gone)
    assert any(left_by_acks) == bool(store.write_grace_ms)  # (Aerospike's acks leave them; lmdb's delete)
    clock.advance(SWEEP_S + 1)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.cursor.moved == 0 and report.cursor.stamped == 0
    assert q.fire() is None and q.sideline.browse() == []


class HeldSlots:
    """Counts the slots the sweep's rounds have peeked and not yet finished with: a round's peeks run on its
    thread and its pointer advance ends it. `most` is the largest total over all threads at any moment."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self.most = 0
        self.peeked = 0
        self.threads: set[int] = set()  # the threads that read a window

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def with_client(self, client_id):
        return self if client_id == self._inner.client_id else self._inner.with_client(client_id)

    def peek(self, magazine, shard, first, last):
        with self._lock:
            me = threading.get_ident()
            self.threads.add(me)
            self._held[me] = self._held.get(me, 0) + (last - first + 1)
            self.peeked += last - first + 1
            self.most = max(self.most, sum(self._held.values()))
        return self._inner.peek(magazine, shard, first, last)

    def advance_sweep(self, *args, **kwargs):
        result = self._inner.advance_sweep(*args, **kwargs)
        with self._lock:
            self._held.pop(threading.get_ident(), None)
        return result


def sweep_abandoned(store, declare, clock, shards: int, per_shard: int, **sweeper: int):
    """A crashed consumer's claims, `per_shard` in each of `shards` shards, swept once through a HeldSlots count by
    a Sweeper of these settings: (the queue, the report, the counts)."""
    q = declare(shards=shards)
    q.publish_many([b"m%d" % i for i in range(shards * per_shard)])
    assert len(q.fire_many(shards * per_shard)) == shards * per_shard
    clock.advance(SWEEP_S + 1)
    counted = HeldSlots(store)
    epoch = store.next_epoch()
    s = Sweeper(counted, epoch_source=lambda: epoch, clock=clock, **sweeper)
    try:
        return q, s.sweep_queue(store.client_id, q.name), counted
    finally:
        s.close()


def test_a_pass_over_a_big_backlog_holds_a_bounded_number_of_slots_whatever_the_shards(store, declare, clock):
    """Memory bounded whatever the backlog (issue 49): a round used to read a window of batch_size slots of
    every shard of its group before moving any, so a pass held shards x batch_size envelopes at once."""
    q, report, counted = sweep_abandoned(store, declare, clock, 16, 300, threads=4, batch_size=100,
                                         slots_in_memory=250)
    assert (report.main.moved, report.main.examined) == (16 * 300, 16 * 300)
    assert q.sideline.pending() == 16 * 300
    assert counted.peeked >= 16 * 300
    assert 100 <= counted.most <= 250  # two shard groups of 8 shards each held 800 apiece before


def test_a_big_backlog_is_swept_by_no_more_threads_than_the_slot_budget_lets_hold_a_window(store, declare, clock,
                                                                                          monkeypatch):
    """Memory bounded whatever the backlog (issue 49): a magazine's shard groups grew with its backlog, up to a
    thread per shard, each waiting for the slot budget, and every thread keeps a malloc arena of its own."""
    monkeypatch.setattr(sweeper_module, "SHARD_GROUP_MIN_SLOTS", 100)  # (16 groups for this backlog, else)
    _, report, counted = sweep_abandoned(store, declare, clock, 16, 300, threads=16, batch_size=100,
                                         slots_in_memory=250)
    assert (report.main.moved, report.main.examined) == (16 * 300, 16 * 300)
    assert 1 <= len(counted.threads) <= 2  # 250 // 100 windows at once: 2 groups (16 before)


def test_the_slot_budget_is_at_least_one_window(store, declare, clock):
    _, report, counted = sweep_abandoned(store, declare, clock, 2, 300, threads=1, batch_size=200,
                                         slots_in_memory=50)
    assert report.main.moved == 600
    assert counted.most == 200  # one shard's window at a time: a window is read whole


def test_ordered_queue_head_is_never_swept(store, declare, clock):
    """An ordered queue's held head stays where it is however old its claim (sweeping it would let a later message
    of its shard pass it: its claim comes again when its hold ends); what lies below the head is swept as ever.
    Fails if the sweep reached the fire pointer's slot of an ordered shard."""
    q = declare("ordered-q", ordered=True)
    q.publish_many([b"m%d" % i for i in range(3)])
    first = q.fire()
    assert first is not None and first.payload == b"m0"
    clock.advance(SWEEP_S + 1)
    s = sweeper(store, clock)
    report = s.sweep_queue(store.client_id, q.name)
    assert report.ok and report.main.moved == 0
    assert present(store, q.name) == [1, 2, 3]
    assert q.sideline.pending() == 0
    first.ack()
    second = q.fire()
    assert second is not None and second.payload == b"m1"
    # An unordered queue's claim as old is swept (the same sweeper, the same clock): the rule is the ordered one's.
    plain = declare("plain-q")
    plain.publish_many([b"p0"])
    assert plain.fire() is not None
    clock.advance(SWEEP_S + 1)
    assert s.sweep_queue(store.client_id, plain.name).main.moved == 1
