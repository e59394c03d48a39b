"""The lmdb store's cursor environments: each subscription's claim state in an LMDB environment of its own.

A subscription's cursor (its position per topic shard, its claim records, its hole counts: ignis.storage.lmdb.topics)
is written by every claim and ack of its consumers. In the store's own environment those commits would share one
write lock with every publisher and every other subscription: LMDB has one writer per environment, and with
durability=fsync a commit holds that lock while it flushes its pages. Three subscriptions' consumers and a publisher
then queue for one lock, one flush at a time, although the disk runs flushes of separate files in parallel well.

So each cursor lives in `<store>/cursors/<cursor>/`, an environment of its own, whose commits lock apart from the
store's. With the store's `durability=fsync` they do not flush either (`cursor_durability=checkpoint`, the default): a
cursor's state is made durable by checkpoints (ignis.storage.lmdb.checkpoints), since losing it only delivers messages
again; `cursor_durability=fsync` flushes every commit as the store does. With `durability=fast`, neither. The
messages stay in the topic, in the store's environment: a claim reads them in a read transaction there (no lock) and
writes its claim records here. What spans the two is said where it happens: a claim (ignis.storage.lmdb.topics), the
sweeper's move out of a cursor (ignis.storage.lmdb.moves).
"""

from __future__ import annotations

import logging
import os
import threading

import lmdb

from ignis import names
from ignis.storage.lmdb import checkpoints
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.environment import CHECKPOINT, _Environment

log = logging.getLogger(__name__)

CURSORS_DIR = "cursors"
CURSOR_DURABILITY_MODES = (CURSOR_CHECKPOINT := "checkpoint", "fsync")  # the store's `cursor_durability`
CURSOR_MAX_DBS = 32  # a data and a meta set per client whose subscription has this name (16 clients)


class CursorEnvironments:
    """One store handle's cursor contexts (StoreContext on each cursor's own environment), opened on first use."""

    def __init__(self, main: StoreContext, *, farm_id: str, durability: str, map_size: int,
                 purge_interval: float, cursor_durability: str = CURSOR_CHECKPOINT) -> None:
        self._main = main
        self._farm_id = farm_id
        # (checkpoints need to tell a machine restart: without a boot id, a cursor flushes as the store does)
        checkpointed = durability == "fsync" and cursor_durability == CURSOR_CHECKPOINT and checkpoints.available()
        self._durability = CHECKPOINT if checkpointed else durability
        self._map_size = map_size
        self._purge_interval = purge_interval
        self._contexts: dict[str, StoreContext] = {}
        self._lock = threading.Lock()
        self._purger: threading.Thread | None = None  # one for all this handle's cursors (a sweeper opens many)
        self._stop = threading.Event()

    def of(self, cursor: str) -> StoreContext:
        """The context of `cursor`'s environment (opened, and its directory made, on first use)."""
        ctx = self._contexts.get(cursor)
        if ctx is None:
            with self._lock:
                ctx = self._contexts.get(cursor)
                if ctx is None:
                    ctx = self._open(cursor)
        return ctx

    def _open(self, cursor: str) -> StoreContext:
        if self._main.closed or self._main.env.forked:
            self._main.opened("open_cursor")  # raises: closed, or inherited through fork
        topic = names.cursor_topic(cursor)
        assert topic is not None, cursor
        path = os.path.join(self._main.env.path, CURSORS_DIR, cursor)
        env = _Environment.acquire(path, self._durability, self._map_size, CURSOR_MAX_DBS)
        try:
            ctx = StoreContext(env, farm_id=self._farm_id, client_id=self._main.client_id,
                               durability=self._durability, map_size=self._map_size, max_dbs=CURSOR_MAX_DBS,
                               cursor_only=True)
        except BaseException:
            env.release()
            raise
        self._contexts[cursor] = ctx
        if self._purger is None and self._purge_interval > 0:
            self._purger = threading.Thread(target=self._purge_loop, name="ignis-lmdb-cursor-purge", daemon=True)
            self._purger.start()
        return ctx

    def _purge_loop(self) -> None:
        """Claim records expire with their topic's records (a message that left the topic before its ack): purged
        as the store's own expired records are (ignis.storage.lmdb.environment), one thread for every cursor."""
        while not self._stop.wait(self._purge_interval):
            try:
                self.purge_expired()
            except lmdb.Error:
                log.exception("background purge of expired claims failed in %s", self._main.env.path)

    def purge_expired(self) -> int:
        """One purge pass over every cursor environment this handle opened; how many records it removed."""
        return sum(ctx.env.purge_expired() for ctx in list(self._contexts.values()) if not ctx.closed)

    def close(self) -> None:
        """Release every cursor environment this handle opened (LMDB closes one when its last user goes)."""
        self._stop.set()
        with self._lock:
            contexts, self._contexts = list(self._contexts.values()), {}
            purger, self._purger = self._purger, None
        if purger is not None:
            purger.join(timeout=5)
        for ctx in contexts:
            if not ctx.closed:
                ctx.closed = True
                ctx.env.release()
