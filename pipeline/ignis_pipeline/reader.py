"""Batch read of the `ignis` format: a non-destructive snapshot (it peeks; it never claims, stamps or acks).

Spark calls `partitions` once, in a Python process on the driver side, then `read(partition)` once per
partition in the executors' Python workers. Each task opens its own store connection from the options.

A topic read (option `topic`) plans per topic shard from its oldest retained message, or from where a search
over publish times finds `startingTimestamp` (slots.plan_topics), and its tasks leave out, as they read, the
records outside the publish-time window and those the `subjectFilter` does not select: only selected rows
reach Spark.

What is read is decided by the options alone (`queue`, `magazine`, `since`); every filter of a query is
evaluated by Spark on the rows. The source accepts no pushed filters, because pyspark 4.2.0 to 4.3.0 (every
version this project allows) keep one read plan per DataFrame and hand it to later queries on it: the
plan is stored on the provider-scoped `PythonDataSourceV2` (`getOrCreateReadInfo`), and a query that
pushes filters replaces it (`PythonScanBuilder.pushFilters` -> `setReadInfo`), so a plan narrowed by one
query's filters would be read by the next query on the same DataFrame, which may push none, and it would
silently get that query's rows (a count after `where magazine = 'dead'` counted only dead letters). With
nothing pushed, every query's plan covers every row its options name, and Spark's own filters do the rest.

A reused DataFrame also reads its kept plan again, so the plan ends, per queue and magazine, with a
*tail* partition that reads, when it runs, what was published after planning (slots.Tail): every query
reads what is stored when it runs, as a freshly loaded DataFrame would.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from ignis.subjects import subject_filter
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


TAILS_PER_PARTITION = 64  # (queue, magazine) tails one partition reads: most are empty, a few calls each


class SlotRangePartition(InputPartition):
    """One input partition: a slot range of one shard of one magazine of one queue (picklable)."""

    def __init__(self, ranges: slots.SlotRange) -> None:
        super().__init__(ranges)
        self.range = ranges


class TailPartition(InputPartition):
    """What some (queue, magazine) pairs gained after planning (see slots.Tail), read when the task runs."""

    def __init__(self, tails: Sequence[slots.Tail]) -> None:
        super().__init__(list(tails))
        self.tails = list(tails)


class IgnisReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def plan(self) -> slots.Plan:
        """The slot ranges to read and the tails (what `partitions` wraps): usable without Spark, e.g. in
        tests."""
        opts = self.options
        store = open_driver_store(opts)
        try:
            if opts.is_topic:
                return slots.plan_topics(store, opts.topics, starting_ms=opts.starting, ending_ms=opts.ending,
                                         slots_per_partition=opts.slots_per_partition)
            return slots.plan(store, opts.queues, opts.magazines, since_ms=opts.since,
                              slots_per_partition=opts.slots_per_partition)
        finally:
            store.close()

    def partitions(self) -> list[InputPartition]:
        plan = self.plan()
        tails = [TailPartition(plan.tails[i:i + TAILS_PER_PARTITION])
                 for i in range(0, len(plan.tails), TAILS_PER_PARTITION)]
        return [*(SlotRangePartition(r) for r in plan.ranges), *tails]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        store = task_store(self.options)
        if isinstance(partition, TailPartition):
            for tail in partition.tails:
                ranges = slots.topic_tail_ranges(store, tail) if tail.kind == slots.TOPIC_KIND else \
                    slots.tail_ranges(store, tail)
                for r in ranges:
                    yield from self._read_range(store, r)
            return
        r: slots.SlotRange | None = getattr(partition, "range", None)
        if r is not None:  # None: for an empty plan Spark runs one InputPartition(None), which reads nothing
            yield from self._read_range(store, r)

    def _read_range(self, store: Any, r: slots.SlotRange) -> Iterator[Any]:
        if r.kind == slots.TOPIC_KIND:
            yield from self._read_topic_range(store, r)
            return
        since, until = self.options.since, self.options.until
        for start, end in windows(r.first, r.last):
            records = schema.in_window(store.peek(r.magazine, r.shard, start, end), since, until)
            if records:
                yield schema.to_batch(r.queue, r.kind, r.shard, records)

    def _read_topic_range(self, store: Any, r: slots.SlotRange) -> Iterator[Any]:
        """A topic's slots: the rows of the publish-time window whose subject the filter selects, left out here,
        in the task that reads them, so no other row reaches Spark."""
        opts = self.options
        only = None if opts.subject_filter is None else subject_filter(opts.subject_filter)
        for start, end in windows(r.first, r.last):
            # The filter twice: by the store (Aerospike's server leaves the others' payloads where they are), and
            # here, so a store that cannot apply it still yields only the selected rows.
            records = schema.in_topic_window(store.peek(r.magazine, r.shard, start, end, only), opts.starting,
                                             opts.ending, only)
            if records:
                yield schema.topic_batch(r.queue, r.shard, records)
