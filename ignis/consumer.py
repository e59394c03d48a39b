"""Push consumers: handlers registered by handlerType, `concurrency` workers per queue per process.

The handler's outcome is the ack/nack, as in IgnisMQ: returning anything but `False` acks; `False`
sidelines (reason `rejected`); raising sidelines (reason `exception`) unless the exception is declared
ignorable, in which case the message is deleted. A handler call is bounded by the queue's handler
timeout, itself capped at sweepDuration / 2 so that no handler still runs when the sweeper may re-home
its message; a timed-out call sidelines (`timeout`), and when every handler thread is stuck for 1 s the
batch is sidelined unrun (`saturated`). A worker calls the handler on its own thread, timed out by
ignis.deadlines (a stuck worker is replaced); calls from outside a worker go to a pool thread.

Batching follows IgnisMQ exactly: one run fires until a batch of maxBatchSize is full and hands it
over at once; when the queue runs dry it lingers until maxWaitTime after the start of the run, then
flushes the partial batch; a run yields after max(maxWaitTime, 30 s), checked only after a full batch.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ignis import tracing
from ignis.acks import AckBatcher
from ignis.client import Ignis
from ignis.deadlines import Deadlines
from ignis.errors import HoleBudgetExceeded, IgnisError, StoreError
from ignis.logs import Reachability, one_line
from ignis.metrics import BATCH_SIZE, HANDLER_DURATION
from ignis.outage import STORE_HEALTH, Backoff
from ignis.queue import EXCEPTION, REJECTED, SATURATED, TIMEOUT, UNREADABLE, Message, Queue
from ignis.signals import set_on_signals
from ignis.spec import QueueSpec
from ignis.storage.base import RUNTIME_BINS, QueueRecord

log = logging.getLogger(__name__)

RUN_BUDGET_SECONDS = 30.0
# The queue listing's own health: it is a query of the queue index, and while a cluster's partitions migrate such
# queries fail now and then for a minute or two although every other call answers. Said with the store's health,
# each refresh that failed after a second of answers was a new outage (a WARNING every few seconds through a
# 100-second migration: measured on a 3-node cluster). One WARNING for that stretch, and one INFO once listings have
# answered for LISTING_SETTLE_SECONDS. While the store itself is down (the workers' loops said so), a failed listing
# is that outage's: not said again.
LISTING_SETTLE_SECONDS = 30.0
LISTING_HEALTH = Reachability("store (listing queues)", logging.getLogger("ignis.store"),
                              settle_seconds=LISTING_SETTLE_SECONDS, within=STORE_HEALTH)
LINGER_POLL_SECONDS = 0.2
SATURATION_GRACE_SECONDS = 1.0

SingleHandler = Callable[[Message], Any]
BatchHandler = Callable[[list[Message]], Any]
F = TypeVar("F", bound=Callable[..., Any])


class HandlerTimeout(IgnisError):
    pass


class HandlerSaturated(IgnisError):
    pass


@dataclass
class Handler:
    handler_type: str
    single: SingleHandler | None = None
    batch: BatchHandler | None = None
    ignorable: tuple[type[BaseException], ...] = ()

    def is_ignorable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.ignorable) if self.ignorable else False


class HandlerPool:
    """Runs handler calls on their own threads so a call can be abandoned at its timeout (calls from outside a
    consumer worker: `run_once`, and a handler over several messages one by one); a worker's own call holds one
    of its slots too (`hold`), so all of them together stay within max_handler_threads."""

    def __init__(self, max_threads: int) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="ignis-handler")
        self._slots = threading.BoundedSemaphore(max_threads)

    def hold(self) -> None:
        """Take a slot for a call on the caller's own thread (give it back with `release`)."""
        if not self._slots.acquire(timeout=SATURATION_GRACE_SECONDS):
            raise HandlerSaturated("no handler thread became free within 1 s")

    def release(self) -> None:
        self._slots.release()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout: float) -> Any:
        self.hold()
        future = self._executor.submit(self._run, fn, arg)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise HandlerTimeout(f"handler did not finish within {timeout:g} s") from None

    def _run(self, fn: Callable[[Any], Any], arg: Any) -> Any:
        try:
            return fn(arg)
        finally:
            self._slots.release()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class _Abandoned(Exception):
    """A worker's own handler call returned after its timeout had been handled (ignis.deadlines)."""


class _QueueRuntime:
    """The workers of one queue in this process."""

    def __init__(self, queue: Queue, handler: Handler) -> None:
        self.queue = queue
        self.handler = handler
        self.workers: list[tuple[threading.Thread, threading.Event]] = []


