"""`ignis up --demo`: the whole system on the embedded default, showing every path a message can take.

On a running `EmbeddedStack` (manifest sync, sweeper, probes) it:
1. writes the queue's IgnisQueue manifest into a directory the stack syncs (the operator's path);
2. publishes N messages;
3. lets a consumer take the first few messages and vanish without acking, as a crashed pod would;
4. runs a push consumer whose handler fails some messages on their first delivery (rejects or
   raises: they are sidelined), always fails a few (dead-lettered after maxDeliveries) and acks the rest;
5. waits while the sweeper re-homes the abandoned messages (sweep → sideline) and shovels every
   sidelined message back to main for redelivery, until each message is acked or dead-lettered;
6. reports the journey, and how many messages were lost (the answer must be 0).

sweepDuration cannot be shorter than 300 s, so the stack's sweeper runs with its clock
`SWEEP_AHEAD_SECONDS` ahead: a claim older than a few real seconds looks 5 minutes old to it. That is
the only thing the demo bends; every store operation is the real one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ignis.client import Ignis
from ignis.consumer import Consumer
from ignis.errors import IgnisError, InvalidInputError, QueueNotFound
from ignis.queue import Message, QueueStats
from ignis.spec import QueueSpec

QUEUE = "up-demo"
SWEEP_DURATION_SECONDS = 300  # the smallest a queue may declare
ABANDON_AFTER_SECONDS = 3  # how old (in real time) a claim must be before the demo's sweeper moves it
SWEEP_AHEAD_SECONDS = SWEEP_DURATION_SECONDS - ABANDON_AFTER_SECONDS
MAX_DELIVERIES = 3
ABANDONED = 10  # messages taken by the consumer that "crashes"
PUBLISH_CHUNK = 50


class DemoFailure(Exception):
    """What the demo handler raises on purpose (sidelined with reason `exception`)."""


def demo_manifest() -> dict[str, Any]:
    return QueueSpec.build(
        name=QUEUE, handlerType=QUEUE, shards=4, concurrency=4, sweepDurationSeconds=SWEEP_DURATION_SECONDS,
        shovel={"concurrency": 2, "intervalSeconds": 1}, maxDeliveries=MAX_DELIVERIES, deletionPolicy="Delete",
        messageExpirySeconds=3600, queueExpirySeconds=86400,
    ).to_manifest()


def planned(n: int, attempt: int) -> bool | None:
    """The handler's verdict for message `n` on delivery `attempt`: True = ack, False = reject,
    None = raise. n % 50 == 49 always fails (→ dead letters); n % 10 == 7 is rejected and
    n % 25 == 13 raises on its first delivery only (→ sideline → shovel → delivered again)."""
    if n % 50 == 49:
        return False
    if attempt == 1 and n % 10 == 7:
        return False
    if attempt == 1 and n % 25 == 13:
        return None
    return True


@dataclass
class JourneyResult:
    published: int
    abandoned: int  # taken by the consumer that vanished
    first_delivery_failed: int  # sidelined by the handler on a first delivery
    swept: int  # re-homed by the sweeper (from the queue record's sweptCounter)
    redelivered: int  # deliveries with attempt > 1 (came back through the shovel)
    acked: int  # distinct messages acked
    dead_lettered: int  # distinct messages in q_DEAD
    lost: int  # neither acked nor dead-lettered
    duplicates: int  # extra acks of an already acked message (at-least-once allows them)
    stats: QueueStats
    elapsed_seconds: float
    finished: bool

    def as_dict(self) -> dict[str, Any]:
        return {"queue": QUEUE, "published": self.published, "abandoned": self.abandoned,
                "firstDeliveryFailed": self.first_delivery_failed, "swept": self.swept,
                "redelivered": self.redelivered, "acked": self.acked, "deadLettered": self.dead_lettered,
                "lost": self.lost, "duplicates": self.duplicates, "finished": self.finished,
                "elapsedSeconds": round(self.elapsed_seconds, 3), "stats": self.stats.as_dict()}


class _Tally:
    """What the handler saw, shared by the consumer's worker threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: set[int] = set()
        self.duplicates = 0
        self.first_failed = 0
        self.redelivered = 0

    def record(self, n: int, attempt: int, verdict: bool | None) -> None:
        with self.lock:
            self.redelivered += attempt > 1
            if verdict is True:
                self.duplicates += n in self.acked
                self.acked.add(n)
            elif attempt == 1:
                self.first_failed += 1


def run_journey(ignis: Ignis, manifest_dir: Path, messages: int = 200, *, timeout: float = 120.0,
                on_published: Callable[[int], None] | None = None,
                on_settled: Callable[[int], None] | None = None) -> JourneyResult:
    """Run the demo on a store that an `EmbeddedStack` syncing `manifest_dir` (and sweeping with its
    clock SWEEP_AHEAD_SECONDS ahead) is running on. `on_settled(k)` reports messages acked or
    dead-lettered so far, for a progress bar."""
    if messages < ABANDONED:
        raise InvalidInputError(f"messages={messages}: the demo needs at least {ABANDONED}")
    started = time.monotonic()
    with contextlib.suppress(QueueNotFound):  # a fresh queue, so the counts are this run's only
        ignis.delete_queue(QUEUE)
    (manifest_dir / f"{QUEUE}.yaml").write_text(yaml.safe_dump(demo_manifest(), sort_keys=False), encoding="utf-8")
    queue = _wait_for_queue(ignis, timeout=30)

    for start in range(0, messages, PUBLISH_CHUNK):
        queue.publish_many([{"n": n} for n in range(start, min(start + PUBLISH_CHUNK, messages))])
        if on_published:
            on_published(min(PUBLISH_CHUNK, messages - start))

    # The consumer that crashes: it takes messages and is never heard of again.
    abandoned = len(queue.fire_many(ABANDONED))

    tally = _Tally()
    consumer = Consumer(ignis, queues=[QUEUE], poll_interval=0.05)

    @consumer.handler(QUEUE)
    def handle(message: Message) -> bool:
        n, attempt = int(message.payload["n"]), message.envelope.attempts
        verdict = planned(n, attempt)
        tally.record(n, attempt, verdict)
        if verdict is None:
            raise DemoFailure(f"demo failure for message {n}")
        return verdict

    consumer_log = logging.getLogger("ignis.consumer")  # handler failures are the point here, not warnings
    level = consumer_log.level
    consumer_log.setLevel(logging.ERROR)
    consumer.start()
    try:
        finished = False
        while time.monotonic() - started < timeout:
            dead = _dead_numbers(queue, messages)
            with tally.lock:
                settled = len(tally.acked | dead)
            if on_settled:
                on_settled(settled)
            if settled == messages:
                finished = True
                break
            time.sleep(0.2)
    finally:
        consumer.stop()
        consumer_log.setLevel(level)

    dead = _dead_numbers(queue, messages)
    record = ignis.record(QUEUE)
    return JourneyResult(
        published=messages, abandoned=abandoned, first_delivery_failed=tally.first_failed,
        swept=int(record.bins.get("sweptCounter", 0)), redelivered=tally.redelivered, acked=len(tally.acked),
        dead_lettered=len(dead), lost=messages - len(tally.acked | dead), duplicates=tally.duplicates,
        stats=queue.stats(in_flight=True), elapsed_seconds=time.monotonic() - started, finished=finished)


def _wait_for_queue(ignis: Ignis, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ignis.queue(QUEUE)
        except IgnisError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def _dead_numbers(queue: Any, limit: int) -> set[int]:
    return {int(env.decoded()["n"]) for _, env in queue.dead.browse(limit=limit)}
