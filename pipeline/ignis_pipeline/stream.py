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

If the query dies before its batch is acked, the claimed messages are neither acked nor lost: a
restarted query re-runs the logged batch from its checkpoint and reads the same claimed slots again; and
whatever no query reads again (a batch that never reached the offset log, a query never restarted) the
sweeper re-homes once its claims are older than the queue's sweepDuration, and the queue delivers it
again. Delivery is at least once: a sink may see a message twice, never zero times (ids are kept).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from ignis.client import Ignis
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
    """The claimed slot runs of one shard for one micro-batch."""

    def __init__(self, shard: int, runs: list[tuple[int, int]]) -> None:
        super().__init__((shard, runs))
        self.shard = shard
        self.runs = runs


class IgnisStreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.queue_name = options.single_queue("a streaming read")
        if options.magazines != ("main",):
            raise InvalidInputError("a streaming read consumes a queue's main magazine; read the sideline and "
                                    "dead letters with a batch read (spark.read) instead")
        self._store: Storage | None = None
        self._queue: Queue | None = None
        self._acked: set[str] = set()  # claims of batches acked by this process (ack is idempotent anyway)

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to the executors for `read`: the driver side's connection stays here.
        return {**self.__dict__, "_store": None, "_queue": None, "_acked": set()}

    # ---- driver side -----------------------------------------------------------------------------
    def _open(self) -> Queue:
        if self._queue is None:
            self._store = open_driver_store(self.options)
            # A deactivated queue can still be drained, as `ignis consume` does.
            self._queue = Ignis(self._store).queue(self.queue_name, allow_inactive=True)
        return self._queue

    def initialOffset(self) -> dict:
        queue = self._open()
        return {"fire": {str(s): p.fire for s, p in queue.main.pointers().items()}, "claims": ""}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        queue = self._open()
        self._ack(start)  # the batch ending at `start` is complete (see the module docstring)
        if isinstance(limit, ReadMaxRows):
            want = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            want = ALL_AVAILABLE_CAP
        else:
            want = self.options.max_messages_per_trigger
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
        if not claimed:
            return start
        fire = dict(start.get("fire") or {})
        for ref in claimed:
            fire[str(ref.shard)] = max(int(fire.get(str(ref.shard), 0)), ref.slot)
        return {"fire": fire, "claims": encode_claims(claimed)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if end.get("claims", "") == start.get("claims", "") and end.get("fire") == start.get("fire"):
            return []
        by_shard: dict[int, list[tuple[int, int]]] = {}
        for shard, first, last in decode_claims(end.get("claims", "")):
            by_shard.setdefault(shard, []).append((first, last))
        return [ClaimedSlots(shard, runs) for shard, runs in sorted(by_shard.items())]

    def commit(self, end: dict) -> None:
        self._ack(end)

    def _ack(self, offset: dict) -> None:
        claims = offset.get("claims", "")
        if not claims or claims in self._acked:
            return
        queue = self._open()
        refs = [SlotRef(queue.name, shard, slot) for shard, first, last in decode_claims(claims)
                for slot in range(first, last + 1)]
        for at in range(0, len(refs), ACK_CHUNK):
            queue.store.delete(refs[at:at + ACK_CHUNK])
        self._acked.add(claims)
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
        for first, last in part.runs:
            records = store.peek(self.queue_name, part.shard, first, last)
            if records:
                yield schema.to_batch(self.queue_name, "main", part.shard, records)