class Consumer:
    """Consumes every active queue whose handlerType has a registered handler.

    >>> consumer = Consumer(ignis)
    >>> @consumer.handler("orders", ignorable=(KeyError,))
    ... def handle(message): ...
    >>> consumer.run()          # until SIGINT/SIGTERM; or start() ... stop()
    """

    def __init__(self, ignis: Ignis, *, queues: Iterable[str] | None = None, max_handler_threads: int = 256,
                 poll_interval: float | None = None, refresh_interval: float | None = None) -> None:
        self.ignis = ignis
        self._only = set(queues) if queues is not None else None
        self._handlers: dict[str, Handler] = {}
        self._max_handler_threads = max_handler_threads
        self._pool = HandlerPool(max_handler_threads)
        self._poll = poll_interval or ignis.settings.poll_interval_seconds
        self._refresh_every = refresh_interval or ignis.settings.queue_refresh_seconds
        self._running: dict[str, _QueueRuntime] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._busy = 0
        self._warned: set[str] = set()
        self.outcomes: Counter[str] = Counter()  # acked / sidelined / ignored / dead-lettered, this process
        self._acks = AckBatcher(self._acked)  # handled messages are acked in batches (ignis.acks)
        self._specs: dict[str, tuple[dict[str, Any], QueueSpec]] = {}  # queue -> (config bins, spec)
        self._deadlines = Deadlines()  # times out the handler calls workers make on their own threads
        self._local = threading.local()  # .worker: (runtime, stop event) on a worker's thread

    # ---- registration ------------------------------------------------------------------------------
    def register(self, handler_type: str, fn: SingleHandler | None = None, *, batch: BatchHandler | None = None,
                 ignorable: Sequence[type[BaseException]] = ()) -> None:
        if fn is None and batch is None:
            raise ValueError(f"handler {handler_type!r}: give a handler function, a batch function, or both")
        current = self._handlers.get(handler_type) or Handler(handler_type)
        self._handlers[handler_type] = Handler(handler_type, fn or current.single, batch or current.batch,
                                               tuple(ignorable) or current.ignorable)

    def handler(self, handler_type: str, *, ignorable: Sequence[type[BaseException]] = ()) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            self.register(handler_type, fn, ignorable=ignorable)
            return fn
        return decorate

    def batch_handler(self, handler_type: str, *, ignorable: Sequence[type[BaseException]] = ()
                      ) -> Callable[[F], F]:
        def decorate(fn: F) -> F:
            self.register(handler_type, batch=fn, ignorable=ignorable)
            return fn
        return decorate

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._supervisor is not None:
            return
        self._stop.clear()
        self.refresh()
        self._supervisor = threading.Thread(target=self._supervise, name="ignis-consumer-supervisor", daemon=True)
        self._supervisor.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop claiming; let every worker finish the messages it holds. True if all exited in time."""
        self._stop.set()
        with self._lock:
            runtimes = list(self._running.values())
            self._running.clear()
        threads = []
        for rt in runtimes:
            for thread, event in rt.workers:
                event.set()
                threads.append(thread)
            rt.queue.main.wake()  # workers waiting for work see their stop at once
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._supervisor is not None:
            self._supervisor.join(max(0.0, deadline - time.monotonic()))
            self._supervisor = None
        self._acks.close(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown()
        self._pool = HandlerPool(self._max_handler_threads)  # a stopped consumer can be started again
        self._deadlines.close()
        self._deadlines = Deadlines()
        return not any(t.is_alive() for t in threads)

    def run(self) -> None:
        """Consume until SIGINT or SIGTERM, then stop gracefully."""
        if threading.current_thread() is threading.main_thread():
            set_on_signals(self._stop)
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()

    def drain(self, timeout: float = 60.0, settle: float = 0.3) -> bool:
        """Run until every consumed queue is empty and nothing is in hand (for scripts and tests).
        True if drained within `timeout`."""
        self.start()
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        try:
            while time.monotonic() < deadline:
                with self._lock:
                    runtimes = list(self._running.values())
                    busy = self._busy
                idle = busy == 0 and self._acks.pending == 0 and all(
                    rt.queue.idle() for rt in runtimes)
                if idle:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since >= settle:
                        return True
                else:
                    quiet_since = None
                time.sleep(0.05)
            return False
        finally:
            self.stop()

    def _supervise(self) -> None:
        backoff = Backoff(health=LISTING_HEALTH)
        wait = self._refresh_every
        while not self._stop.wait(wait):
            try:
                self.refresh()
            except StoreError as exc:  # said once per outage (ignis.outage); the workers go on meanwhile
                wait = min(self._refresh_every, backoff.failed("list queues", exc))
                continue
            except Exception as exc:
                log.error("consumer refresh failed; keeping current workers: %s: %s", type(exc).__name__,
                          one_line(exc), exc_info=not isinstance(exc, IgnisError))
                wait = self._refresh_every
                continue
            backoff.ok()
            wait = self._refresh_every

    def refresh(self) -> None:
        """Adopt new active queues, retire inactive ones, follow concurrency and config changes."""
        wanted: dict[str, tuple[QueueSpec, Handler]] = {}
        for record in self.ignis.list_queues(active=True):
            if self._only is not None and record.name not in self._only:
                continue
            handler_type = record.bins.get("handlerType", "")
            handler = self._handlers.get(handler_type)
            if handler is None:
                if record.name not in self._warned:
                    self._warned.add(record.name)
                    log.warning("queue %s has handlerType %r with no handler registered here; not consuming it",
                                record.name, handler_type)
                continue
            try:
                wanted[record.name] = (self._spec_of(record), handler)
            except IgnisError as exc:
                log.error("queue %s has an invalid stored config, not consuming it: %s", record.name, exc)
        with self._lock:
            if self._stop.is_set():
                return
            for name in list(self._running):
                if name not in wanted:
                    retired = self._running.pop(name)
                    for _, event in retired.workers:
                        event.set()
                    retired.queue.main.wake()
            for name, (spec, handler) in wanted.items():
                rt = self._running.get(name)
                if rt is None:
                    rt = self._running[name] = _QueueRuntime(self.ignis.queue_for(spec), handler)
                elif (rt.queue.spec is not spec and rt.queue.spec != spec) or rt.handler is not handler:
                    queue = self.ignis.queue_for(spec)
                    queue.adopt(rt.queue)  # its claimed, not yet handed out messages go on with it
                    rt.queue = queue
                    rt.handler = handler
                self._scale(rt, spec.concurrency)

    def _spec_of(self, record: QueueRecord) -> QueueSpec:
        """The queue's spec from its record, validated again only when its config bins changed (a refresh
        reads every queue's record; validating a thousand specs every few seconds is most of an idle
        consumer's work)."""
        config = {k: v for k, v in record.bins.items() if k not in RUNTIME_BINS}
        cached = self._specs.get(record.name)
        if cached is not None and cached[0] == config:
            return cached[1]
        spec = QueueSpec.from_bins(record.name, record.bins, self.ignis.client_id)
        self._specs[record.name] = (config, spec)
        return spec

    def _scale(self, rt: _QueueRuntime, target: int) -> None:
        rt.workers = [(t, e) for t, e in rt.workers if t.is_alive() and not e.is_set()]
        if len(rt.workers) > target:
            while len(rt.workers) > target:
                rt.workers.pop()[1].set()
            rt.queue.main.wake()
        while len(rt.workers) < target:
            event = threading.Event()
            thread = threading.Thread(target=self._work, args=(rt, event), daemon=True,
                                      name=f"ignis-consumer-{rt.queue.name}-{len(rt.workers)}")
            rt.workers.append((thread, event))
            thread.start()

    # ---- one worker ----------------------------------------------------------------------------------
    def _work(self, rt: _QueueRuntime, stop: threading.Event) -> None:
        self._local.worker = (rt, stop)  # its handler calls run here (_call_here)
        backoff = Backoff()
        while not stop.is_set():
            main = rt.queue.main
            seen = main.changes  # before looking for work: a change after it ends the wait below at once
            try:
                worked = self._run_once(rt.queue, rt.handler, stop)
            except StoreError as exc:
                # The store failed (said once per outage, ignis.outage): wait, longer and longer, never in a
                # tight loop, whatever this handle still awaits.
                stop.wait(backoff.failed(f"consume {rt.queue.name}", exc))
                continue
            except Exception as exc:
                log.error("consumer run on %s failed: %s: %s", rt.queue.name, type(exc).__name__, one_line(exc),
                          exc_info=not isinstance(exc, IgnisError))
                stop.wait(backoff.failed(f"consume {rt.queue.name}", exc))
                continue
            backoff.ok()
            if not worked:
                # Sleep until the queue gets work (a publish in this process, or one elsewhere that the
                # watcher or the doorbell reports: ignis.watch), or a slot claimed before its record landed
                # is due for a re-read (Magazine.wait_for_work), or the poll interval passed (a safety net:
                # a wake-up is a hint).
                main.wait_for_work(seen, self._poll)
        self._hand_out_kept(rt)

    def _hand_out_kept(self, rt: _QueueRuntime) -> None:
        """A worker that stops handles what its queue handle claimed and keeps (prefetched for the other
        workers, or late writes that landed), claiming nothing new: a graceful stop or a scale-down leaves
        no message to wait for the sweeper."""
        size = rt.queue.spec.batching.max_batch_size if rt.queue.spec.batching is not None else 1
        while True:
            try:
                messages = self._fire(rt.queue, size, kept_only=True)
            except Exception as exc:
                log.warning("consumer on %s: handing out kept messages failed; the sweeper recovers them: %s: %s",
                            rt.queue.name, type(exc).__name__, one_line(exc))
                return
            if not messages:
                return
            self.consume(rt.queue, rt.handler, messages)

    def run_once(self, queue: Queue, handler: Handler, stop: threading.Event | None = None) -> bool:
        """One consumer run (IgnisMQ §1.6), its acks sent before it returns. True if any message was handled."""
        worked = self._run_once(queue, handler, stop)
        self._acks.flush()
        return worked

    def _run_once(self, queue: Queue, handler: Handler, stop: threading.Event | None = None) -> bool:
        """run_once for the workers: their acks go with the next batch (ignis.acks)."""
        stop = stop or self._stop
        batching = queue.spec.batching
        start = time.monotonic()
        if batching is None:
            worked = False
            while not stop.is_set():
                messages = self._fire(queue, 1)
                if messages is None:
                    worked = True
                    continue
                if not messages:
                    return worked
                self.consume(queue, handler, messages)
                worked = True
                if time.monotonic() - start > RUN_BUDGET_SECONDS:
                    break
            return worked

        max_size, wait = batching.max_batch_size, batching.max_wait_seconds
        linger_deadline = start + wait
        run_deadline = start + max(wait, RUN_BUDGET_SECONDS)
        batch: list[Message] = []
        worked = False
        while True:
            seen = queue.main.changes
            messages = self._fire(queue, max_size - len(batch))
            if messages:
                batch.extend(messages)
                if len(batch) >= max_size:
                    self.consume(queue, handler, batch)
                    worked, batch = True, []
                    if time.monotonic() > run_deadline or stop.is_set():
                        break
                continue
            if messages is None:
                continue
            now = time.monotonic()
            # (an ordered queue's batch does not linger: the shards it waits for are held, by it or by others)
            if not batch or now >= linger_deadline or stop.is_set() or queue.ordered:
                break
            queue.main.wait_for_work(seen, min(LINGER_POLL_SECONDS, linger_deadline - now))
        if batch:
            self.consume(queue, handler, batch)
            worked = True
        return worked

    def _fire(self, queue: Queue, n: int, kept_only: bool = False) -> list[Message] | None:
        """Messages, [] when empty, None when the hole budget ran out (fire again at once); counted as in
        hand until consume settles them. `kept_only`: only what the handle already claimed (a stopping
        worker)."""
        try:
            messages = queue.take_kept(n) if kept_only else queue.fire_many(n)
        except HoleBudgetExceeded:
            return None
        if messages:
            with self._lock:
                self._busy += len(messages)
        return messages

    def consume(self, queue: Queue, handler: Handler, messages: list[Message]) -> None:
        """Decode, call the handler, settle every message of the call."""
        in_hand = len(messages)  # (less those a timeout settled meanwhile: _call_here)
        try:
            readable = []
            for message in messages:
                try:
                    message.payload  # noqa: B018 - decode before the handler sees it
                except Exception as exc:
                    self._settle_failure(queue, handler, [message], UNREADABLE, exc)
                else:
                    readable.append(message)
            if not readable:
                return
            if queue.spec.batching is not None:
                BATCH_SIZE.labels(queue.name).observe(len(readable))
                if handler.batch is not None:
                    self._call(queue, handler, handler.batch, readable, readable, alone=True)
                    return
            single = handler.single or (lambda m: handler.batch([m]))  # type: ignore[misc]
            for message in readable:
                self._call(queue, handler, single, message, [message], alone=len(readable) == 1)
        except _Abandoned:  # its timeout settled them, and a worker took this one's place: this one stops
            in_hand -= len(readable)
        finally:
            with self._lock:
                self._busy -= in_hand

    def _call(self, queue: Queue, handler: Handler, fn: Callable[[Any], Any], arg: Any,
              messages: list[Message], alone: bool = False) -> None:
        """Call the handler and settle its messages by the outcome. `alone`: the call holds every message in hand
        of its consume, so a worker makes it on its own thread (_call_here); other calls go to the pool."""
        started = time.perf_counter()
        outcome = "success"
        error: BaseException | str | None = None  # for the trace
        span = tracing.start_process(queue, messages, batch=isinstance(arg, list))  # None when tracing is off
        worker = getattr(self._local, "worker", None) if alone else None
        timeout = queue.spec.effective_handler_timeout_seconds
        try:
            if span is not None:
                fn = tracing.within(span, fn)
            if worker is None:
                result = self._pool.call(fn, arg, timeout)
            else:
                result = self._call_here(worker, queue, handler, fn, arg, messages, timeout, started, span)
        except _Abandoned:
            outcome = ""  # observed and traced by its timeout
            raise
        except HandlerTimeout as exc:
            outcome, error = "timeout", exc
            self._settle_failure(queue, handler, messages, TIMEOUT, exc)
        except HandlerSaturated as exc:
            outcome, error = "saturated", exc
            self._settle_failure(queue, handler, messages, SATURATED, exc)
        except Exception as exc:
            outcome, error = "failure", exc
            self._settle_failure(queue, handler, messages, EXCEPTION, exc)
        else:
            if result is False:
                outcome = error = "rejected"
                self._settle(queue, messages, REJECTED)
            else:
                self._ack(queue, messages)
        finally:
            if outcome:
                HANDLER_DURATION.labels(queue.name, outcome).observe(time.perf_counter() - started)
                if span is not None:
                    tracing.end_process(span, error)

    def _call_here(self, worker: tuple[_QueueRuntime, threading.Event], queue: Queue, handler: Handler,
                   fn: Callable[[Any], Any], arg: Any, messages: list[Message], timeout: float, started: float,
                   span: Any) -> Any:
        """fn(arg) on this worker's own thread: no hand-off to a pool thread and back (ignis.deadlines). Past the
        timeout, the deadlines thread settles the messages as timed out, as a pool call's caller would, and starts
        a worker in this one's place; this one, once the handler returns, drops its outcome (_Abandoned) and stops."""
        pool, deadlines = self._pool, self._deadlines  # (a stop replaces both: this call ends with those it began with)
        pool.hold()  # (HandlerSaturated when every slot has been held for 1 s)

        def timed_out() -> None:
            exc = HandlerTimeout(f"handler did not finish within {timeout:g} s")
            self._replace(worker)
            try:
                self._settle_failure(queue, handler, messages, TIMEOUT, exc)
            finally:
                HANDLER_DURATION.labels(queue.name, "timeout").observe(time.perf_counter() - started)
                if span is not None:
                    tracing.end_process(span, exc)
                with self._lock:
                    self._busy -= len(messages)

        call = deadlines.begin(timeout, timed_out)
        try:
            return fn(arg)
        finally:
            pool.release()
            if not deadlines.end(call):
                raise _Abandoned  # (whatever the handler returned or raised: its timeout settled the messages)

    def _replace(self, worker: tuple[_QueueRuntime, threading.Event]) -> None:
        """A worker is stuck in a handler past its timeout: it stops once the handler returns, and another takes
        its place now, so the queue is consumed at its concurrency meanwhile."""
        rt, stop = worker
        stop.set()
        with self._lock:
            if not self._stop.is_set() and self._running.get(rt.queue.name) is rt:
                self._scale(rt, rt.queue.spec.concurrency)

    def _ack(self, queue: Queue, messages: list[Message]) -> None:
        """Ack handled messages: with the others of the same few milliseconds, again and again (backing off)
        while the store does not answer, until the consumer stops (ignis.acks)."""
        self._acks.add(messages)

    def _acked(self, queue: Queue, messages: list[Message]) -> None:
        """The store accepted the acks of these messages."""
        self._count("acked", len(messages))

    def _settle_failure(self, queue: Queue, handler: Handler, messages: list[Message], reason: str,
                        exc: BaseException) -> None:
        # Timeouts and saturation are never ignorable: the handler may still be running or never ran.
        if reason not in (TIMEOUT, SATURATED) and handler.is_ignorable(exc):
            queue.drop(messages)
            self._count("ignored", len(messages))
            return
        if reason == EXCEPTION:
            log.warning("handler for %s raised %s: %s", queue.name, type(exc).__name__, exc)
        self._settle(queue, messages, reason)

    def _settle(self, queue: Queue, messages: list[Message], reason: str) -> None:
        moved = queue.nack(messages, reason)
        self._count("retried", moved.retried)
        self._count("sidelined", moved.sidelined)
        self._count("dead-lettered", moved.dead_lettered)
        self._count("sideline-refused", moved.refused)

    def _count(self, outcome: str, n: int) -> None:
        if n:
            with self._lock:
                self.outcomes[outcome] += n
