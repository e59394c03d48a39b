"""The lmdb store's environment: one open LMDB environment per path per process, shared by every store handle.

`_Environment` opens the files (durability, map size and number of sets fixed at the first open), counts its
users, opens the named databases, runs the background purger of expired records and owns the doorbell and
the group commit of this process's threads (ignis.storage.lmdb.group_commit). A child process forked while
an environment was open must never touch the parent's handle, so the fork handling lives here too (`forked`,
`_inherited`, the at-fork hook). It is separate from the store handle because it is per process and per path,
not per client: `LmdbStore.with_client` makes another handle on the same environment.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import Any

import lmdb

from ignis.envelope import now_ms
from ignis.errors import InvalidInputError, StoreUnavailable
from ignis.storage.lmdb import checkpoints
from ignis.storage.lmdb.doorbell import EnvironmentBell
from ignis.storage.lmdb.group_commit import GroupCommit
from ignis.storage.lmdb.records import _expired

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"  # the durability of a cursor's environment that checkpoints instead of flushing


class _Environment:
    """One open LMDB environment per path per process (LMDB forbids opening it twice)."""

    _open: dict[str, _Environment] = {}
    _inherited: set[str] = set()  # paths this process inherited open through fork()
    _registry_lock = threading.Lock()

    def __init__(self, path: str, durability: str, map_size: int, max_dbs: int) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.durability = durability
        self.pid = os.getpid()
        if durability == CHECKPOINT:  # a cursor's: no flush a commit, a checkpoint a second (see checkpoints)
            checkpoints.prepare(path)
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=max_dbs,
            max_readers=1024,
            # durability=fsync: each commit flushes its data pages before it writes the meta page that makes
            # them current, but does not flush that meta page (MDB_NOMETASYNC: "maintains database integrity,
            # but a system crash may undo the last committed transaction", LMDB docs). That halves the time a
            # commit holds the write lock, which every publisher, claimer and acker of every process shares.
            # What a caller is told is stored (a publish, a queue apply, a lease) is made durable by
            # StoreContext.flush after the commit, outside the lock; claims and acks are not waited for: a crash
            # of the machine that undoes one only delivers a message again (at least once).
            sync=durability == "fsync",
            metasync=False,
            # durability=fast: dirty pages are written in place in the shared map, about twice the write rate
            # (bench_lmdb.py). Not with fsync: a commit then msyncs the whole map, so each durable commit costs
            # time in proportion to the store's size (1,000,000 messages stored: 12 ms a publish instead of
            # 1.2 ms, bench_delayed.py); written pages go out with pwrite and one fdatasync instead. Every
            # process of a store must use the same durability: LMDB's docs warn that "processes with and
            # without MDB_WRITEMAP on the same environment do not cooperate well" (mdb_env_open).
            writemap=durability == "fast",
            lock=True,
        )
        # durability=checkpoint (a cursor's environment under a store's fsync): neither sync nor writemap, LMDB's
        # MDB_NOSYNC alone; made durable by its checkpoints, and restored from them after a machine crash.
        self.checkpoints: checkpoints.Checkpoints | None = None
        if durability == CHECKPOINT:
            self.checkpoints = checkpoints.Checkpoints(self.env, path)
            checkpoints.CHECKPOINTER.register(self.checkpoints)
        self.dbs: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.users = 0
        self.forked = False  # set in a forked child: this handle belongs to the parent
        self._purger: threading.Thread | None = None
        self._stop = threading.Event()
        self._bell: EnvironmentBell | None = None
        self.group = GroupCommit(self)

    @classmethod
    def acquire(cls, path: str, durability: str, map_size: int, max_dbs: int) -> _Environment:
        real = os.path.realpath(path)
        with cls._registry_lock:
            env = cls._open.get(real)
            if env is None and real in cls._inherited:
                raise StoreUnavailable(
                    f"lmdb store at {real} was open when this process was forked from its parent, and LMDB "
                    "cannot open it again here: open stores only after forking, or start worker processes "
                    "with the 'spawn' method")
            if env is None:
                try:
                    env = cls(real, durability, map_size, max_dbs)
                except lmdb.Error as exc:
                    raise StoreUnavailable(f"cannot open lmdb store at {real}: {exc}") from None
                except OSError as exc:
                    raise StoreUnavailable(f"cannot open lmdb store at {real}: {exc.strerror}") from None
                cls._open[real] = env
            elif env.durability != durability:
                raise InvalidInputError(
                    f"lmdb store at {real} is already open in this process with durability="
                    f"{env.durability!r}; cannot reopen it with durability={durability!r}"
                )
            env.users += 1
            return env

    @classmethod
    def _after_fork_in_child(cls) -> None:
        # The child must not touch the parent's handle (not even to close it: that would abort the
        # parent's transactions in shared memory), and LMDB refuses a second open of the same files.
        for env in cls._open.values():
            env.forked = True
        cls._inherited = set(cls._open) | cls._inherited
        cls._open = {}
        cls._registry_lock = threading.Lock()

    def bell(self, location: str) -> EnvironmentBell:
        """The environment's doorbell in this process (ignis.storage.lmdb.doorbell), made on first use."""
        if self._bell is None:
            with self.lock:
                if self._bell is None:
                    self._bell = EnvironmentBell(self.path, location)
        return self._bell

    def bell_if_open(self) -> EnvironmentBell | None:
        """The doorbell, if this process made it (a claim asks it without making one)."""
        return self._bell

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users > 0 or self.forked:
                return
            self._open.pop(self.path, None)
            self._stop.set()
            self.group.close()
            if self._purger is not None:
                self._purger.join(timeout=5)
            if self.checkpoints is not None:
                checkpoints.CHECKPOINTER.unregister(self.checkpoints)
                self.checkpoints.close()
            if self._bell is not None:
                self._bell.close()
            self.env.close()

    def db(self, name: str) -> Any:
        handle = self.dbs.get(name)
        if handle is None:
            with self.lock:
                handle = self.dbs.get(name)
                if handle is None:
                    # In our own write transaction: open_db without one begins it while holding the GIL,
                    # which deadlocks the process when another thread holds the write lock.
                    with self.env.begin(write=True) as txn:
                        handle = self.env.open_db(name.encode(), txn=txn, create=True)
                    self.dbs[name] = handle
        return handle

    def start_purger(self, interval: float) -> None:
        with self.lock:
            if interval <= 0 or self._purger is not None:
                return
            self._purger = threading.Thread(target=self._purge_loop, args=(interval,), name="ignis-lmdb-purge",
                                            daemon=True)
            self._purger.start()

    def _purge_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.purge_expired()
            except lmdb.Error:
                log.exception("background purge of expired records failed in %s", self.path)

    def purge_expired(self, chunk: int = 2000) -> int:
        """Delete expired records of every open database. Only one process per host does the work at a
        time (a non-blocking file lock); the others skip the pass."""
        with open(os.path.join(self.path, "purge.lock"), "a+") as lock_file:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            removed = 0
            for handle in list(self.dbs.values()):
                cursor_key: bytes | None = b""
                while cursor_key is not None:
                    now = now_ms()
                    with self.env.begin(write=True, db=handle) as txn:
                        cursor = txn.cursor()
                        cursor_key, n = _purge_chunk(cursor, cursor_key, now, chunk)
                    removed += n
            return removed


os.register_at_fork(after_in_child=_Environment._after_fork_in_child)


def _purge_chunk(cursor: Any, start: bytes, now: int, chunk: int) -> tuple[bytes | None, int]:
    removed = 0
    if not cursor.set_range(start):
        return None, 0
    for _ in range(chunk):
        value = cursor.value()
        if len(value) >= 8 and _expired(value, now):
            cursor.delete()  # moves to the next record
            removed += 1
            if not cursor.key():
                return None, removed
        elif not cursor.next():
            return None, removed
    return bytes(cursor.key()), removed
