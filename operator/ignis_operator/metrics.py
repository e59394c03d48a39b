"""Operator metrics (DESIGN §7): reconciles by result, reconcile duration, declared queues by state, drift
repairs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("ignis_operator_reconciles", "Queue reconciles by result (the Ready reason)", ["result"])
RECONCILE_DURATION = Histogram("ignis_operator_reconcile_duration_seconds", "Duration of one queue reconcile",
                               buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
QUEUES = Gauge("ignis_operator_queues", "Declared queues by state (the Ready reason)", ["state"])
DRIFT_REPAIRS = Counter("ignis_operator_drift_repairs", "Queue records restored or reverted by the periodic resync "
                        "(deleted, or config bins edited behind the operator's back)")


class QueueStates:
    """The last reconcile result of every declared queue, folded into the `ignis_operator_queues` gauge."""

    def __init__(self) -> None:
        self._states: dict[str, str] = {}
        self._lock = threading.Lock()

    def record(self, key: str, state: str) -> None:
        RECONCILES.labels(state).inc()
        with self._lock:
            previous = self._states.get(key)
            self._states[key] = state
            if previous != state:
                if previous is not None:
                    QUEUES.labels(previous).dec()
                QUEUES.labels(state).inc()

    def forget(self, key: str) -> None:
        with self._lock:
            previous = self._states.pop(key, None)
            if previous is not None:
                QUEUES.labels(previous).dec()

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self._states)


@contextmanager
def timed() -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        RECONCILE_DURATION.observe(time.perf_counter() - started)
