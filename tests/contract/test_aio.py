"""The asyncio API (issue 29, part 1) on every backend: publish, fire, the iterator and `process()`, the push
consumer, and the cancellation cases aio-pika users report as bugs: nothing claimed and unsettled is left for
the sweeper when an iterator is left or cancelled, when prefetched messages were never yielded, when a handler
task is cancelled, or when a waiting fire is cancelled."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

import pytest

from ignis import QueueSpec
from ignis.aio import AsyncConsumer, AsyncIgnis


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def opened(backend: Any) -> AsyncIgnis:
    ig = AsyncIgnis(backend.url)
    await ig.open()
    return ig


async def declare(ig: AsyncIgnis, name: str, **fields: Any) -> None:
    fields.setdefault("handlerType", name)
    fields.setdefault("shards", 2)
    await ig.apply(QueueSpec.build(name=name, **fields))


def counts(ig: AsyncIgnis, name: str) -> tuple[int, int]:
    """(depth, in flight): what is deliverable and what is claimed and not settled."""
    s = ig.sync.stats(name, in_flight=True)
    return s.depth, s.in_flight or 0


def test_publish_fire_ack_nack_and_stats(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "basic", shards=1)  # one shard: first in, first out
            q = ig.queue("basic")
            ref = await q.publish({"n": 1}, key="k", headers={"h": "v"})
            refs = await q.publish_many([b"a", b"b"])
            assert len(refs) == 2 and ref.id
            m = await q.fire()
            assert m is not None and m.payload == {"n": 1} and m.headers == {"h": "v"}
            await m.ack()
            batch = await q.fire_many(10)
            assert sorted(x.payload for x in batch) == [b"a", b"b"]
            await batch[0].nack("bad")
            await q.ack(batch[1:])
            s = await q.stats()
            assert (s.depth, s.sidelined) == (0, 1)
            assert await q.fire(timeout=0.2) is None

    run(main())


def test_a_waiting_fire_is_woken_by_a_publish_and_the_loop_is_never_blocked(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "wake")
            q = ig.queue("wake")
            ticks = 0

            async def ticker() -> None:  # runs only while the loop is free
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            tick_task = asyncio.create_task(ticker())
            waiter = asyncio.create_task(q.fire(timeout=5))
            await asyncio.sleep(0.3)
            await q.publish(b"now")
            started = time.monotonic()
            m = await waiter
            assert m is not None and m.payload == b"now" and time.monotonic() - started < 1.0
            await m.ack()
            tick_task.cancel()
            assert ticks >= 20  # the loop kept running while a thread waited for the message

    run(main())


def test_process_acks_on_exit_and_an_exception_nacks_and_propagates(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "proc")
            q = ig.queue("proc")
            await q.publish_many([b"ok", b"boom"])
            handled = 0
            async with q.iterator(prefetch=2, wait=0.2) as it:
                async for message in it:
                    handled += 1
                    if message.payload == b"ok":
                        async with message.process():
                            pass
                    else:
                        with pytest.raises(ValueError):
                            async with message.process():
                                raise ValueError("handler failed")
                    if handled == 2:
                        break
            s = await q.stats()
            assert (s.depth, s.sidelined) == (0, 1)

    run(main())


def test_leaving_an_iterator_hands_back_the_unsettled_and_the_prefetched_at_once(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "limbo")
            q = ig.queue("limbo")
            await q.publish_many([f"m{i}".encode() for i in range(10)])
            async with q.iterator(prefetch=5, wait=0.2) as it:
                first = await it.__anext__()  # yielded, never settled; 4 more prefetched, never yielded
                assert first.attempts == 1
            assert counts(ig, "limbo") == (10, 0)  # all back in main, none left claimed for the sweeper
            again = []
            while batch := await q.fire_many(20):
                again += batch
            attempts = {m.payload: m.attempts for m in again}
            assert len(again) == 10
            assert attempts[first.payload] == 2  # it was delivered once
            assert sorted(attempts.values()).count(1) == 9  # the prefetched ones: their claim not counted
            await q.ack(again)

    run(main())


def test_a_cancelled_iterating_task_hands_its_messages_back(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "cancel")
            q = ig.queue("cancel")
            await q.publish_many([f"m{i}".encode() for i in range(6)])
            inside = asyncio.Event()

            async def consume() -> None:
                async with q.iterator(prefetch=3, wait=0.2) as it:
                    async for message in it:
                        async with message.process():
                            inside.set()
                            await asyncio.sleep(60)  # cancelled here, mid-handle

            task = asyncio.create_task(consume())
            await inside.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert counts(ig, "cancel") == (6, 0)

    run(main())


def test_an_iterator_left_by_another_task_while_its_claim_waits_yields_nothing_and_hands_it_back(backend
                                                                                                   ) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "shutdown")
            q = ig.queue("shutdown")
            it = q.iterator(prefetch=2, wait=3.0)
            waiting = asyncio.create_task(it.__anext__())
            await asyncio.sleep(0.3)  # its claim waits in a thread
            await it.aclose()  # a shutdown handler leaves the iterator the consumer task is in
            ig.sync.queue("shutdown").publish(b"after")  # the waiting claim takes it
            with pytest.raises(StopAsyncIteration):
                await waiting  # nothing is yielded from a left iterator
            deadline = time.monotonic() + 5
            while counts(ig, "shutdown") != (1, 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert counts(ig, "shutdown") == (1, 0)  # back in main at once, not claimed for the sweeper
            again = await q.fire(timeout=1)
            assert again is not None and again.payload == b"after" and again.attempts == 1  # claim not counted
            await again.ack()

    run(main())


def test_a_cancelled_fire_hands_back_what_its_thread_claimed(backend) -> None:
    """The cancelled task's thread keeps waiting for the rest of its slice and may claim what is published
    meanwhile: it hands that back. Judged once that thread is done: a (2, 0) read before it claimed said
    nothing (a run on a busy machine read it so, left the wait, and its final read then caught the thread's
    claim mid-way: (1, 0))."""
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "late")
            q = ig.queue("late")
            claims: list[concurrent.futures.Future[Any]] = []  # the calls the claim makes on the pool
            submit = ig._pool.submit

            def recorded(*args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
                claims.append(submit(*args, **kwargs))
                return claims[-1]

            ig._pool.submit = recorded  # type: ignore[method-assign]
            waiter = asyncio.create_task(q.fire_many(5, timeout=3))
            await asyncio.sleep(0.2)  # the thread waits for a message
            ig._pool.submit = submit  # type: ignore[method-assign]
            publisher = threading.Timer(0.05, lambda: ig.sync.queue("late").publish_many([b"x", b"y"]))
            publisher.start()
            waiter.cancel()  # cancelled while its thread may claim what comes
            with pytest.raises(asyncio.CancelledError):
                await waiter
            publisher.join()
            assert claims
            done, _ = await asyncio.to_thread(concurrent.futures.wait, claims, 10)
            assert len(done) == len(claims)  # the thread's slice is over: nothing else claims
            # (Its hand-back runs as the claim's future completes: wait for the figures it leaves.)
            deadline = time.monotonic() + 5
            while counts(ig, "late") != (2, 0) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert counts(ig, "late") == (2, 0)

    run(main())


def test_the_async_push_consumer_settles_by_outcome_and_stops_gracefully(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "push", concurrency=3, handlerTimeoutSeconds=1)
            q = ig.queue("push")
            await q.publish_many([b"ok", b"reject", b"raise", b"ignore", b"slow", b"ok"])
            consumer = AsyncConsumer(ig, queues=["push"], grace=5)
            seen = asyncio.Event()

            @consumer.handler("push", ignorable=(KeyError,))
            async def handle(message: Any) -> bool | None:
                if message.payload == b"reject":
                    return False
                if message.payload == b"raise":
                    raise ValueError("no")
                if message.payload == b"ignore":
                    raise KeyError("ignorable")
                if message.payload == b"slow":
                    await asyncio.sleep(3)  # past the 1 s handler timeout: cancelled, nacked as timeout
                if sum(consumer.outcomes.values()) >= 5:
                    seen.set()
                return None

            task = asyncio.create_task(consumer.run())
            deadline = time.monotonic() + 15
            while sum(consumer.outcomes.values()) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            consumer.stop()
            await asyncio.wait_for(task, 10)
            assert consumer.outcomes == {"acked": 2, "rejected": 1, "failed": 1, "ignored": 1, "timeout": 1}
            s = await q.stats()
            assert (s.depth, s.sidelined) == (0, 3)

    run(main())


def test_a_handler_cancelled_by_the_stop_hands_its_message_back(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "stopped")
            q = ig.queue("stopped")
            await q.publish(b"long")
            consumer = AsyncConsumer(ig, queues=["stopped"], grace=0.2)
            started = asyncio.Event()

            @consumer.handler("stopped")
            async def handle(message: Any) -> None:
                started.set()
                await asyncio.sleep(60)

            task = asyncio.create_task(consumer.run())
            await asyncio.wait_for(started.wait(), 10)
            consumer.stop()  # the handler outlives the grace: cancelled, and its message goes back
            await asyncio.wait_for(task, 10)
            assert consumer.outcomes.get("released") == 1
            assert counts(ig, "stopped") == (1, 0)

    run(main())


def test_async_publish_of_a_delayed_message(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "later")
            q = ig.queue("later")
            ref = await q.publish(b"x", delay=0.3)
            assert ref.magazine == "later_DELAYED"
            m = await q.fire(timeout=10)
            assert m is not None and m.envelope.due_at == ref.slot
            await m.ack()

    run(main())


def test_concurrent_plain_publishes_go_to_the_store_together_and_each_is_its_own_message(backend,
                                                                                          monkeypatch) -> None:
    """The publishes a loop's tasks make at once are one `publish_plain` call (one hand-off, one round trip
    on Aerospike), and each stays its own message with its own reference; a store error reaches every
    publisher of its batch, and the next batch goes through."""
    from ignis.errors import StoreUnavailable
    from ignis.queue import Queue

    calls: list[int] = []
    real = Queue.publish_plain

    def counted(self: Queue, payloads: list[bytes]) -> Any:
        calls.append(len(payloads))
        return real(self, payloads)

    monkeypatch.setattr(Queue, "publish_plain", counted)

    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "gathered", shards=4)
            q = ig.queue("gathered")
            payloads = [b"m-%d" % i for i in range(200)]
            refs = await asyncio.gather(*(q.publish(p) for p in payloads))
            assert len({r.id for r in refs}) == 200 and sum(calls) == 200
            assert len(calls) < 200 and max(calls) > 1  # gathered, not one call each
            got = []
            while batch := await q.fire_many(100, timeout=0.5):
                got += batch
                await q.ack(batch)
            assert sorted(m.payload for m in got) == sorted(payloads)  # each once
            assert {m.id for m in got} == {r.id for r in refs}
            assert {(m.id, m.envelope.attempts) for m in got} == {(r.id, 1) for r in refs}

            def failing(self: Queue, payloads: list[bytes]) -> Any:
                raise StoreUnavailable("store down (test)")

            monkeypatch.setattr(Queue, "publish_plain", failing)
            outcomes = await asyncio.gather(*(q.publish(b"x") for _ in range(5)), return_exceptions=True)
            assert all(isinstance(o, StoreUnavailable) for o in outcomes)
            monkeypatch.setattr(Queue, "publish_plain", counted)
            again = await asyncio.gather(*(q.publish(b"y") for _ in range(5)))
            assert len({r.id for r in again}) == 5 and (await q.stats()).depth == 5

    run(main())


def test_publishes_queue_while_the_publish_threads_are_busy_and_go_out_together(backend, monkeypatch) -> None:
    """With every publish thread busy, the publishes of later turns wait, and the thread that comes free takes
    them all in one call; each publish still gets its own reference."""
    from ignis.queue import Queue

    calls: list[int] = []
    real = Queue.publish_plain

    def slow(self: Queue, payloads: list[bytes]) -> Any:
        calls.append(len(payloads))
        time.sleep(0.3)
        return real(self, payloads)

    monkeypatch.setattr(Queue, "publish_plain", slow)

    async def main() -> None:
        async with AsyncIgnis(backend.url, publish_threads=1) as ig:
            await declare(ig, "busy")
            q = ig.queue("busy")
            await q.sync()  # resolved: each publish hands over in the turn it is made
            first = [asyncio.create_task(q.publish(b"a%d" % i)) for i in range(3)]
            await asyncio.sleep(0.1)  # the first batch is being written
            later = [asyncio.create_task(q.publish(b"b%d" % i)) for i in range(10)]
            await asyncio.sleep(0)
            more = [asyncio.create_task(q.publish(b"c%d" % i)) for i in range(5)]  # another turn, still busy
            refs = await asyncio.gather(*first, *later, *more)
            assert calls == [3, 15]
            assert len({r.id for r in refs}) == 18 and (await q.stats()).depth == 18

    run(main())


def test_close_writes_what_was_published_before_it_and_refuses_publishes_after(backend, monkeypatch) -> None:
    from ignis.queue import Queue

    real = Queue.publish_plain

    def slow(self: Queue, payloads: list[bytes]) -> Any:
        time.sleep(0.3)  # still writing when close() is called
        return real(self, payloads)

    monkeypatch.setattr(Queue, "publish_plain", slow)

    async def main() -> None:
        ig = await opened(backend)
        await declare(ig, "closing")
        q = ig.queue("closing")
        await q.sync()  # resolved: the next publishes hand over in the turn they are made
        tasks = [asyncio.create_task(q.publish(b"m%d" % i)) for i in range(50)]
        await asyncio.sleep(0)  # every task has handed its publish over; none is written yet
        await ig.close()
        await ig.close()  # a second close is harmless
        refs = await asyncio.gather(*tasks)
        assert len({r.id for r in refs}) == 50
        with pytest.raises(RuntimeError, match="closed"):
            await q.publish(b"late")
        async with AsyncIgnis(backend.url) as again:
            assert (await again.stats("closing")).depth == 50

    run(main())


def test_a_cancelled_publish_leaves_its_batch_and_later_loops_unharmed(backend, monkeypatch) -> None:
    """Cancelling one publish of a batch in flight cancels only that await (its message may be stored all the
    same, as for any publish cancelled mid-call); the others get their references. A loop that ends with a
    publish in flight does not stop the next loop's publishes on the same handle."""
    from ignis.queue import Queue

    real = Queue.publish_plain
    delay = [0.3]

    def slow(self: Queue, payloads: list[bytes]) -> Any:
        time.sleep(delay[0])
        return real(self, payloads)

    monkeypatch.setattr(Queue, "publish_plain", slow)
    errors: list[dict[str, Any]] = []
    ig = AsyncIgnis(backend.url)

    async def first_loop() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: errors.append(context))
        await ig.open()
        await declare(ig, "cancelled")
        q = ig.queue("cancelled")
        tasks = [asyncio.create_task(q.publish(b"p%d" % i)) for i in range(5)]
        await asyncio.sleep(0.1)
        tasks[0].cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(outcomes[0], asyncio.CancelledError)
        assert len({r.id for r in outcomes[1:]}) == 4
        left = asyncio.create_task(q.publish(b"left in flight"))  # asyncio.run cancels it when this loop ends
        await asyncio.sleep(0.05)
        assert not left.done()

    async def second_loop() -> None:
        delay[0] = 0
        q = ig.queue("cancelled")
        refs = await asyncio.gather(*(q.publish(b"n%d" % i) for i in range(20)))
        assert len({r.id for r in refs}) == 20
        await ig.close()

    run(first_loop())
    time.sleep(0.4)  # the write left in flight ends after its loop closed
    run(second_loop())
    assert errors == []


def test_publishes_from_two_event_loops_share_one_handle(backend) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await declare(ig, "two-loops", shards=4)

            async def publish(prefix: bytes) -> list[Any]:
                q = ig.queue("two-loops")
                return await asyncio.gather(*(q.publish(prefix + b"%d" % i) for i in range(100)))

            other: list[Any] = []
            thread = threading.Thread(target=lambda: other.extend(asyncio.run(publish(b"b"))))
            thread.start()
            mine = await publish(b"a")
            await asyncio.to_thread(thread.join)
            assert len({r.id for r in mine + other}) == 200
            assert (await ig.stats("two-loops")).depth == 200

    run(main())
