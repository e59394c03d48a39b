"""The shovel (DESIGN §4): move sidelined messages back to the main magazine for redelivery.

    shovel = Shovel(store, epoch_source=lambda: epoch, budget=10_000)
    report = shovel.shovel_queue("default", "orders")                    # sideline -> main
    report = shovel.shovel_queue("default", "orders", source="dead")     # redrive dead letters

`concurrency` workers (the queue's shovelConcur by default) claim from the source magazine without
counting a delivery attempt and move each message into main: copy, then delete from the source, fenced
by the leader's epoch as part of the writes (`Storage.move`), so a paused ex-leader that resumes moves
nothing twice. A pass moves at most `budget` messages, so a handler that fails everything cannot keep
the shovel spinning. A sidelined message that has used up the queue's maxDeliveries goes to `q_DEAD`
instead, its history kept. A redrive from dead letters resets the attempts (a person asked for a fresh
start). If a move fails the claimed messages are moved, unclaimed, to the source's own tail; if even
that fails they stay in place, and the sideline sweep re-homes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ignis.envelope import CODEC_UNREADABLE, Envelope, now_ms
from ignis.errors import HoleBudgetExceeded, InvalidInputError, QueueNotFound, StaleEpoch, StoreUnavailable
from ignis.logs import one_line
from ignis.magazine import Magazine
from ignis.metrics import DEAD_LETTERED
from ignis.outage import store_failed
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import Claimed, SlotRef, Storage, client_view
from ignis_workers.metrics import SHOVEL_FAILURES, SHOVEL_PASSES, SHOVELLED
from ignis_workers.sweeper import LeadershipLost

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

    def __init__(self, store: Storage, *, epoch_source: Callable[[], int], budget: int = DEFAULT_BUDGET,
                 batch: int = SHOVEL_BATCH, clock: Callable[[], int] = now_ms,
                 guard: Callable[[], bool] = lambda: True) -> None:
        if budget < 1 or batch < 1:
            raise ValueError(f"budget={budget} and batch={batch} must both be at least 1")
        self.store = store
        self.epoch_source = epoch_source
        self.budget = budget
        self.batch = batch
        self.clock = clock
        self.guard = guard

    def shovel_queue(self, client_id: str, queue_name: str, *, source: Source = "sideline",
                     concurrency: int | None = None, budget: int | None = None) -> ShovelReport:
        """One pass over one queue. Errors are in the report (and counted); only StaleEpoch and
        LeadershipLost are raised (this process no longer leads)."""
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
        except (StaleEpoch, LeadershipLost):
            raise
        except Exception as exc:
            if isinstance(exc, StoreUnavailable):  # said once per outage for the whole process
                store_failed(f"shovel of {client_id}/{queue_name} ({source})", exc)
            else:
                log.error("shovel of %s/%s (%s) failed: %s: %s", client_id, queue_name, source,
                          type(exc).__name__, one_line(exc))
            SHOVEL_FAILURES.labels(queue_name).inc()
            report.error = f"{type(exc).__name__}: {one_line(exc)}"
        SHOVEL_PASSES.labels(queue_name).inc()
        return report

    def _work(self, queue: Queue, source: Source, state: _Pass) -> None:
        magazine = queue.sideline if source == "sideline" else queue.dead
        limit = queue.spec.max_deliveries
        epoch = self.epoch_source()
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
                wait = magazine.next_check_in()
                if wait is None:
                    return
                time.sleep(wait)  # claimed slots whose record is still being written: re-read them
                continue
            at = self.clock()
            back: list[tuple[SlotRef, int | None, Envelope]] = []
            dead: list[tuple[SlotRef, int | None, Envelope]] = []
            for c in claimed:
                env = c.envelope
                assert env is not None  # fire returns present records only
                copy = env.for_transfer(None, at)
                if source == "sideline" and env.codec == CODEC_UNREADABLE:  # never deliverable: no round trip
                    copy.reason = env.reason or "unreadable"
                    dead.append((c.ref, env.fire_ts, copy))
                elif source == "sideline" and limit and env.attempts >= limit:
                    copy.reason = env.reason or EXHAUSTED_REASON
                    dead.append((c.ref, env.fire_ts, copy))
                else:
                    if source == "dead":
                        copy.attempts = 0
                    back.append((c.ref, env.fire_ts, copy))
            try:
                dead_moved = queue.dead.move_in(epoch, dead) if dead else []
                back_moved = queue.main.move_in(epoch, back) if back else []
            except StaleEpoch:
                raise
            except Exception:
                self._put_back(magazine, claimed, epoch, at)
                raise
            state.done(sum(back_moved), sum(dead_moved))
            if any(back_moved):
                SHOVELLED.labels(queue.name, source).inc(sum(back_moved))
            for (_, _, env), moved in zip(dead, dead_moved, strict=True):
                if moved:
                    DEAD_LETTERED.labels(queue.name, env.reason or EXHAUSTED_REASON).inc()

    @staticmethod
    def _put_back(magazine: Magazine, claimed: list[Claimed], epoch: int, at: int) -> None:
        """After a failed move, offer the claimed messages again: move them, unclaimed, to the source's
        own tail (IgnisMQ's fallback; what was moved already is gone and skipped). Without this a claimed
        dead letter would never be offered again (nothing sweeps q_DEAD); if this fails too, the
        originals stay where they are (the sideline sweep re-homes sideline ones)."""
        moves = []
        for c in claimed:
            assert c.envelope is not None
            copy = c.envelope.for_transfer(None, at)
            copy.reason = c.envelope.reason
            moves.append((c.ref, c.envelope.fire_ts, copy))
        try:
            magazine.move_in(epoch, moves)
        except Exception as exc:
            log.error("could not put %d claimed message(s) back at the tail of %s: %s", len(claimed),
                      magazine.name, one_line(exc))


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
