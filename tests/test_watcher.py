"""The watcher's idle pace (ignis.watch) against a store that counts its calls: idle queues' pointers are read in
one call per beacon read, not one call per queue, and a queue whose pointers moved behind a beacon that stood
still flows again. The timings are shortened here (monkeypatch); what they cost on a real server is
bench/bench_latency.py's idle phase."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

import ignis.watch as watch
from ignis.activity import ShardActivity


class CountingStore:
    """What a Watcher asks of a store without a doorbell (Aerospike), counted."""

    closed = False

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loaded: dict[str, int] = {}  # the sum of each magazine's load pointers
        self.beacons: dict[str, int] = {}
        self.pointer_calls: list[list[str]] = []  # the magazines of each watch_pointers call
        self.beacon_calls = 0

    def doorbell(self) -> None:
        return None

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        with self.lock:
            self.beacon_calls += 1
            return [self.beacons.get(m, 0) for m in magazines]

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        with self.lock:
            self.pointer_calls.append([m for m, _ in magazines])
            return [([0] if self.loaded.get(m, 0) else [], self.loaded.get(m, 0)) for m, _ in magazines]


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "IDLE_AFTER_SECONDS", 0.05)
    monkeypatch.setattr(watch, "IDLE_POLL_SECONDS", 0.02)
    monkeypatch.setattr(watch, "IDLE_SAFETY_POLL_SECONDS", 0.2)
    monkeypatch.setattr(watch, "HUNGRY_SECONDS", 60.0)  # (no consumer waits here: each counts as looking)


def wait_until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    assert condition(), "not reached in time"  # type: ignore[operator]


def idle(watcher: watch.Watcher, names: list[str]) -> bool:
    return all(watcher._watched[n].beacon is not None for n in names)


def test_idle_queues_pointers_are_read_together_with_the_beacons_not_one_call_each(fast: None) -> None:
    store = CountingStore()
    watcher = watch.Watcher(store)  # type: ignore[arg-type]
    names = [f"q{i}" for i in range(50)]
    try:
        for name in names:
            watcher.watch(name, 4, ShardActivity())
        wait_until(lambda: idle(watcher, names))
        with store.lock:
            store.pointer_calls.clear()
            beacons_before = store.beacon_calls
        time.sleep(1.0)
        with store.lock:
            calls = list(store.pointer_calls)
            beacon_reads = store.beacon_calls - beacons_before
    finally:
        watcher.stop()
    # Every idle queue's pointers were still read, about every IDLE_SAFETY_POLL_SECONDS (five times a second)...
    reads = {name: sum(name in call for call in calls) for name in names}
    assert min(reads.values()) >= 2, reads
    # ...but in at most one call per beacon read: one call each would have made 250.
    assert len(calls) <= beacon_reads, (len(calls), beacon_reads)
    assert max(len(call) for call in calls) > 1, calls


def test_an_idle_queue_whose_pointers_moved_behind_a_still_beacon_flows_again(fast: None) -> None:
    store = CountingStore()
    watcher = watch.Watcher(store)  # type: ignore[arg-type]
    activity = ShardActivity()
    try:
        watcher.watch("quiet", 4, ShardActivity())
        watcher.watch("bumpless", 4, activity)
        wait_until(lambda: idle(watcher, ["quiet", "bumpless"]))
        with store.lock:
            store.loaded["bumpless"] = 1  # a publish whose beacon bump failed
        wait_until(lambda: activity.active == (0,))  # found by a safety read, its shard marked for the consumers
        wait_until(lambda: watcher._watched["bumpless"].beacon is None)  # flowing: its pointers polled again
        assert watcher._watched["quiet"].beacon is not None
    finally:
        watcher.stop()


def test_a_cursor_is_read_often_while_its_subscriptions_consumers_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A subscription's consumers wait on its main magazine (woken by its cursor's changes: ShardActivity.wake_with),
    not on the cursor's own activity: while one waits, the cursor's pointers are read at the fast pace, not at the
    pace of a magazine whose consumers are all busy (SAFETY_POLL_SECONDS), which made a subscription's consumer in
    another process hear of a publish tens of milliseconds late on Aerospike."""
    monkeypatch.setattr(watch, "HUNGRY_SECONDS", 0.0)  # (nobody looked for work lately: only a waiter counts)
    store = CountingStore()
    main, cursor = ShardActivity(), ShardActivity()
    cursor.wake_with(main)
    watcher = watch.Watcher(store)  # type: ignore[arg-type]
    try:
        main._waiting = 1  # a consumer waits on the subscription's main magazine
        watcher.watch("subs_FROM_feed", 1, cursor)
        wait_until(lambda: "subs_FROM_feed" in watcher._watched and watcher._watched["subs_FROM_feed"].loaded == 0)
        assert watcher._watched["subs_FROM_feed"].interval < 1.0 and not watcher._watched["subs_FROM_feed"].busy
        main._waiting = 0  # nobody waits any more: read slowly
        wait_until(lambda: watcher._watched["subs_FROM_feed"].busy)
    finally:
        watcher.stop()


