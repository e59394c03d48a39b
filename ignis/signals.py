"""Stop a long-running loop on SIGTERM / SIGINT without the handler ever blocking.

A Python signal handler runs on the main thread between two bytecodes, and that thread is usually inside
`stop.wait(...)` of the very Event the handler sets. `Event.set()` takes the Event's internal lock, a
plain non-reentrant Lock that `Event.wait()` holds for a moment on each call: a signal landing in that
moment makes the handler wait for a lock its own thread holds, for ever (the process ignores SIGTERM
from then on). So the handler hands `set()` to a short-lived thread, which takes the lock as soon as
the main thread lets go of it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterable
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def set_on_signals(event: threading.Event, signals: Iterable[signal.Signals] = STOP_SIGNALS, *,
                   announce: bool = False) -> None:
    """Install handlers (main thread only) that set `event` when one of `signals` arrives."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if announce:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
        threading.Thread(target=event.set, name="ignis-signal", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)
