"""Reservations of a magazine handle: slots a publish reserved ahead, in its own increment of a shard's load
pointer, for the next publishes of the handle (two-step backends only), handed out in order, sealed when they go
stale (by the next publish, a timer, close). Kept apart from the `Magazine` coordinator because it is a
self-contained piece of state with its own timer thread and its own rules (how much to reserve, when a
reservation is stale), which publishes only consult: one `Reservations` per handle, sharing the handle's lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from ignis.errors import StoreError
from ignis.storage.base import RESERVATION_FRESH_MS, SlotRef, Storage

log = logging.getLogger("ignis.magazine")  # the magazine's logger: its lines read as before the split
RESERVE_MAX = 32  # slots one allocation reserves for the next publishes of its handle, at most
RESERVE_AHEAD_SECONDS = 0.005  # ... as many as the handle's recent publish rate fills in this long
REAP_DELAY_SECONDS = 0.05  # after RESERVATION_FRESH_MS, when the timer seals what nobody wrote
_new_tuple = tuple.__new__  # NamedTuples without their slower generated __init__


# Reservations (two-step backends): a publish is an increment of a shard's load pointer and then the
# record's write, two round trips. When a handle publishes fast, an allocation reserves, in the same
# increment, the slots its next publishes will need (the recent rate times RESERVE_AHEAD_SECONDS,
# RESERVE_MAX at most), and those publishes, from any thread, write into them with one round trip.
# The rate is told by how long the previous allocation lasted, so this costs a publish into a reserved
# slot no bookkeeping at all: in a tight per-message path under the interpreter lock every step shows
# (counting the publishes in progress cost 8 threads about a tenth of their throughput, measured).
# Concurrent publishers and a loop publishing one by one both run fast, so both reserve; a trickle
# (under about one publish per RESERVE_AHEAD_SECONDS) reserves nothing.
# A reserved slot is written within RESERVATION_FRESH_MS or sealed (by the next publish, a timer, close),
# so a consumer that claims it first awaits it within the store's write grace like any publish in
# flight, and nothing but a dead process leaves a reserved slot empty (then the claimer seals it).
class Reservations:
    """The slots one magazine handle reserved for its next publishes: (when reserved, slot), oldest first."""

    def __init__(self, store: Storage, name: str, ttl_seconds: int, lock: threading.Lock) -> None:
        self.store = store
        self.name = name
        self.ttl_seconds = ttl_seconds
        self._lock = lock  # the magazine handle's lock
        # Slots reserved by a publish for the next publishes of this handle: (when reserved, slot).
        self.slots: deque[tuple[float, SlotRef]] = deque()
        self._allocated_at = float("-inf")  # when this handle last allocated slots to publish into (monotonic)
        self._allocated = 1  # how many slots that allocation took
        self._reaping = False  # a timer will seal the reservations that go stale

    def size(self, now: float, needed: int = 1) -> int:
        """Slots the allocation made `now` takes: those `needed`, and the reserve for the publishes expected
        next. (Unlocked: two threads allocating at once may each size from the other's numbers; both are
        recent, which is all the estimate needs.)"""
        elapsed = now - self._allocated_at
        self._allocated_at = now
        ahead = RESERVE_MAX if elapsed <= 0 else int(self._allocated / elapsed * RESERVE_AHEAD_SECONDS)
        self._allocated = needed + min(ahead, RESERVE_MAX)
        return self._allocated

    def keep(self, shard: int, slots: range, reserved_at: float) -> None:
        """Keep slots an allocation reserved ahead for the next publishes (sealed by the reaper if unwritten)."""
        if slots:
            self.slots.extend([(reserved_at, _new_tuple(SlotRef, (self.name, shard, slot))) for slot in slots])
            if not self._reaping:
                self._arm_reaper()

    def take(self) -> SlotRef | None:
        """A reserved slot young enough to write; older ones are sealed on the way."""
        stale = self.pop(time.monotonic() - RESERVATION_FRESH_MS / 1000)
        if stale:
            self._seal([ref for _, ref in stale])
        try:
            return self.slots.popleft()[1]
        except IndexError:  # none left (another thread may have taken the last one)
            return None

    def pop(self, older_than: float | None = None) -> list[tuple[float, SlotRef]]:
        """Take reservations off the front: those made before `older_than` (monotonic), or all of them.
        Without a lock (publishers pop the same deque): the front is looked at, then popped, and put back
        if a publish took it in between."""
        out = []
        reserved = self.slots
        while True:
            try:
                head = reserved[0]
                if older_than is not None and head[0] >= older_than:
                    break
                popped = reserved.popleft()
            except IndexError:
                break
            if popped is head:
                out.append(popped)
            else:  # a publish took the front meanwhile: put back what came out instead, and look again
                reserved.appendleft(popped)
        return out

    # A reservation left when publishing stops (the end of a loop, of a burst) is sealed by a timer a
    # moment after it goes stale, not left to a consumer that would await it for the whole write grace
    # (seconds): one short-lived daemon thread per magazine, only while reservations are held.
    def _arm_reaper(self) -> None:
        with self._lock:
            if self._reaping:
                return
            self._reaping = True
        timer = threading.Timer(RESERVATION_FRESH_MS / 1000 + REAP_DELAY_SECONDS, self._reap)
        timer.daemon = True
        timer.start()

    def _reap(self) -> None:
        """Seal the stale reservations; come back while fresh ones remain."""
        stale = self.pop(time.monotonic() - RESERVATION_FRESH_MS / 1000)
        if stale:
            self._seal([ref for _, ref in stale])
        with self._lock:
            self._reaping = False
        if self.slots:
            self._arm_reaper()

    def release(self) -> int:
        """Seal every slot reserved and not written (at close): a consumer then passes them at once
        instead of awaiting each for the write grace. Returns how many."""
        refs = [ref for _, ref in self.pop()]
        if refs:
            self._seal(refs)
        return len(refs)

    def _seal(self, refs: list[SlotRef]) -> None:
        try:
            self.store.seal(refs, self.ttl_seconds)
        except StoreError as exc:  # the claimers of these slots seal them after the write grace instead
            log.warning("could not seal %d unused reserved slot(s) of %s: %s", len(refs), self.name, exc)