def test_a_cursors_change_wakes_one_waiting_consumer_per_shard_not_all_of_them() -> None:
    """A publish to a topic marks one shard of each cursor: it wakes one of the subscription's waiting consumer
    threads, as a queue's publish does, not every one of them (all of them claimed at once, all but one came back
    empty, and the crowd slowed each call threefold on a real server, measured)."""
    main, cursor = ShardActivity(), ShardActivity()
    cursor.wake_with(main)
    woken: list[bool] = []
    seen = main.changes
    waiters = [threading.Thread(target=lambda: woken.append(main.wait(seen, 10.0))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: main.waiting == 3)
    cursor.mark_one(0)
    wait_until(lambda: len(woken) == 1)
    time.sleep(0.2)  # (a wake of every waiter would have returned them all by now)
    assert woken == [True] and main.waiting == 2
    cursor.mark([1, 2])  # two shards: two more
    wait_until(lambda: len(woken) == 3)
    for waiter in waiters:
        waiter.join()


def test_the_watcher_vouches_for_a_flowing_magazines_pointers_only_while_its_consumers_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While consumers wait, the watcher reads the pointers every few milliseconds and vouches for what it read
    (`fresh_until`: a subscription's caught-up claim then reads the topic's load pointer no more); once they are all
    busy it reads slowly, and vouches for nothing: their claims read for themselves."""
    monkeypatch.setattr(watch, "HUNGRY_SECONDS", 0.0)
    store = CountingStore()
    main, cursor = ShardActivity(), ShardActivity()
    cursor.wake_with(main)
    watcher = watch.Watcher(store)  # type: ignore[arg-type]
    try:
        main._waiting = 1
        watcher.watch("subs_FROM_feed", 1, cursor)
        wait_until(lambda: "subs_FROM_feed" in watcher._watched and watcher._watched["subs_FROM_feed"].loaded == 0)
        store.loaded["subs_FROM_feed"] = 5  # a publish: the pointers moved
        wait_until(lambda: watcher._watched["subs_FROM_feed"].loaded == 5)
        assert cursor.fresh_until > time.monotonic()
        main._waiting = 0
        wait_until(lambda: watcher._watched["subs_FROM_feed"].busy)
        assert cursor.fresh_until < time.monotonic()
    finally:
        watcher.stop()


def test_a_read_that_began_before_an_invalidate_vouches_for_nothing_and_drops_nothing() -> None:
    """A seek invalidates the handle's activity so that its next fire reads the pointers again. A watcher read that
    began before it and finished after it may show the pointers from before the seek (a shard the seek moved back
    still drained): it adds what it found, drops nothing, and neither it nor the watcher's vouching makes the fire
    skip its own read (a message was not delivered after a seek, 2 runs in 36)."""
    activity = ShardActivity()
    activity.replace([1], activity.before_read())  # a drained shard 0: not listed
    seen = activity.before_read()  # a watcher read begins
    activity.invalidate()  # a seek moved the cursor of shard 0 back
    activity.mark([0])  # (what the fire's own read would find)
    activity.replace([1, 2], seen)  # the stale read lands
    activity.vouch(time.monotonic() + 60.0, seen)
    assert set(activity.active) == {0, 1, 2} and activity.refresh_due(1.0)
    fresh = activity.before_read()
    activity.replace([2], fresh)  # a read after the invalidate is the truth again
    activity.vouch(time.monotonic() + 60.0, fresh)
    assert activity.active == (2,) and not activity.refresh_due(1.0)
