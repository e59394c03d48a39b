"""Prometheus metrics of the core library (DESIGN §7): base units, counters end in `_total`,
bounded labels only (queue, magazine, reason, outcome, operation)."""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector


class FastCounter(Collector):
    """A labelled counter whose increments take no lock: each thread adds to its own cell and a scrape
    sums the cells. prometheus_client's Counter takes a lock per `inc`, which is a measurable share of
    a publish or a fire on the embedded store (several increments per message).

    `child.tick()` adds one even faster: it is `next()` on an `itertools.count`, one C call that the
    GIL makes atomic, about a third of `inc()`'s cost; the hot paths (publish, fire, ack) use it."""

    def __init__(self, name: str, documentation: str, labelnames: list[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        # (thread, its cell); a scrape folds the cells of finished threads into _retired, so thread
        # churn does not grow the list.
        self._cells: list[tuple[threading.Thread, dict[tuple[str, ...], float]]] = []
        self._retired: dict[tuple[str, ...], float] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        # One live child per label set, so its ticks are found. Held weakly: a process that opens many
        # queues (the operator reads figures of 10,000) would otherwise keep a child per queue and label
        # for ever. A child that goes leaves its count in _departed (from __del__, which may run anywhere,
        # even inside this class's own locked sections: so it only appends, no lock); the next scrape or
        # labels() call folds them into _retired.
        self._children: weakref.WeakValueDictionary[tuple[str, ...], _Child] = weakref.WeakValueDictionary()
        self._departed: deque[tuple[tuple[str, ...], itertools.count[int]]] = deque()
        REGISTRY.register(self)

    def labels(self, *values: str) -> _Child:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        with self._lock:
            self._fold_departed()  # here too: a process nobody scrapes must not keep what departed
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = _Child(self, key)
        return child

    def _fold_departed(self) -> None:
        """Add the ticks of children gone since the last call to _retired (caller holds _lock)."""
        while self._departed:
            key, count = self._departed.popleft()
            ticks = _ticks(count)
            if ticks:
                self._retired[key] = self._retired.get(key, 0) + ticks

    def _cell(self) -> dict[tuple[str, ...], float]:
        cell: dict[tuple[str, ...], float] = {}
        self._local.cell = cell
        with self._lock:
            self._cells.append((threading.current_thread(), cell))
        return cell

    def collect(self) -> Iterator[CounterMetricFamily]:
        with self._lock:
            live = []
            for thread, cell in self._cells:
                if thread.is_alive():
                    live.append((thread, cell))
                else:  # a finished thread never writes again: its counts can be folded for good
                    for key, value in cell.items():
                        self._retired[key] = self._retired.get(key, 0) + value
            self._cells = live
            self._fold_departed()
            totals = dict(self._retired)
            children = list(self._children.values())
        for child in children:
            ticks = child.ticks()
            if ticks:
                totals[child._key] = totals.get(child._key, 0) + ticks
        for _, cell in live:
            for key, value in cell.copy().items():  # dict.copy is atomic under the GIL
                totals[key] = totals.get(key, 0) + value
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, value in sorted(totals.items()):
            family.add_metric(list(key), value)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)


def _ticks(count: itertools.count[int]) -> int:
    """How many times next() ran on a count from 0. A count shows its next value only in its repr
    ("count(N)"), and reading it there does not advance it."""
    return int(repr(count)[6:-1])


class _Child:
    __slots__ = ("__weakref__", "_count", "_key", "_local", "_parent", "tick")

    def __init__(self, parent: FastCounter, key: tuple[str, ...]) -> None:
        self._parent = parent
        self._local = parent._local
        self._key = key
        self._count = itertools.count()
        # += 1, atomic, no lock. Keep the child, not only its tick: a child nobody holds departs (__del__).
        self.tick: Callable[[], int] = functools.partial(next, self._count)

    def ticks(self) -> int:
        """How many times tick() ran."""
        return _ticks(self._count)

    def __del__(self) -> None:
        # Runs when the last holder lets go (no cycle holds a child). deque.append is atomic and takes no lock.
        self._parent._departed.append((self._key, self._count))

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        try:
            cell = self._local.cell
        except AttributeError:  # this thread's first increment of this counter
            cell = self._parent._cell()
        cell[self._key] = cell.get(self._key, 0) + amount


PUBLISHED = FastCounter("ignis_published", "Messages published", ["queue"])
DELAYED_PUBLISHED = FastCounter("ignis_delayed_published", "Messages published (or retried) with a delay",
                                ["queue"])
DELIVERED = FastCounter("ignis_delivered", "Messages fired to a consumer", ["queue"])
REDELIVERED = FastCounter("ignis_redelivered", "Deliveries of messages delivered before (attempts > 1: after a "
                          "failure, a sweep or a shovel)", ["queue"])
ACKED = FastCounter("ignis_acked", "Messages acknowledged (deleted after success)", ["queue"])
RETRIED = FastCounter("ignis_retried", "Failed messages set to be delivered again later (a nack with a delay, or "
                      "the queue's retry backoff), by reason", ["queue", "reason"])
SIDELINED = FastCounter("ignis_sidelined", "Messages moved to the sideline, by reason", ["queue", "reason"])
DEAD_LETTERED = FastCounter("ignis_dead_lettered", "Messages moved to the dead-letter magazine",
                            ["queue", "reason"])
PUBLISH_REJECTED = FastCounter("ignis_publish_rejected", "Publishes a bounded queue refused (maxLength/maxBytes, "
                               "overflow rejectPublish: QueueFull), one per message", ["queue"])
OVERFLOW_DROPPED = FastCounter("ignis_overflow_dropped", "Oldest waiting messages a bounded queue (overflow dropHead) "
                               "moved to the dead letters to make room for publishes", ["queue"])
IGNORED = FastCounter("ignis_ignored", "Messages deleted because the handler raised an ignorable exception",
                      ["queue"])
SIDELINE_REFUSED = FastCounter("ignis_sideline_refused",
                               "Failed messages left in place because the copy to the sideline failed", ["queue"])
HOLES_SKIPPED = FastCounter("ignis_holes_skipped", "Claimed slots given up with no record (failed or expired "
                            "writes; on Aerospike only after the producer's write deadline)", ["queue", "magazine"])
LATE_WRITES = FastCounter("ignis_late_writes", "Claimed slots whose record was still being written: re-read "
                          "and delivered once it landed", ["queue", "magazine"])
HOLE_BUDGET_EXHAUSTED = FastCounter("ignis_hole_budget_exhausted",
                                    "Fire calls that gave up after skipping their hole budget", ["queue"])
SUBSCRIPTION_EXPIRED = FastCounter("ignis_subscription_expired", "Messages a subscription lost to its topic's "
                                   "retention: they left the topic before the subscription claimed them", ["queue"])
TOPIC_PUBLISHED = FastCounter("ignis_topic_published", "Messages published to a topic", ["topic"])
FIRE_CLAIMS = FastCounter("ignis_fire_claims", "Claim attempts by outcome (won, drained)", ["queue", "outcome"])
STORAGE_CALLS = FastCounter("ignis_storage_calls", "Storage round trips by operation", ["operation"])
STORAGE_RETRIES = FastCounter("ignis_storage_retries", "Storage retries by operation", ["operation"])
STORAGE_ERRORS = FastCounter("ignis_storage_errors", "Storage calls that failed with a transient store error after "
                             "their retries (or that could not be retried safely)", ["operation"])
STORE_ROLLBACKS = FastCounter("ignis_store_rollbacks", "Times the store answered a pointer lower than one this "
                              "process had seen (acknowledged writes lost, e.g. by a crash before the flush): "
                              "allocation moved past the high mark", ["queue", "magazine"])
HANDLER_DURATION = Histogram("ignis_handler_duration_seconds", "Handler call duration",
                             ["queue", "outcome"])
BATCH_SIZE = Histogram("ignis_handler_batch_size", "Messages per handler call on batching queues", ["queue"],
                       buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 20000, 200000))
