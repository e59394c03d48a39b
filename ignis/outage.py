"""Store outages in long-running loops: back off, and say so once.

Every loop that talks to the store (consumer workers, the consumer's queue refresh, the sweep and shovel
loops, the sweeper's store lease, the gauges) waits out a failing store the same way:

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
The process-wide `STORE_HEALTH` (an `ignis.logs.Reachability`) turns the failures of all loops into two
log lines per outage: one WARNING when the store stops answering (the operation and the error, on one line,
no traceback) and one INFO when it answers again, with how many calls failed meanwhile.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from tenacity import wait_fixed, wait_random_exponential

from ignis.logs import Reachability

FLOOR_SECONDS = 0.05  # never retry sooner than this
CAP_SECONDS = 5.0  # nor wait longer than this (plus the floor) between two tries

# Back once it has answered for a second: a cluster moving partitions answers and fails by turns.
STORE_HEALTH = Reachability("store", logging.getLogger("ignis.store"), settle_seconds=1.0)


def store_failed(operation: str, exc: BaseException) -> bool:
    """Tell STORE_HEALTH that `operation` failed with `exc` (True for the call that logged the WARNING)."""
    return STORE_HEALTH.failed(f"{operation} failed: {type(exc).__name__}: {exc}")


class Backoff:
    """The delays of one loop: `failed()` reports the failure to `health` and returns how long to wait
    (FLOOR + a random share of an exponentially growing window, at most CAP); `ok()` starts afresh."""

    def __init__(self, floor: float = FLOOR_SECONDS, cap: float = CAP_SECONDS,
                 health: Reachability | None = None) -> None:
        self._wait = wait_fixed(floor) + wait_random_exponential(multiplier=floor, max=cap)
        self._attempt = 0
        self.delay = 0.0  # the last delay failed() gave
        self.health = health or STORE_HEALTH

    @property
    def failing(self) -> bool:
        return self._attempt > 0

    def failed(self, operation: str, exc: BaseException) -> float:
        self._attempt += 1
        self.health.failed(f"{operation} failed: {type(exc).__name__}: {exc}")
        # tenacity's strategies read only the attempt number of the call state.
        self.delay = float(self._wait(SimpleNamespace(attempt_number=self._attempt)))  # type: ignore[arg-type]
        return self.delay

    def ok(self) -> None:
        self._attempt = 0
        self.health.answered()
