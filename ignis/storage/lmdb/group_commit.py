"""The lmdb store's group commit: the write transactions of one process's threads, committed together.

Every LMDB commit holds the environment's write lock, shared with every other process, while it flushes its
pages; with several threads publishing, claiming or acking, one commit per call would have them queue for
that lock one flush at a time. `GroupCommit` batches them into one transaction and one flush.

A claim need not wait for its commit (`early`): the claim is decided when its function runs, under the write
lock, so no other claimer can take the same slots from then on, and the commit only makes that decision
durable. A claim's messages are handed out meanwhile, which takes the commit's flush (about 1 ms on a
virtual disk at 100 commits/s) off every message's end-to-end latency. Committing the transaction is
the committer thread's job: an LMDB write transaction must end in the thread that began it ("A transaction
and its cursors must only be used by a single thread", lmdb.h), so the claimer hands its write to that
thread instead of leading the commit itself. What an early write gives up is nothing at-least-once did not
give up already: a claim that fails to commit (a failing disk) leaves its messages ready, so they are
delivered again, as a claim undone by a machine crash is (durability=fsync never flushes a claim's meta
page); then claims wait for their commits, and get their errors, until a commit succeeds, so a failing disk
does not hand the same messages out again and again. An ack is a write too, so it commits after the claim it
settles.

A claim can even ride along in a publish's own transaction: a publish that wakes a consumer of this process
(its committing ring, ignis.storage.lmdb.doorbell) waits up to RIDE_ALONG_SECONDS, the write lock held, for
that consumer's claim, and runs it after its own writes, where it sees them uncommitted. The consumer then
has the message before the publish's commit flushes at all.
"""

from __future__ import annotations

import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

RIDE_ALONG_SECONDS = 0.001  # how long a commit that woke a consumer of this process waits for its claim

# LEAD_WHEN_IDLE (GroupCommit.run's `lead_when_idle`, a subscription's claims: ignis.storage.lmdb.topics). Handing a
# claim to the committer thread and back costs two thread switches and two turns at the interpreter lock, on the
# claimer's core and the committer's; the early release it buys saves the claim's message one flush. In a cursor's
# environment, written only by its subscription's consumers, there is mostly no commit in flight to wait out, and
# with several subscriptions' consumer processes on few cores the switches are what delays messages. Measured at
# 1,000 msg/s to a topic with 3 subscriptions (3 consumer processes, 2 cores): end-to-end p50 / p99 per subscription
# 5.9 / 24, 4.2 / 11 and 2.5 / 9 ms handed off, 4.5 / 12, 3.1 / 8.3 and 2.6 / 8 ms led in place (alternate runs). A
# queue's claim (the store's own environment, where it follows a publisher's commit that rang before its flush)
# stays handed off: led in place, a queue consumer's p50 at 1,000 msg/s went from 0.44-0.50 ms to 0.66-0.69.


class Combined:
    """A commit hook that is called once per commit for all the writes of a batch that carry the same `fn`:
    fn(args), with the `arg` of each such write whose result is truthy, in batch order without repeats (a ring:
    `fn` rings one magazine, `arg` is a publish's shard). Publishers that share a commit then ring its listeners
    once, with every shard, instead of once each: a listener in another process wakes, and claims, once per
    commit rather than once per message (each wake-up is a thread switch or two there)."""

    __slots__ = ("arg", "fn")

    def __init__(self, fn: Callable[[list[Any]], None], arg: Any) -> None:
        self.fn = fn
        self.arg = arg


class _Write:
    """One write waiting for a group commit."""

    __slots__ = ("after", "batch", "before", "durable", "early", "error", "fn", "gate", "released", "result", "taken")

    def __init__(self, fn: Callable[[Any], Any], durable: bool, after: Callable[[Any], None] | None,
                 early: bool, before: Callable[[Any], None] | None) -> None:
        self.fn = fn
        self.durable = durable
        self.before = before  # called with the result before the commit (the write lock held)
        self.after = after  # called with the result once committed, before the flush
        self.early = early  # its caller takes the result as soon as fn ran (see the module's docstring)
        self.taken = False  # in a leader's batch
        self.released = False  # handed back to its caller before the commit
        self.result: Any = None
        self.error: BaseException | None = None
        # A caller that waits blocks on its own gate (a lock taken for it), released once: when its write is done
        # (or released early), or when it is handed the lead of the next commit (`batch`, its writes). So a commit
        # wakes exactly the callers it concerns, not every waiting thread to look and sleep again (a thread switch
        # each, and a turn at the interpreter lock: measured, 2.6 waits a message in a consumer where 1.2 do).
        self.gate: Any = None
        self.batch: list[_Write] | None = None


