"""Store outages in long-running loops: back off, and say so once.

Every loop that talks to the store (consumer workers, the consumer's queue refresh, the sweep and shovel
loops, the elector's store lease, the operator's figures) waits out a failing store the same way:

    backoff = Backoff()
    while running:
        try:
            work()
        except StoreError as exc:
            stop.wait(backoff.failed("consume orders", exc))   # capped exponential, jittered, >= 50 ms
            continue
        backoff.ok()

`Backoff` gives each loop its own delays (capped exponential with full jitter on top of a 50 ms floor:
tenacity's wait strategies, so many consumers that lost the store together do not come back in step).
The process-wide `STORE_HEALTH` turns the failures of all loops into two log lines per outage: one WARNING
when the store stops answering (the operation and the error, on one line, no traceback) and one INFO
when it answers again, with how many failures were seen meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

from tenacity import wait_fixed, wait_random_exponential

from ignis.errors import StoreUnavailable

log = logging.getLogger("ignis.store")

FLOOR_SECONDS = 0.05  # never retry sooner than this
CAP_SECONDS = 5.0  # nor wait longer than this (plus the floor) between two tries


def one_line(text: object) -> str:
    """`text` with every run of whitespace (newlines of a client's `sub-errors:` list included) made one
    space: a log message is one line."""
    return " ".join(str(text).split())


class StoreHealth:
    """Whether this process can reach the store, as its loops see it: logs the transitions only."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    @property
    def failures(self) -> int:
        """Failures seen since the store went down (0 while it answers)."""
        return self._failures

    def failed(self, operation: str, exc: BaseException) -> None:
        with self._lock:
            self._failures += 1
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        kind = "unavailable" if isinstance(exc, StoreUnavailable) else "failing"
        self._log.warning("store %s: %s failed: %s: %s", kind, operation, type(exc).__name__, one_line(exc),
                          extra={"event": "store_down", "operation": operation})

    def ok(self) -> None:
        if self._down_since is None:  # the common case: one attribute read, no lock
            return
        with self._lock:
            if self._down_since is None:
                return
            seconds, failures = time.monotonic() - self._down_since, self._failures
            self._down_since, self._failures = None, 0
        self._log.info("store available again after %.1f s (%d failed call(s) meanwhile)", seconds, failures,
                       extra={"event": "store_up", "seconds": round(seconds, 3), "failures": failures})


STORE_HEALTH = StoreHealth()


class Backoff:
    """The delays of one loop: `failed()` reports the failure to `health` and returns how long to wait
    (FLOOR + a random share of an exponentially growing window, at most CAP); `ok()` starts afresh."""

    def __init__(self, floor: float = FLOOR_SECONDS, cap: float = CAP_SECONDS,
                 health: StoreHealth | None = None) -> None:
        self._wait = wait_fixed(floor) + wait_random_exponential(multiplier=floor, max=cap)
        self._attempt = 0
        self.delay = 0.0  # the last delay failed() gave
        self.health = health or STORE_HEALTH

    @property
    def failing(self) -> bool:
        return self._attempt > 0

    def failed(self, operation: str, exc: BaseException) -> float:
        self._attempt += 1
        self.health.failed(operation, exc)
        # tenacity's strategies read only the attempt number of the call state.
        self.delay = float(self._wait(SimpleNamespace(attempt_number=self._attempt)))  # type: ignore[arg-type]
        return self.delay

    def ok(self) -> None:
        self._attempt = 0
        self.health.ok()
