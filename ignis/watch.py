"""Cross-process wake-ups: keeps the shard activity (ignis.activity) of the magazines that consumers in this
process wait on up to date with what other processes publish, so a waiting consumer learns of a message
within milliseconds, not on a periodic refresh (DESIGN §4).

One `Watcher` thread per store handle, started by the first wait on a magazine of it, following only the
magazines consumers of this process look for work in (one nobody looked in for KEEP_WATCHING_SECONDS is
dropped). Two means, by what the store offers:

* a doorbell (`Storage.doorbell`; lmdb): a publisher rings the listening processes as it commits, and
  the ring itself marks the shards active. The watcher subscribes, and reads the pointers only as a safety
  net, every SAFETY_POLL_SECONDS;
* otherwise (Aerospike) it polls. While messages flow, a magazine's shard pointers (one batch read,
  `Storage.watch_pointers`) every FAST_POLL_SECONDS (never below 1 ms), the interval growing by POLL_GROWTH
  with each poll that found them where they were. Once they stood still for IDLE_AFTER_SECONDS the queue is
  idle: then only its beacon is read, one record per queue, every IDLE_POLL_SECONDS, for all idle queues in
  one call (`Storage.read_beacons`; publishers bump it at most once a second, `Storage.beacon`); a bumped
  beacon makes it flow again. Its pointers are read too, every IDLE_SAFETY_POLL_SECONDS (in case a bump
  failed), along with the beacons: one more call per beacon read for all the idle queues due, each first due
  at a random point of that period so that they spread evenly (a thousand idle queues read one by one made
  seventeen calls a second, and a wake of this thread for each). All the idle queues together cost two store
  calls per IDLE_POLL_SECONDS (one more per BATCH_CHUNK shards of pointers due, on Aerospike).

A magazine no consumer looked in lately (they are all busy with messages, and claim on their own) is only
read every SAFETY_POLL_SECONDS. Only consumers (fires on a main magazine) are watched: the sweeper, the
shovel and the operator's figures read pointers as before and pay nothing for this. A failing store is
backed off and said once (ignis.outage), like every other loop that talks to it.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import weakref
from dataclasses import dataclass

from ignis.activity import ShardActivity
from ignis.delay import wake_mover
from ignis.errors import StoreError
from ignis.outage import Backoff
from ignis.per_store import PerStore
from ignis.storage.base import BEACON_SECONDS, Doorbell, Storage

log = logging.getLogger(__name__)

FAST_POLL_SECONDS = 0.001
POLL_GROWTH = 1.1
IDLE_AFTER_SECONDS = BEACON_SECONDS + 0.5  # a publish within BEACON_SECONDS of a bump bumps nothing
IDLE_POLL_SECONDS = 0.75
SAFETY_POLL_SECONDS = 30.0
IDLE_SAFETY_POLL_SECONDS = 60.0  # an idle queue's pointers, besides its beacon (a bump may have failed)
SUBSCRIBED_POLL_SECONDS = 0.1  # one more read this soon after subscribing: a publisher sees the listing late
HUNGRY_SECONDS = 1.0  # a consumer looked for work this recently: poll as above
KEEP_WATCHING_SECONDS = 30.0


@dataclass(slots=True)
class _Watched:
    magazine: str
    shards: int
    activity: ShardActivity
    touched: float  # when a consumer last looked for work here (monotonic)
    interval: float = FAST_POLL_SECONDS
    due: float = 0.0  # next pointer read
    loaded: int = -1  # the sum of the load pointers at the last read (-1: never read)
    moved_at: float = 0.0  # when the load pointers last moved (monotonic)
    beacon: int | None = None  # idle: the beacon as last read (None: flowing)
    safety_due: float = 0.0  # idle: the next read of its pointers, with the beacons (monotonic)
    busy: bool = False  # read slowly because no consumer looked for work lately


class Watcher:
    """Follows the magazines of one store handle that consumers of this process look for work in."""

    def __init__(self, store: Storage) -> None:
        self._store = weakref.ref(store)
        self._doorbell: Doorbell | None = store.doorbell()
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._beacons_due = 0.0
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="ignis-watch", daemon=True)
        self._thread.start()

    def watch(self, magazine: str, shards: int, activity: ShardActivity) -> None:
        """A consumer looks for work in `magazine`: follow it (again) for the next KEEP_WATCHING_SECONDS."""
        now = time.monotonic()
        watched = self._watched.get(magazine)
        if watched is not None and watched.shards == shards:
            watched.touched = now
            if watched.busy:  # its consumers ran out of work: read now, and often
                watched.busy, watched.interval, watched.due = False, FAST_POLL_SECONDS, now
                self._changed.set()
            return
        with self._lock:
            self._watched[magazine] = _Watched(magazine, shards, activity, now, moved_at=now)
            self._subscribe()
        self._changed.set()  # read its pointers now: what was published before anyone watched

    def _subscribe(self) -> None:
        if self._doorbell is not None:
            self._doorbell.subscribe(set(self._watched))

    def stop(self) -> None:
        self.stopped = True
        self._changed.set()

    @property
    def watching(self) -> list[str]:
        return sorted(self._watched)

    # ---- the thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        backoff = Backoff()
        while not self.stopped:
            store = self._store()
            if store is None or store.closed:
                break
            now = time.monotonic()
            with self._lock:
                gone = [n for n, w in self._watched.items() if now - w.touched > KEEP_WATCHING_SECONDS]
                for name in gone:
                    del self._watched[name]
                if gone:
                    self._subscribe()
                watched = list(self._watched.values())
            try:
                if self._doorbell is None and now >= self._beacons_due:
                    self._read_beacons(store, [w for w in watched if w.beacon is not None])
                for w in watched:
                    if w.due <= now:
                        self._read_pointers(store, w)
            except StoreError as exc:
                if store.closed:
                    break
                delay = backoff.failed("watch for new messages", exc)
                for w in watched:
                    w.due = max(w.due, time.monotonic() + delay)
                self._beacons_due = time.monotonic() + delay
            else:
                backoff.ok()
            del store
            next_due = min([w.due for w in watched] + [now + SAFETY_POLL_SECONDS])
            if self._doorbell is None and any(w.beacon is not None for w in watched):
                next_due = min(next_due, self._beacons_due)
            wait = next_due - time.monotonic()
            if wait > 0:
                self._changed.wait(wait)
            self._changed.clear()
        self.stopped = True
        with self._lock:
            self._watched.clear()
            self._subscribe()

    def _read_beacons(self, store: Storage, idle: list[_Watched]) -> None:
        """One read of every idle magazine's beacon: a bumped one flows again, its pointers read now."""
        self._beacons_due = time.monotonic() + IDLE_POLL_SECONDS
        if not idle:
            return
        began = [w.activity.before_read() for w in idle]
        for w, seen, value in zip(idle, began, store.read_beacons([w.magazine for w in idle]), strict=True):
            if value != w.beacon:
                w.beacon, w.interval, w.due = None, FAST_POLL_SECONDS, 0.0
                wake_mover(store)  # perhaps a delayed publish: the mover reads the delay records now
            else:  # nothing published since: what its consumers know is as good as a fresh read of the pointers
                w.activity.vouch(time.monotonic() + 2 * IDLE_POLL_SECONDS, seen)
        now = time.monotonic()
        due = [w for w in idle if w.beacon is not None and w.safety_due <= now]
        if not due:
            return
        seen = [w.activity.before_read() for w in due]
        read = store.watch_pointers([(w.magazine, w.shards) for w in due])
        now = time.monotonic()
        for w, before, (with_work, loaded) in zip(due, seen, read, strict=True):
            w.activity.replace(with_work, before)
            if loaded != w.loaded:  # published to although its beacon stood still (a bump failed): flowing
                w.loaded, w.moved_at = loaded, now
                w.beacon, w.interval, w.due = None, FAST_POLL_SECONDS, now
            else:
                w.safety_due = now + IDLE_SAFETY_POLL_SECONDS

    def _read_pointers(self, store: Storage, w: _Watched) -> None:
        seen = w.activity.before_read()
        # A queue whose pointers stood still long enough may be idle: its beacon is read *before* the pointers
        # that confirm it, so a publish after this read bumps it (or moves the pointers read next), unless its
        # process bumped it less than BEACON_SECONDS ago, for a publish IDLE_AFTER_SECONDS would have seen.
        settling = self._doorbell is None and w.beacon is None and time.monotonic() - w.moved_at >= IDLE_AFTER_SECONDS
        idle_beacon = store.read_beacons([w.magazine])[0] if settling else None
        [(with_work, loaded)] = store.watch_pointers([(w.magazine, w.shards)])
        w.activity.replace(with_work, seen)
        now = time.monotonic()
        moved = loaded != w.loaded
        if moved:
            w.moved_at = now
        w.loaded = loaded
        # (A subscription's consumers wait on its main magazine, which its cursor's changes wake: `wakes`.)
        activity = w.activity
        hungry = activity.waiting > 0 or now - w.touched <= HUNGRY_SECONDS or \
            any(woken.waiting > 0 for woken in activity.wakes)
        w.busy = False
        if self._doorbell is not None:  # rings do the rest
            w.interval = SAFETY_POLL_SECONDS if w.due else SUBSCRIBED_POLL_SECONDS
            w.activity.vouch(now + w.interval + 1.0, seen)
        elif not hungry:  # its consumers are busy with messages (they claim on their own), or gone
            w.interval, w.busy = SAFETY_POLL_SECONDS, True
            w.activity.fresh_until = float("-inf")  # (vouched for no more: their claims read for themselves)
        elif moved:
            w.interval = FAST_POLL_SECONDS  # messages flow: look again soon
            w.activity.vouch(now + w.interval + 1.0, seen)
        elif idle_beacon is not None or w.beacon is not None:  # idle: from now on read with the others' beacons
            if w.beacon is None:
                w.safety_due = now + random.uniform(0, IDLE_SAFETY_POLL_SECONDS)  # (spread: the module docstring)
            else:
                w.safety_due = now + IDLE_SAFETY_POLL_SECONDS
            w.beacon, w.interval = idle_beacon if w.beacon is None else w.beacon, math.inf
        else:
            w.interval = min(w.interval * POLL_GROWTH, IDLE_POLL_SECONDS)
            w.activity.vouch(now + w.interval + 1.0, seen)
        w.due = now + w.interval


_watchers: PerStore[Watcher] = PerStore(Watcher)


def watcher_for(store: Storage) -> Watcher | None:
    """The process's watcher of a store handle (started on first use; None once the handle is closing)."""
    return _watchers.get(store)


def stop_watcher(store: Storage, timeout: float = 5.0) -> None:
    """Stop the store handle's watcher for good and wait for it (before the handle closes)."""
    _watchers.retire(store, timeout)
