"""Active-shard tracking of a magazine handle: which shards have work (the process's `ShardActivity` of the
magazine, refreshed from the store's pointers every `refresh_seconds`), marking a shard on a load and ringing
the beacon for consumers elsewhere, dropping a shard a claim found drained, picking a shard to claim from, and
waiting for work (the watcher and the delay mover follow the magazine meanwhile). Kept apart from the
`Magazine` coordinator because it is how an idle magazine costs almost no reads, with its own race-free
protocol (ignis.activity), which loads and claims only consult: one `ActiveShards` per handle, sharing the
handle's lock.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable

import ignis.delay
import ignis.watch
from ignis.activity import ShardActivity, activity_for, with_work
from ignis.delay import MainMagazine, mover_for
from ignis.errors import LoadInterrupted
from ignis.storage.base import SlotRef, Storage
from ignis.watch import watcher_for

_random = random.random


# The shards with work live in the process's ShardActivity of this magazine (ignis.activity, where the
# race-free marking and dropping is explained): a load through any handle lists its shard and wakes the
# consumers waiting on the magazine, whichever handle they hold, and rings the store's doorbell for those
# of other processes (lmdb); the watcher (ignis.watch) lists what other processes publish.
class ActiveShards:
    """The shards of one magazine with work, as one handle of it sees and updates them."""

    def __init__(self, store: Storage, name: str, shards: int, *, refresh_seconds: float, lock: threading.Lock,
                 is_main: bool) -> None:
        self.store = store
        self.name = name
        self.shards = shards
        self.refresh_seconds = refresh_seconds
        # Which shards have work, shared with every handle of this magazine in the process (ignis.activity).
        self.activity: ShardActivity = activity_for(store.location, store.client_id, name)
        # Only main has consumers (rung on a load), and only a store without a doorbell needs its beacon bumped.
        # (Bound now: tests stand other stores in for `store` later.)
        self._beacon = store.beacon if is_main and store.needs_beacon else None
        self._lock = lock  # the magazine handle's lock
        self._is_main = is_main  # only main has due messages moved into it
        if self._beacon is None:  # mark_one is then the activity's own (every publish comes here: one call)
            self.mark_one = self.activity.mark_one  # type: ignore[method-assign]

    def mark(self, shards: Iterable[int]) -> None:
        shards = tuple(shards)
        if not shards:
            return
        self.activity.mark(shards)
        self.ring(shards)

    def loaded(self, load: Callable[[], list[SlotRef]]) -> list[SlotRef]:
        """Run a load of existing messages and mark the shards it filled; for a load an outage cut short
        (LoadInterrupted), the shards of the writes that landed: this process's consumers look for them."""
        try:
            refs = load()
        except LoadInterrupted as exc:
            self.mark({ref.shard for ref, landed in zip(exc.refs, exc.landed, strict=True) if landed})
            raise
        self.mark({ref.shard for ref in refs})
        return refs

    def mark_one(self, shard: int) -> None:
        self.activity.mark_one(shard)
        if self._beacon is not None:  # (ring, inlined: every publish comes here)
            self._beacon(self.name)

    def ring(self, shards: Iterable[int]) -> None:
        """Tell consumers in other processes (only main has consumers): the store's beacon (a store with a
        doorbell rang it in the load itself)."""
        if self._beacon is not None:
            self._beacon(self.name)

    def suppress(self, shard: int, loads_seen: int) -> None:
        self.activity.suppress(shard, loads_seen)

    def pick(self) -> int | None:
        activity = self.activity
        now = time.monotonic()  # (activity.refresh_due, inlined: every fire comes here)
        if now - activity.refreshed_at >= self.refresh_seconds and now >= activity.fresh_until:
            with self._lock:
                if activity.refresh_due(self.refresh_seconds):
                    seen = activity.before_read()
                    activity.replace(with_work(self.store.pointers(self.name, self.shards)), seen)
        active = activity.active
        return active[int(_random() * len(active))] if active else None

    def pick_alone(self) -> int | None:
        """As pick, among the shards no other claim of this process is on, taken for this one (release it with
        `claimed`): see ShardActivity.claim_alone."""
        shard = self.pick()
        return None if shard is None else self.activity.claim_alone(shard)

    def claimed(self, shard: int) -> None:
        self.activity.claimed(shard)

    def wait_for_work(self, main: MainMagazine, seen: int, timeout: float) -> bool:
        """Magazine.wait_for_work: sleep on the activity, followed by the watcher and the mover meanwhile. The
        follow is renewed while it sleeps: they drop a magazine nobody looked in for a while (the shorter of
        ignis.watch.KEEP_WATCHING_SECONDS and ignis.delay.KEEP_FOLLOWING_SECONDS, read when asked: tests shorten
        them), and a longer wait (a poll interval or a fire timeout) would then sleep through a publish."""
        deadline = time.monotonic() + timeout
        while True:
            self.watch(main)
            remaining = deadline - time.monotonic()
            renew = min(ignis.watch.KEEP_WATCHING_SECONDS, ignis.delay.KEEP_FOLLOWING_SECONDS) / 2
            if self.activity.wait(seen, min(remaining, renew)):
                return True
            if remaining <= renew:
                return False

    def watch(self, main: MainMagazine) -> None:
        """Have the process's watcher follow this magazine (for the next ignis.watch.KEEP_WATCHING_SECONDS), and
        its delay mover move the queue's due messages into `main` (ignis.delay; main magazines only)."""
        watcher = watcher_for(self.store)
        if watcher is not None:  # (None: the handle is closing)
            watcher.watch(self.name, self.shards, self.activity)
        mover = mover_for(self.store) if self._is_main else None
        if mover is not None:
            mover.follow(main)
        for other in getattr(main, "also_watch", ()):  # (a subscription's cursor, for its main)
            other.watch()
