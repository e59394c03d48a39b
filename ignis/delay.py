"""Delayed delivery: a message published with a delay (or nacked with one, or retried with backoff) waits in
its queue's delayed records (`Storage.load_delayed`, keyed by due time) until a mover makes the due ones
deliverable at main's tail (DESIGN §4, README "Delayed delivery"). Where the store can (lmdb,
`Storage.moves_delayed_in_one_write`), a batch's copy into main, the delete of its delayed records and their
uncount are one transaction, so the `delayed` and `depth` figures are exact at every moment. Elsewhere
(Aerospike) the mover copies, then deletes and uncounts: between the two writes a message is counted in both
figures (docs/python/delayed.md says for how long), never in neither.

Cost per delayed message: its own write, then the copy into main and the delete (two store writes; one
transaction on lmdb), the count's increment and decrement and the slot allocation shared by a whole batch.
Only one process moves a queue's due messages at a time (`Storage.lead_delayed`, a lease of LEAD_MS in the
queue's delay record), so a message is moved once; on Aerospike a mover that dies between the copy and the
delete leaves a copy that is delivered again (at least once).

Who moves: the `DelayMover` of every process whose consumers wait on the queue (a pull-only user's
`fire()` included), and the sweeper on each pass. A process needs no sweeper for its delayed messages.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ignis.envelope import Envelope, now_ms
from ignis.errors import LoadInterrupted, StoreError
from ignis.logs import Reachability
from ignis.outage import Backoff
from ignis.per_store import PerStore
from ignis.storage.base import DelayState, SlotRef, Storage

log = logging.getLogger(__name__)

MOVE_BATCH = 1000  # due messages per query, copy and delete
LEAD_MS = 10_000  # the mover's lease: another process takes over this long after a mover died
DUE_POLL_SECONDS = 0.25  # a queue holding delayed messages whose next due time the store cannot tell
MOVE_GAP_SECONDS = 0.05  # after a move: messages falling due one by one are moved in batches, not one each
IDLE_POLL_SECONDS = 2.0  # a followed queue with none (a publish here, or a bumped beacon, wakes it sooner)
KEEP_FOLLOWING_SECONDS = 30.0

_holder: tuple[int, str] | None = None


def holder() -> str:
    """This process's name as a mover (host, pid and a random part: a pid can come back)."""
    global _holder
    if _holder is None or _holder[0] != os.getpid():
        _holder = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}")
    return _holder[1]


def as_delivered(envelope: Envelope) -> Envelope:
    """The copy a due message becomes in main: unfired, with its attempts, history and due time."""
    return Envelope(envelope.payload, envelope.msg_id, envelope.loaded_at, codec=envelope.codec,
                    headers=envelope.headers, key=envelope.key, attempts=envelope.attempts, reason=envelope.reason,
                    history=envelope.history, due_at=envelope.due_at, subject=envelope.subject)


class MainMagazine(Protocol):
    """What a mover needs of the main magazine it moves a queue's due messages into: an
    `ignis.magazine.Magazine` (described here rather than imported, as ignis.magazine follows its mover)."""

    @property
    def store(self) -> Storage: ...

    @property
    def name(self) -> str: ...

    def load(self, envelopes: Sequence[Envelope]) -> list[SlotRef]: ...

    def reload(self, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool]
               ) -> list[SlotRef]: ...

    def load_due(self, envelopes: Sequence[Envelope]) -> list[SlotRef]: ...


_moving: dict[tuple[str, str, str], threading.Lock] = {}  # (store location, client, queue): one thread of a process
_moving_lock = threading.Lock()


def move_due(main: MainMagazine, now: int | None = None, limit: int = MOVE_BATCH) -> int | None:
    """Move the queue's due messages into `main` (batches of `limit`) if this process may (the lease) and no
    other thread of it is at it. Returns how many, or None when someone else moves them. Store errors
    propagate."""
    store = main.store
    key = (store.location, store.client_id, main.name)
    with _moving_lock:
        lock = _moving.setdefault(key, threading.Lock())
    if not lock.acquire(blocking=False):
        return None
    try:
        return _move(main, now, limit)
    finally:
        lock.release()


