"""Unit tests of the parts a Magazine composes (ignis.magazine.*), each on its own with a fake store and, where
time matters, a fake clock: the awaited slots' re-read schedule, the active shards, the reservations and the
prefetch. (The contract suite covers them through queues, on every backend.) A race of threads over an ordered
queue's held shards runs on a real (lmdb) queue."""

from __future__ import annotations

import gc
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ignis import Ignis, QueueSpec
from ignis.activity import activity_for
from ignis.envelope import Envelope
from ignis.errors import StoreUnavailable
from ignis.magazine import awaited as awaited_module
from ignis.magazine import prefetch as prefetch_module
from ignis.magazine import reservations as reservations_module
from ignis.magazine.awaited import AwaitedSlots
from ignis.magazine.ordered import OrderedMagazine
from ignis.magazine.prefetch import Prefetch
from ignis.magazine.reservations import RESERVE_MAX, Reservations
from ignis.magazine.shards import ActiveShards
from ignis.storage.base import RESERVATION_FRESH_MS, Claimed, ShardPointers, SlotRef


class Clock:
    """Stands in for the `time` module of a part: monotonic() is what the test says."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


class FakeStore:
    """What the parts call of a store, recorded."""

    def __init__(self, grace_ms: int = 2000) -> None:
        self.location = f"fake-{uuid.uuid4().hex}"  # (a ShardActivity of its own)
        self.client_id = "client"
        self.write_grace_ms = grace_ms
        self.needs_beacon = True  # (it records the beacons a publish bumps)
        self.restamps: list[list[SlotRef]] = []
        self.sealed: list[list[SlotRef]] = []
        self.beacons: list[str] = []
        self.pointer_reads = 0
        self.landed: set[SlotRef] = set()  # slots whose record is there
        self.with_work: dict[int, ShardPointers] = {}
        self.failing = False
        self.seal_answers: bool = True

    def restamp(self, refs: list[SlotRef], now: int, count_attempt: bool) -> list[Claimed]:
        if self.failing:
            raise StoreUnavailable("the store does not answer")
        self.restamps.append(list(refs))
        return [Claimed(ref, Envelope(b"x", f"id-{ref.slot}", 1) if ref in self.landed else None, ref not in
                        self.landed) for ref in refs]

    def seal(self, refs: list[SlotRef], ttl_seconds: int) -> list[bool]:
        if self.failing:
            raise StoreUnavailable("the store does not answer")
        self.sealed.append(list(refs))
        return [self.seal_answers] * len(refs)

    def beacon(self, magazine: str) -> None:
        self.beacons.append(magazine)

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        self.pointer_reads += 1
        return {shard: self.with_work.get(shard, ShardPointers()) for shard in range(shards)}


def ignore(holes: list[SlotRef], unwritten: list[SlotRef]) -> None:
    """A `passed` callback for tests that count no holes."""


def slot(n: int, shard: int = 0) -> SlotRef:
    return SlotRef("q", shard, n)


# ---- awaited slots -----------------------------------------------------------------------------------
@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    for module in (awaited_module, prefetch_module, reservations_module):
        monkeypatch.setattr(module, "time", clock)
    return clock


def awaited_slots(store: FakeStore) -> AwaitedSlots:
    return AwaitedSlots(store, threading.Lock(), ttl_seconds=60, count_attempt=True, queue="q", kind="main")


def test_an_awaited_slot_is_re_read_first_after_1_ms_then_1_15_times_later_each_time(clock: Clock) -> None:
    store = FakeStore(grace_ms=60_000)
    awaited = awaited_slots(store)
    awaited.add(slot(1))
    start = clock.now
    assert awaited.next_check_in() == pytest.approx(0.001)
    clock.now = start + 0.0009
    awaited.recheck(ignore)
    assert store.restamps == []  # not due yet
    reads: list[float] = []
    for _ in range(45):
        clock.now += awaited.next_check_in()
        awaited.recheck(ignore)
        reads.append(clock.now - start)
    assert len(store.restamps) == 45 and all(refs == [slot(1)] for refs in store.restamps)
    gaps = [b - a for a, b in zip([0.0, *reads], reads, strict=False)]
    expected = [min(0.001 * 1.15 ** n, 0.25) for n in range(45)]  # 1, 1.15, 1.32 ms ... at most 250 ms apart
    assert gaps == pytest.approx(expected)
    assert gaps[:3] == pytest.approx([0.001, 0.00115, 0.0013225]) and gaps[-1] == pytest.approx(0.25)


def test_a_record_that_landed_is_handed_out_and_the_slot_no_longer_awaited(clock: Clock) -> None:
    store = FakeStore()
    awaited = awaited_slots(store)
    awaited.add(slot(1))
    awaited.add(slot(2))
    store.landed.add(slot(2))
    assert awaited.take(5, ignore) == []  # nothing due yet: no read
    clock.now += 0.001
    got = awaited.take(5, ignore)
    assert [c.ref for c in got] == [slot(2)] and store.restamps == [[slot(1), slot(2)]]
    assert [a.ref for a in awaited.slots] == [slot(1)] and not awaited.landed


def test_an_awaited_slot_past_the_write_grace_is_sealed_and_passed_as_a_hole(clock: Clock) -> None:
    store = FakeStore(grace_ms=10)
    awaited = awaited_slots(store)
    awaited.add(slot(1))
    passed: list[SlotRef] = []
    clock.now += 0.009
    awaited.recheck(lambda holes, _unwritten: passed.extend(holes))
    assert store.sealed == [] and passed == []  # within the grace: re-read later
    clock.now += 0.002
    awaited.recheck(lambda holes, _unwritten: passed.extend(holes))
    assert store.sealed == [[slot(1)]] and passed == [slot(1)] and awaited.slots == []
    assert awaited.next_check_in() is None


def test_a_seal_that_loses_to_the_record_re_reads_it_at_once(clock: Clock) -> None:
    store = FakeStore(grace_ms=1)
    store.seal_answers = False  # the record landed at the last moment
    awaited = awaited_slots(store)
    awaited.add(slot(1))
    clock.now += 0.002
    passed: list[SlotRef] = []
    awaited.recheck(lambda holes, _unwritten: passed.extend(holes))
    assert passed == [] and [a.ref for a in awaited.slots] == [slot(1)] and awaited.next_check_in() == 0.0


def test_while_the_store_fails_an_awaited_slot_is_re_read_later_and_later_and_kept(clock: Clock) -> None:
    store = FakeStore()
    awaited = awaited_slots(store)
    awaited.add(slot(1))
    store.failing = True
    waits = []
    for _ in range(5):
        clock.now += awaited.next_check_in()
        with pytest.raises(StoreUnavailable):
            awaited.recheck(ignore)
        waits.append(awaited.next_check_in())
    assert waits == pytest.approx([0.5, 1.0, 2.0, 4.0, 5.0])  # doubling from 250 ms, at most 5 s apart
    assert [a.ref for a in awaited.slots] == [slot(1)]


def test_prefetched_messages_restamped_that_the_store_does_not_answer_for_are_awaited(clock: Clock) -> None:
    store = FakeStore()
    awaited = awaited_slots(store)
    store.landed.add(slot(1))
    kept = [Claimed(slot(1), Envelope(b"x", "a", 1), False), Claimed(slot(2), Envelope(b"y", "b", 1), False)]
    assert [c.ref for c in awaited.restamp_kept(kept)] == [slot(1)]
    assert [a.ref for a in awaited.slots] == [slot(2)]


# ---- active shards -----------------------------------------------------------------------------------
def active_shards(store: FakeStore, *, is_main: bool = True, refresh: float = 3600.0) -> ActiveShards:
    return ActiveShards(store, "q", 4, refresh_seconds=refresh, lock=threading.Lock(), is_main=is_main)


def test_a_doorbell_makes_a_shard_pickable_before_the_refresh_interval() -> None:
    store = FakeStore()
    shards = active_shards(store)
    assert shards.pick() is None and store.pointer_reads == 1  # the first pick reads the pointers: none has work
    assert shards.pick() is None and store.pointer_reads == 1  # not again within refresh_seconds
    # A doorbell ring (or a load through another handle of the process) marks the magazine's activity, which
    # every handle of it shares (what the watcher does when the store rings: ignis.watch).
    seen = shards.activity.changes
    activity_for(store.location, store.client_id, "q").mark_one(2)
    assert shards.activity.changes != seen  # a waiting consumer is woken
    assert shards.pick() == 2 and store.pointer_reads == 1  # pickable now, without a read


def test_the_pointers_are_read_again_once_the_refresh_interval_has_passed() -> None:
    store = FakeStore()
    shards = active_shards(store, refresh=0.05)
    assert shards.pick() is None and store.pointer_reads == 1
    store.with_work[3] = ShardPointers(load=5, fire=2)  # published by another process, no ring
    assert shards.pick() is None and store.pointer_reads == 1
    time.sleep(0.06)
    assert shards.pick() == 3 and store.pointer_reads == 2


def test_a_drained_shard_is_dropped_unless_a_load_marked_it_since_the_claim_began() -> None:
    store = FakeStore()
    shards = active_shards(store)
    shards.mark_one(1)
    seen = shards.activity.last_load
    shards.mark([1])  # a load raced the claim
    shards.suppress(1, seen)
    assert shards.activity.active == (1,)
    shards.suppress(1, shards.activity.last_load)
    assert shards.activity.active == ()


def test_one_claim_per_shard_at_a_time_and_its_end_wakes_a_waiter_while_the_shard_has_work() -> None:
    """A cursor's claims (pick_alone): a thread does not claim a shard another thread of the process is claiming
    (it would find the message taken, after a turn at the cursor's write lock); it waits, and the claim's end wakes
    it if the shard still has work."""
    store = FakeStore()
    shards = active_shards(store)
    assert shards.pick_alone() is None  # (the first pick reads the pointers: none has work)
    shards.mark([1, 2])
    first = shards.pick_alone()
    second = shards.pick_alone()
    assert {first, second} == {1, 2}  # (each its own shard)
    assert shards.pick_alone() is None  # both are being claimed: nothing for a third thread
    seen = shards.activity.changes
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(shards.activity.wait(seen, 5.0)))
    waiter.start()
    time.sleep(0.05)
    shards.suppress(first, shards.activity.last_load)  # the first claim drained its shard: nobody to wake for it
    shards.claimed(first)
    time.sleep(0.05)
    assert not woke
    shards.claimed(second)  # the second left work in its shard: the waiter claims the rest
    waiter.join(5.0)
    assert woke == [True]
    assert shards.pick_alone() == second


def test_a_load_cut_short_marks_the_shards_of_the_writes_that_landed() -> None:
    """A copy an outage cut short (LoadInterrupted): what landed is there for this process's consumers, what did
    not is not looked for; a load that went through marks every shard it filled."""
    from ignis.errors import LoadInterrupted
    from ignis.storage.base import SlotRef

    store = FakeStore()
    shards = active_shards(store)
    refs = [SlotRef("q", 1, 7), SlotRef("q", 2, 3), SlotRef("q", 3, 9)]

    def cut_short() -> list[SlotRef]:
        raise LoadInterrupted("down (test)", refs, [True, False, True])

    with pytest.raises(LoadInterrupted):
        shards.loaded(cut_short)
    assert sorted(shards.activity.active) == [1, 3] and store.beacons == ["q"]
    assert shards.loaded(lambda: refs[1:2]) == refs[1:2] and sorted(shards.activity.active) == [1, 2, 3]


def test_loads_ring_the_beacon_of_main_only() -> None:
    store = FakeStore()
    main, sideline = active_shards(store), ActiveShards(store, "q.sideline", 4, refresh_seconds=1.0,
                                                         lock=threading.Lock(), is_main=False)
    main.mark_one(0)
    main.mark([1, 2])
    main.mark([])  # nothing loaded: no ring
    sideline.mark_one(0)
    assert store.beacons == ["q", "q"]
    assert sorted(main.activity.active) == [0, 1, 2] and sideline.activity.active == (0,)  # listed, rung or not


# ---- reservations ------------------------------------------------------------------------------------
def reservations(store: FakeStore) -> Reservations:
    return Reservations(store, "q", 60, threading.Lock())


def test_reserved_slots_are_handed_out_in_order(clock: Clock) -> None:
    store = FakeStore()
    reserved = reservations(store)
    reserved.keep(2, range(10, 14), clock.now)
    reserved.keep(1, range(20, 22), clock.now)
    taken = [reserved.take() for _ in range(7)]
    assert taken == [SlotRef("q", 2, 10), SlotRef("q", 2, 11), SlotRef("q", 2, 12), SlotRef("q", 2, 13),
                     SlotRef("q", 1, 20), SlotRef("q", 1, 21), None]
    assert store.sealed == []


def test_stale_reservations_are_sealed_on_the_way_to_a_fresh_one(clock: Clock) -> None:
    store = FakeStore()
    reserved = reservations(store)
    reserved.keep(0, range(1, 4), clock.now)
    clock.now += RESERVATION_FRESH_MS / 1000 / 2
    reserved.keep(0, range(7, 9), clock.now)
    clock.now += RESERVATION_FRESH_MS / 1000 / 2 + 0.001  # the first three are too old to write now
    assert reserved.take() == slot(7)
    assert store.sealed == [[slot(1), slot(2), slot(3)]]
    assert [ref for _, ref in reserved.slots] == [slot(8)]


def test_release_seals_every_reservation_and_says_how_many(clock: Clock) -> None:
    store = FakeStore()
    reserved = reservations(store)
    assert reserved.release() == 0 and store.sealed == []
    reserved.keep(0, range(5, 8), clock.now)
    assert reserved.release() == 3
    assert store.sealed == [[slot(5), slot(6), slot(7)]] and not reserved.slots and reserved.take() is None


def test_a_seal_that_fails_is_logged_and_left_to_the_claimers(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStore()
    reserved = reservations(store)
    reserved.keep(0, range(5, 7), clock.now)
    store.failing = True
    with caplog.at_level(logging.WARNING, logger="ignis.magazine"):
        assert reserved.release() == 2
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("ignis.magazine", logging.WARNING, "could not seal 2 unused reserved slot(s) of q: the store does not answer")]
    assert not reserved.slots


def test_the_reaper_seals_reservations_nobody_wrote_once_they_are_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reservations_module, "REAP_DELAY_SECONDS", 0.0)
    store = FakeStore()
    reserved = reservations(store)
    reserved.keep(0, range(1, 3), time.monotonic())
    assert store.sealed == []
    deadline = time.monotonic() + 5
    while not store.sealed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.sealed == [[slot(1), slot(2)]] and not reserved.slots


def test_a_reservation_is_sized_by_the_recent_publish_rate() -> None:
    reserved = reservations(FakeStore())
    reserved._allocated_at, reserved._allocated = 100.0, 1
    assert reserved.size(100.0009) == 1 + 5  # 1 slot in 0.9 ms: 1,111/s, 5 more for the next 5 ms
    assert reserved.size(100.0063) == 1 + 5  # 6 slots in 5.4 ms: the same rate
    assert reserved.size(100.0064) == 1 + RESERVE_MAX  # 6 in 0.1 ms: capped
    assert reserved.size(101.0064) == 1  # 33 slots lasted a second: a trickle, nothing ahead
    assert reserved.size(101.5, needed=4) == 4  # what is needed, at least


# ---- prefetch ----------------------------------------------------------------------------------------
def claimed(n: int) -> Claimed:
    return Claimed(slot(n), Envelope(b"m", f"id-{n}", 1), False)


def test_kept_messages_are_handed_out_oldest_first(clock: Clock) -> None:
    prefetch = Prefetch(True)
    prefetch.keep([claimed(1), claimed(2)])
    clock.now += 0.1
    prefetch.keep([claimed(3), claimed(4)])
    item, fresh = prefetch.take_one() or (None, None)
    assert item == claimed(1) and fresh
    assert prefetch.take(2) == ([claimed(2), claimed(3)], [])
    assert prefetch.take(5) == ([claimed(4)], []) and prefetch.take_one() is None


def test_on_stop_every_kept_message_is_handed_out_and_those_kept_too_long_are_told_apart(clock: Clock) -> None:
    # A consumer that stops takes what its handle kept (Magazine.take_kept): nothing is left to the sweeper,
    # and what was kept past PREFETCH_FRESH_SECONDS comes out apart, to be stamped again.
    prefetch = Prefetch(True)
    prefetch.keep([claimed(1), claimed(2)])
    clock.now += prefetch_module.PREFETCH_FRESH_SECONDS + 0.5
    prefetch.keep([claimed(3)])
    assert prefetch.take(10) == ([claimed(3)], [claimed(1), claimed(2)])
    assert not prefetch.kept
    prefetch.keep([claimed(5)])
    clock.now += prefetch_module.PREFETCH_FRESH_SECONDS + 0.5
    assert prefetch.take_one() == (claimed(5), False)


def test_a_fire_claims_for_the_threads_that_fired_lately_and_the_fires_in_progress(clock: Clock) -> None:
    prefetch = Prefetch(True)
    fired, done = threading.Barrier(4), threading.Event()

    def consumer() -> None:  # fires, then is busy with what it got (alive: its thread id stays its own)
        prefetch.fired()
        fired.wait()
        done.wait()

    threads = [threading.Thread(target=consumer, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        _count_consumers(prefetch, fired, clock)
    finally:
        done.set()
        for thread in threads:
            thread.join()


def _count_consumers(prefetch: Prefetch, fired: threading.Barrier, clock: Clock) -> None:
    fired.wait()
    prefetch.fired()  # this thread: four consumers, three others
    assert prefetch.begin() == 3
    assert prefetch.begin() == 3  # (a fire in progress counts too, if more)
    prefetch.end()
    prefetch.end()
    clock.now += prefetch_module.CONSUMER_RECENT_SECONDS + 0.01
    prefetch.fired()
    assert prefetch.begin() == 0 and list(prefetch.consumers) == [threading.get_ident()]  # the others pruned
    assert prefetch.begin() == 1  # one fire in progress beside it
    prefetch.end()
    prefetch.end()


def test_a_handle_that_does_not_prefetch_claims_for_nobody() -> None:
    prefetch = Prefetch(False)
    prefetch.consumers.update({1: time.monotonic(), 2: time.monotonic()})
    assert prefetch.begin() == 0
    prefetch.end()


def test_a_pointer_read_keeps_the_shards_a_load_marked_while_it_was_under_way() -> None:
    """A load of this process marks its shard after a pointer read began and commits after that read: the read's
    answer (no work) must not drop the mark, or the message stays hidden until the next read (a subscription
    reopened in the same process found nothing, 1 run in 5 of its test file)."""
    from ignis.activity import ShardActivity

    activity = ShardActivity()
    activity.mark([1])
    seen = activity.before_read()  # the watcher's read begins: shard 1 listed
    activity.mark([2])  # a publish to shard 2, committed after the read
    assert activity.replace([1], seen) is False  # the read saw shard 1's work, not shard 2's
    assert set(activity.active) == {1, 2}
    seen = activity.before_read()
    activity.replace([], seen)  # nothing marked during this read: the read is the truth
    assert activity.active == ()


def _race_walks_against_new_keys(walk: Callable[[], None], add_key: Callable[[], None]) -> list[BaseException]:
    """Run `walk` in a loop in one thread while new threads each call `add_key` (a new key without a lock, as a
    thread that starts firing adds itself): the errors either raised. Other threads run inside a C-level walk
    of a dict only when it runs Python code, as a garbage collection does (finalizers, gc.callbacks): here every
    allocation collects and every collection yields the GIL, so a walk that allocates loses the race at once."""
    errors: list[BaseException] = []
    stop = threading.Event()

    def walker() -> None:
        while not stop.is_set():
            try:
                walk()
            except BaseException as exc:
                errors.append(exc)
                return

    def newcomer() -> None:
        try:
            add_key()
        except BaseException as exc:
            errors.append(exc)

    def yield_the_gil(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            time.sleep(0)

    threshold = gc.get_threshold()
    gc.set_threshold(1)
    gc.callbacks.append(yield_the_gil)
    try:
        walking = threading.Thread(target=walker)
        walking.start()
        deadline = time.monotonic() + 3
        while not errors and time.monotonic() < deadline:
            threads = [threading.Thread(target=newcomer) for _ in range(20)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        stop.set()
        walking.join()
    finally:
        gc.callbacks.remove(yield_the_gil)
        gc.set_threshold(*threshold)
    return errors


def test_threads_that_start_firing_while_another_prunes_the_consumers_break_no_fire() -> None:
    # Prefetch.begin prunes the threads that fired long ago under its lock, while a thread that fires notes itself
    # without it (a fire's hot path): the prune must not iterate the dict it could grow meanwhile ("dictionary
    # changed size during iteration", seen twice in CI from a consumer thread's fire).
    prefetch = Prefetch(enabled=True)

    def prune() -> None:
        for i in range(5000):  # long-idle consumers (more than the 2,000 tuples Python keeps for reuse)
            prefetch.consumers[-1 - i] = 0.0
        prefetch.begin()
        prefetch.end()

    def newcomer() -> None:  # a new thread id: a new key
        prefetch.begin()
        prefetch.end()

    errors = _race_walks_against_new_keys(prune, newcomer)
    assert not errors, errors[0]


def test_an_ordered_queues_next_check_survives_consumers_holding_new_shards_meanwhile(tmp_path: Path) -> None:
    # OrderedMagazine.next_check_in walks the shards known to be held, which claiming threads add to (and drop
    # from) without a lock.
    with Ignis(f"lmdb://{tmp_path}") as ignis:
        ignis.apply(QueueSpec.build(name="seq", handlerType="seq", shards=4, ordered=True))
        magazine = ignis.queue("seq").main
        assert isinstance(magazine, OrderedMagazine)
        added = itertools.count(10_000)

        def next_check() -> None:
            for shard in range(5000):
                magazine._blocked[shard] = time.monotonic() + 60
            magazine.next_check_in()

        def hold_a_new_shard() -> None:
            magazine._blocked[next(added)] = time.monotonic() + 60

        errors = _race_walks_against_new_keys(next_check, hold_a_new_shard)
    assert not errors, errors[0]
