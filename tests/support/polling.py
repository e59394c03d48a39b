"""Helpers for tests that wait on something running in another thread or process."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any


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


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET; an error status is returned, not raised; (0, "") if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""
