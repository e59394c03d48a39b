"""ignis.deadlines: the timeouts of handler calls made on a consumer worker's own thread."""

from __future__ import annotations

import threading
import time

from ignis.deadlines import Deadlines


def test_a_call_that_ends_in_time_is_never_timed_out() -> None:
    deadlines = Deadlines()
    fired: list[str] = []
    try:
        call = deadlines.begin(0.3, lambda: fired.append("late"))
        assert deadlines.end(call) is True
        time.sleep(0.6)
        assert fired == [] and deadlines.in_flight == 0
    finally:
        deadlines.close()


def test_a_call_past_its_timeout_is_timed_out_once_and_its_end_says_so() -> None:
    deadlines = Deadlines()
    fired = threading.Event()
    count: list[int] = []
    try:
        started = time.monotonic()
        call = deadlines.begin(0.2, lambda: (count.append(1), fired.set()))
        assert fired.wait(5)
        assert time.monotonic() - started >= 0.2
        assert deadlines.end(call) is False  # the caller drops its outcome
        time.sleep(0.3)
        assert count == [1]
    finally:
        deadlines.close()


def test_a_shorter_timeout_begun_later_is_not_held_up_by_a_longer_one() -> None:
    deadlines = Deadlines()
    short = threading.Event()
    try:
        long_call = deadlines.begin(30, lambda: None)
        time.sleep(0.05)  # the thread now sleeps towards the long deadline
        started = time.monotonic()
        deadlines.begin(0.2, short.set)
        assert short.wait(5) and time.monotonic() - started < 5
        assert deadlines.end(long_call) is True
    finally:
        deadlines.close()


def test_a_failing_timeout_handler_does_not_stop_the_others() -> None:
    deadlines = Deadlines()
    second = threading.Event()

    def boom() -> None:
        raise RuntimeError("settle failed")

    try:
        deadlines.begin(0.1, boom)
        deadlines.begin(0.2, second.set)
        assert second.wait(5)
    finally:
        deadlines.close()
