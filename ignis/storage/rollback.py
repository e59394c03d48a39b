"""Rollback detection: a store that answers lower than what it answered before has lost acknowledged
writes (DESIGN §8a). A single Aerospike node acknowledges a write before flushing it to its device
(`flush-max-ms`); killed in that window, it comes back without those writes, and its counters go back.

Each process remembers, per record it counts with, the highest values it has seen (`HighMarks`). The
store takes a mark *before* it sends a call and compares the answer with it: a counter that only grows
answers at least the mark to any call sent after the mark was seen, so a lower answer is a rollback, never
a race between this process's own threads. A rollback is counted (`ignis_store_rollbacks_total{queue,
magazine}`) and logged at ERROR with both values, once per record and counter until the value moves past
the mark, however many calls see it (`HighMarks.report`). The caller then moves an allocation counter (load
and fire pointers) past the mark, so no slot number is ever handed out twice; a sweep pointer is taken as
stored, so the slots between it and the mark are swept again (re-sweeping a range is idempotent).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

from ignis import names
from ignis.envelope import now_ms
from ignis.metrics import STORE_ROLLBACKS

log = logging.getLogger("ignis.store")


class HighMarks:
    """The highest value seen per (record, counter), and when it was seen. Thread-safe (see `saw`)."""

    def __init__(self) -> None:
        self._marks: dict[Hashable, tuple[int, int]] = {}
        self._reported: dict[Hashable, int] = {}  # key -> the mark its last reported rollback was below
        self._lock = threading.Lock()

    def mark(self, key: Hashable) -> int:
        return self._marks.get(key, (0, 0))[0]

    def seen_at(self, key: Hashable) -> int:
        """When the mark was first seen (epoch ms; 0 = no mark)."""
        return self._marks.get(key, (0, 0))[1]

    def saw(self, key: Hashable, value: int) -> None:
        # No lock: this runs on every claim and allocation. Two threads racing may leave the lower of their
        # two values, which only makes the check a little less sensitive, never wrong: a mark is always a
        # value the store did answer, and it is compared only with answers to calls sent after it was seen.
        current = self._marks.get(key)
        if current is None or value > current[0]:
            self._marks[key] = (value, now_ms())

    def forget(self, predicate: Callable[[Hashable], bool]) -> None:
        """Drop every mark whose key matches (a purge: the numbering starts afresh, on purpose)."""
        with self._lock:
            for key in [k for k in self._marks if predicate(k)]:
                del self._marks[key]
            for key in [k for k in self._reported if predicate(k)]:
                del self._reported[key]

    def report(self, key: Hashable, what: str, magazine: str | None, stored: int, *, queue: str | None = None,
               kind: str | None = None) -> bool:
        """Count and log a rollback of `key` (the store answered `stored`, below the mark): once per process
        until the mark moves (a value past it is seen), however many calls or passes see the same rollback.
        True if this call reported it."""
        high = self.mark(key)
        with self._lock:
            if self._reported.get(key) == high:
                return False
            self._reported[key] = high
        report(what, magazine, stored, high, queue=queue, kind=kind)
        return True


def report(what: str, magazine: str | None, stored: int, high: int, *, queue: str | None = None,
           kind: str | None = None) -> None:
    """Count and log one rollback: `what` (e.g. 'load pointer of orders shard 3') answered `stored` where
    this process had seen `high`."""
    if magazine is not None:
        queue, kind = names.queue_and_kind(magazine)
    STORE_ROLLBACKS.labels(queue or "", kind or "").inc()
    log.error("store rollback: the %s is %d, but this process had seen %d: the store lost acknowledged writes "
              "(a crash before its flush); moving past %d so no slot is given twice", what, stored, high, high,
              extra={"event": "store_rollback", "stored": stored, "high": high, "queue": queue, "magazine": kind})
