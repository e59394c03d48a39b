"""Helpers for tests that wait on something running in another thread or process, and for figures a store
updates after the fact."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# How long a test waits for a figure the store updates after the fact (docs/python/delayed.md, "How exact the
# figures are"): on Aerospike a moved delayed message is uncounted by the settle that follows its copy into main,
# two store calls later (milliseconds; the emulator: microseconds). The bound is the margin of a loaded 2-core CI
# machine, whose threads can wait for the scheduler or a garbage collection; a passing test waits only as long
# as the figure takes. A store that keeps the figure exact at every moment (lmdb) is read once, with no wait.
FIGURE_LAG_SECONDS = 5.0


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition", step: float = 0.05
             ) -> Any:
    """Poll `predicate` until it returns something truthy and return that; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def figure_lag(store: Any) -> float:
    """How long `store`'s `delayed` figure (and the depth beside it) may lag a move of due delayed messages: 0
    where a move is one transaction (Storage.moves_delayed_in_one_write), else FIGURE_LAG_SECONDS."""
    return 0.0 if store.moves_delayed_in_one_write else FIGURE_LAG_SECONDS


def settles_to(read: Callable[[], T], expected: T, within: float, what: str = "the figure", step: float = 0.01
               ) -> None:
    """Assert that read() equals `expected`: at once when `within` is 0 (a figure the store keeps exact), else
    within `within` seconds (a figure the store updates after the fact). Only the exact value passes; the
    failure names the last value read."""
    deadline = time.monotonic() + within
    while True:
        value = read()
        if value == expected:
            return
        if time.monotonic() >= deadline:
            lag = f" within {within:g} s" if within else " (a figure this store keeps exact: no wait)"
            raise AssertionError(f"{what} is {value!r}, expected {expected!r}{lag}")
        time.sleep(step)


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; an error status is returned, not raised; (0, "") if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""