def _wake(entry: _Write) -> None:
    """Let the caller of `entry` go on (the group's lock held), if it waits."""
    if entry.gate is not None:
        entry.gate.release()


class GroupCommit:
    """Concurrent writes of this process's threads to one LMDB environment, committed together.

    A thread that finds no commit running takes every write queued meanwhile and runs them in one
    transaction and one flush; the others wait for it, and a thread that finds one running queues its write
    for the next. A lone caller commits at once. An early write is led by the committer thread instead
    (started on first use), and its caller resumes once its function ran. The flush of the meta page that
    makes a durable write durable (`env.sync`) is made after the write lock and the next leader's turn are
    given up, so the next batch commits meanwhile.

    The writes are the store's own transaction functions, which raise nothing but lmdb.Error (then the
    whole transaction is aborted and every write of it gets the error, as a failed commit would give each
    of them)."""

    def __init__(self, environment: Any) -> None:
        self._environment = environment  # (its LMDB handle, .env, looked up per commit: tests stand in for it)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # what the committer (and a leader awaiting riders) waits on
        self._queue: list[_Write] = []
        self._busy = False
        self._committer: threading.Thread | None = None
        self._closed = False
        # False after a commit failed with early writes released, until one succeeds: a failing disk must not
        # hand the same messages out again and again; meanwhile a claim waits for its commit and its error.
        self._early_ok = True
        self._expecting = False  # a before hook of the commit running now woke a consumer of this process

    def run(self, fn: Callable[[Any], T], durable: bool, after: Callable[[T], None] | None = None,
            early: bool = False, before: Callable[[T], None] | None = None, lead_when_idle: bool = False) -> T:
        """fn(txn) in a write transaction, committed (and flushed when `durable`) before this returns, or,
        when `early`, as soon as fn ran; before(result) before the commit, after(result) once it is committed
        (visible to every reader), before the flush. Both hooks are hints: an error of theirs is logged. A hook
        may be a Combined: called once per commit with the other writes' of the same fn. `lead_when_idle`: an
        early write that finds no commit running or queued leads its own, in this thread, and returns once it is
        committed (see LEAD_WHEN_IDLE)."""
        batch: list[_Write] | None = None
        with self._lock:
            early = early and self._early_ok and not (lead_when_idle and not self._busy and not self._queue)
            item = _Write(fn, durable, after, early, before)
            if early and self._committer is None and not self._closed:
                self._committer = threading.Thread(target=self._commit_loop, name="ignis-lmdb-commit", daemon=True)
                self._committer.start()
            self._queue.append(item)
            if not self._busy and not (early and not self._closed):  # no commit running: lead one at once
                batch = self._take()
            else:
                item.gate = _allocate_lock()
                item.gate.acquire()
                if early:
                    self._cond.notify_all()  # the committer (or a leader awaiting riders: _ride_along)
        if batch is None:
            item.gate.acquire()  # (see _Write.gate)
            batch = item.batch
        if batch is not None:
            self._commit(batch)  # (the leader's own write is done when it returns, flushed if durable)
        if item.error is not None:
            raise item.error
        return item.result

    def close(self) -> None:
        """Stop the committer thread once the writes queued for it are committed."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            committer = self._committer
        if committer is not None and committer is not threading.current_thread():
            committer.join(timeout=5)

    def expect_claim(self) -> None:
        """From a before hook, in the leader's thread: the commit running now woke a consumer of this process
        for what it writes. That consumer's claim rides along in the same transaction (it sees the writes
        there, uncommitted) instead of waiting out this commit: see _ride_along."""
        self._expecting = True

    def _take(self) -> list[_Write]:
        """The queued writes, for a leader to commit (the group's lock held)."""
        self._busy = True
        batch, self._queue = self._queue, []
        for entry in batch:
            entry.taken = True
        return batch

    def _hand_over(self) -> None:
        """No commit runs now (the group's lock held): the queued writes get a leader. The committer if one of them
        is early and it still runs (it takes them all), else the caller of the first, woken with the batch."""
        if not self._queue:
            return
        if not self._closed and self._committer is not None and any(entry.early for entry in self._queue):
            self._cond.notify_all()
            return
        first = self._queue[0]
        first.batch = self._take()
        _wake(first)

    def _ride_along(self) -> list[_Write]:
        """The early writes (claims) queued within RIDE_ALONG_SECONDS, taken for this transaction: a consumer of
        this process that a publish woke gets the message before the publish's commit, not after it. The wait
        holds the write lock, so it is short and only made when a consumer of this process was woken."""
        self._expecting = False
        deadline = time.monotonic() + RIDE_ALONG_SECONDS
        with self._lock:
            while not any(entry.early for entry in self._queue):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(remaining)
            riders = [entry for entry in self._queue if entry.early]
            self._queue = [entry for entry in self._queue if not entry.early]
            for entry in riders:
                entry.taken = True
        return riders

    def _commit_loop(self) -> None:
        """The committer thread: leads every batch with an early write in it."""
        while True:
            with self._lock:
                while not self._closed and (self._busy or not any(entry.early for entry in self._queue)):
                    self._cond.wait()
                if self._closed and not self._queue:
                    return
                if self._busy:  # closed, but a leader is still committing: it leaves the rest to its callers
                    return
                batch = self._take()
            self._commit(batch)

    def _commit(self, batch: list[_Write]) -> None:
        env = self._environment.env
        error: BaseException | None = None
        early = [entry for entry in batch if entry.early]
        try:
            with env.begin(None, None, True) as txn:
                for entry in batch:
                    entry.result = entry.fn(txn)
                _run_hooks(batch, True)
                if self._expecting:
                    riders = self._ride_along()
                    batch += riders  # (before they run: a rider's error is the whole transaction's)
                    early += riders
                    for entry in riders:
                        entry.result = entry.fn(txn)
                if early:  # decided under the write lock: the commit below only makes them durable
                    with self._lock:
                        for entry in early:
                            entry.released = True
                            _wake(entry)
        except BaseException as exc:  # the transaction was aborted: none of its writes happened
            error = exc
            if any(entry.released for entry in early) and self._early_ok:
                log.warning("lmdb store at %s: a commit failed after its claims were handed out; their messages "
                            "stay ready and will be delivered again; claims wait for their commits until one "
                            "succeeds: %s", self._environment.path, exc)
        durable = [entry for entry in batch if entry.durable] if error is None else []
        if error is None:
            _run_hooks(batch, False)
        with self._lock:
            for entry in batch:
                if not entry.released:
                    entry.error = error
                    if error is not None or not entry.durable:  # done (a durable one: once flushed, below)
                        _wake(entry)
            if error is None:
                self._early_ok = True
            elif any(entry.released for entry in early):
                self._early_ok = False
            self._busy = False  # the next batch may commit while this one's meta page is flushed
            self._hand_over()
        if durable:
            try:
                env.sync(True)
            except BaseException as exc:
                for entry in durable:
                    entry.error = exc
            with self._lock:
                for entry in durable:
                    _wake(entry)


def _run_hooks(batch: list[_Write], before: bool) -> None:
    """Call the batch's before (or after) hooks, each Combined fn once (see Combined)."""
    combined: dict[Any, dict[Any, None]] | None = None
    for entry in batch:
        hook = entry.before if before else entry.after
        if hook is None:
            continue
        if type(hook) is not Combined:
            _hint(hook, entry.result)
        elif entry.result:
            if combined is None:
                combined = {}
            args = combined.get(hook.fn)
            if args is None:
                args = combined[hook.fn] = {}
            args[hook.arg] = None
    if combined is not None:
        for fn, args in combined.items():
            _hint(fn, list(args))


def _hint(hook: Callable[[Any], None], result: Any) -> None:
    """Call a commit hook (a ring): a hint, so its failure is never the write's."""
    try:
        hook(result)
    except Exception:
        log.debug("commit hook failed", exc_info=True)
