"""The asyncio API (README "Async API"): the blocking library behind a bounded thread pool, so no store call
ever runs on the event loop (an lmdb fsync, an Aerospike round trip).

    async with AsyncIgnis(url) as ig:
        q = ig.queue("orders")
        await q.publish(payload, key=..., delay=...)
        async with q.iterator(prefetch=10) as it:
            async for message in it:
                async with message.process():      # acks on exit; an exception nacks it and propagates
                    ...

No message is left in limbo: whatever this API claimed and did not settle goes back to main's tail at once
(`Queue.release`), without waiting for the sweeper, when an iterator is left or cancelled (the messages it
prefetched and did not yield too, with their claim's attempt not counted), when a `process()` block or a
push handler is cancelled, and when an awaiting `fire()` is cancelled after its thread claimed a message.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from ignis import tracing
from ignis.browse import BrowsedMessage
from ignis.client import Ignis
from ignis.errors import QueueFull
from ignis.queue import EXCEPTION, REJECTED, TIMEOUT, Message, Queue, QueueStats
from ignis.spec import QueueSpec
from ignis.storage.base import MessageRef, SlotRef
from ignis.topics import Topic, TopicSpec, TopicStats

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_THREADS = 16
DEFAULT_PUBLISH_THREADS = 4
WAIT_SLICE_SECONDS = 1.0  # a thread waits for a message this long at most per call, so cancellation is quick
AsyncHandler = Callable[["AsyncMessage"], Awaitable[bool | None]]


class AsyncIgnis:
    """`Ignis` for asyncio: the same URLs and settings; every store call runs on a pool of `threads`, and plain
    publishes go in batches through up to `publish_threads` threads of their own."""

    def __init__(self, store: Any = None, *, threads: int = DEFAULT_THREADS,
                 publish_threads: int = DEFAULT_PUBLISH_THREADS, **kwargs: Any) -> None:
        self._args, self._kwargs = store, kwargs
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ignis-aio")
        self._publishers = _PublishThreads(publish_threads)
        self._mailbox: _Mailbox | None = None
        self._ignis: Ignis | None = None
        self._queues: dict[str, AsyncQueue] = {}
        self._topics: dict[str, AsyncTopic] = {}

    async def __aenter__(self) -> AsyncIgnis:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._ignis is None:
            self._ignis = await self.run(lambda: Ignis(self._args, **self._kwargs))

    async def close(self) -> None:
        if not self._publishers.closed:
            self._publishers.close()  # what was published before is written first
            await asyncio.get_running_loop().run_in_executor(self._pool, self._publishers.join)
        if self._ignis is not None:
            ignis, self._ignis = self._ignis, None
            await self.run(ignis.close)
        self._pool.shutdown(wait=False)

    @property
    def sync(self) -> Ignis:
        """The blocking client underneath (open)."""
        if self._ignis is None:
            raise RuntimeError("AsyncIgnis is not open: use `async with AsyncIgnis(...)` or `await open()`")
        return self._ignis

    async def run(self, fn: Callable[[], T]) -> T:
        """fn() on the pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def _publish_plain(self, queue: Queue, payload: bytes) -> asyncio.Future[MessageRef]:
        loop = asyncio.get_running_loop()
        mailbox = self._mailbox
        if mailbox is None or mailbox.loop is not loop:  # (a publish in flight keeps its own mailbox)
            mailbox = self._mailbox = _Mailbox(loop)
        future: asyncio.Future[MessageRef] = loop.create_future()
        self._publishers.submit((queue, payload, future, mailbox))
        return future

    async def apply(self, spec: QueueSpec | TopicSpec) -> bool:
        return await self.run(lambda: self.sync.apply(spec))

    def queue(self, name: str) -> AsyncQueue:
        """A handle on a declared queue (checked on first use)."""
        found = self._queues.get(name)
        if found is None:
            found = self._queues[name] = AsyncQueue(self, name)
        return found

    async def stats(self, name: str, in_flight: bool = False) -> QueueStats:
        return await self.run(lambda: self.sync.stats(name, in_flight))

    def topic(self, name: str) -> AsyncTopic:
        """A handle on a declared topic (checked on first use)."""
        found = self._topics.get(name)
        if found is None:
            found = self._topics[name] = AsyncTopic(self, name)
        return found

    async def seek(self, name: str, to: str | int) -> dict[int, int]:
        """Move a subscription to a time, earliest or latest (Ignis.seek)."""
        return await self.run(lambda: self.sync.seek(name, to))


_Result = tuple["asyncio.Future[Any]", Any, BaseException | None]


