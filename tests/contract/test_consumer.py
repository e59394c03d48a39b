"""Contract: push consumers — handler outcomes, batching (IgnisMQ §1.6), timeouts, graceful stop —
and the copy-then-delete rule under fault injection."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from ignis import Consumer, Ignis, QueueSpec
from ignis.consumer import Handler
from ignis.storage import Storage


class FaultyStore:
    """Wraps a real store: records the order of loads and deletes, and can refuse loads to one magazine."""

    def __init__(self, inner: Storage, refuse_loads_to: str | None = None) -> None:
        self._inner = inner
        self.refuse_loads_to = refuse_loads_to
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def load(self, magazine, items, ttl_seconds):
        if magazine == self.refuse_loads_to:
            raise OSError(f"injected failure loading into {magazine}")
        refs = self._inner.load(magazine, items, ttl_seconds)
        self.calls.append(("load", magazine))
        return refs

    def delete(self, refs, versions=None, ids=None):
        self.calls.append(("delete", ",".join(sorted({r.magazine for r in refs}))))
        return self._inner.delete(refs, versions, ids)


def declare(ignis: Ignis, **fields: Any):
    fields.setdefault("name", "jobs")
    fields.setdefault("handlerType", "jobs")
    fields.setdefault("shards", 2)
    ignis.apply(QueueSpec.build(**fields))
    return ignis.queue(fields["name"])


def test_handler_outcomes(ignis: Ignis) -> None:
    q = declare(ignis, concurrency=3)
    q.publish_many(range(40))
    consumer = Consumer(ignis, poll_interval=0.05)

    @consumer.handler("jobs", ignorable=(KeyError,))
    def handle(message):
        n = message.payload
        if n % 4 == 1:
            return False
        if n % 4 == 2:
            raise RuntimeError("boom")
        if n % 4 == 3:
            raise KeyError("ignorable")
        return None  # None acks, like True

    assert consumer.drain(timeout=20)
    assert consumer.outcomes == {"acked": 10, "sidelined": 20, "ignored": 10}
    reasons = sorted((e.reason, e.decoded() % 4) for _, e in q.sideline.browse(100))
    assert reasons == [("exception", 2)] * 10 + [("rejected", 1)] * 10
    stats = q.stats()
    assert (stats.depth, stats.sidelined) == (0, 20)
    assert q.store.peek("jobs", 0, 1, 100) == [] and q.store.peek("jobs", 1, 1, 100) == []


def test_failed_handler_sidelines_only_after_the_copy(backend) -> None:
    store = FaultyStore(backend.open())
    with Ignis(store) as ignis:
        q = declare(ignis)
        q.publish("x")
        consumer = Consumer(ignis)
        consumer.register("jobs", lambda m: False)
        assert consumer.run_once(q, consumer._handlers["jobs"])
        deletes = [i for i, call in enumerate(store.calls) if call == ("delete", "jobs")]
        assert deletes == [store.calls.index(("load", "jobs_SIDELINE")) + 1]  # one delete, right after the copy


def test_refused_sideline_keeps_the_original(backend) -> None:
    store = FaultyStore(backend.open(), refuse_loads_to="jobs_SIDELINE")
    with Ignis(store) as ignis:
        q = declare(ignis, shards=1)
        ref = q.publish("keep me")
        consumer = Consumer(ignis)
        consumer.register("jobs", lambda m: False)
        consumer.run_once(q, consumer._handlers["jobs"])
        assert consumer.outcomes == {"sideline-refused": 1}
        [kept] = store.read([ref.ref])
        assert kept is not None and kept.payload == b"keep me" and kept.fire_ts is not None
        assert ("delete", "jobs") not in store.calls


def test_one_refused_group_does_not_block_the_other(backend) -> None:
    store = FaultyStore(backend.open(), refuse_loads_to="jobs_DEAD")
    with Ignis(store) as ignis:
        q = declare(ignis, shards=1, maxDeliveries=1)
        q.publish("dead on first failure")
        m = q.fire()
        result = q.nack([m], "rejected")
        assert (result.sidelined, result.dead_lettered, result.refused) == (0, 0, 1)
        assert store.read([m.ref])[0] is not None


def test_unreadable_payload_is_sidelined_without_calling_the_handler(ignis: Ignis) -> None:
    q = declare(ignis, shards=1)
    q.store.load("jobs", [(0, q.envelope({"ok": 1}))], 60)
    bad = q.envelope("x")
    bad.codec, bad.payload = "json", b"{not json"
    q.store.load("jobs", [(0, bad)], 60)
    q.main.invalidate()
    seen: list[Any] = []
    consumer = Consumer(ignis)
    consumer.register("jobs", seen.append)
    consumer.run_once(q, consumer._handlers["jobs"])
    assert seen and [m.payload for m in seen] == [{"ok": 1}]
    assert [e.reason for _, e in q.sideline.browse()] == ["unreadable"]


def test_timeout_sidelines_and_is_never_ignorable(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, handlerTimeoutSeconds=1)
    q.publish("slow")
    release = threading.Event()
    consumer = Consumer(ignis)
    consumer.register("jobs", lambda m: release.wait(10), ignorable=(Exception,))
    started = time.monotonic()
    consumer.run_once(q, consumer._handlers["jobs"])
    release.set()
    assert time.monotonic() - started < 8
    assert consumer.outcomes == {"sidelined": 1}
    assert [e.reason for _, e in q.sideline.browse()] == ["timeout"]
    consumer.stop(5)


def test_a_worker_calls_its_handler_on_its_own_thread(ignis: Ignis) -> None:
    # No hand-off to a pool thread and back per message (ignis.deadlines: half of a consumer's thread switches).
    q = declare(ignis, shards=1, concurrency=2)
    q.publish_many(range(4))
    threads: list[str] = []
    consumer = Consumer(ignis, poll_interval=0.05)
    consumer.register("jobs", lambda m: threads.append(threading.current_thread().name))
    assert consumer.drain(timeout=20)
    assert len(threads) == 4 and all(name.startswith("ignis-consumer-jobs-") for name in threads), threads


def test_a_worker_stuck_past_its_timeout_is_replaced_and_its_late_outcome_dropped(ignis: Ignis) -> None:
    # The stuck call's message is sidelined at its timeout while the handler still runs; another worker takes
    # the stuck one's place (concurrency 1: nothing else would consume); the handler's late return acks nothing.
    q = declare(ignis, shards=1, concurrency=1, handlerTimeoutSeconds=1)
    q.publish("stuck")
    release, entered = threading.Event(), threading.Event()
    handled: list[Any] = []
    consumer = Consumer(ignis, poll_interval=0.05)

    def handle(message):
        if message.payload == "stuck":
            entered.set()
            assert release.wait(30)
            return True  # (too late: its timeout sidelined it)
        handled.append(message.payload)

    consumer.register("jobs", handle)
    consumer.start()
    try:
        assert entered.wait(10)
        deadline = time.monotonic() + 15
        while not list(q.sideline.browse()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [e.reason for _, e in q.sideline.browse()] == ["timeout"]
        q.publish_many(["after", "the", "timeout"])
        while len(handled) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(handled) == ["after", "the", "timeout"]  # consumed while the first handler is still stuck
        assert not release.is_set()
        release.set()
        time.sleep(0.3)  # the stuck worker returns, drops its outcome and stops
    finally:
        consumer.stop(10)
    assert consumer.outcomes == {"sidelined": 1, "acked": 3}
    assert [e.reason for _, e in q.sideline.browse()] == ["timeout"]
    assert consumer._busy == 0


def test_a_handler_that_outlasts_the_stop_but_not_its_timeout_is_still_acked(ignis: Ignis) -> None:
    # stop() gives up waiting after its own timeout; the handler, well inside the queue's, finishes later and its
    # outcome counts (a stop replaces the consumer's deadlines: the call ends with the ones it began with).
    q = declare(ignis, shards=1, concurrency=1, handlerTimeoutSeconds=30)
    q.publish("slow")
    entered, finished = threading.Event(), threading.Event()
    consumer = Consumer(ignis, poll_interval=0.05)

    def slow(message):
        entered.set()
        time.sleep(1.0)
        finished.set()

    consumer.register("jobs", slow)
    consumer.start()
    assert entered.wait(10)
    assert consumer.stop(timeout=0.2) is False  # the worker is still in its handler
    assert finished.wait(10)
    deadline = time.monotonic() + 10
    while not consumer.outcomes and time.monotonic() < deadline:  # (counted once the store took the ack)
        time.sleep(0.05)
    assert consumer.outcomes == {"acked": 1}
    assert q.stats().consumed == 1 and not list(q.sideline.browse())


def test_handler_timeout_is_capped_at_half_the_sweep_duration() -> None:
    spec = QueueSpec.build(name="q", handlerType="h", handlerTimeoutSeconds=1800, sweepDurationSeconds=600)
    assert spec.effective_handler_timeout_seconds == 300


# ---- batching -------------------------------------------------------------------------------------
def batch_consumer(ignis: Ignis) -> tuple[Consumer, list[list[Any]], Handler]:
    consumer = Consumer(ignis)
    batches: list[list[Any]] = []
    consumer.register("jobs", batch=lambda ms: batches.append(sorted(m.payload for m in ms)))
    return consumer, batches, consumer._handlers["jobs"]


def test_backlog_of_five_at_size_two_gives_2_2_1(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 2, "maxWaitSeconds": 1})
    q.publish_many(range(5))
    consumer, batches, handler = batch_consumer(ignis)
    consumer.run_once(q, handler)
    assert batches == [[0, 1], [2, 3], [4]]
    assert q.stats().depth == 0 and q.store.peek("jobs", 0, 1, 5) == []


def test_full_batch_is_handed_over_without_waiting(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 3, "maxWaitSeconds": 30})
    q.publish_many(range(3))
    consumer = Consumer(ignis)
    handed: list[float] = []
    started = time.monotonic()
    consumer.register("jobs", batch=lambda ms: handed.append(time.monotonic() - started))
    consumer.run_once(q, consumer._handlers["jobs"])
    assert len(handed) == 1 and handed[0] < 10  # far below the 30 s linger


def test_partial_batch_is_flushed_at_max_wait_time(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 10, "maxWaitSeconds": 1})
    q.publish_many(range(4))
    consumer, batches, handler = batch_consumer(ignis)
    started = time.monotonic()
    consumer.run_once(q, handler)
    elapsed = time.monotonic() - started
    assert batches == [[0, 1, 2, 3]]
    assert elapsed >= 0.9  # it lingered for more messages until maxWaitTime


def test_idle_batching_consumer_never_lingers(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 10, "maxWaitSeconds": 5})
    consumer, batches, handler = batch_consumer(ignis)
    started = time.monotonic()
    assert consumer.run_once(q, handler) is False
    assert batches == [] and time.monotonic() - started < 4


def test_rejected_batch_sidelines_the_whole_batch(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 3, "maxWaitSeconds": 1})
    q.publish_many(range(7))
    consumer = Consumer(ignis)
    consumer.register("jobs", batch=lambda ms: 5 not in [m.payload for m in ms])
    consumer.run_once(q, consumer._handlers["jobs"])
    assert sorted(e.decoded() for _, e in q.sideline.browse()) == [3, 4, 5]
    assert consumer.outcomes == {"acked": 4, "sidelined": 3}


# ---- lifecycle ------------------------------------------------------------------------------------
def test_graceful_stop_finishes_messages_in_hand(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, concurrency=1)
    q.publish_many(range(3))
    entered = threading.Event()
    done: list[int] = []
    consumer = Consumer(ignis, poll_interval=0.05)

    def slow(message):
        entered.set()
        time.sleep(0.5)
        done.append(message.payload)

    consumer.register("jobs", slow)
    consumer.start()
    assert entered.wait(10)
    assert consumer.stop(timeout=10) is True
    assert done and done == list(range(len(done)))
    stats = q.stats()
    assert stats.consumed == len(done)  # nothing claimed and abandoned by the stop
    assert stats.depth == 3 - len(done)


def test_graceful_stop_hands_out_what_the_workers_claimed_for_each_other(ignis: Ignis, monkeypatch) -> None:
    # Workers of one queue prefetch for each other (Magazine.fire); a stop must not leave those claimed
    # messages to the sweeper: the stopping workers handle them, and claim nothing new.
    from ignis.magazine import prefetch as magazine_module

    monkeypatch.setattr(magazine_module, "CONSUMER_RECENT_SECONDS", 60.0)  # every worker counts, however slow
    q = declare(ignis, shards=1, concurrency=4)
    q.publish_many(range(40))
    gate, entered = threading.Event(), threading.Semaphore(0)
    done: list[int] = []
    lock = threading.Lock()
    consumer = Consumer(ignis, poll_interval=0.05)

    def held(message):
        entered.release()
        assert gate.wait(10)
        with lock:
            done.append(message.payload)

    consumer.register("jobs", held)
    consumer.start()
    for _ in range(4):
        assert entered.acquire(timeout=10)  # every worker holds one message
    claimed = 40 - q.stats().depth
    assert claimed > 4  # and the handle keeps more, claimed for the workers' next fires
    stopping = threading.Thread(target=lambda: consumer.stop(timeout=20))
    stopping.start()
    time.sleep(0.1)  # the stop is under way
    gate.set()
    stopping.join(20)
    stats = q.stats()
    assert len(done) == len(set(done)) == stats.consumed  # every message claimed was handled, once
    assert stats.depth == 40 - stats.consumed


def test_consumer_follows_registry_changes(ignis: Ignis) -> None:
    declare(ignis, concurrency=2)
    consumer = Consumer(ignis, refresh_interval=60)
    consumer.register("jobs", lambda m: True)
    consumer.start()
    try:
        assert len(consumer._running["jobs"].workers) == 2
        declare(ignis, concurrency=5)
        consumer.refresh()
        assert len(consumer._running["jobs"].workers) == 5
        ignis.deactivate("jobs")
        consumer.refresh()
        assert "jobs" not in consumer._running
    finally:
        assert consumer.stop(10)


def test_queues_without_a_registered_handler_are_left_alone(ignis: Ignis) -> None:
    q = declare(ignis, handlerType="someone-else")
    q.publish("not mine")
    consumer = Consumer(ignis)
    consumer.register("jobs", lambda m: True)
    assert consumer.drain(timeout=5)
    assert q.stats().depth == 1


@pytest.mark.parametrize("concurrency", [0])
def test_publish_only_queue_runs_no_workers(ignis: Ignis, concurrency: int) -> None:
    q = declare(ignis, concurrency=concurrency)
    q.publish("waiting")
    consumer = Consumer(ignis)
    consumer.register("jobs", lambda m: True)
    consumer.start()
    try:
        assert consumer._running["jobs"].workers == []
    finally:
        consumer.stop(5)
    assert q.stats().depth == 1


class FailingDeletes(FaultyStore):
    def __init__(self, inner: Storage, failures: int) -> None:
        super().__init__(inner)
        self.failures = failures

    def delete(self, refs, versions=None, ids=None):
        if self.failures:
            self.failures -= 1
            raise OSError("injected delete failure")
        return super().delete(refs, versions, ids)


def test_a_failed_ack_can_be_retried(backend) -> None:
    from ignis.errors import AlreadySettled

    store = FailingDeletes(backend.open(), failures=1)
    with Ignis(store) as ignis:
        q = declare(ignis, shards=1)
        q.publish_many(["a", "b"])
        first, second = q.fire_many(2)
        with pytest.raises(OSError):
            first.ack()
        assert not first.settled and store.read([first.ref])[0] is not None
        first.ack()
        assert first.settled and store.read([first.ref]) == [None]
        with pytest.raises(AlreadySettled):
            q.ack([second, first])  # one settled message: nothing in the batch changes
        assert not second.settled and store.read([second.ref])[0] is not None


def test_a_stopped_consumer_can_start_again(ignis: Ignis) -> None:
    q = declare(ignis, shards=1)
    consumer = Consumer(ignis, poll_interval=0.05)
    consumer.register("jobs", lambda m: True)
    q.publish("first")
    assert consumer.drain(timeout=10)
    q.publish("second")
    assert consumer.drain(timeout=10)
    assert consumer.outcomes == {"acked": 2}
