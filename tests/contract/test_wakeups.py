"""Wake-ups (issue 27): a consumer learns of a message within milliseconds, not on a periodic refresh;
whichever handle or process published it; and an idle consumer stays idle.

Bounds here are generous (a shared CI machine): delivery well inside the old one-second refresh. The latency
figures themselves come from bench/bench_latency.py, never from timed tests. Cross-process cases need a store
that two processes can share: lmdb, or a real Aerospike server (IGNIS_TEST_AEROSPIKE); the emulator lives in
this process."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ignis import Consumer, Ignis
from ignis.envelope import now_ms
from ignis.storage.base import SlotRef
from ignis.watch import IDLE_POLL_SECONDS

WORKER = str(Path(__file__).resolve().parent.parent / "support" / "proc_worker.py")
BOUND_S = 0.25  # "well inside the old 1 s refresh"
COUNT, EVERY_S = 30, 0.05  # messages another process publishes, one every EVERY_S seconds


def cross_process(backend: Any) -> None:
    if backend.name == "aerospike-emu":
        pytest.skip("the Aerospike emulator lives in this process; cross-process wake-ups need a real server")


def storage_calls() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)


class Latencies:
    """A push consumer's handler: publish-to-handler time of each message (the publisher's loadedAt)."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self.arrived = threading.Event()

    def __call__(self, message: Any) -> None:
        self.seen.append(time.time() - message.envelope.loaded_at / 1000)
        self.arrived.set()

    def wait_for(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.seen) >= count, f"{len(self.seen)} of {count} delivered in {timeout} s"


def consumer_on(ignis: Ignis, latencies: Latencies) -> Consumer:
    consumer = Consumer(ignis, queues=["wake"])  # the default poll interval: waits are woken, not polled
    consumer.register("wake", latencies)
    consumer.start()
    return consumer


def test_a_publish_through_another_handle_wakes_a_waiting_consumer_at_once(backend: Any, make_queue: Any) -> None:
    """Handles of one store location (lmdb: one environment) share the shard activity: every message wakes the
    consumer at once. Two Aerospike connections of a process are two locations (Storage.location): each learns of
    the other's publishes through its watcher, as from another process, so the first message may wait out the
    idle beacon interval (the consumer idled 1.5 s, IDLE_AFTER_SECONDS: its watcher may have gone idle just
    before the first publish, seen once in 20 runs on a busy machine) and the queue flows from then on."""
    make_queue("wake", shards=8, concurrency=2)
    latencies = Latencies()
    with backend.ignis() as theirs:  # another Ignis, its own Queue objects: only the process is shared
        consumer = consumer_on(theirs, latencies)
        try:
            time.sleep(1.5)  # idle: every worker waits
            with backend.ignis() as mine:
                shared = mine.store.location == theirs.store.location
                queue = mine.queue("wake")
                start = time.monotonic()
                for i in range(COUNT):
                    time.sleep(max(0.0, start + i * EVERY_S - time.monotonic()))
                    queue.publish(b"x")
            latencies.wait_for(COUNT, 10)
        finally:
            consumer.stop()
    if shared:
        assert max(latencies.seen) < BOUND_S, latencies.seen
        return
    assert latencies.seen[0] < IDLE_POLL_SECONDS + BOUND_S, latencies.seen
    flowing = int((IDLE_POLL_SECONDS + BOUND_S) / EVERY_S) + 1
    assert max(latencies.seen[flowing:]) < BOUND_S, latencies.seen