# Copied into main, their delayed records not deleted yet (the delete failed: a store outage). Deleted before
# anything else is moved, and never copied again meanwhile: without this, the next move copied every message of
# that batch a second time, and each was delivered twice.
_unsettled: dict[tuple[str, str, str], list[Envelope]] = {}

# A batch whose copy into main failed part way (an outage: LoadInterrupted): its slots, and which copies are known
# to have landed. The next move finishes that copy first, into the same slots (Storage.reload): copying the batch
# afresh copied the landed messages a second time, and a cluster fault run delivered one after its ack.
_interrupted: dict[tuple[str, str, str], tuple[list[Envelope], list[SlotRef], list[bool]]] = {}


def _move(main: MainMagazine, now: int | None, limit: int) -> int | None:
    store, queue = main.store, main.name
    key = (store.location, store.client_id, queue)
    pending = _unsettled.get(key)
    if pending:
        store.settle_delayed(queue, pending)  # (an outage still: raises, and this move waits for the next)
        del _unsettled[key]
    moved = 0
    half_copied = _interrupted.get(key)
    if half_copied is not None:
        due, refs, landed = half_copied
        # Only the lease holder finishes it: had another process taken the lease over, it moves these very
        # messages (and copies the landed ones again: at least once).
        if store.lead_delayed(queue, holder(), now_ms() if now is None else now, LEAD_MS):
            moved = _copy(main, key, due, (refs, landed))
        else:
            del _interrupted[key]
    while True:
        at = now_ms() if now is None else now
        if not store.lead_delayed(queue, holder(), at, LEAD_MS):  # renewed for every batch: a lease the
            return moved if moved else None                       # store lost (a node restarted) is told soon
        # (Should a query answer a record twice, it is copied once.)
        due = list({(env.due_at, env.msg_id): env for env in store.due_delayed(queue, at, limit)}.values())
        if not due:
            return moved
        # The lease again, now: if the query (and the store's retries of it) outlasted it, another process may
        # have taken over and be moving these very messages (a cluster fault run moved a batch twice while
        # migrations slowed the store). Renewed here, it covers the copy and the delete that follow.
        if not store.lead_delayed(queue, holder(), now_ms() if now is None else now, LEAD_MS):
            return moved if moved else None
        done = _copy(main, key, due)
        log.debug("moved %d of %d due message(s) of %s into main (%s .. %s)", done, len(due), queue, due[0].msg_id,
                  due[-1].msg_id)
        moved += done
        if len(due) < limit:
            return moved


def _copy(main: MainMagazine, key: tuple[str, str, str], due: list[Envelope],
          half_copied: tuple[list[SlotRef], list[bool]] | None = None) -> int:
    """Make a batch of due messages deliverable in main; how many were moved. In one transaction where the store
    can (`Storage.move_delayed`: those another mover took meanwhile are left out). Elsewhere copy them into main,
    then delete their delayed records: a crash between the two delivers them twice (at least once). A copy or a
    delete the store failed part way is kept, and finished by the next move before anything else (`half_copied`:
    the slots of a copy that failed part way, and which landed)."""
    copies = [as_delivered(env) for env in due]
    if main.store.moves_delayed_in_one_write:
        return len(main.load_due(copies))
    try:
        if half_copied is None:
            main.load(copies)
        else:
            main.reload(half_copied[0], copies, half_copied[1])
    except LoadInterrupted as exc:
        _interrupted[key] = (due, exc.refs, exc.landed)
        raise
    _interrupted.pop(key, None)
    try:
        main.store.settle_delayed(main.name, due)
    except StoreError:
        _unsettled[key] = due
        raise
    return len(due)


@dataclass(slots=True)
class _Followed:
    main: weakref.ref[MainMagazine]
    touched: float
    state: DelayState | None = None


