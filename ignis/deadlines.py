"""Deadlines of handler calls that run on a consumer worker's own thread (ignis.consumer).

A push consumer's worker calls its handler itself, with no hand-off to a pool thread: at 1,000 msg/s that
hand-off (submit, wake the pool thread, wake the worker again with the result) was half of a consumer's
thread switches and a sixth of its CPU (measured: docs/benchmarks/topics.md). A call still has a timeout,
and a worker cannot abandon the call it is inside. So one `Deadlines` thread per consumer watches the calls
in flight, and when one outlives its timeout it runs that call's `on_timeout` (the consumer sidelines the
messages and starts a worker in place of the stuck one); the call's own thread learns it was given up when
the handler finally returns (`end` is False) and drops the result.

The thread wakes only when a call in flight reaches its deadline (or a call with an earlier deadline than
the one it sleeps towards starts), not once per call: calls that end in time cost two short lock holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ignis.logs import one_line

log = logging.getLogger(__name__)


class Call:
    """One handler call in flight."""

    __slots__ = ("deadline", "on_timeout")

    def __init__(self, deadline: float, on_timeout: Callable[[], None]) -> None:
        self.deadline = deadline  # monotonic
        self.on_timeout = on_timeout


class Deadlines:
    """Calls in flight and the thread that times them out."""

    def __init__(self, name: str = "ignis-deadlines") -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._calls: set[Call] = set()
        self._wakes_at = float("inf")  # when the thread wakes next, as it last planned (monotonic)
        self._shortest = float("inf")  # the shortest timeout a call had: with none in flight, the thread sleeps
        # that long, so a call that starts then ends before it wakes (the usual case) does not wake it either
        self._thread: threading.Thread | None = None
        self._closed = False

    def begin(self, timeout: float, on_timeout: Callable[[], None]) -> Call:
        """A call starts: `on_timeout()` runs on this object's thread if `end(call)` has not come within
        `timeout` seconds."""
        call = Call(time.monotonic() + timeout, on_timeout)
        with self._cond:
            self._calls.add(call)
            self._shortest = min(self._shortest, timeout)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif call.deadline < self._wakes_at:
                self._cond.notify()
        return call

    def end(self, call: Call) -> bool:
        """The call returned: True if in time, False if it was already timed out (its on_timeout ran or runs)."""
        with self._cond:
            if call in self._calls:
                self._calls.remove(call)
                return True
            return False

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    def close(self) -> None:
        """Stop the thread (calls still in flight are no longer timed out)."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                expired = [call for call in self._calls if call.deadline <= now]
                self._calls.difference_update(expired)
                if not expired:
                    self._wakes_at = min((call.deadline for call in self._calls), default=now + self._shortest)
                    self._cond.wait(None if self._wakes_at == float("inf") else self._wakes_at - now)
                    continue
            for call in expired:  # (outside the lock: a timeout settles messages, a store call)
                try:
                    call.on_timeout()
                except Exception as exc:
                    log.error("handling a handler timeout failed (the sweeper recovers its messages): %s: %s",
                              type(exc).__name__, one_line(exc))