class _Mailbox:
    """Results that threads hand back to one event loop: posted from any thread, delivered on the loop by one
    callback per burst, so a batch of results costs one wake-up of the loop, not one per result."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.hand_out_scheduled = False  # (_PublishThreads: this loop will hand the backlog out)
        self._results: deque[_Result] = deque()
        self._scheduled = False

    def post(self, results: Iterable[_Result]) -> None:
        self._results.extend(results)
        if not self._scheduled:  # (two threads racing here only cost a spare call: _deliver clears it first)
            self._scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits these any more
                self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        results = self._results
        while results:
            future, result, error = results.popleft()
            if future.done():  # its task was cancelled (the message may be stored all the same)
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)


_Publish = tuple[Queue, bytes, "asyncio.Future[MessageRef]", _Mailbox]


class _PublishThreads:
    """Writes the plain publishes (bytes; no id, key, headers or delay) of an AsyncIgnis's tasks on up to `size`
    threads of its own. What the tasks publish in one turn of their loop is handed to one idle thread at the
    end of the turn (one wake-up), which writes it per queue in one `Queue.publish_plain` call (on Aerospike
    one batch write into reserved slots, on lmdb one group commit) and posts each publish its reference, or
    the store's error, through its loop's mailbox. While every thread is busy, publishes queue up, and the
    first thread to finish takes them all (up to MAX_BATCH). Dedicated threads cost the loop less than
    `run_in_executor` (no concurrent Future chained to an asyncio one, one wake-up per batch each way)."""

    MAX_BATCH = 256

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._lock = threading.Lock()
        self._backlog: deque[_Publish] = deque()
        self._idle: list[_PublishThread] = []
        self._threads: list[_PublishThread] = []
        self.closed = False

    def submit(self, item: _Publish) -> None:
        """Queue one publish (on its loop); handed out at the end of the loop's turn."""
        mailbox = item[3]
        with self._lock:
            if self.closed:
                raise RuntimeError("AsyncIgnis is closed: publish on an open one")
            self._backlog.append(item)
            if mailbox.hand_out_scheduled or not (self._idle or len(self._threads) < self.size):
                return  # handed out already this turn, or a busy thread takes it when it comes free
            mailbox.hand_out_scheduled = True
        mailbox.loop.call_soon(self._hand_out, mailbox)

    def _hand_out(self, mailbox: _Mailbox) -> None:
        with self._lock:
            mailbox.hand_out_scheduled = False
            if self._backlog and (self._idle or len(self._threads) < self.size):  # else a busy thread takes it
                self._worker().hand(self._take())

    def _worker(self) -> _PublishThread:
        """An idle thread, or a new one (under the lock; the caller checked that one is allowed)."""
        if self._idle:
            return self._idle.pop()
        worker = _PublishThread(self)
        self._threads.append(worker)
        return worker

    def _take(self) -> list[_Publish]:
        backlog = self._backlog
        return [backlog.popleft() for _ in range(min(len(backlog), self.MAX_BATCH))]

    def next_batch(self, worker: _PublishThread) -> list[_Publish] | None:
        """What `worker` writes next: the backlog; or [] after it joined the idle threads (it waits to be
        handed a batch); or None when it is to end (closed, nothing left)."""
        with self._lock:
            if self._backlog:
                return self._take()
            if self.closed:
                return None
            self._idle.append(worker)
            return []

    def close(self) -> None:
        """Take no more publishes; the threads write what is queued, then end (join them)."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
            if self._backlog and not self._threads:  # queued this turn, no thread yet to write it
                idle = [self._worker()]
            for worker in idle:
                worker.hand(self._take() if self._backlog else None)

    def join(self) -> None:
        for worker in list(self._threads):
            worker.thread.join()


class _PublishThread:
    def __init__(self, owner: _PublishThreads) -> None:
        self._owner = owner
        self._wake = threading.Lock()
        self._wake.acquire()
        self._batch: list[_Publish] | None = None
        self.thread = threading.Thread(target=self._run, name="ignis-aio-publish", daemon=True)
        self.thread.start()

    def hand(self, batch: list[_Publish] | None) -> None:
        """Give the (waiting) thread a batch to write, or None to end."""
        self._batch = batch
        self._wake.release()

    def _run(self) -> None:
        while True:
            self._wake.acquire()
            batch, self._batch = self._batch, None
            while batch:
                _write(batch)
                batch = self._owner.next_batch(self)
            if batch is None:
                return


def _write(batch: list[_Publish]) -> None:
    """Write a batch of publishes, per queue in one call, and post each its reference or the error."""
    by_queue: dict[Queue, list[_Publish]] = {}
    for item in batch:
        by_queue.setdefault(item[0], []).append(item)
    for queue, items in by_queue.items():
        error: BaseException | None = None
        refs: list[Any] = [None] * len(items)
        errors: list[BaseException | None] | None = None
        try:
            refs = queue.publish_plain([payload for _, payload, _, _ in items])
        except QueueFull as exc:  # a bounded queue refused some: those raise it, each on its own; the others are stored
            refs = exc.results
            errors = [None if ref is not None else QueueFull(queue.name, exc.why) for ref in refs]
        except BaseException as exc:  # each of them raises it (like any publish that raised, it may be stored)
            error = exc
        by_mailbox: dict[_Mailbox, list[_Result]] = {}
        for i, ((_, _, future, mailbox), ref) in enumerate(zip(items, refs, strict=True)):
            by_mailbox.setdefault(mailbox, []).append((future, ref, error if errors is None else errors[i]))
        for mailbox, results in by_mailbox.items():
            mailbox.post(results)


class AsyncTopic:
    """Publish to a topic from asyncio (Topic's calls, on the client's pool)."""

    def __init__(self, owner: AsyncIgnis, name: str) -> None:
        self._owner = owner
        self.name = name
        self._topic: Topic | None = None

    async def sync(self) -> Topic:
        """The blocking Topic underneath (TopicNotFound on first use)."""
        if self._topic is None:
            self._topic = await self._owner.run(lambda: self._owner.sync.topic(self.name))
        return self._topic

    async def publish(self, payload: Any, *, subject: str, key: str | None = None,
                      headers: Mapping[str, str] | None = None, id: str | None = None) -> MessageRef:
        topic = await self.sync()
        return await self._owner.run(lambda: topic.publish(payload, subject=subject, key=key, headers=headers, id=id))

    async def publish_many(self, payloads: Iterable[Any], *, subject: str, key: str | None = None,
                           headers: Mapping[str, str] | None = None) -> list[MessageRef]:
        topic = await self.sync()
        items = list(payloads)
        return await self._owner.run(lambda: topic.publish_many(items, subject=subject, key=key, headers=headers))

    async def stats(self) -> TopicStats:
        topic = await self.sync()
        return await self._owner.run(topic.stats)


class AsyncQueue:
    def __init__(self, owner: AsyncIgnis, name: str) -> None:
        self._owner = owner
        self.name = name
        self._queue: Queue | None = None

    async def sync(self) -> Queue:
        """The blocking Queue underneath (QueueNotFound / QueueInactive on first use)."""
        if self._queue is None:
            self._queue = await self._owner.run(lambda: self._owner.sync.queue(self.name))
        return self._queue

    async def publish(self, payload: Any, *, id: str | None = None, key: str | None = None,
                      headers: Mapping[str, str] | None = None,
                      delay: float | timedelta | None = None) -> MessageRef:
        q = await self.sync()
        if id is None and key is None and headers is None and delay is None and type(payload) is bytes \
                and len(payload) <= q.max_payload_bytes and tracing.tracer() is None:
            return await self._owner._publish_plain(q, payload)
        return await self._owner.run(lambda: q.publish(payload, id=id, key=key, headers=headers, delay=delay))

    async def publish_many(self, payloads: Iterable[Any], *, key: str | None = None,
                           headers: Mapping[str, str] | None = None,
                           delay: float | timedelta | None = None) -> list[MessageRef]:
        q = await self.sync()
        items = list(payloads)
        return await self._owner.run(lambda: q.publish_many(items, key=key, headers=headers, delay=delay))

    async def fire(self, timeout: float | None = None) -> AsyncMessage | None:
        found = await self.fire_many(1, timeout)
        return found[0] if found else None

    async def fire_many(self, max_messages: int, timeout: float | None = None) -> list[AsyncMessage]:
        """Up to `max_messages`, waiting up to `timeout` seconds for the first (in slices of WAIT_SLICE_SECONDS,
        so a cancelled wait frees its thread soon). Cancelled: what the thread claimed goes back at once."""
        q = await self.sync()
        loop = asyncio.get_running_loop()
        deadline = None if not timeout else loop.time() + timeout
        while True:
            wait = 0.0 if deadline is None else max(0.0, min(deadline - loop.time(), WAIT_SLICE_SECONDS))
            found = await self._claiming(q, lambda w=wait: q.fire_many(max_messages, timeout=w or None))
            if found or deadline is None or loop.time() >= deadline:
                return [AsyncMessage(self._owner, q, m) for m in found]

    async def _claiming(self, q: Queue, fn: Callable[[], list[Message]]) -> list[Message]:
        """fn() on the pool; if the caller is cancelled meanwhile, what it claims is handed back."""
        future = self._owner._pool.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            def hand_back(done: concurrent.futures.Future[list[Message]]) -> None:
                if not done.cancelled() and done.exception() is None and done.result():
                    _release_quietly(q, done.result(), delivered=False)
            future.add_done_callback(hand_back)
            raise

    async def ack(self, messages: Iterable[AsyncMessage]) -> None:
        q = await self.sync()
        batch = [m.message for m in messages]
        await self._owner.run(lambda: q.ack(batch))

    async def stats(self) -> QueueStats:
        q = await self.sync()
        return await self._owner.run(q.stats)

    async def browse(self, limit: int = 10, shard: int | None = None) -> list[BrowsedMessage]:
        """Queue.browse: the next messages waiting, without claiming them."""
        q = await self.sync()
        return await self._owner.run(lambda: q.browse(limit, shard))

    async def read(self, ref: SlotRef | MessageRef | str) -> BrowsedMessage:
        """Queue.read: one message by its reference, without claiming it."""
        q = await self.sync()
        return await self._owner.run(lambda: q.read(ref))

    def iterator(self, prefetch: int = 10, wait: float = 1.0) -> AsyncQueueIterator:
        """An async iterator of messages, `prefetch` claimed at a time; use it as `async with ... as it`."""
        return AsyncQueueIterator(self, prefetch, wait)


class AsyncMessage:
    """A delivered message: settle it once with `await ack()` / `await nack()`, or inside `process()`."""

    def __init__(self, owner: AsyncIgnis, queue: Queue, message: Message) -> None:
        self._owner, self._queue, self.message = owner, queue, message

    def __getattr__(self, name: str) -> Any:  # id, payload, data, headers, attempts, envelope, ref, settled
        return getattr(self.message, name)

    async def ack(self) -> None:
        await self._owner.run(self.message.ack)

    async def nack(self, reason: str = "nacked", delay: float | timedelta | None = None) -> None:
        await self._owner.run(lambda: self.message.nack(reason, delay=delay))

    async def release(self) -> None:
        """Hand it back unsettled, at once (Queue.release)."""
        await self._owner.run(lambda: self._queue.release([self.message]))

    @contextlib.asynccontextmanager
    async def process(self, reason: str = EXCEPTION) -> AsyncIterator[AsyncMessage]:
        """Acks on a normal exit; an exception nacks with `reason` and propagates; a cancellation hands the
        message back at once and propagates. With tracing on, a `process {queue}` span covers it."""
        try:
            with tracing.processing(self._queue, (self.message,)):
                yield self
        except asyncio.CancelledError:
            if not self.message.settled:
                await asyncio.shield(self.release())
            raise
        except BaseException:
            if not self.message.settled:
                await self.nack(reason)
            raise
        else:
            if not self.message.settled:
                await self.ack()


class AsyncQueueIterator:
    """Yields messages, claimed `prefetch` at a time. Leaving it (normally, by an exception or a cancellation)
    hands back what it yielded and was not settled, and what it prefetched and did not yield."""

    def __init__(self, queue: AsyncQueue, prefetch: int, wait: float) -> None:
        self._queue, self._prefetch, self._wait = queue, max(1, prefetch), wait
        self._buffer: deque[AsyncMessage] = deque()
        self._yielded: list[AsyncMessage] = []
        self._closed = False

    async def __aenter__(self) -> AsyncQueueIterator:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.aclose())

    def __aiter__(self) -> AsyncQueueIterator:
        return self

    async def __anext__(self) -> AsyncMessage:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            found = await self._queue.fire_many(self._prefetch, timeout=self._wait)
            if self._closed:  # left while it waited (aclose() from another task): what it claimed goes back
                if found:     # at once, from the pool, even if this task is cancelled now
                    self._queue._owner._pool.submit(_release_quietly, found[0]._queue,
                                                    [m.message for m in found], False)
                raise StopAsyncIteration
            self._buffer.extend(found)
        message = self._buffer.popleft()
        self._yielded = [m for m in self._yielded if not m.message.settled]
        self._yielded.append(message)
        return message

    async def aclose(self) -> None:
        self._closed = True
        q = await self._queue.sync()
        unyielded = [m.message for m in self._buffer]
        unsettled = [m.message for m in self._yielded if not m.message.settled]
        self._buffer.clear()
        self._yielded = []
        owner = self._queue._owner
        if unyielded:
            await owner.run(lambda: q.release(unyielded, delivered=False))
        if unsettled:
            await owner.run(lambda: q.release(unsettled))


def _release_quietly(queue: Queue, messages: list[Message], delivered: bool) -> None:
    try:
        queue.release(messages, delivered=delivered)
    except Exception as exc:  # the sweeper re-homes them later
        log.warning("could not hand %d message(s) of %s back (the sweeper will): %s", len(messages), queue.name, exc)


class AsyncConsumer:
    """Push consumer for `async def` handlers: `concurrency` tasks per queue (the queue's spec), the handler
    timeout (a handler past it is cancelled: asyncio can), the same outcomes as `Consumer`: anything but False
    acks, False nacks as `rejected`, an exception as `exception` (or drops it if declared ignorable), a timeout
    as `timeout`. `await run()` until cancelled or SIGTERM/SIGINT; then it stops claiming, lets running
    handlers finish for up to `grace` seconds, and hands back what is left."""

    def __init__(self, ignis: AsyncIgnis, *, queues: Iterable[str] | None = None, grace: float = 30.0) -> None:
        self.ignis = ignis
        self._names = list(queues) if queues is not None else None
        self._handlers: dict[str, tuple[AsyncHandler, tuple[type[BaseException], ...]]] = {}
        self.grace = grace
        self.outcomes: dict[str, int] = {}
        self._stopping = asyncio.Event()

    def handler(self, handler_type: str, *, ignorable: tuple[type[BaseException], ...] = ()
                ) -> Callable[[AsyncHandler], AsyncHandler]:
        def register(fn: AsyncHandler) -> AsyncHandler:
            self.register(handler_type, fn, ignorable=ignorable)
            return fn
        return register

    def register(self, handler_type: str, fn: AsyncHandler, *, ignorable: tuple[type[BaseException], ...] = ()
                 ) -> None:
        if not asyncio.iscoroutinefunction(fn):
            raise TypeError(f"handler for {handler_type!r} must be an `async def` function")
        self._handlers[handler_type] = (fn, ignorable)

    def stop(self) -> None:
        """Stop claiming; run() returns once running handlers are done (or `grace` passed)."""
        self._stopping.set()

    def _count(self, outcome: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
        try:
            names = self._names
            if names is None:
                records = await self.ignis.run(lambda: self.ignis.sync.list_queues())
                names = [r.name for r in records]
            workers = []
            for name in names:
                q = await self.ignis.queue(name).sync()
                entry = self._handlers.get(q.spec.handler_type)
                if entry is None:
                    continue
                workers += [asyncio.create_task(self._work(self.ignis.queue(name), q, *entry), name=f"ignis-{name}")
                            for _ in range(max(1, q.spec.concurrency))]
            try:
                await self._stopping.wait()
            finally:
                self._stopping.set()
                _, pending = await asyncio.wait(workers, timeout=self.grace) if workers else (set(), set())
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _work(self, queue: AsyncQueue, q: Queue, fn: AsyncHandler,
                    ignorable: tuple[type[BaseException], ...]) -> None:
        timeout = q.spec.effective_handler_timeout_seconds
        while not self._stopping.is_set():
            found = await queue.fire_many(1, timeout=WAIT_SLICE_SECONDS)
            for message in found:
                await self._handle(message, fn, ignorable, timeout)

    async def _handle(self, message: AsyncMessage, fn: AsyncHandler, ignorable: tuple[type[BaseException], ...],
                      timeout: float) -> None:
        try:
            with tracing.processing(message._queue, (message.message,)) as span:
                result = await asyncio.wait_for(fn(message), timeout)
                if result is False and span is not None:
                    tracing.end_outcome(span, REJECTED)
        except asyncio.CancelledError:
            await asyncio.shield(message.release())  # stopped mid-handle: back at once
            self._count("released")
            raise
        except TimeoutError:
            await message.nack(TIMEOUT)
            self._count("timeout")
        except Exception as exc:
            if ignorable and isinstance(exc, ignorable):
                await self.ignis.run(lambda: message._queue.drop([message.message]))
                self._count("ignored")
            else:
                log.warning("handler for %s raised %s: %s", message._queue.name, type(exc).__name__, exc)
                await message.nack(EXCEPTION)
                self._count("failed")
        else:
            if message.message.settled:
                self._count("settled-by-handler")
            elif result is False:
                await message.nack(REJECTED)
                self._count("rejected")
            else:
                await message.ack()
                self._count("acked")
