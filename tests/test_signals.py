"""Stopping on SIGTERM/SIGINT: the handler must never wait for a lock its own (main) thread holds."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ignis.signals import STOP_SIGNALS, set_on_signals


@pytest.mark.timeout(30)
def test_a_signal_landing_while_the_event_lock_is_held_still_stops() -> None:
    # Event.wait() holds the Event's internal lock for a moment on each call; a handler that called
    # stop.set() itself would wait for that lock for ever on the thread that holds it.
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        set_on_signals(stop)
        with stop._cond:  # the lock, held by this (the main) thread, as inside Event.wait
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here, on this thread, and must return at once
            assert not stop.is_set()
        assert stop.wait(5), "the stop event was never set"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
