"""The shovel (DESIGN §4): move sidelined messages back to the main magazine for redelivery.

    shovel = Shovel(store, budget=10_000)
    report = shovel.shovel_queue("default", "orders")                    # sideline -> main
    report = shovel.shovel_queue("default", "orders", source="dead")     # redrive dead letters

`concurrency` workers (the queue's shovelConcur by default) claim from the source magazine without
counting a delivery attempt, copy each message into main, and only then delete it from the source. A
pass moves at most `budget` messages, so a handler that fails everything cannot keep the shovel
spinning. A sidelined message that has used up the queue's maxDeliveries goes to `q_DEAD` instead, its
history kept. A redrive from dead letters resets the attempts (a person asked for a fresh start).
If a copy fails the claimed messages are re-appended, unclaimed, at the source's tail (then the
claimed originals deleted); if even that fails they stay in place, and the sideline sweep re-homes them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ignis.envelope import Envelope, now_ms
from ignis.errors import HoleBudgetExceeded, InvalidInputError, QueueNotFound
from ignis.magazine import Magazine
from ignis.metrics import DEAD_LETTERED
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import Claimed, Storage, client_view
from ignis_workers.metrics import SHOVEL_FAILURES, SHOVELLED

log = logging.getLogger(__name__)

Source = Literal["sideline", "dead"]
SHOVEL_BATCH = 100  # messages per claim
DEFAULT_BUDGET = 10_000  # messages per queue per pass
EXHAUSTED_REASON = "exhausted"  # dead-letter reason when a sidelined message had no reason


@dataclass
class ShovelReport:
    client_id: str
    queue: str
    source: str
    moved: int = 0  # copied back to main
    dead_lettered: int = 0  # copied to q_DEAD (maxDeliveries used up)
    budget_exhausted: bool = False  # stopped at the budget with messages possibly left
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Shovel:
    """Runs shovel passes. Thread-safe; every pass uses its own `concurrency` worker threads."""

    def __init__(self, store: Storage, *, budget: int = DEFAULT_BUDGET, batch: int = SHOVEL_BATCH,
                 clock: Callable[[], int] = now_ms, guard: Callable[[], bool] = lambda: True) -> None:
        if budget < 1 or batch < 1:
            raise ValueError(f"budget={budget} and batch={batch} must both be at least 1")
        self.store = store
        self.budget = budget
        self.batch = batch
        self.clock = clock
        self.guard = guard

    def shovel_queue(self, client_id: str, queue_name: str, *, source: Source = "sideline",
                     concurrency: int | None = None, budget: int | None = None) -> ShovelReport:
        """One pass over one queue. Errors are in the report (and counted), never raised."""
        if source not in ("sideline", "dead"):
            raise InvalidInputError(f"shovel source {source!r}: must be 'sideline' or 'dead'")
        report = ShovelReport(client_id, queue_name, source)
        try:
            store = client_view(self.store, client_id)
            record = store.get_queue(queue_name)
            if record is None:
                raise QueueNotFound(queue_name, client_id)
            queue = Queue(store, QueueSpec.from_bins(queue_name, record.bins, client_id))
            workers = max(1, concurrency or queue.spec.shovel.concurrency)
            limit = budget or self.budget
            state = _Pass(limit)
            with ThreadPoolExecutor(workers, thread_name_prefix=f"ignis-shovel-{queue_name}") as pool:
                futures = [pool.submit(self._work, queue, source, state) for _ in range(workers)]
                errors = [f.exception() for f in futures]
            report.moved, report.dead_lettered = state.moved, state.dead
            report.budget_exhausted = state.moved + state.dead >= limit
            failure = next((e for e in errors if e is not None), None)
            if failure is not None:
                raise failure
        except Exception as exc:
            log.error("shovel of %s/%s (%s) failed: %s: %s", client_id, queue_name, source,
                      type(exc).__name__, exc)
            SHOVEL_FAILURES.labels(queue_name).inc()
            report.error = f"{type(exc).__name__}: {exc}"
        return report

    def _work(self, queue: Queue, source: Source, state: _Pass) -> None:
        magazine = queue.sideline if source == "sideline" else queue.dead
        limit = queue.spec.max_deliveries
        while self.guard():
            take = state.reserve(self.batch)
            if take == 0:
                return
            try:
                claimed = magazine.fire(take)
            except HoleBudgetExceeded:
                claimed = []
                state.release(take)
                continue
            state.release(take - len(claimed))
            if not claimed:
                return
            at = self.clock()
            back: list[Envelope] = []
            dead: list[Envelope] = []
            for c in claimed:
                env = c.envelope
                assert env is not None  # fire returns present records only
                if source == "sideline" and limit and env.attempts >= limit:
                    copy = env.for_transfer(None, at)
                    copy.reason = env.reason or EXHAUSTED_REASON
                    dead.append(copy)
                else:
                    copy = env.for_transfer(None, at)
                    if source == "dead":
                        copy.attempts = 0
                    back.append(copy)
            try:
                if dead:
                    queue.dead.load(dead)
                if back:
                    queue.main.load(back)
            except Exception:
                self._put_back(magazine, claimed, at)
                raise
            # Only after both copies landed: a failure above leaves the claimed records in place.
            queue.store.delete([c.ref for c in claimed])
            state.done(len(back), len(dead))
            if back:
                SHOVELLED.labels(queue.name, source).inc(len(back))
            for env in dead:
                DEAD_LETTERED.labels(queue.name, env.reason or EXHAUSTED_REASON).inc()


    @staticmethod
    def _put_back(magazine: Magazine, claimed: list[Claimed], at: int) -> None:
        """After a failed copy, offer the claimed messages again: re-append them, unclaimed, at the
        source's tail and only then delete the claimed originals (IgnisMQ's fallback). Without this a
        claimed dead letter would never be offered again (nothing sweeps q_DEAD); if this fails too, the
        originals stay where they are (the sideline sweep re-homes sideline ones)."""
        copies = []
        for c in claimed:
            assert c.envelope is not None
            copy = c.envelope.for_transfer(None, at)
            copy.reason = c.envelope.reason
            copies.append(copy)
        try:
            magazine.load(copies)
            magazine.store.delete([c.ref for c in claimed])
        except Exception as exc:
            log.error("could not put %d claimed message(s) back at the tail of %s: %s", len(claimed),
                      magazine.name, exc)


class _Pass:
    """The budget shared by the workers of one pass."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.moved = 0
        self.dead = 0
        self._lock = threading.Lock()

    def reserve(self, want: int) -> int:
        with self._lock:
            take = min(want, self.left)
            self.left -= take
            return take

    def release(self, unused: int) -> None:
        with self._lock:
            self.left += unused

    def done(self, moved: int, dead: int) -> None:
        with self._lock:
            self.moved += moved
            self.dead += dead
