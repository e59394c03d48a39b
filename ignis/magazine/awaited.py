"""Awaited slots of a magazine handle: slots it claimed before their record landed (a two-step publish in flight),
kept and re-read on a 1 ms x 1.15^n schedule until the record lands (then handed out, counted as a late write)
or the producer's write deadline passes (then sealed: a hole for good). Kept apart from the `Magazine`
coordinator because the schedule, its back-off while the store fails and the sealing are one concern with
their own timing constants, which fires only consult (is anything due, what landed): one `AwaitedSlots` per
handle, sharing the handle's lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from ignis.envelope import now_ms
from ignis.errors import StoreError
from ignis.metrics import LATE_WRITES
from ignis.storage.base import Claimed, SlotRef, Storage
from ignis.subjects import SubjectFilter

# An awaited slot (claimed, its record still being written) is re-read first this soon, then less and
# less often, until the store's write grace has passed. A publish lands within a round trip or two, but a
# slot a publisher reserved ahead (RESERVE_AHEAD_SECONDS) is written only when its publish comes, a few
# milliseconds later on a busy machine: re-reads spaced 1 ms x 1.15^n (1, 2.2, 3.5, 5, 6.7, 8.8 ms ...) find
# it soon after. Doubling from 2 ms (2, 6, 14, 30 ms) gave an e2e p50 / p99 of 2.6-3.1 / 14-21 ms at 1,000
# msg/s on Aerospike; this gives 1.9 / 7-8 ms (bench_latency, same machine, runs side by side). The re-reads
# are one batch call per handle for all its due slots, and only while slots are awaited (never when idle).
AWAIT_FIRST_CHECK_SECONDS = 0.001
AWAIT_CHECK_GROWTH = 1.15
AWAIT_MAX_CHECK_SECONDS = 0.25
AWAIT_MAX_FAILING_SECONDS = 5.0  # between re-reads while the store does not answer them


class _Awaited:
    """A slot this magazine handle claimed whose record has not landed yet."""

    __slots__ = ("deadline", "due", "ref", "wait")

    def __init__(self, ref: SlotRef, now: float, grace: float) -> None:
        self.ref = ref
        self.deadline = now + grace  # the producer's write deadline: seal it after this
        self.wait = AWAIT_FIRST_CHECK_SECONDS
        self.due = now + self.wait  # next re-read


# A consumer that is caught up may claim a slot between a producer's increment and its write
# (Aerospike). The claimer owns the slot, so it keeps it here and re-reads it on later fires until
# the record lands (delivered then, counted as a late write) or the producer's write deadline has
# passed (sealed: a hole for good, which refuses the late write, so its producer publishes it again).
class AwaitedSlots:
    """The awaited slots of one magazine handle (`slots`) and the records that turned up for them, stamped,
    not handed out yet (`landed`). Re-read on later fires of the handle: a worker never blocks on them."""

    def __init__(self, store: Storage, lock: threading.Lock, *, ttl_seconds: int, count_attempt: bool, queue: str,
                 kind: str, only: SubjectFilter | None = None) -> None:
        self.store = store
        # A subscription's cursor (kind "cursor") re-reads and seals through its topic, with its filter.
        self._cursor = kind == "cursor"
        self._only = only
        self._lock = lock  # the magazine handle's lock
        self.ttl_seconds = ttl_seconds
        self._count_attempt = count_attempt  # a claim from the sideline is a shovel move, not a delivery
        self.queue = queue
        self.kind = kind
        self.slots: list[_Awaited] = []
        self.landed: deque[Claimed] = deque()
        self.grace = store.write_grace_ms / 1000

    def add(self, ref: SlotRef) -> None:
        """Await a claimed slot whose record has not landed."""
        with self._lock:
            self.slots.append(_Awaited(ref, time.monotonic(), self.grace))

    def next_check_in(self) -> float | None:
        """Seconds until an awaited slot is due for a re-read (0 when a record that landed waits to be handed
        out); None when nothing is awaited."""
        if self.landed:
            return 0.0
        with self._lock:
            due = min((a.due for a in self.slots), default=None)
        return None if due is None else max(due - time.monotonic(), 0.0)

    def take(self, n: int, passed: Callable[[list[SlotRef], list[SlotRef]], None]) -> list[Claimed]:
        """Up to n late writes that landed (the due slots re-read first; `passed` counts those that turned out
        holes for good: Magazine._passed)."""
        if self.slots:
            self.recheck(passed)
        out: list[Claimed] = []
        while len(out) < n:
            try:
                out.append(self.landed.popleft())
            except IndexError:
                break
        return out

    def restamp_kept(self, stale: Sequence[Claimed]) -> list[Claimed]:
        """Prefetched messages kept too long, stamped again (not a new attempt) so their sweep clock starts
        at delivery; one the sweeper took meanwhile is dropped. (Here because a message the store does not
        answer for stays the handle's: it is awaited.)"""
        try:
            restamped = self._restamp([c.ref for c in stale], False)
        except StoreError:
            for c in stale:  # still ours: re-read once the store answers
                self.add(c.ref)
            raise
        for c in restamped:
            if c.envelope is None and c.awaiting:  # not answered for: still ours, re-read later
                self.add(c.ref)
        return [c for c in restamped if c.envelope is not None]

    def _restamp(self, refs: list[SlotRef], count_attempt: bool) -> list[Claimed]:
        if self._cursor:
            return self.store.restamp_cursor(refs, now_ms(), self._only, count_attempt)
        return self.store.restamp(refs, now_ms(), count_attempt)

    def recheck(self, passed: Callable[[list[SlotRef], list[SlotRef]], None]) -> None:
        """Re-read the awaited slots that are due, in one store call; seal those past their deadline. `passed`
        counts the slots that turned out holes for good, and which of them were never written (a cursor's seal
        tells; given per call: the magazine handle is not kept here)."""
        now = time.monotonic()
        with self._lock:
            due = [a for a in self.slots if a.due <= now]
            if not due:
                return
            self.slots = [a for a in self.slots if a.due > now]
        keep: list[_Awaited] = due  # what goes back to the list if a store call fails
        holes: list[SlotRef] = []
        unwritten: list[SlotRef] = []
        late = 0
        try:
            found = self._restamp([a.ref for a in due], self._count_attempt)
            keep, expired = [], []
            for awaited, item in zip(due, found, strict=True):
                if item.envelope is not None:
                    self.landed.append(item)
                    late += 1
                elif item.awaiting is None:  # landed, and the subscription's filter passes it over
                    continue
                elif not item.awaiting:
                    holes.append(awaited.ref)  # deleted or sealed meanwhile: a hole for good
                elif now >= awaited.deadline:
                    expired.append(awaited)
                else:
                    awaited.wait = min(awaited.wait * AWAIT_CHECK_GROWTH, AWAIT_MAX_CHECK_SECONDS)
                    awaited.due = now + awaited.wait
                    keep.append(awaited)
            if expired:
                keep.extend(expired)  # until they are sealed
                sealed = (self.store.seal_cursor if self._cursor else self.store.seal)([a.ref for a in expired],
                                                                                     self.ttl_seconds)
                keep = keep[:-len(expired)]
                for awaited, done in zip(expired, sealed, strict=True):
                    if done is None:  # sealed, never written (a cursor's seal says so): a hole, nothing lost
                        holes.append(awaited.ref)
                        unwritten.append(awaited.ref)
                    elif done:
                        holes.append(awaited.ref)
                    else:  # the record landed at the last moment: re-read it at once
                        awaited.due = now
                        keep.append(awaited)
        except StoreError:
            # The store did not answer: the slots stay ours, and are re-read later and later while it
            # fails (never in a tight loop: a caller that waits for next_check_in() backs off too).
            for awaited in keep:
                awaited.wait = min(max(awaited.wait, AWAIT_MAX_CHECK_SECONDS) * 2, AWAIT_MAX_FAILING_SECONDS)
                awaited.due = now + awaited.wait
            raise
        finally:
            with self._lock:
                self.slots.extend(keep)
            if holes:
                passed(holes, unwritten)
            if late:
                LATE_WRITES.labels(self.queue, self.kind).inc(late)
