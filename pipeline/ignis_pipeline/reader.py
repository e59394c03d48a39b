"""Batch read of the `ignis` format: a non-destructive snapshot (it peeks; it never claims, stamps or acks).

Spark calls, in a Python process on the driver side, `pushFilters` once and then `partitions` once
(pyspark.sql.datasource.DataSourceReader: "This method is called once during query planning"); then
`read(partition)` once per partition in the executors' Python workers. Each task opens its own store
connection from the options.

Pushed filters (the rest Spark evaluates as usual):

* `queue` and `magazine`: `=` and `IN` pick the queues and magazines read; fully handled;
* `shard`: `=`, `IN`, `<`, `<=`, `>`, `>=`: fully handled (whole shards are skipped);
* `loaded_at`: `>`, `>=`, `=` give a lower bound that the `since` search uses to skip slots in main;
  Spark still evaluates them on the rows (pyspark's pushFilters contract: "partially pushed filters"
  are returned).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from ignis_pipeline import schema, slots
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.stores import open_driver_store, task_store

PEEK_WINDOW = 4_096  # slots per storage call in a read task
# The first and last windows of a slot range are smaller. A task reads its ranges one after another, and
# Spark starts a Python runner per range: the JVM waits for a range's first batch and the Python worker
# for the JVM to take its last, so half a core idles for about one batch at each end of every range
# (utilization dips measured in the export); small end batches make those waits short.
EDGE_WINDOWS = (256, 1_024)


def windows(first: int, last: int, size: int = PEEK_WINDOW, edges: tuple[int, ...] = EDGE_WINDOWS
            ) -> list[tuple[int, int]]:
    """[first, last] cut into consecutive (start, end) windows of at most `size` slots, the `edges` sizes
    first and (reversed) last."""
    total = last - first + 1
    if total <= 0:
        return []
    head = list(edges)
    tail = list(reversed(edges))
    if sum(head) + sum(tail) >= total:  # a short range: plain windows
        head, tail = [], []
    middle = total - sum(head) - sum(tail)
    sizes = head + [size] * (middle // size) + ([middle % size] if middle % size else []) + tail
    out, start = [], first
    for n in sizes:
        out.append((start, start + n - 1))
        start += n
    return out


_SHARD_TESTS = {
    "EqualTo": operator.eq, "In": lambda shard, values: shard in values, "LessThan": operator.lt,
    "LessThanOrEqual": operator.le, "GreaterThan": operator.gt, "GreaterThanOrEqual": operator.ge,
}


class SlotRangePartition(InputPartition):
    """One input partition: a slot range of one shard of one magazine of one queue (picklable)."""

    def __init__(self, ranges: slots.SlotRange) -> None:
        super().__init__(ranges)
        self.range = ranges


def _ms(value: Any) -> int | None:
    """A filter literal on a timestamp column as epoch ms (Spark hands tz-aware datetimes in the session
    time zone; a naive one is taken as UTC)."""
    if isinstance(value, datetime):
        at = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return int(at.timestamp() * 1000)
    return None


class IgnisReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.queues: set[str] | None = None  # from pushed filters; None = no restriction
        self.kinds: set[str] | None = None
        self.shard_tests: list[tuple[str, Any]] = []
        self.loaded_from: int | None = None

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            column = f.attribute[0] if len(f.attribute) == 1 else None
            if column in ("queue", "magazine") and isinstance(f, EqualTo | In):
                wanted = {f.value} if isinstance(f, EqualTo) else set(f.value)
                if column == "queue":
                    self.queues = wanted if self.queues is None else self.queues & wanted
                else:
                    self.kinds = wanted if self.kinds is None else self.kinds & wanted
                continue
            if column == "shard" and isinstance(f, EqualTo | In | LessThan | LessThanOrEqual | GreaterThan
                                                  | GreaterThanOrEqual):
                self.shard_tests.append((type(f).__name__, f.value))
                continue
            if column == "loaded_at" and isinstance(f, GreaterThan | GreaterThanOrEqual | EqualTo):
                at = _ms(f.value)
                if at is not None:  # `> t` with t in microseconds: the ms floor is a safe lower bound
                    self.loaded_from = at if self.loaded_from is None else max(self.loaded_from, at)
            yield f  # loaded_at (partially pushed) and everything else: Spark evaluates it

    def _shard_ok(self, shard: int) -> bool:
        return all(_SHARD_TESTS[op](shard, value) for op, value in self.shard_tests)

    def plan(self) -> list[slots.SlotRange]:
        """The slot ranges to read (what `partitions` wraps): usable without Spark, e.g. in tests."""
        opts = self.options
        kinds = [k for k in opts.magazines if self.kinds is None or k in self.kinds]
        queues: Iterable[str] | None = opts.queues
        since = opts.since
        if self.loaded_from is not None:
            since = self.loaded_from if since is None else max(since, self.loaded_from)
        store = open_driver_store(opts)
        try:
            if self.queues is not None:
                if queues is None:  # '*' narrowed by a filter: only the named queues that exist
                    existing = {r.name for r in store.list_queues(active=None)}
                    queues = sorted(self.queues & existing)
                else:
                    queues = [q for q in queues if q in self.queues]
            return slots.plan(store, queues, kinds, since_ms=since, slots_per_partition=opts.slots_per_partition,
                              shard_ok=self._shard_ok)
        finally:
            store.close()

    def partitions(self) -> list[InputPartition]:
        return [SlotRangePartition(r) for r in self.plan()]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        r: slots.SlotRange | None = getattr(partition, "range", None)
        if r is None:  # nothing to read: for an empty plan Spark runs one InputPartition(None) instead
            return
        store = task_store(self.options)
        since, until = self.options.since, self.options.until
        for start, end in windows(r.first, r.last):
            records = schema.in_window(store.peek(r.magazine, r.shard, start, end), since, until)
            if records:
                yield schema.to_batch(r.queue, r.kind, r.shard, records)
