"""The push consumer's acks, sent in batches by one thread (`AckBatcher`).

A handler's success is acked a moment later, with the other successes of the same few milliseconds, in one
store call per queue: on lmdb one commit instead of one per message (every commit holds the write lock that
publishers and claimers of every process share, for a flush to disk), on Aerospike one batch call instead of
one call per message. The delay costs nothing but this: a process that dies within it delivers those
messages again, as it would had it died a moment earlier, inside the handler (at least once).

While the store does not answer, a batch is retried, backing off (ignis.outage: said once per outage); a
consumer that stops sends what is pending first, and gives up only when its stop's deadline passes (then
the sweeper redelivers those messages).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ignis.errors import StoreError
from ignis.logs import one_line
from ignis.outage import Backoff

if TYPE_CHECKING:
    from ignis.queue import Message, Queue

log = logging.getLogger(__name__)

ACK_WINDOW_SECONDS = 0.01  # how long an ack waits for others to share its store call
ACK_BATCH_MAX = 500  # ... or until this many are waiting


class AckBatcher:
    """Collects acks from any thread and sends them in batches; `acked(queue, messages)` is called after each
    batch the store accepted."""

    def __init__(self, acked: Callable[[Queue, list[Message]], None], window: float = ACK_WINDOW_SECONDS,
                 most: int = ACK_BATCH_MAX) -> None:
        self._acked = acked
        self._window = window
        self._most = most
        self._pending: list[Message] = []
        self._sending = 0  # messages taken off _pending and not yet accepted by the store
        self._unsent = 0  # messages given up on (a closing batcher's store kept failing)
        self._cond = threading.Condition(threading.Lock())
        self._closing = False
        self._flushing = False  # someone waits for what is pending: no window
        self._deadline = float("inf")  # when a closing batcher gives up on a failing store
        self._thread: threading.Thread | None = None

    def add(self, messages: Sequence[Message]) -> None:
        with self._cond:
            self._pending.extend(messages)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ignis-acks", daemon=True)
                self._thread.start()
            if len(self._pending) >= self._most or len(self._pending) == len(messages):
                self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Send what is pending now, and wait until the store accepted it (or `timeout` passed). True if
        nothing is left pending."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._flushing = True
            self._cond.notify_all()
            while self._pending or self._sending:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None:
                    break
                self._cond.wait(min(remaining, 0.05))
            self._flushing = False
            return not (self._pending or self._sending)

    @property
    def pending(self) -> int:
        """Acks not yet accepted by the store."""
        return len(self._pending) + self._sending

    def close(self, timeout: float) -> bool:
        """Send what is pending (retrying a failing store until `timeout` seconds passed) and stop. True if
        every ack was sent."""
        with self._cond:
            self._closing = True
            self._deadline = time.monotonic() + timeout
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout + 1)
        with self._cond:
            left = len(self._pending) + self._sending + self._unsent
            self._pending.clear()
            self._unsent = 0
            self._closing = False
            self._deadline = float("inf")
        if left:
            log.warning("%d ack(s) not sent before the consumer stopped: those messages will be delivered again", left)
        return left == 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return
                if not (self._closing or self._flushing) and len(self._pending) < self._most:
                    self._cond.wait(self._window)  # let the acks of the same moment join
                batch, self._pending = self._pending, []
                self._sending = len(batch)
            by_queue: dict[int, tuple[Queue, list[Message]]] = {}
            for message in batch:
                by_queue.setdefault(id(message.queue), (message.queue, []))[1].append(message)
            unsent = 0
            for queue, messages in by_queue.values():
                if unsent or not self._send(queue, messages):
                    unsent += len(messages)
            with self._cond:
                self._sending = 0
                self._unsent += unsent
                self._cond.notify_all()  # a flush may be waiting
            if unsent:
                return

    def _send(self, queue: Queue, messages: list[Message]) -> bool:
        """Ack one queue's batch, retrying while the store fails; False once a closing batcher's time is up."""
        backoff = Backoff()
        while True:
            try:
                queue.ack(messages)
            except StoreError as exc:
                delay = backoff.failed(f"ack {queue.name}", exc)
                if time.monotonic() + delay > self._deadline:
                    return False
                time.sleep(delay)
                continue
            except Exception as exc:  # a bug: said, and the messages left to the sweeper (at least once)
                log.error("acking %d message(s) of %s failed: %s: %s", len(messages), queue.name, type(exc).__name__,
                          one_line(exc))
                return True
            backoff.ok()
            self._acked(queue, messages)
            return True
