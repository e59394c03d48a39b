"""Budgets of the hot paths, counted, never timed: the guard that keeps a throughput regression from passing unseen.

Speed is measured in bench/ (bench/compare.py runs two revisions alternately); a test that timed it would flake
on a shared machine. What a slowdown is made of can be counted exactly instead:

* the Python function calls (and the calls into C) of one `publish`, one `fire` + `ack`, and one
  `fire_many(100)` + `ack` on lmdb, counted with sys.setprofile in the calling thread. The median of many ops:
  the rare op that also refreshes the active shards or re-reads the doorbell's listing is left out;
* the store calls per message on the Aerospike emulator, counted by the store itself (ignis_storage_calls), with
  the clock the publish reservations size themselves by (ignis.magazine.reservations) made a fixed step per
  look, so the count does not depend on how fast this machine runs.

Each budget is a little above the figure the code has today (in the comment beside it). A thread hand-off, a
new lock, one more helper call or one more store read on a hot path fails here; a change that makes a path
leaner should lower its budget.
"""

from __future__ import annotations

import random
import statistics
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.aerospike_emulator import EmulatedServer

from ignis import Ignis, Queue, QueueSpec
from ignis.magazine import reservations
from ignis.storage.aerospike import context

PAYLOAD = b"x" * 256
# (python calls, C calls) of one op, median of many; today's figures in the comments.
LMDB_BUDGETS: dict[str, dict[str, tuple[int, int]]] = {
    "fast": {  # bench/bench_lmdb.py's setting
        "publish": (16, 32),  # 14, 29
        "fire+ack": (25, 45),  # 22, 41
        "fire_many(100)+ack": (700, 1710),  # 637, 1553
    },
    "fsync": {  # the default
        "publish": (50, 46),  # 45, 42
        "fire+ack": (66, 73),  # 60, 66
        "fire_many(100)+ack": (870, 1105),  # 792, 1003
    },
}
# Store calls per message on the emulator (publish, fire + ack); today's figures in the comments.
EMULATOR_BUDGETS = {
    "publish": 1.1,  # 1.03: an increment reserves the next publishes' slots, each a write
    "fire+ack": 3.1,  # 3.032: a claim, its stamp, an ack (and a claim of a shard just drained, now and then)
    "fire_many(100)+ack": 0.14,  # 0.127: a claim and a stamp per shard's run, one ack per batch
}


def calls_of(op: Callable[[], Any]) -> tuple[int, int]:
    """(Python function calls, calls into C) that `op` makes in this thread."""
    counts = {"call": 0, "c_call": 0}

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        op()
    finally:
        sys.setprofile(None)
    return counts["call"], counts["c_call"]


def median_calls(op: Callable[[], Any], times: int) -> tuple[float, float]:
    counted = [calls_of(op) for _ in range(times)]
    return statistics.median(c[0] for c in counted), statistics.median(c[1] for c in counted)


@pytest.fixture(params=["fast", "fsync"])
def lmdb_queue(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[str, Queue]]:
    with Ignis(f"lmdb://{tmp_path}?durability={request.param}") as ignis:
        ignis.apply(QueueSpec.build(name="budget", handlerType="budget", shards=32))
        yield request.param, ignis.queue("budget")


def test_the_lmdb_hot_paths_stay_within_their_call_budgets(lmdb_queue: tuple[str, Queue]) -> None:
    durability, q = lmdb_queue
    measured = {"publish": median_calls(lambda: q.publish(PAYLOAD), 51)}
    q.publish_many([PAYLOAD] * 3000)

    def fire_and_ack() -> None:
        message = q.fire()
        assert message is not None
        message.ack()

    def fire_many_and_ack() -> None:
        messages = q.fire_many(100)
        assert len(messages) == 100
        q.ack(messages)

    measured["fire+ack"] = median_calls(fire_and_ack, 51)
    measured["fire_many(100)+ack"] = median_calls(fire_many_and_ack, 11)
    over = {path: (got, LMDB_BUDGETS[durability][path]) for path, got in measured.items()
            if got[0] > LMDB_BUDGETS[durability][path][0] or got[1] > LMDB_BUDGETS[durability][path][1]}
    assert not over, f"durability={durability}: (python, C) calls over budget, (measured, budget): {over}"


class SteppingClock:
    """time.monotonic for the reservations: a fixed step per look, whatever this machine's speed."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def storage_calls() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)


def test_the_store_calls_per_message_on_the_emulator_stay_within_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "client_factory", EmulatedServer().client)
    random.seed(44)  # the shards publishes and fires pick: a claim on a shard drained meanwhile is a call too
    # 20 µs between looks: a fast publisher, as in bench_aerospike.py (the reservation then covers the next ones).
    monkeypatch.setattr(reservations, "time", types.SimpleNamespace(monotonic=SteppingClock(20e-6).monotonic))
    n = 1000
    with Ignis("aerospike://emulator:3000/test?farm=budget&client=budget") as ignis:
        ignis.apply(QueueSpec.build(name="one", handlerType="budget", shards=32))
        q = ignis.queue("one")
        before = storage_calls()
        for _ in range(n):
            q.publish(PAYLOAD)
        measured = {"publish": (storage_calls() - before) / n}
        # The fires drain a queue publish_many filled: no reservation left to seal (a timer's calls) meanwhile.
        ignis.apply(QueueSpec.build(name="singles", handlerType="budget", shards=32))
        q = ignis.queue("singles")
        q.publish_many([PAYLOAD] * n)
        before = storage_calls()
        for _ in range(n):
            message = q.fire()
            assert message is not None
            message.ack()
        measured["fire+ack"] = (storage_calls() - before) / n
        ignis.apply(QueueSpec.build(name="batches", handlerType="budget", shards=32))
        batches = ignis.queue("batches")
        batches.publish_many([PAYLOAD] * n)
        before = storage_calls()
        delivered = 0
        while messages := batches.fire_many(100):
            batches.ack(messages)
            delivered += len(messages)
        assert delivered == n
        measured["fire_many(100)+ack"] = (storage_calls() - before) / n
    over = {path: (round(got, 3), EMULATOR_BUDGETS[path]) for path, got in measured.items()
            if got > EMULATOR_BUDGETS[path]}
    assert not over, f"store calls per message over budget, (measured, budget): {over}"
