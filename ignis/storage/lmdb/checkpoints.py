"""Checkpoints of a subscription's cursor environment (lmdb, `durability=fsync`, `cursor_durability=checkpoint`).

A cursor's environment (ignis.storage.lmdb.cursor_environments) holds a subscription's position, its claim records and
its hole counts: state whose loss only delivers messages again (at least once), never loses one, since the messages
themselves stay in the topic, flushed with every publish. So its commits do not flush (LMDB's `MDB_NOSYNC`), which
takes a flush off every claim's path (a claim is handed out after its commit: three subscriptions at 1,000 msg/s
waited for three flushes a message on a busy disk), and the state is made durable by a checkpoint instead: about every
`CHECKPOINT_SECONDS`, and at once for a durable write (a seek, a subscription's start), a consistent copy of the
environment (`Environment.copyfd`: one read transaction's snapshot) is written beside it, flushed, and renamed over
the last one.

Why a copy and not `mdb_env_sync` now and then: with `MDB_NOSYNC` "a system crash can corrupt the database" unless
"the filesystem preserves write order" (LMDB's docs of `mdb_env_open`), which ext4 and xfs do not promise, and later
commits reuse the pages of an earlier synced state. A copy is never written in place.

A process crash (even SIGKILL) loses nothing: the commits are in the OS's page cache, in LMDB's order. A machine
crash may leave the environment torn, so it is not trusted after one: `prepare`, before LMDB opens the environment,
compares the boot id the last opener wrote beside it (Linux's `/proc/sys/kernel/random/boot_id`) with this boot's;
when they differ, the checkpoint replaces the data file, undoing the claims and acks after it (those messages are
delivered again, at most about `CHECKPOINT_SECONDS` of them). A clean close takes a last checkpoint, so a clean
reboot undoes nothing. Where there is no boot id (not Linux), cursors flush every commit as the store does.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

CHECKPOINT_SECONDS = 1.0  # how much a machine crash may undo of a subscription's claims and acks, about
CHECKPOINT_FILE = "checkpoint.mdb"  # the last checkpoint: an LMDB data file, copied over data.mdb to restore
BOOT_FILE = "boot-id"  # the boot id of the machine that last opened the environment
LOCK_FILE = "checkpoint.lock"  # serialises checkpoints and restores across processes (flock)
DATA_FILE = "data.mdb"  # LMDB's data file in an environment's directory
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's id (changes at every start of the machine), None where the OS has none."""
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip() or None
    except OSError:
        return None


