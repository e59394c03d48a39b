"""The main magazine of an ordered queue (QueueSpec.ordered): at most one message of each shard in flight, so the
messages of a key (which always maps to the same shard) are handled in publish order.

The rule is the store's, enforced in the claim's own atomic write (`Storage.claim_held`: lmdb's write
transaction; Aerospike's operate() on the shard's meta record under a filter expression): a claim holds the
shard's head until its settle releases the hold (`Storage.release_hold`), or until the hold ends by itself
(`QueueSpec.hold_ms`: a crashed consumer's), when the next claim takes the same message again. A failed delivery
stays at the head: the queue keeps it held until its retry backoff is over (ignis.queue), so it comes again before
any later message of its shard.

The held message stays after the shard's fire pointer until it is settled (the settle moves the pointer past it), so
a shard whose head is held, or waits for its retry, still has work as every watcher sees it: whoever looks once the
hold ended takes it. This handle only chooses where to claim: among the shards with work, those it does not know to
be held. A shard held by this process is skipped until its settle here unblocks it (and wakes a waiting consumer);
a shard held elsewhere is looked at again later and later (RECHECK_SECONDS, doubling, at most RECHECK_MAX_SECONDS,
never after its hold ends). A subclass of `Magazine`,
built only for ordered queues, so an unordered queue's claims run exactly the code they ran before.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from ignis.envelope import now_ms
from ignis.errors import StoreError
from ignis.magazine.core import Magazine
from ignis.outage import store_failed
from ignis.storage.base import Claimed, ClaimInterrupted, SlotRef, Storage

# How soon a shard held by another process is looked at again (its settle there does not wake this one, and that
# process claims the shard's next message itself): RECHECK_SECONDS, doubling with each look that finds it still held,
# at most RECHECK_MAX_SECONDS (and never after its hold ends).
RECHECK_SECONDS = 0.05
RECHECK_MAX_SECONDS = 2.0


class OrderedMagazine(Magazine):
    """An ordered queue's main magazine (module doc)."""

    def __init__(self, store: Storage, name: str, *, hold_ms: int, **kwargs: Any) -> None:
        super().__init__(store, name, **kwargs)
        self.hold_ms = hold_ms
        self._blocked: dict[int, float] = {}  # shard -> when to look again (monotonic): held, as far as we know
        self._misses: dict[int, int] = {}  # shard -> looks in a row that found it held by another consumer

    def _claim_next(self, max_slots: int) -> list[Claimed] | None:
        """One claim of one slot (an ordered shard gives one at a time) on an active shard not known to be held:
        None when every shard with work is held (or none has work), [] when the picked shard was drained."""
        active_shards = self._active_shards
        loads_seen = active_shards.activity.last_load
        if active_shards.pick() is None:  # (refreshes the active set when due)
            return None
        now = time.monotonic()
        blocked = self._blocked
        candidates = [shard for shard in active_shards.activity.active if blocked.get(shard, 0.0) <= now]
        # From a random one on, so consumers spread over the shards (a shuffle: 11 µs a claim, 64 shards)
        start = int(random.random() * len(candidates))
        for shard in candidates[start:] + candidates[:start]:
            try:
                got = self._store.claim_held(self.name, shard, now_ms(), self.hold_ms, self._count_attempt)
            except ClaimInterrupted as exc:  # the slot is ours, held: awaited until the store answers
                blocked[shard] = time.monotonic() + self.hold_ms / 1000
                self._keep_interrupted(exc)
                raise
            if got.held_until:  # held by another consumer (another process's, or a handle of ours)
                misses = self._misses[shard] = self._misses.get(shard, 0) + 1
                wait = max(got.held_until - now_ms(), 0) / 1000
                blocked[shard] = time.monotonic() + min(wait, RECHECK_SECONDS * 2 ** min(misses - 1, 6),
                                                        RECHECK_MAX_SECONDS)
                continue
            self._misses.pop(shard, None)
            if not got.claimed:
                self._drained.tick()
                blocked.pop(shard, None)
                active_shards.suppress(shard, loads_seen)
                return []
            self._won.tick()
            if got.claimed[0].envelope is not None or got.claimed[0].awaiting:
                blocked[shard] = time.monotonic() + self.hold_ms / 1000  # ours until we settle it
            return got.claimed
        return None

    def unblock(self, shard: int, after_seconds: float = 0.0) -> None:
        """This process settled the held message of `shard` (or failed it, to come again in `after_seconds`): its
        next message may be claimed; a waiting consumer is woken to claim it."""
        self._blocked[shard] = time.monotonic() + after_seconds
        self._misses.pop(shard, None)
        if after_seconds <= 0:
            self._active_shards.activity.poke(1)

    def next_check_in(self) -> float | None:
        """Magazine.next_check_in, and the time until a held shard with work is due for another look."""
        due = super().next_check_in()
        if self._blocked:
            active = self._active_shards.activity.active
            now = time.monotonic()
            # (over dict.copy(): claiming threads add shards without a lock; see Prefetch.begin for why not items())
            later = [until - now for shard, until in self._blocked.copy().items() if shard in active and until > now]
            if later:
                due = min(later) if due is None else min(due, min(later))
        return due

    def _passed(self, holes: list[SlotRef], unwritten: Sequence[SlotRef] = ()) -> None:
        """Magazine._passed, and the holds of awaited slots given up as holes released: their shards move on."""
        super()._passed(holes, unwritten)
        for ref in holes:
            try:
                self._store.release_hold(ref.magazine, ref.shard, ref.slot)
            except StoreError as exc:  # the hold then ends by itself (hold_ms)
                store_failed(f"release the hold of hole {ref} in {self.name}", exc)
            self.unblock(ref.shard)
