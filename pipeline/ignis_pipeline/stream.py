"""Streaming consume of the `ignis` format: `spark.readStream.format("ignis").option("queue", "orders")`.

A Structured Streaming query that *consumes* one queue, at least once:

* `latestOffset(start, limit)` claims (fires) up to the read limit (`maxMessagesPerTrigger`, default
  10,000) in the driver-side Python process, with the library's own fire (guarded claims, holes skipped,
  attempts + 1: a delivery). The offset it returns is per-shard fire positions (`fire`: the highest slot
  this query claimed per shard) plus the slots claimed for this micro-batch (`claims`), which Spark
  writes to the checkpoint's offset log before the batch runs.
* `partitions(start, end)` and `read` read exactly the slots claimed for the batch (`end.claims`), in the
  executors, without claiming anything.
* `commit(end)` acks (deletes) them. Spark calls it once the next batch's offsets are logged; to ack
  promptly on an idle queue too, `latestOffset` acks the claims of `start` as well: Spark asks for the
  next offset only after the batch ending at `start` has completed and been recorded in the commit log
  (MicroBatchExecution runs one batch at a time), so those rows are in the sink.

`Trigger.AvailableNow` (process what is there now, then stop): `prepareForTriggerAvailableNow`, called
once at the start of such a query, takes the target: each shard's load pointer at that moment. From then
on `latestOffset` claims with the storage interface's bounded claim (`Storage.claim(..., up_to=target)`:
the fire pointer never passes the target slot), so no offset goes past the target, messages published
during the run are left for later, and once every shard's fire pointer has reached its target
`latestOffset` returns its start: no new data, and Spark ends the query. (A message at or below the target
that another consumer claimed first is that consumer's; a write still in flight in a claimed slot is
awaited up to the producer's write deadline, as the library's fire does.)

A subscription (a queue with `subscribe`) streams the same way: its fire takes from its own main, then through
its cursor from the topic (its filter applied by the claim); the offset keeps the cursor's claims apart
(`topicClaims`, and `topicFire` per topic shard), the executors read them through the cursor (the topic's
records), and the ack settles the claim records. Under Trigger.AvailableNow the topic's load pointers are the
cursor's target (`Storage.claim_cursor(..., up_to=...)`). A `topic` option is refused: stream a subscription.

If the query dies before its batch is acked, the claimed messages are neither acked nor lost: a
restarted query re-runs the logged batch from its checkpoint and reads the same claimed slots again; and
whatever no query reads again (a batch that never reached the offset log, a query never restarted) the
sweeper re-homes once its claims are older than the queue's sweepDuration, and the queue delivers it
again. Delivery is at least once: a sink may see a message twice, never zero times (ids are kept).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ignis.client import Ignis
from ignis.envelope import now_ms
from ignis.errors import HoleBudgetExceeded, InvalidInputError
from ignis.queue import Queue
from ignis.storage.base import SlotRef, Storage
from ignis_pipeline import schema
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.stores import open_driver_store, task_store

log = logging.getLogger(__name__)

ALL_AVAILABLE_CAP = 100_000  # messages one micro-batch claims under a ReadAllAvailable limit
ACK_CHUNK = 5_000
HOLE_RETRIES = 8  # fire calls that may end on a hole budget before a batch is planned with what it has
AWAIT_FIRST_SECONDS = 0.01  # first re-read of a claimed slot whose write is in flight (doubling, capped)
AWAIT_MAX_SECONDS = 0.5


def encode_claims(refs: list[SlotRef]) -> str:
    """Claimed slots as 'shard:first-last,...' (runs of consecutive slots): a string, which Spark's offset
    JSON always keeps as it is."""
    runs: list[list[int]] = []
    for shard, slot in sorted((r.shard, r.slot) for r in refs):
        if runs and runs[-1][0] == shard and runs[-1][2] + 1 == slot:
            runs[-1][2] = slot
        else:
            runs.append([shard, slot, slot])
    return ",".join(f"{s}:{a}-{b}" for s, a, b in runs)


def decode_claims(text: str) -> list[tuple[int, int, int]]:
    runs = []
    for part in filter(None, text.split(",")):
        shard, _, span = part.partition(":")
        first, _, last = span.partition("-")
        runs.append((int(shard), int(first), int(last)))
    return runs


class ClaimedSlots(InputPartition):
    """The claimed slot runs of one shard of one magazine for one micro-batch: the queue's main (magazine None),
    or a subscription's cursor (its claims of the topic's slots)."""

    def __init__(self, shard: int, runs: list[tuple[int, int]], magazine: str | None = None) -> None:
        super().__init__((shard, runs, magazine))
        self.shard = shard
        self.runs = runs
        self.magazine = magazine


# A subscription's offsets have two more keys, for its cursor (the slots it claims are the topic's; a plain
# queue's offsets are as they always were): TOPIC_FIRE, per topic shard the highest slot this query claimed, and
# TOPIC_CLAIMS, the topic slots claimed for the micro-batch.
TOPIC_FIRE, TOPIC_CLAIMS = "topicFire", "topicClaims"


class IgnisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        # What a stream cannot do is refused by the first call Spark makes (`check`), not here: pyspark's
        # source runner stops the reader it failed to make in a `finally`, and the UnboundLocalError of that
        # hides the message.
        self.queue_name = options.queues[0] if options.queues and len(options.queues) == 1 else ""
        self._store: Storage | None = None
        self._queue: Queue | None = None
        self._acked: set[str] = set()  # claims of batches acked by this process (ack is idempotent anyway)
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow: per shard, the last slot to claim
        self._topic_target: dict[int, int] = {}  # ... and a subscription's, per topic shard

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to the executors for `read`: the driver side's connection stays here.
        return {**self.__dict__, "_store": None, "_queue": None, "_acked": set()}

    # ---- driver side -----------------------------------------------------------------------------
    def check(self) -> None:
        """One queue, its main magazine: what a streaming read consumes."""
        if self.options.is_topic:
            raise InvalidInputError("a streaming read consumes a queue (option queue): to stream a topic, stream a "
                                    "subscription of it (a queue with subscribe: {topic: ...}), whose commits ack")
        self.options.single_queue("a streaming read")
        if self.options.magazines != ("main",):
            raise InvalidInputError("a streaming read consumes a queue's main magazine; read the sideline and "
                                    "dead letters with a batch read (spark.read) instead")

    def _open(self) -> Queue:
        if self._queue is None:
            self.check()
            self._store = open_driver_store(self.options)
            # A deactivated queue can still be drained, as `ignis consume` does.
            self._queue = Ignis(self._store).queue(self.queue_name, allow_inactive=True)
        return self._queue

    def initialOffset(self) -> dict:
        queue = self._open()
        offset: dict[str, Any] = {"fire": {str(s): p.fire for s, p in queue.main.pointers().items()}, "claims": ""}
        if queue.cursor is not None:  # a subscription: its position in the topic too
            offset[TOPIC_FIRE] = {str(s): p.fire for s, p in queue.cursor.pointers().items()}
            offset[TOPIC_CLAIMS] = ""
        return offset

    def getDefaultReadLimit(self) -> ReadLimit:
        self.check()
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: take the target, every shard's load pointer now (see the module doc)."""
        queue = self._open()
        pointers = queue.main.pointers()
        self._target = {shard: p.load for shard, p in pointers.items()}
        pending = sum(p.pending for p in pointers.values())
        if queue.cursor is not None:  # a subscription: the topic's load pointers too
            topic = queue.cursor.pointers()
            self._topic_target = {shard: p.load for shard, p in topic.items()}
            pending += sum(max(p.load - p.fire, 0) for p in topic.values())
        log.info("ignis stream: available now: %d unclaimed slot(s) of %s", pending, queue.name)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        queue = self._open()
        self._ack(start)  # the batch ending at `start` is complete (see the module docstring)
        if isinstance(limit, ReadMaxRows):
            want = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            want = ALL_AVAILABLE_CAP
        else:
            want = self.options.max_messages_per_trigger
        # Trigger.AvailableNow: never past the target (see the module doc); else the library's fire.
        claimed = self._fire(queue, want) if self._target is None else self._claim_up_to_target(queue, want)
        if not claimed:
            return start
        main = [ref for ref in claimed if ref.magazine == queue.name]
        fire = dict(start.get("fire") or {})
        for ref in main:
            fire[str(ref.shard)] = max(int(fire.get(str(ref.shard), 0)), ref.slot)
        offset: dict[str, Any] = {"fire": fire, "claims": encode_claims(main)}
        if queue.cursor is not None:  # a subscription: what it claimed of the topic, apart
            topic = [ref for ref in claimed if ref.magazine != queue.name]
            # The executors read these claims' records (the cursor's slots joined to the topic's), and a store may
            # write them late (Storage.write_claims): written before the offset goes to them.
            queue.store.write_claims(topic)
            topic_fire = dict(start.get(TOPIC_FIRE) or {})
            for ref in topic:
                topic_fire[str(ref.shard)] = max(int(topic_fire.get(str(ref.shard), 0)), ref.slot)
            offset[TOPIC_FIRE], offset[TOPIC_CLAIMS] = topic_fire, encode_claims(topic)
        return offset

    @staticmethod
    def _fire(queue: Queue, want: int) -> list[SlotRef]:
        """Up to `want` messages, with the library's fire."""
        claimed: list[SlotRef] = []
        misses = 0
        while len(claimed) < want:
            try:
                got = queue.fire_many(want - len(claimed))
            except HoleBudgetExceeded:  # the fire pointer moved past the holes; data may follow
                misses += 1
                if misses >= HOLE_RETRIES:
                    break
                continue
            if not got:
                break
            claimed.extend(m.ref for m in got)
        return claimed

    def _claim_up_to_target(self, queue: Queue, want: int) -> list[SlotRef]:
        """Up to `want` messages in slots up to the target (Trigger.AvailableNow), spread over the shards that
        have some left; [] once every shard's fire pointer has reached its target."""
        target = self._target or {}
        store, name = queue.store, queue.name

        def claim(shard: int, count: int) -> tuple[list[Any], bool]:
            got = store.claim(name, shard, count, now_ms(), True, up_to=target[shard])
            return got, not got  # (none: the target, or the load pointer, reached)

        claimed, in_flight = _claim_spread(target, queue.main.pointers(), want, claim)
        claimed += self._await(queue, in_flight)
        if queue.cursor is not None and len(claimed) < want:  # a subscription: the rest from its topic
            claimed += self._claim_topic_up_to_target(queue, want - len(claimed))
        return claimed

    def _claim_topic_up_to_target(self, queue: Queue, want: int) -> list[SlotRef]:
        """_claim_up_to_target through a subscription's cursor (its filter applied by the claim, in the store):
        up to `want` messages of topic slots up to the topic's target."""
        cursor = queue.cursor
        assert cursor is not None
        store, target = queue.store, self._topic_target

        def claim(shard: int, count: int) -> tuple[list[Any], bool]:
            got = store.claim_cursor(cursor.name, shard, count, now_ms(), cursor.only, up_to=target[shard])
            # Drained: the target (or the load pointer) reached; an empty claim that is not drained passed over
            # what the filter refused: the shard goes on.
            return got.claimed, got.drained

        claimed, in_flight = _claim_spread(target, cursor.pointers(), want, claim)
        return claimed + self._await(queue, in_flight, topic=True)

    @staticmethod
    def _await(queue: Queue, refs: list[SlotRef], topic: bool = False) -> list[SlotRef]:
        """Claimed slots whose record was still being written: re-read until it lands (stamped then, as a
        claim stamps), or until the producer's write deadline is over, when the slot is sealed (a hole that
        refuses the late write, so its producer publishes it again, into a later slot). Bounded: what is
        neither landed nor sealed by twice the deadline is left to the sweeper, which finds stranded writes."""
        store = queue.store
        landed: list[SlotRef] = []
        cursor = queue.cursor if topic else None
        if cursor is not None:  # a subscription's topic slots: through its cursor (a seal seals the topic's slot)
            def restamp(refs: list[SlotRef], at: int, count: bool) -> list[Any]:
                return store.restamp_cursor(refs, at, cursor.only, count)

            def seal(refs: list[SlotRef], ttl: int) -> list[bool]:
                return store.seal_cursor(refs, ttl)
            ttl_seconds = cursor.ttl_seconds
        else:
            restamp, seal, ttl_seconds = store.restamp, store.seal, queue.main.ttl_seconds
        grace = store.write_grace_ms / 1000
        deadline = time.monotonic() + grace
        give_up = deadline + max(grace, 1.0)
        wait = AWAIT_FIRST_SECONDS
        while refs and time.monotonic() < give_up:
            time.sleep(wait)
            wait = min(wait * 2, AWAIT_MAX_SECONDS)
            still = []
            for item in restamp(refs, now_ms(), True):
                if item.envelope is not None:
                    landed.append(item.ref)
                elif item.awaiting:
                    still.append(item.ref)
            refs = still
            if refs and time.monotonic() >= deadline:
                sealed = seal(refs, ttl_seconds)
                refs = [ref for ref, done in zip(refs, sealed, strict=True) if not done]  # landed: read again
                wait = AWAIT_FIRST_SECONDS
        if refs:
            log.warning("ignis stream: %d claimed slot(s) of %s neither landed nor sealed; left to the sweeper",
                        len(refs), queue.name)
        return landed

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if all(end.get(key, "") == start.get(key, "") for key in ("claims", "fire", TOPIC_CLAIMS, TOPIC_FIRE)):
            return []
        out: list[InputPartition] = []
        for key, magazine in (("claims", None), (TOPIC_CLAIMS, self._cursor_name())):
            by_shard: dict[int, list[tuple[int, int]]] = {}
            for shard, first, last in decode_claims(end.get(key, "")):
                by_shard.setdefault(shard, []).append((first, last))
            out += [ClaimedSlots(shard, runs, magazine) for shard, runs in sorted(by_shard.items())]
        return out

    def _cursor_name(self) -> str | None:
        """The name of the subscription's cursor magazine (None for a plain queue)."""
        cursor = self._open().cursor
        return None if cursor is None else cursor.name

    def commit(self, end: dict) -> None:
        self._ack(end)

    def _ack(self, offset: dict) -> None:
        claims, topic_claims = offset.get("claims", ""), offset.get(TOPIC_CLAIMS, "")
        done = f"{claims}/{topic_claims}"
        if not (claims or topic_claims) or done in self._acked:
            return
        queue = self._open()
        refs = [SlotRef(queue.name, shard, slot) for shard, first, last in decode_claims(claims)
                for slot in range(first, last + 1)]
        if topic_claims:  # a subscription's claims of topic slots: an ack settles its claim records
            cursor = self._cursor_name()
            assert cursor is not None, "topic claims in the offset of a queue that is no subscription"
            refs += [SlotRef(cursor, shard, slot) for shard, first, last in decode_claims(topic_claims)
                     for slot in range(first, last + 1)]
        for at in range(0, len(refs), ACK_CHUNK):
            queue.store.delete(refs[at:at + ACK_CHUNK])
        self._acked.add(done)
        if len(self._acked) > 16:
            self._acked.pop()
        log.info("ignis stream: acked %d claimed slot(s) of %s", len(refs), queue.name)

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = self._queue = None

    # ---- executors -------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[Any]:
        part: ClaimedSlots = partition  # type: ignore[assignment]
        store = task_store(self.options)
        magazine = getattr(part, "magazine", None) or self.queue_name
        for first, last in part.runs:
            records = store.peek(magazine, part.shard, first, last)
            if records:
                yield schema.to_batch(self.queue_name, "main", part.shard, records)


def _claim_spread(target: dict[int, int], pointers: dict[int, Any], want: int,
                  claim: Callable[[int, int], tuple[list[Any], bool]]) -> tuple[list[SlotRef], list[SlotRef]]:
    """Up to `want` messages claimed over the shards whose fire pointer has not reached its target, spread evenly:
    `claim(shard, count)` gives its items and whether the shard is done. (Claimed refs, refs awaiting their write.)"""
    shards = [s for s, last in sorted(target.items()) if pointers[s].fire < last]
    claimed: list[SlotRef] = []
    in_flight: list[SlotRef] = []
    while shards and len(claimed) < want:
        for shard in list(shards):
            need = want - len(claimed)
            if need <= 0:
                break
            items, done = claim(shard, -(-need // len(shards)))
            if done:
                shards.remove(shard)
            for item in items:
                if item.envelope is not None:
                    claimed.append(item.ref)
                elif item.awaiting:
                    in_flight.append(item.ref)
    return claimed, in_flight
