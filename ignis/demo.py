"""`ignis demo`: the first thing a new user runs. It exercises the whole path on the configured store
(the embedded lmdb default unless told otherwise): declare a queue, publish, consume with a push
`Consumer` whose handler acks most messages and fails some on purpose, then report what happened.

Which messages fail is decided by the message number alone, so every run gives the same counts.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ignis.client import Ignis
from ignis.consumer import Consumer
from ignis.errors import InvalidInputError, QueueNotFound
from ignis.queue import EXCEPTION, REJECTED, Message, QueueStats
from ignis.spec import QueueSpec

DEMO_QUEUE = "demo"
DEMO_HANDLER_TYPE = "demo"
PUBLISH_CHUNK = 50  # small enough for a progress bar that moves, large enough for few group commits
FIRST_SIDELINED = 5
ACKED = "acked"


class DemoFailure(Exception):
    """What the demo handler raises on purpose (sidelined with reason `exception`)."""


def demo_spec() -> QueueSpec:
    return QueueSpec.build(name=DEMO_QUEUE, handlerType=DEMO_HANDLER_TYPE, shards=4, concurrency=4,
                           maxDeliveries=3)


def planned_outcome(n: int) -> str:
    """What the handler does with message number `n`: every 10th (n % 10 == 7) is rejected, every 25th
    (n % 25 == 13) raises; the two sets never overlap (n mod 5 is 2 for one, 3 for the other)."""
    if n % 10 == 7:
        return REJECTED
    if n % 25 == 13:
        return EXCEPTION
    return ACKED


def demo_payload(n: int) -> dict[str, Any]:
    return {"n": n, "item": f"demo-{n:05d}", "amount": round(n * 1.25, 2), "note": "héllo ✓"}


@dataclass
class DemoResult:
    queue: str
    published: int
    outcomes: dict[str, int]  # Consumer.outcomes: acked / sidelined / dead-lettered / ...
    sidelined_by_reason: dict[str, int]
    dead_by_reason: dict[str, int]
    first_sidelined: list[dict[str, Any]]
    stats: QueueStats
    drained: bool
    elapsed_seconds: float
    expected: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        o = self.outcomes
        return {
            "queue": self.queue,
            "published": self.published,
            "delivered": sum(o.values()),
            "acked": o.get("acked", 0),
            "sidelined": o.get("sidelined", 0),
            "sidelinedByReason": self.sidelined_by_reason,
            "deadLettered": o.get("dead-lettered", 0),
            "deadByReason": self.dead_by_reason,
            "ignored": o.get("ignored", 0),
            "sidelineRefused": o.get("sideline-refused", 0),
            "expected": self.expected,
            "drained": self.drained,
            "elapsedSeconds": round(self.elapsed_seconds, 3),
            "firstSidelined": self.first_sidelined,
            "stats": self.stats.as_dict(),
        }


def run_demo(ignis: Ignis, messages: int = 200, *, on_published: Callable[[int], None] | None = None,
             on_handled: Callable[[], None] | None = None, timeout: float = 60.0) -> DemoResult:
    """Run the demo end to end on `ignis`'s store and return what happened.

    `on_published(n)` is called after each publish chunk of n messages and `on_handled()` after each
    handler call, for progress bars. The `demo` queue is deleted first if it exists, so the counts
    of one run never include an earlier one."""
    if messages < 1:
        raise InvalidInputError(f"messages={messages}: must be at least 1")
    started = time.monotonic()
    with contextlib.suppress(QueueNotFound):
        ignis.delete_queue(DEMO_QUEUE)
    ignis.apply(demo_spec())
    queue = ignis.queue(DEMO_QUEUE)

    for start in range(0, messages, PUBLISH_CHUNK):
        chunk = [demo_payload(n) for n in range(start, min(start + PUBLISH_CHUNK, messages))]
        queue.publish_many(chunk)
        if on_published:
            on_published(len(chunk))

    consumer = Consumer(ignis, queues=[DEMO_QUEUE], poll_interval=0.05)

    @consumer.handler(DEMO_HANDLER_TYPE)
    def handle(message: Message) -> bool:
        try:
            outcome = planned_outcome(int(message.payload["n"]))
            if outcome == EXCEPTION:
                raise DemoFailure(f"demo failure for message {message.payload['n']}")
            return outcome != REJECTED
        finally:
            if on_handled:
                on_handled()

    # The consumer logs every handler exception as a warning; here they are the point of the demo.
    consumer_log = logging.getLogger("ignis.consumer")
    level = consumer_log.level
    consumer_log.setLevel(logging.ERROR)
    try:
        drained = consumer.drain(timeout=timeout, settle=0.1)
    finally:
        consumer_log.setLevel(level)

    sidelined = queue.sideline.browse(limit=messages)
    dead = queue.dead.browse(limit=messages)
    first = sorted(sidelined, key=lambda item: _number(item[1].decoded()))[:FIRST_SIDELINED]
    return DemoResult(
        queue=DEMO_QUEUE,
        published=messages,
        outcomes=dict(consumer.outcomes),
        sidelined_by_reason=dict(Counter(env.reason or "-" for _, env in sidelined)),
        dead_by_reason=dict(Counter(env.reason or "-" for _, env in dead)),
        first_sidelined=[{"n": _number(env.decoded()), "ref": str(ref), "id": env.msg_id, "reason": env.reason,
                          "attempts": env.attempts} for ref, env in first],
        stats=queue.stats(),
        drained=drained,
        elapsed_seconds=time.monotonic() - started,
        expected=dict(Counter(planned_outcome(n) for n in range(messages))),
    )


def _number(payload: Any) -> int:
    return int(payload["n"]) if isinstance(payload, dict) and "n" in payload else -1