def available() -> bool:
    """Whether checkpoints can protect a cursor here (a machine restart can be told)."""
    return boot_id() is not None


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(os.path.join(path, LOCK_FILE), "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield  # (closing the file releases the lock)


def _write_durably(path: str, write: Callable[[int], object]) -> None:
    """Replace the file at `path` with what write(fd) writes, on disk when this returns: written aside, flushed, renamed
    over it, the directory flushed. A write that fails (a full disk) leaves no half file; the old one stands."""
    aside = f"{path}.{os.getpid()}.tmp"
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(aside, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(aside)
        raise
    _sync_dir(os.path.dirname(path))


def _copy_into(source: str) -> Callable[[int], object]:
    def write(fd: int) -> None:
        with open(source, "rb") as src, open(fd, "wb", closefd=False) as out:
            shutil.copyfileobj(src, out)
    return write


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # (a rename is on disk once its directory is)
    finally:
        os.close(fd)


def _age(path: str) -> float:
    """Seconds since the file at `path` was written (infinite when there is none)."""
    try:
        return time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")


def prepare(path: str) -> None:
    """Before LMDB opens the cursor environment at `path` (made if missing): after a machine restart since its last
    opener, replace its data file with the last checkpoint (or, with none, start it empty); then note this boot."""
    os.makedirs(path, exist_ok=True)
    current = boot_id()
    marker = os.path.join(path, BOOT_FILE)
    with _locked(path):
        try:
            with open(marker) as f:
                last = f.read().strip()
        except FileNotFoundError:
            last = None
        if last == current:
            return
        data, checkpoint = os.path.join(path, DATA_FILE), os.path.join(path, CHECKPOINT_FILE)
        if last is not None and os.path.exists(data):
            # Opened during another boot: that boot may have ended in a crash, which can tear a no-sync environment.
            if os.path.exists(checkpoint):
                _write_durably(data, _copy_into(checkpoint))
                log.warning("the machine restarted since the cursor %s was last open: restored its checkpoint of "
                            "%s (claims and acks after it are undone: those messages are delivered again)",
                            os.path.basename(path), time.strftime("%Y-%m-%dT%H:%M:%S",
                                                                  time.localtime(os.path.getmtime(checkpoint))))
            else:  # (a cursor gets one at its first durable write, its start: none means it never had a position)
                os.remove(data)
                log.warning("the machine restarted since the cursor %s was last open and it has no checkpoint: it "
                            "starts again from its topic's first retained message", os.path.basename(path))
            _sync_dir(path)
        if current is not None:
            _write_durably(marker, lambda fd: os.write(fd, current.encode()))


class Checkpoints:
    """One cursor environment's checkpoints in this process: `take` writes one when something committed since the
    last (this process's or another's: LMDB's transaction id is the environment's)."""

    def __init__(self, env: Any, path: str) -> None:
        self._env = env
        self._path = path
        self.name = os.path.basename(path)  # the cursor's, for what is logged
        self._lock = threading.Lock()
        self._taken: int | None = None  # the transaction id of the last checkpoint this process wrote
        self.failing = False  # the last background attempt failed (logged once until one succeeds)
        self._closed = False

    def take(self, at_once: bool = False) -> bool:
        """Write a checkpoint if anything committed since this process's last, unless another process of the
        subscription wrote one just now (`at_once`: even so: a durable write's, a close's); whether one was written.
        Raises OSError or lmdb.Error."""
        with self._lock:
            if self._closed:
                return False
            last = self._env.info()["last_txnid"]
            target = os.path.join(self._path, CHECKPOINT_FILE)
            if last == self._taken or (not at_once and _age(target) < CHECKPOINT_SECONDS / 2):
                return False  # (nothing new, or another process of the subscription wrote one just now: next time)
            with _locked(self._path):  # (one at a time across processes, so a later copy is never renamed first)
                _write_durably(target, lambda fd: self._env.copyfd(fd, compact=True))
            self._taken = last
            return True

    def close(self) -> None:
        """A last checkpoint (a clean stop undoes nothing, even if the machine stops next), then no more: the caller
        closes the environment after this."""
        try:
            self.take(at_once=True)
        except Exception as exc:  # (closing goes on: the earlier checkpoint stands)
            log.warning("cannot write the last checkpoint of the cursor %s: %s", self.name, exc)
        with self._lock:
            self._closed = True


class _Checkpointer:
    """The process's one thread that takes every open cursor environment's checkpoints (a sweeper opens many)."""

    def __init__(self) -> None:
        self._open: weakref.WeakSet[Checkpoints] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def register(self, checkpoints: Checkpoints) -> None:
        with self._lock:
            self._open.add(checkpoints)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="ignis-lmdb-checkpoints", daemon=True)
                self._thread.start()

    def unregister(self, checkpoints: Checkpoints) -> None:
        with self._lock:
            self._open.discard(checkpoints)

    def _loop(self) -> None:
        while True:
            time.sleep(CHECKPOINT_SECONDS)
            with self._lock:
                open_now = list(self._open)
            for checkpoints in open_now:
                try:
                    checkpoints.take()
                except Exception as exc:  # (OSError, lmdb.Error: a full disk, a closed environment): tried again
                    if not checkpoints.failing:
                        checkpoints.failing = True
                        log.warning("cannot write the checkpoint of the cursor %s: %s (tried again every %.0f s)",
                                    checkpoints.name, exc, CHECKPOINT_SECONDS)
                else:
                    if checkpoints.failing:
                        checkpoints.failing = False
                        log.info("the checkpoint of the cursor %s is written again", checkpoints.name)


CHECKPOINTER = _Checkpointer()


def _after_fork_in_child() -> None:
    global CHECKPOINTER
    CHECKPOINTER = _Checkpointer()  # (the parent's thread is not in the child, nor are its environments usable)


os.register_at_fork(after_in_child=_after_fork_in_child)