class FastHistogram(Collector):
    """A labelled histogram whose observations take no lock, for per-message paths: each thread counts into
    its own cells (buckets and sum) and a scrape adds them up, as FastCounter does. prometheus_client's
    Histogram takes a lock per observation (about 2 µs, a few percent of a delivery on the embedded store)."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], buckets: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = tuple(float(b) for b in buckets)
        self._cells: list[tuple[threading.Thread, dict[tuple[str, ...], list[float]]]] = []
        self._retired: dict[tuple[str, ...], list[float]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], _HistogramChild] = {}
        REGISTRY.register(self)

    def labels(self, *values: str) -> _HistogramChild:
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key, _HistogramChild(self, key))
        return child

    def _cell(self) -> dict[tuple[str, ...], list[float]]:
        cell: dict[tuple[str, ...], list[float]] = {}
        self._local.cell = cell
        with self._lock:
            self._cells.append((threading.current_thread(), cell))
        return cell

    def collect(self) -> Iterator[HistogramMetricFamily]:
        for child in list(self._children.values()):
            child.fold()
        with self._lock:
            live = []
            for thread, cell in self._cells:
                if thread.is_alive():
                    live.append((thread, cell))
                else:  # a finished thread never writes again: fold its counts for good
                    for key, counts in cell.items():
                        _add_into(self._retired.setdefault(key, [0.0] * (len(self.bounds) + 2)), counts)
            self._cells = live
            totals = {key: list(counts) for key, counts in self._retired.items()}
        for _, cell in live:
            for key, counts in cell.copy().items():  # dict.copy is atomic under the GIL
                _add_into(totals.setdefault(key, [0.0] * (len(self.bounds) + 2)), list(counts))
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, counts in sorted(totals.items()):
            cumulative, running = [], 0.0
            for bound, n in zip((*self.bounds, float("inf")), counts[:-1], strict=True):
                running += n
                cumulative.append((_bucket_label(bound), running))
            family.add_metric(list(key), cumulative, counts[-1])
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)


def _add_into(total: list[float], counts: list[float]) -> None:
    for i, n in enumerate(counts):
        total[i] += n


def _bucket_label(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


FOLD_AT = 4096  # observations a histogram child's `pending` list holds at most before its appender folds them


class _HistogramChild:
    """One label set's histogram. `observe` counts a value at once; a per-message path appends values to `pending`
    instead (one list.append: no call into here, a tenth of observe's cost) and calls `fold` once it holds FOLD_AT
    of them; a scrape folds what is pending first, so no observation is ever missing from one."""

    __slots__ = ("_bounds", "_fold_lock", "_key", "_local", "_parent", "_size", "pending")

    def __init__(self, parent: FastHistogram, key: tuple[str, ...]) -> None:
        self._parent = parent
        self._local = parent._local
        self._key = key
        self._bounds = parent.bounds
        self._size = len(parent.bounds) + 2  # the buckets, +Inf, and the sum
        self.pending: list[float] = []
        self._fold_lock = threading.Lock()

    def fold(self) -> None:
        """Count the pending observations (negative ones as 0: clocks of two hosts). Appends that land meanwhile
        stay pending: under the interpreter lock a copy and a slice deletion are each atomic, and an append goes
        after both."""
        with self._fold_lock:  # (two folders would count the same values twice)
            pending = self.pending
            values = pending[:]
            del pending[:len(values)]
        if values:
            self.observe_many(values)

    def observe(self, value: float) -> None:
        try:
            cell = self._local.cell
        except AttributeError:  # this thread's first observation of this histogram
            cell = self._parent._cell()
        counts = cell.get(self._key)
        if counts is None:
            counts = cell[self._key] = [0.0] * self._size
        counts[bisect_left(self._bounds, value)] += 1
        counts[-1] += value

    def observe_many(self, values: Iterable[float]) -> None:
        """observe() each of `values`, a negative one as 0 (clocks of two hosts), in one call (a fold of the
        deliveries' pending values). Sorted first, then one bisection per bucket: the per-value work is C's sort,
        not a Python loop (this runs for every delivered message, in folds of FOLD_AT)."""
        try:
            cell = self._local.cell
        except AttributeError:
            cell = self._parent._cell()
        counts = cell.get(self._key)
        if counts is None:
            counts = cell[self._key] = [0.0] * self._size
        ordered = sorted(values)
        negative = bisect_left(ordered, 0.0)  # counted as 0.0: in the bucket of the first bound >= 0
        below = 0  # values at or under the previous bound (a bucket's upper bound is inclusive: Prometheus' `le`)
        for i, bound in enumerate(self._bounds):
            upto = bisect_right(ordered, bound) if bound >= 0.0 else 0
            counts[i] += upto - below
            below = upto
        counts[-2] += len(ordered) - below  # +Inf
        counts[-1] += sum(ordered[negative:])


# First delivery time minus publish time (or due time, for a delayed message), on the consumer's clock against
# the producer's (epoch ms; keep hosts in NTP sync). Only attempts == 1: a redelivery's wait says how long a
# failure took to come back.
DELIVERY_LATENCY = FastHistogram("ignis_delivery_latency_seconds", "Time from publish to first delivery", ["queue"],
                                 buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                          10, 30, 60, 300, 900, 1800, 3600))
