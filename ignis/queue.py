"""A queue handle: publish, pull (fire / ack / nack), and the sideline and dead-letter moves.

Failed messages are copied to the sideline (or, past maxDeliveries, to the dead-letter magazine)
and only then deleted from main; if the copy fails the original stays where it is (the sweeper
re-homes it later), so a failure duplicates but never loses.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ignis import browse as browsing
from ignis import names, tracing
from ignis.bounds import OVERFLOW, estimated_bytes, shard_limits
from ignis.browse import BrowsedMessage
from ignis.delay import wake_mover
from ignis.envelope import (
    CODEC_UNREADABLE,
    PROBLEM_HEADER,
    Envelope,
    EnvelopeFields,
    due_after,
    now_ms,
)
from ignis.errors import AlreadySettled, IgnisError
from ignis.figures import QueueStats
from ignis.logs import one_line
from ignis.magazine import Magazine
from ignis.magazine.bounded import BoundedMagazine
from ignis.magazine.ordered import OrderedMagazine
from ignis.metrics import (
    ACKED,
    DEAD_LETTERED,
    DELIVERED,
    DELIVERY_LATENCY,
    FOLD_AT,
    IGNORED,
    OVERFLOW_DROPPED,
    PUBLISHED,
    REDELIVERED,
    RETRIED,
    SIDELINE_REFUSED,
    SIDELINED,
)
from ignis.outage import store_failed
from ignis.publishing import QueuePublishing
from ignis.spec import Overflow, QueueSpec
from ignis.storage.base import Claimed, MessageRef, ShardPointers, SlotRef, Storage  # (MessageRef: re-exported)
from ignis.topics.subscribed import SubscriptionSide
from ignis.waiting import age_seconds, oldest_waiting_since

log = logging.getLogger(__name__)
_now = time.time  # (bound once: every delivery reads the clock)

DIVERT_ROUNDS = 16  # claims fire_many makes again when all it claimed were unreadable records

# Why a message left the main magazine (the `reason` label and envelope field).
REJECTED = "rejected"
EXCEPTION = "exception"
TIMEOUT = "timeout"
SATURATED = "saturated"
UNREADABLE = "unreadable"
NACKED = "nacked"

_UNDECODED = object()
_new_tuple = tuple.__new__  # builds NewMessages without the NamedTuple's slower generated __init__


@dataclass(frozen=True, slots=True)
class Transfer:
    """Outcome of moving failed messages out of main."""

    sidelined: int
    dead_lettered: int
    refused: int  # copy failed: the original stays in main for the sweeper
    retried: int = 0  # waiting for their next attempt (a nack with a delay, or the queue's retry backoff)


class Message(EnvelopeFields):
    """A delivered message (its fields: EnvelopeFields). Settle it exactly once with `ack()` or `nack(reason)`."""

    __slots__ = ("_decoded", "_settled", "envelope", "queue", "ref")

    def __init__(self, queue: Queue, ref: SlotRef, envelope: Envelope) -> None:
        self.queue = queue
        self.ref = ref
        self.envelope = envelope
        self._settled = False
        self._decoded: Any = _UNDECODED

    @property
    def payload(self) -> Any:
        """The payload decoded as published: bytes, str or a JSON value (decoded once, then cached)."""
        if self._decoded is _UNDECODED:
            self._decoded = self.envelope.decoded()
        return self._decoded

    @property
    def settled(self) -> bool:
        return self._settled

    def ack(self) -> None:
        # Queue.ack for one message, without its lists: this is the per-message consume path.
        if self._settled:
            raise AlreadySettled(f"message {self.id} ({self.ref}) was already acked or nacked")
        queue, envelope = self.queue, self.envelope
        if queue.ordered:  # its shard's hold is released too
            queue.ack((self,))
            return
        store = queue.store
        store.delete((self.ref,), (envelope.version,),  # (ids as _ids builds them, inlined: one message)
                     ((None if envelope.codec == CODEC_UNREADABLE else envelope.msg_id),) if store.settles_by_id
                     else None)
        self._settled = True
        queue._acked.tick()

    def nack(self, reason: str = NACKED, delay: float | timedelta | None = None) -> None:
        """Give the message up for now: delivered again after `delay` (seconds or a timedelta), or as the queue's
        retry policy says, else moved to the sideline; past maxDeliveries to the dead letters."""
        self.queue.nack([self], reason, delay=delay)

    @contextmanager
    def process(self) -> Iterator[Message]:
        """`with message.process():` acks the message when the block ends, nacks it (reason `exception`) when
        the block raises, and lets the exception propagate; a block that settled it itself is left as it is.
        With tracing on, a `process {queue}` span covers the block (ignis.tracing)."""
        with tracing.processing(self.queue, (self,)):
            try:
                yield self
            except Exception:
                if not self._settled:
                    self.nack(EXCEPTION)
                raise
            if not self._settled:
                self.ack()

    def __repr__(self) -> str:
        return f"Message({self.ref}, id={self.id}, attempts={self.attempts})"


def _ids(messages: Sequence[Message], store: Storage) -> list[str | None] | None:
    """The ids a settle checks the store's records against (Storage.delete); None for a record that was no
    IgnisMQ message (its id is made up), which is settled whatever it holds. None for a store that never
    reads them (Storage.settles_by_id)."""
    if not store.settles_by_id:
        return None
    return [None if m.envelope.codec == CODEC_UNREADABLE else m.envelope.msg_id for m in messages]


def _check_unsettled(messages: Sequence[Message]) -> None:
    for m in messages:
        if m._settled:
            raise AlreadySettled(f"message {m.id} ({m.ref}) was already acked or nacked")


class Queue(QueuePublishing, SubscriptionSide):
    """Publish to and consume from one queue. Thread-safe; cheap to share. Its publishes are in ignis.publishing; a
    subscription's topic side (QueueSpec.subscribe) in ignis.topics.subscribed."""

    def __init__(self, store: Storage, spec: QueueSpec, *, max_payload_bytes: int = 1 << 20,
                 hole_budget: int = 512, refresh_seconds: float = 1.0) -> None:
        self.store = store
        self.spec = spec
        self.name = spec.name
        self.max_payload_bytes = max_payload_bytes

        def magazine(name: str, kind: str, ttl: int) -> Magazine:
            return Magazine(store, name, queue=spec.name, kind=kind, shards=spec.shards, ttl_seconds=ttl,
                            hole_budget=hole_budget, refresh_seconds=refresh_seconds)

        limits = shard_limits(spec)
        self.ordered = spec.ordered
        if spec.ordered:  # at most one message of a shard in flight (ignis.magazine.ordered)
            self.main = OrderedMagazine(store, spec.name, hold_ms=spec.hold_ms, queue=spec.name, kind="main",
                                        shards=spec.shards, ttl_seconds=spec.message_expiry_seconds,
                                        hole_budget=hole_budget, refresh_seconds=refresh_seconds)
        elif limits is None:
            self.main = magazine(spec.name, "main", spec.message_expiry_seconds)
        else:  # a bounded queue (ignis.bounds): its publishes allocate within each shard's share of the bound
            bound = ", ".join(f"{what} {value}" for what, value in (("maxLength", spec.max_length),
                                                                     ("maxBytes", spec.max_bytes)) if value)
            self.main = BoundedMagazine(
                store, spec.name, limits=limits, spec_text=bound,
                drop_head=self._drop_head if spec.overflow is Overflow.DROP_HEAD else None, queue=spec.name,
                kind="main", shards=spec.shards, ttl_seconds=spec.message_expiry_seconds, hole_budget=hole_budget,
                refresh_seconds=refresh_seconds)
        self.sideline = magazine(names.sideline_of(spec.name), "sideline", spec.message_expiry_seconds)
        # Dead letters are kept for the queue's lifetime so people have time to look at them.
        self.dead = magazine(names.dead_of(spec.name), "dead", spec.queue_expiry_seconds)
        self._published = PUBLISHED.labels(spec.name)
        self._published_tick = self._published.tick
        self._delivered = DELIVERED.labels(spec.name)
        self._redelivered = REDELIVERED.labels(spec.name)
        self._acked = ACKED.labels(spec.name)
        self._latency = DELIVERY_LATENCY.labels(spec.name)
        self._latency_pending = self._latency.pending
        self._hole_budget, self._refresh_seconds = hole_budget, refresh_seconds
        self._subscribed = spec.subscribe is not None
        if self._subscribed:
            self._subscribe()

    def adopt(self, previous: Queue) -> None:
        """Take over the claimed-not-handed-out slots of an earlier handle of this queue (see
        Magazine.adopt); call it when a new handle replaces an old one."""
        pairs = [(self.main, previous.main), (self.sideline, previous.sideline), (self.dead, previous.dead)]
        if previous._cursor is not None and self.cursor is not None:
            pairs.append((self.cursor, previous._cursor))
        for mine, theirs in pairs:
            if mine.name == theirs.name:
                mine.adopt(theirs)

    # ---- pull consume ----------------------------------------------------------------------------
    # A fire that finds nothing has the process's watcher follow the queue (ignis.watch), so the next one sees
    # what other processes publish within milliseconds; with a `timeout`, it waits that long for a message,
    # woken at once by a publish here or elsewhere.
    def fire(self, timeout: float | None = None) -> Message | None:
        """Claim the next message, or None when the queue has nothing to deliver (within `timeout` seconds,
        when given)."""
        if timeout:
            return self._fire_waiting(timeout)
        # The per-message consume path: a readable message from main, tested first; every other case in _fire_other.
        claimed = self.main.fire_one()
        if claimed is None or (envelope := claimed[1]).codec == CODEC_UNREADABLE:  # type: ignore[union-attr]
            claimed = self._fire_other(claimed)
            if claimed is None:
                return None
            envelope = claimed[1]
        self._delivered.tick()
        if envelope.attempts > 1:  # type: ignore[union-attr]
            self._redelivered.tick()
        else:
            since = envelope.due_at or envelope.loaded_at  # type: ignore[union-attr]  # (a delayed one: its due time)
            pending = self._latency_pending  # (observed in bulk: see metrics.FastHistogram's pending)
            pending.append(_now() - since / 1000)
            if len(pending) >= FOLD_AT:
                self._latency.fold()
        return Message(self, claimed[0], envelope)  # type: ignore[arg-type]

    def _fire_other(self, claimed: Claimed | None) -> Claimed | None:
        """fire's other cases: unreadable messages from main diverted, then, main empty, a subscription's topic; the
        readable message claimed, or None (and the watcher follows the queue)."""
        while claimed is not None and claimed.envelope.codec == CODEC_UNREADABLE:  # type: ignore[union-attr]
            self._divert([claimed])
            claimed = self.main.fire_one()
        if claimed is None and self._subscribed:  # a subscription: then from its topic
            cursor = self.cursor
            claimed = cursor.fire_one()  # type: ignore[union-attr]
            while claimed is not None and claimed.envelope.codec == CODEC_UNREADABLE:  # type: ignore[union-attr]
                self._divert([claimed])
                claimed = cursor.fire_one()  # type: ignore[union-attr]
        if claimed is None:
            self._watch()
        return claimed

    def _fire_waiting(self, timeout: float) -> Message | None:
        """fire(timeout): fire until a message comes or `timeout` seconds passed, waiting for work between."""
        deadline = time.monotonic() + timeout
        while True:
            seen = self.main.changes
            message = self.fire()
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.main.wait_for_work(seen, remaining)

    def fire_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Claim up to `max_messages` messages in as few storage calls as the shards allow ([] when there are
        none; within `timeout` seconds, when given, for at least one)."""
        deadline = None if not timeout else time.monotonic() + timeout
        while True:
            seen = self.main.changes
            messages = self._fire_many(max_messages)
            if messages:
                return messages
            remaining = 0.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                self._watch()
                return []
            self.main.wait_for_work(seen, remaining)

    def _fire_many(self, max_messages: int) -> list[Message]:
        for _ in range(DIVERT_ROUNDS):
            claimed = self.main.fire(max_messages)
            if self._subscribed and len(claimed) < max_messages:  # a subscription: the rest from its topic
                claimed += self.cursor.fire(max_messages - len(claimed))  # type: ignore[union-attr]
            messages = self._delivering(claimed)
            if messages or not claimed:  # (all claimed were unreadable and diverted: claim again)
                return messages
        return []

    def release(self, messages: Sequence[Message], delivered: bool = True) -> int:
        """Hand claimed, unsettled messages back at once (to main's tail: copy, then delete, as every move),
        without waiting for the sweeper: a consumer that stops or is cancelled before it settled them.
        `delivered=False`: they never reached user code (prefetched), so their claim's attempt is not counted.
        Returns how many went back; a failed copy leaves them to the sweeper (unsettled). An ordered queue's stay
        their shards' heads instead, claimable again at once (their attempt stays counted)."""
        todo = [m for m in messages if not m._settled]
        if not todo:
            return 0
        if self.ordered:  # not to main's tail: they stay their shards' heads, claimable again at once
            self._hold_again(todo, [0.0] * len(todo))
            return len(todo)
        at = now_ms()
        copies = []
        for m in todo:
            copy = m.envelope.for_transfer(None, at, attempts=m.attempts if delivered else max(m.attempts - 1, 0))
            copy.reason = m.envelope.reason
            copies.append(copy)
        self.main.load(copies)
        self.store.delete([m.ref for m in todo], ids=_ids(todo, self.store))  # after the copy landed
        for m in todo:
            m._settled = True
        return len(todo)

    def take_kept(self, max_messages: int) -> list[Message]:
        """Up to `max_messages` messages this handle already claimed for later fires (see
        Magazine.take_kept), and no new claim: for a consumer that stops."""
        kept = self.main.take_kept(max_messages)
        if self._cursor is not None and len(kept) < max_messages:
            kept += self._cursor.take_kept(max_messages - len(kept))
        return self._delivering(kept)

    def _delivering(self, claimed: list[Claimed]) -> list[Message]:
        if any(c.envelope.codec == CODEC_UNREADABLE for c in claimed):  # type: ignore[union-attr]
            self._divert([c for c in claimed if c.envelope.codec == CODEC_UNREADABLE])  # type: ignore[union-attr]
            claimed = [c for c in claimed if c.envelope.codec != CODEC_UNREADABLE]  # type: ignore[union-attr]
        if claimed:
            self._delivered.inc(len(claimed))
            now = time.time()
            firsts = [now - (c.envelope.due_at or c.envelope.loaded_at) / 1000  # type: ignore[union-attr]
                      for c in claimed if c.envelope.attempts <= 1]  # type: ignore[union-attr]
            pending = self._latency_pending
            pending += firsts
            if len(pending) >= FOLD_AT:
                self._latency.fold()
            if len(firsts) < len(claimed):
                self._redelivered.inc(len(claimed) - len(firsts))
        return [Message(self, c.ref, c.envelope) for c in claimed]  # type: ignore[arg-type]

    # Settling checks every message first and marks them settled only once the store call succeeded:
    # a failed ack can be retried, and a batch holding one settled message changes nothing.
    def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge (delete) messages in one batch."""
        _check_unsettled(messages)
        if self.ordered:  # and their shards' holds released
            self._settle_held(messages)
        else:  # (versions: these are acks of messages as claimed, see Storage.delete)
            self.store.delete([m.ref for m in messages], [m.envelope.version for m in messages],
                              _ids(messages, self.store))
        for m in messages:
            m._settled = True
        self._acked.inc(len(messages))

    def nack(self, messages: Sequence[Message], reason: str = NACKED,
             delay: float | timedelta | None = None) -> Transfer:
        """Give failed messages up, with a reason: with `delay`, or on a queue with a retry policy, each is
        delivered again after that wait (ignis.delay); else moved to the sideline. Past maxDeliveries they go to
        the dead letters either way. Messages whose copy failed stay unsettled (and stored): nack them again, or
        leave them to the sweeper. On an ordered queue a failed message is never sidelined: it stays its shard's
        head, delivered again after that wait (at once without one), before any later message of its shard."""
        _check_unsettled(messages)
        # (an ordered queue's failed message always comes again, at its shard's head: see retry)
        if reason != UNREADABLE and (self.ordered or delay is not None or self.spec.retry is not None):
            return self.retry(messages, reason, None if delay is None else self.delay_seconds(delay))
        return self.transfer(messages, reason)

    def retry_wait(self, message: Message) -> float:
        """Seconds before a failed message's next attempt under the queue's retry policy (its deliveries so far
        are the failed delivery's number); with jitter, drawn from [0, the backoff]."""
        policy = self.spec.retry
        if policy is None:
            return 0.0
        wait = policy.backoff_seconds(message.attempts)
        return random.uniform(0, wait) if policy.jitter else wait

    def retry(self, messages: Sequence[Message], reason: str, wait: float | None = None) -> Transfer:
        """Deliver failed messages again after `wait` seconds (None: the retry policy's backoff), as delayed
        messages: the copy first, then the delete, as every move. Past maxDeliveries: the dead letters."""
        limit = self.spec.max_deliveries
        dead = [m for m in messages if limit and m.attempts >= limit]
        later = [m for m in messages if not (limit and m.attempts >= limit)]
        outcome = self.transfer(dead, reason) if dead else Transfer(0, 0, 0)
        if not later:
            return outcome
        if self.ordered:  # an ordered queue's: stays its shard's head, held until its wait is over
            self._hold_again(later, [self.retry_wait(m) if wait is None else wait for m in later])
            RETRIED.labels(self.name, reason).inc(len(later))
            return Transfer(outcome.sidelined, outcome.dead_lettered, outcome.refused, len(later))
        at = now_ms()
        copies = []
        for m in later:
            copy = m.envelope.for_transfer(reason, at)
            copy.reason = None  # still a main message: the reason is in its history
            seconds = self.retry_wait(m) if wait is None else wait
            copy.due_at = due_after(seconds, at)
            copies.append(copy)
        try:
            self.store.load_delayed(self.name, copies, self.spec.message_expiry_seconds)
        except Exception as exc:
            log.error("retry copy of %d message(s) of %s failed; originals kept for the sweeper: %s: %s", len(later),
                      self.name, type(exc).__name__, one_line(exc), exc_info=not isinstance(exc, IgnisError))
            SIDELINE_REFUSED.labels(self.name).inc(len(later))
            return Transfer(outcome.sidelined, outcome.dead_lettered, outcome.refused + len(later))
        self.store.delete([m.ref for m in later], ids=_ids(later, self.store))  # after the copy landed
        for m in later:
            m._settled = True
        RETRIED.labels(self.name, reason).inc(len(later))
        self.main.ring()
        wake_mover(self.store)
        return Transfer(outcome.sidelined, outcome.dead_lettered, outcome.refused, len(later))

    def drop(self, messages: Sequence[Message]) -> None:
        """Delete without sidelining: the handler raised an exception declared ignorable."""
        _check_unsettled(messages)
        if self.ordered:
            self._settle_held(messages)
        else:
            self.store.delete([m.ref for m in messages], ids=_ids(messages, self.store))
        for m in messages:
            m._settled = True
        IGNORED.labels(self.name).inc(len(messages))

    # ---- sideline / dead letter --------------------------------------------------------------------
    def _divert(self, claimed: Sequence[Claimed]) -> None:
        """Claimed records that are not IgnisMQ messages (written by another tool, or damaged: the store reads
        them as CODEC_UNREADABLE envelopes) never reach a consumer: they go to the sideline as `unreadable`,
        with what was wrong in their ignis-unreadable header (or to the dead letters if that copy fails)."""
        messages = [Message(self, c.ref, c.envelope) for c in claimed]  # type: ignore[arg-type]
        outcome = self.transfer(messages, UNREADABLE)
        log.warning("%d record(s) of %s are not IgnisMQ messages (first: %s: %s): moved to the %s", len(messages),
                    self.name, messages[0].ref, (messages[0].envelope.headers or {}).get(PROBLEM_HEADER),
                    "dead letters" if outcome.dead_lettered and not outcome.sidelined else "sideline")

    def transfer(self, messages: Sequence[Message], reason: str) -> Transfer:
        """Copy-then-delete into the sideline, or into `q_DEAD` when a message has used up its
        maxDeliveries. A failed copy keeps the original in place (counted as refused)."""
        at = now_ms()
        limit = self.spec.max_deliveries
        to_dead = [m for m in messages if limit and m.attempts >= limit]
        to_sideline = [m for m in messages if not (limit and m.attempts >= limit)]
        moved: list[Message] = []
        counts = {"sideline": 0, "dead": 0}
        for target, group, counter in ((self.sideline, to_sideline, SIDELINED),
                                       (self.dead, to_dead, DEAD_LETTERED)):
            if not group:
                continue
            try:
                target.load([m.envelope.for_transfer(reason, at) for m in group])
            except Exception as exc:
                if reason == UNREADABLE and target is self.sideline:  # not to be left in main: dead-letter it
                    to_dead.extend(group)
                    continue
                log.error("copy of %d message(s) of %s to %s failed; originals kept for the sweeper: %s: %s",
                          len(group), self.name, target.name, type(exc).__name__, one_line(exc),
                          exc_info=not isinstance(exc, IgnisError))
                SIDELINE_REFUSED.labels(self.name).inc(len(group))
                continue
            counter.labels(self.name, reason).inc(len(group))
            counts[target.kind] = len(group)
            moved.extend(group)
        if moved:
            if self.ordered:  # after the copy landed
                self._settle_held(moved)
            else:
                self.store.delete([m.ref for m in moved], ids=_ids(moved, self.store))  # after the copy landed
            for m in moved:
                m._settled = True
        return Transfer(counts["sideline"], counts["dead"], len(messages) - len(moved))

    # ---- an ordered queue's holds (ignis.magazine.ordered) ---------------------------------------------------
    def _settle_held(self, messages: Sequence[Message]) -> None:
        """The settle of an ordered queue's messages leaving main (an ack, a drop, a move out): their records deleted
        and their shards' holds released (Storage.settle_held: one transaction on lmdb; on Aerospike the release
        after the delete, and a failed one raises, so the settle is made again), so each shard's next message may
        be delivered."""
        self.store.settle_held([m.ref for m in messages], _ids(messages, self.store))
        for m in messages:
            self.main.unblock(m.ref.shard)  # type: ignore[attr-defined]

    def _hold_again(self, messages: Sequence[Message], waits: Sequence[float]) -> None:
        """Failed (or handed back) messages of an ordered queue stay their shards' heads: each held until its wait
        is over, then delivered again (attempts counted by that claim) before any later message of its shard. A
        message whose hold had already ended and gone to another claim is left to that claim."""
        at = now_ms()
        for m, seconds in zip(messages, waits, strict=True):
            until = due_after(seconds, at) if seconds > 0 else at  # (at: claimable at once)
            try:
                self.store.release_hold(self.name, m.ref.shard, m.ref.slot, until)
            except IgnisError as exc:
                store_failed(f"hold {m.ref} of {self.name} for its next attempt (it comes again when its hold "
                             "ends)", exc)
            m._settled = True
            self.main.unblock(m.ref.shard, seconds)  # type: ignore[attr-defined]

    def _drop_head(self, shard: int, count: int) -> int:
        """dropHead (ignis.bounds): make room in a full shard of main by moving its `count` oldest waiting messages
        to the dead letters, reason `overflow`: claimed (so no consumer gets them meanwhile), copied, then deleted,
        counted (ignis_overflow_dropped_total, and ignis_dead_lettered_total{reason="overflow"}). A failed copy
        leaves them claimed in main, where the sweeper re-homes them: never deleted silently. Returns the slots of
        main freed (messages and holes claimed)."""
        at = now_ms()
        present, freed = self.main.claim_head(shard, count, at)  # type: ignore[attr-defined]
        if not present:
            return freed
        messages = [Message(self, c.ref, c.envelope) for c in present]  # type: ignore[arg-type]
        try:
            self.dead.load([m.envelope.for_transfer(OVERFLOW, at) for m in messages])
        except Exception as exc:
            log.error("overflow: copy of %d message(s) of %s to its dead letters failed; they stay claimed in main "
                      "for the sweeper: %s: %s", len(messages), self.name, type(exc).__name__, one_line(exc),
                      exc_info=not isinstance(exc, IgnisError))
            SIDELINE_REFUSED.labels(self.name).inc(len(messages))
            return freed
        self.store.delete([m.ref for m in messages], ids=_ids(messages, self.store))  # after the copy landed
        for m in messages:
            m._settled = True
        DEAD_LETTERED.labels(self.name, OVERFLOW).inc(len(messages))
        OVERFLOW_DROPPED.labels(self.name).inc(len(messages))
        return freed

    # ---- inspection --------------------------------------------------------------------------------
    def read(self, ref: SlotRef | MessageRef | str) -> BrowsedMessage:
        """One message of this queue by its reference (`Message.ref`, what publish returns, or their text), read
        without claiming it, with its state (waiting, in flight, sidelined, dead). Raises MessageNotFound when
        there is none there (never written, acked, expired), InvalidInputError for a reference of another queue."""
        return browsing.read(self, ref)

    def browse(self, limit: int = 10, shard: int | None = None) -> list[BrowsedMessage]:
        """The next messages waiting in main (one shard's, with `shard`), oldest publish first, at most `limit`
        (1 to 1,000), without claiming them: a consumer still gets each one exactly as before (ignis.browse)."""
        return browsing.browse(self, limit, shard)

    def stats(self, in_flight: bool = False) -> QueueStats:
        """Pointer figures (one batch read per magazine) and the oldest waiting message's age (a batch
        read of each non-empty shard's head, ignis.waiting); `in_flight=True` also counts delivered,
        unsettled messages, which costs a scan of the newest claimed slots."""
        # Slots this handle reserved for its next publishes are no messages yet (another process's reserved
        # slots are, for the moment they last: RESERVATION_FRESH_MS, then written or sealed as holes).
        reserved = self.main.reserved()
        pointers = self.main.pointers()
        main = pointers.values()
        oldest = oldest_waiting_since(self.store, self.name, pointers)
        if self._subscribed:
            return self._subscription_stats(pointers, oldest, in_flight)
        return QueueStats(
            name=self.name,
            shards=self.spec.shards,
            published=max(sum(p.published for p in main) - reserved, 0),
            consumed=sum(p.consumed for p in main),
            depth=max(sum(p.pending for p in main) - reserved, 0),
            sidelined=self.sideline.pending(),
            dead=self.dead.pending(),
            in_flight=self.main.in_flight(self._sweep_pointers()) if in_flight else None,
            delayed=self.store.delay_states([self.name])[0].count,
            oldest_age_seconds=age_seconds(oldest, now_ms()),
            full_percent=self._full_percent(pointers) if self.spec.bounded else None,
        )

    def _full_percent(self, pointers: Mapping[int, ShardPointers]) -> int:
        """How full a bounded queue is, in percent of its bound: the fuller of its unclaimed slots over maxLength
        and its estimated waiting bytes over maxBytes (ignis.bounds; one more store call for the bytes)."""
        spec, ratios = self.spec, [0.0]
        if spec.max_length:
            ratios.append(sum(p.unclaimed for p in pointers.values()) / spec.max_length)
        if spec.max_bytes:
            loaded = self.store.loaded_bytes(self.name, spec.shards)
            ratios.append(sum(estimated_bytes(p.load, p.fire, loaded[shard]) for shard, p in pointers.items()
                              if shard < len(loaded)) / spec.max_bytes)
        return round(max(ratios) * 100)

    def in_flight_summary(self) -> tuple[int, int | None]:
        """Delivered, unsettled messages of the main magazine and the oldest one's fire time (epoch ms,
        None when there is none): what the sweeper's gauges report."""
        return self.main.in_flight_summary(self._sweep_pointers())

    def _sweep_pointers(self) -> dict[str, int]:
        record = self.store.get_queue(self.name)
        return record.sweep_pointers("main") if record else {}


__all__ = ["Message", "MessageRef", "Queue", "QueueStats", "Transfer"]