def test_a_publish_by_another_process_wakes_a_waiting_consumer(backend: Any, make_queue: Any) -> None:
    cross_process(backend)
    make_queue("wake", shards=8, concurrency=2)
    latencies = Latencies()
    with backend.ignis() as ignis:
        consumer = consumer_on(ignis, latencies)
        try:
            time.sleep(2.0)  # idle long enough for a poller to have slowed down to its idle pace
            proc = subprocess.run([sys.executable, WORKER, "publish-every", backend.url, "wake", str(COUNT),
                                   str(EVERY_S)], capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            latencies.wait_for(COUNT, 10)
        finally:
            consumer.stop()
    if backend.name == "lmdb":  # the doorbell: every message, the first one too
        assert max(latencies.seen) < BOUND_S, latencies.seen
        return
    # Polling: the queue was idle, so its first message waits out at most the idle beacon interval, and so may
    # those published meanwhile; from then on the queue flows, and every message is seen within milliseconds.
    assert latencies.seen[0] < IDLE_POLL_SECONDS + BOUND_S, latencies.seen
    flowing = int((IDLE_POLL_SECONDS + BOUND_S) / EVERY_S) + 1
    assert max(latencies.seen[flowing:]) < BOUND_S, latencies.seen


def test_fire_sees_a_message_published_by_another_process(backend: Any, make_queue: Any) -> None:
    cross_process(backend)
    queue = make_queue("wake", shards=8)
    assert queue.fire() is None  # nothing yet: from now on the process's watcher follows the queue
    proc = subprocess.Popen([sys.executable, WORKER, "publish-every", backend.url, "wake", "1", "0.2"],
                            stdout=subprocess.PIPE, text=True)
    message = queue.fire(timeout=10)
    fired_at = time.time()  # (before the child's exit: under load that alone took 0.3-0.9 s, and was counted)
    proc.wait(30)
    assert message is not None
    waited = fired_at - message.envelope.loaded_at / 1000
    assert waited < BOUND_S, waited
    message.ack()
    assert queue.fire_many(10, timeout=0.2) == []  # waits out its timeout, then says there is nothing


def test_a_pointer_read_between_a_ring_and_its_commit_does_not_hide_the_message(backend: Any, make_queue: Any
                                                                               ) -> None:
    """lmdb: another process rings the doorbell before its commit, so a read of the pointers made between the two
    (the watcher's, or a fire's refresh) sees no work in that shard. The shard stays listed anyway: the next
    fire claims it at once (a claim's write lock waits such a commit out), not at the next read of the pointers
    (the watcher's safety poll: 30 s). (It dropped it: 1 run in 5 of this file, on a busy machine, delivered
    the message 0.3-1.1 s late, when a pointer read fell into that gap.)"""
    cross_process(backend)
    if backend.name != "lmdb":
        pytest.skip("a doorbell's ring-then-commit is lmdb's")
    from ignis.activity import activity_for

    queue = make_queue("held", shards=1)
    assert queue.fire() is None  # the watcher follows the queue, and this process listens for rings of it
    time.sleep(0.3)  # (the watcher's first reads of it are done)
    activity = activity_for(queue.store.location, queue.store.client_id, queue.main.name)
    assert activity.active == ()
    child = subprocess.Popen([sys.executable, WORKER, "publish-held", backend.url, "held", "1", "x"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "rang\n"  # its commit waits for us
        deadline = time.monotonic() + 10
        while activity.active != (0,):
            assert time.monotonic() < deadline, "the ring never arrived"
            time.sleep(0.005)
        # A read of the pointers now, as the watcher makes one: the commit is not there yet.
        seen = activity.before_read()
        [(with_work, _)] = queue.store.watch_pointers([(queue.main.name, 1)])
        assert with_work == []
        activity.replace(with_work, seen)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().startswith("published ")
    finally:
        child.wait(30)
    message = queue.fire()  # no wait, no pointer read of its own (the watcher vouches for the set it read)
    assert message is not None and message.payload == "x"
    message.ack()


def test_an_idle_consumer_stays_idle(backend: Any, make_queue: Any) -> None:
    queues = 20
    for i in range(queues):
        make_queue(f"idle{i}", handlerType="idle", shards=8, concurrency=2)
    with backend.ignis() as ignis:
        consumer = Consumer(ignis)
        consumer.register("idle", lambda m: None)
        consumer.start()
        try:
            time.sleep(4.0)  # settled: the watcher at its idle pace
            calls, started = storage_calls(), time.monotonic()
            time.sleep(4.0)
            per_queue_per_s = (storage_calls() - calls) / (time.monotonic() - started) / queues
        finally:
            consumer.stop()
    assert per_queue_per_s <= 2.0, per_queue_per_s  # the bound for an idle queue


def test_a_wait_longer_than_the_watchers_follow_keeps_the_queue_followed(
        backend: Any, make_queue: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A consumer's poll interval or a fire timeout may be longer than the watcher and the delay mover follow a
    # magazine after a consumer looked in it: a wait renews that, or a publish elsewhere would go unseen.
    import ignis.delay
    import ignis.watch
    monkeypatch.setattr(ignis.watch, "KEEP_WATCHING_SECONDS", 0.4)
    monkeypatch.setattr(ignis.delay, "KEEP_FOLLOWING_SECONDS", 0.4)
    queue = make_queue("wake", shards=4)
    main = queue.main
    ages: list[float] = []
    waiting = threading.Thread(target=main.wait_for_work, args=(main.changes, 1.5))
    waiting.start()
    time.sleep(0.1)
    watcher, mover = ignis.watch.watcher_for(queue.store), ignis.delay.mover_for(queue.store)
    assert watcher is not None and mover is not None
    while waiting.is_alive():
        now = time.monotonic()
        watched, followed = watcher._watched.get(main.name), mover._followed.get(main.name)  # (None: dropped)
        ages += [now - (watched.touched if watched else -math.inf), now - (followed.touched if followed else -math.inf)]
        time.sleep(0.05)
    assert max(ages) < 0.4, max(ages)


@pytest.mark.parametrize("fire", ["fire", "fire_many"])
def test_a_waiting_fire_hands_out_a_slot_it_claimed_before_its_record_landed(backend: Any, make_queue: Any,
                                                                              fire: str) -> None:
    """A fire(timeout=) that claimed a slot whose publisher has not written it yet (two-step stores) re-reads
    it on the awaited schedule, as a push consumer's worker does: the message comes soon after it lands, not
    at the end of the timeout. (A landing moves no pointer, so no wake-up comes for it.)"""
    queue = make_queue("landing", shards=1)
    store = queue.main.store
    if not store.write_grace_ms:
        pytest.skip("lmdb writes a slot in the transaction that allocates it: nothing is claimed before it lands")
    slot = store.reserve(queue.main.name, 0, 1)  # allocated by a publisher that has not written it yet
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append((getattr(queue, fire)(**(
        {"timeout": 10} if fire == "fire" else {"max_messages": 5, "timeout": 10})), time.monotonic())))
    waiter.start()
    time.sleep(0.5)  # the waiting fire saw the slot (the watcher follows the queue), claimed it, awaits it
    assert not got
    landed = time.monotonic()
    assert store.load_reserved(SlotRef(queue.main.name, 0, slot), b"late", "m-late", now_ms(), 60)
    waiter.join(15)
    result, returned_at = got[0]  # (the time the fire returned, not the thread's end)
    waited = returned_at - landed
    message = result if fire == "fire" else result[0]
    assert message is not None and message.data == b"late"
    assert waited < BOUND_S, waited
