"""Cross-process wake-ups: keeps the shard activity (ignis.activity) of the magazines that consumers in this
process wait on up to date with what other processes publish, so a waiting consumer learns of a message
within milliseconds, not on a periodic refresh (DESIGN §4).

One `Watcher` thread per store handle, started by the first wait on a magazine of it, following only the
magazines consumers of this process look for work in (one nobody looked in for KEEP_WATCHING_SECONDS is
dropped). Two means:

* the store's doorbell where it has one (`Storage.doorbell`; lmdb): a publisher rings the listening
  processes after its commit, and the ring itself marks the shards active. The watcher subscribes, and
  reads the pointers only as a safety net, every DOORBELL_POLL_SECONDS;
* otherwise (Aerospike) it polls the shard pointers, one batch read per magazine, at an adaptive interval:
  FAST_POLL_SECONDS (never below 1 ms) once the load pointers moved, growing by POLL_GROWTH with each poll
  that found them where they were, up to SLOW_POLL_SECONDS: at most one store call a second per idle queue.
  A magazine no consumer looked in lately (its consumers are busy with messages, and claim on their own) is
  polled at the slow interval only.

Only consumers (fires on a main magazine) are watched: the sweeper, the shovel and the operator's figures
read pointers as before and pay nothing for this. A failing store is backed off and said once
(ignis.outage), like every other loop that talks to it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass

from ignis.activity import ShardActivity, with_work
from ignis.errors import StoreError
from ignis.outage import Backoff
from ignis.storage.base import Doorbell, Storage

log = logging.getLogger(__name__)

FAST_POLL_SECONDS = 0.001
SLOW_POLL_SECONDS = 1.0
POLL_GROWTH = 1.25
DOORBELL_POLL_SECONDS = 5.0
SUBSCRIBED_POLL_SECONDS = 0.1  # one more read this soon after subscribing: a publisher sees the listing late
HUNGRY_SECONDS = 1.0  # a consumer looked for work this recently: poll adaptively
KEEP_WATCHING_SECONDS = 30.0


@dataclass(slots=True)
class _Watched:
    magazine: str
    shards: int
    activity: ShardActivity
    touched: float  # when a consumer last looked for work here (monotonic)
    interval: float = FAST_POLL_SECONDS
    due: float = 0.0
    loaded: int = -1  # the sum of the load pointers at the last poll (-1: never polled)
    busy: bool = False  # polled slowly because no consumer looked for work lately


class Watcher:
    """Follows the magazines of one store handle that consumers of this process look for work in."""

    def __init__(self, store: Storage) -> None:
        self._store = weakref.ref(store)
        self._doorbell: Doorbell | None = store.doorbell()
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="ignis-watch", daemon=True)
        self._thread.start()

    def watch(self, magazine: str, shards: int, activity: ShardActivity) -> None:
        """A consumer looks for work in `magazine`: follow it (again) for the next KEEP_WATCHING_SECONDS."""
        now = time.monotonic()
        watched = self._watched.get(magazine)
        if watched is not None and watched.shards == shards:
            watched.touched = now
            if watched.busy:  # its consumers ran out of work: look now, and often
                watched.busy, watched.interval, watched.due = False, FAST_POLL_SECONDS, now
                self._changed.set()
            return
        with self._lock:
            self._watched[magazine] = _Watched(magazine, shards, activity, now)
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
            due = [w for w in watched if w.due <= now]
            try:
                for w in due:
                    self._poll(store, w)
            except StoreError as exc:
                if store.closed:
                    break
                delay = backoff.failed("watch for new messages", exc)
                for w in due:
                    w.due = time.monotonic() + delay
            else:
                if due:
                    backoff.ok()
            del store
            wait = min((w.due for w in watched), default=now + SLOW_POLL_SECONDS) - time.monotonic()
            if wait > 0:
                self._changed.wait(min(wait, SLOW_POLL_SECONDS))
            self._changed.clear()
        self.stopped = True
        with self._lock:
            self._watched.clear()
            self._subscribe()

    def _poll(self, store: Storage, w: _Watched) -> None:
        seen = w.activity.before_read()
        pointers = store.pointers(w.magazine, w.shards)
        loaded = sum(p.load for p in pointers.values())
        w.activity.replace(with_work(pointers), seen)
        now = time.monotonic()
        hungry = w.activity.waiting > 0 or now - w.touched <= HUNGRY_SECONDS
        w.busy = False
        if self._doorbell is not None:
            w.interval = DOORBELL_POLL_SECONDS if w.loaded >= 0 else SUBSCRIBED_POLL_SECONDS
        elif not hungry:  # its consumers are busy with messages (they claim on their own), or gone
            w.interval, w.busy = SLOW_POLL_SECONDS, True
        elif loaded != w.loaded and w.loaded >= 0:
            w.interval = FAST_POLL_SECONDS  # messages flow: look again soon
        else:
            w.interval = min(w.interval * POLL_GROWTH, SLOW_POLL_SECONDS)
        w.loaded = loaded
        w.due = now + w.interval


_watchers: weakref.WeakKeyDictionary[Storage, Watcher] = weakref.WeakKeyDictionary()
_watchers_lock = threading.Lock()


def watcher_for(store: Storage) -> Watcher:
    """The process's watcher of a store handle (started on first use)."""
    found = _watchers.get(store)
    if found is None or found.stopped:
        with _watchers_lock:
            found = _watchers.get(store)
            if found is None or found.stopped:
                found = _watchers[store] = Watcher(store)
    return found