class DelayMover:
    """Moves the due messages of the queues consumers of this process wait on (one thread per store handle)."""

    def __init__(self, store: Storage) -> None:
        self._store = weakref.ref(store)
        self._followed: dict[str, _Followed] = {}
        # A store with a doorbell is local (lmdb): a look costs microseconds, so an idle queue is looked at often.
        self._idle_poll = DUE_POLL_SECONDS if store.doorbell() is not None else IDLE_POLL_SECONDS
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._mark: int | None = None  # the store's change mark when the delay states were last read
        self.stopped = False
        self._thread = threading.Thread(target=self._run, name="ignis-delay", daemon=True)
        self._thread.start()

    def follow(self, main: MainMagazine) -> None:
        """A consumer waits on `main`: move its due messages for the next KEEP_FOLLOWING_SECONDS."""
        found = self._followed.get(main.name)
        now = time.monotonic()
        if found is not None and found.main() is not None:
            found.touched = now
            return
        with self._lock:
            self._followed[main.name] = _Followed(weakref.ref(main), now)
        self._changed.set()

    def wake(self) -> None:
        """Look again now (a delayed publish in this process, a bumped beacon)."""
        self._changed.set()

    def stop(self) -> None:
        self.stopped = True
        self._changed.set()

    def _run(self) -> None:
        backoff = Backoff()  # the delay records' batch read: the store's own health
        moving = Backoff(health=MOVES_HEALTH)  # the moves, once that read answered
        while not self.stopped:
            store = self._store()
            if store is None or store.closed:
                break
            now = time.monotonic()
            with self._lock:
                for name in [n for n, f in self._followed.items()
                             if now - f.touched > KEEP_FOLLOWING_SECONDS or f.main() is None]:
                    del self._followed[name]
                followed = list(self._followed.items())
            wait = self._idle_poll
            mark = store.change_mark()
            if (mark is not None and mark == self._mark and followed
                    and all(f.state is not None and not f.state.count for _, f in followed)):
                followed = []  # nothing written since every followed queue was seen without delayed messages
            try:
                states = store.delay_states([name for name, _ in followed]) if followed else []
                self._mark = mark  # (taken before the read: a write during it is read next time)
            except StoreError as exc:
                if store.closed:
                    break
                wait = backoff.failed("read the delay records", exc)
                states = []
            else:
                backoff.ok()
            try:
                for (_, f), state in zip(followed, states, strict=False):
                    f.state = state
                    wait = min(wait, self._serve(f, state))
            except StoreError as exc:
                if store.closed:
                    break
                wait = moving.failed("move due delayed messages", exc)
            else:
                if states:
                    moving.ok()
            del store
            if wait > 0:
                self._changed.wait(wait)
            self._changed.clear()
        self.stopped = True

    def _serve(self, f: _Followed, state: DelayState) -> float:
        """Move what is due; the seconds until this queue needs a look again."""
        if not state.count:
            return self._idle_poll
        if state.next_due is not None and state.next_due > now_ms():
            return min((state.next_due - now_ms()) / 1000, DUE_POLL_SECONDS)
        main = f.main()
        if main is not None and move_due(main):
            return MOVE_GAP_SECONDS  # moved some: look again soon, and move what fell due meanwhile together
        return DUE_POLL_SECONDS


# The moves' own health: while partitions migrate, the delay index's queries time out now and then for a minute
# or two although the store answers every other call; one WARNING for that stretch, and one INFO once they have
# answered for MOVES_SETTLE_SECONDS, rather than a pair for each time-out (an outage of the store itself is
# reported by the read of the delay records, and by every other loop).
MOVES_SETTLE_SECONDS = 30.0
MOVES_HEALTH = Reachability("store (moving delayed messages)", logging.getLogger("ignis.store"),
                            settle_seconds=MOVES_SETTLE_SECONDS)

_movers: PerStore[DelayMover] = PerStore(DelayMover)


def mover_for(store: Storage) -> DelayMover | None:
    """The process's delay mover of a store handle (started on first use; None once the handle is closing)."""
    return _movers.get(store)


def stop_mover(store: Storage, timeout: float = 5.0) -> None:
    """Stop the store handle's mover for good and wait for it (before the handle closes)."""
    _movers.retire(store, timeout)


def wake_mover(store: Storage) -> None:
    """Have the store handle's mover look now, if it runs."""
    found = _movers.find(store)
    if found is not None:
        found.wake()
