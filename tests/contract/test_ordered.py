"""Contract: ordered queues (QueueSpec.ordered, issue 49 part 1) on every store — at most one message of a shard in
flight, per-key publish order with concurrent consumers (pull, push, async, batches), a failed message redelivered
before any later one of its shard (after its backoff), dead letters after maxDeliveries, a crashed holder's message
first again once its hold ends, delayed messages, the spec's immutability, and unordered queues unchanged.
(A SIGKILLed consumer process: tests/contract/test_ordered_processes.py.)"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from typing import Any

import pytest

from ignis import Consumer, Ignis, QueueSpec
from ignis.aio import AsyncConsumer, AsyncIgnis
from ignis.envelope import now_ms
from ignis.errors import InvalidSpecError
from ignis.magazine import Magazine
from ignis.magazine.ordered import OrderedMagazine
from ignis.storage.base import HeldClaim


def declare(ignis: Ignis, name: str = "seq", **fields: Any):
    fields.setdefault("handlerType", name)
    fields.setdefault("shards", 4)
    fields.setdefault("ordered", True)
    ignis.apply(QueueSpec.build(name=name, **fields))
    return ignis.queue(name)


def publish_keyed(q: Any, keys: int, per_key: int) -> None:
    """per_key messages for each of `keys` keys, interleaved, payload {"k": key, "n": sequence number}."""
    for n in range(per_key):
        for k in range(keys):
            q.publish({"k": f"key-{k}", "n": n}, key=f"key-{k}")


class OrderCheck:
    """What handlers saw: per key the sequence numbers in handling order, and the shards in flight at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.in_flight: set[int] = set()
        self.overlaps = 0  # a handler started on a shard another handler was still on

    def begin(self, message: Any) -> None:
        with self.lock:
            if message.ref.shard in self.in_flight:
                self.overlaps += 1
            self.in_flight.add(message.ref.shard)
            self.by_key[message.payload["k"]].append(message.payload["n"])

    def end(self, message: Any) -> None:
        with self.lock:
            self.in_flight.discard(message.ref.shard)

    def violations(self) -> int:
        """Per key, a handling of a sequence number lower than one handled before (a redelivery of the same
        number is allowed: a failed message comes again before later ones)."""
        return sum(1 for seen in self.by_key.values() for a, b in itertools.pairwise(seen) if b < a)

    def handled(self, key: str) -> list[int]:
        return sorted(set(self.by_key[key]))


def test_at_most_one_message_of_a_shard_in_flight(ignis: Ignis) -> None:
    q = declare(ignis, shards=4)
    publish_keyed(q, keys=8, per_key=5)
    held = []
    while (m := q.fire()) is not None:
        held.append(m)
        assert len(held) <= 4, "more messages in flight than shards"
    assert sorted(m.ref.shard for m in held) == sorted({m.ref.shard for m in held})  # one per shard
    assert len(held) == 4  # every shard has work: one each
    assert q.fire_many(10) == []  # nor in a batch
    done: dict[str, list[int]] = defaultdict(list)
    while held:  # settle one, and only its shard gives its next message
        m = held.pop(0)
        done[m.payload["k"]].append(m.payload["n"])
        m.ack()
        nxt = q.fire()
        if nxt is not None:
            assert nxt.ref.shard == m.ref.shard
            held.append(nxt)
    assert {k: v for k, v in done.items()} == {f"key-{k}": list(range(5)) for k in range(8)}


def test_fire_many_gives_at_most_one_message_per_shard(ignis: Ignis) -> None:
    q = declare(ignis, shards=4, batching={"maxBatchSize": 50, "maxWaitSeconds": 1})
    publish_keyed(q, keys=16, per_key=4)
    got = q.fire_many(50)
    assert 1 <= len(got) <= 4
    assert len({m.ref.shard for m in got}) == len(got)
    q.ack(got)
    again = q.fire_many(50)
    assert len({m.ref.shard for m in again}) == len(again) and again
    # each shard's next message comes after the one acked before it
    firsts = {m.ref.shard: (m.ref.slot, m.payload) for m in got}
    for m in again:
        if m.ref.shard in firsts:
            assert m.ref.slot > firsts[m.ref.shard][0]


def test_nack_redelivers_the_same_message_before_later_ones(ignis: Ignis) -> None:
    q = declare(ignis, shards=1)
    for n in range(3):
        q.publish({"k": "a", "n": n}, key="a")
    first = q.fire()
    assert first.payload["n"] == 0 and first.attempts == 1
    first.nack("rejected")
    again = q.fire()
    assert again is not None and again.id == first.id and again.payload["n"] == 0 and again.attempts == 2
    assert q.fire() is None  # still one in flight
    again.ack()
    assert q.fire().payload["n"] == 1
    assert q.stats().sidelined == 0  # kept at the head, never the sideline's tail


def test_retry_backoff_is_respected(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, retry={"minBackoffSeconds": 0.5, "maxBackoffSeconds": 5})
    q.publish({"k": "a", "n": 0}, key="a")
    q.publish({"k": "a", "n": 1}, key="a")
    m = q.fire()
    failed_at = time.monotonic()
    m.nack("rejected")
    assert q.fire() is None  # neither the failed one (backing off) nor the later one
    again = q.fire(timeout=10)
    waited = time.monotonic() - failed_at
    assert again is not None and again.payload["n"] == 0 and again.attempts == 2
    assert waited >= 0.45, f"redelivered after {waited:.3f}s, before its 0.5 s backoff"
    again.nack("rejected")  # the second failure backs off min x multiplier = 1 s
    failed_at = time.monotonic()
    third = q.fire(timeout=10)
    assert third is not None and third.payload["n"] == 0 and third.attempts == 3
    assert time.monotonic() - failed_at >= 0.95
    third.ack()
    assert q.fire(timeout=5).payload["n"] == 1


def test_nack_with_a_delay_holds_the_head(ignis: Ignis) -> None:
    q = declare(ignis, shards=1)
    q.publish({"k": "a", "n": 0}, key="a")
    q.publish({"k": "a", "n": 1}, key="a")
    m = q.fire()
    m.nack("later", delay=0.4)
    assert q.fire() is None
    again = q.fire(timeout=10)
    assert again.payload["n"] == 0 and again.attempts == 2


def test_max_deliveries_dead_letters_then_the_shard_moves_on(ignis: Ignis) -> None:
    q = declare(ignis, shards=1, maxDeliveries=3)
    q.publish({"k": "a", "n": 0}, key="a")
    q.publish({"k": "a", "n": 1}, key="a")
    for attempt in (1, 2, 3):
        m = q.fire()
        assert m.payload["n"] == 0 and m.attempts == attempt
        outcome = q.nack([m], "rejected")
    assert outcome.dead_lettered == 1
    [(_, dead)] = q.dead.browse()
    assert dead.msg_id == m.id and dead.reason == "rejected"
    nxt = q.fire()
    assert nxt is not None and nxt.payload["n"] == 1 and nxt.attempts == 1


def test_a_crashed_holder_blocks_its_shard_until_the_hold_ends_then_the_same_message_comes_first(
        ignis: Ignis) -> None:
    q = declare(ignis, shards=1, handlerTimeoutSeconds=1)
    for n in range(3):
        q.publish({"k": "a", "n": n}, key="a")
    lost = q.fire()  # claimed by a consumer that "crashes": never settled
    claimed_at = time.monotonic()
    assert lost.payload["n"] == 0
    assert q.fire() is None  # the shard is held: the next message does not pass it
    again = q.fire(timeout=10)
    assert again is not None and again.id == lost.id and again.attempts == 2
    assert time.monotonic() - claimed_at >= 0.95  # not before the hold (handlerTimeoutSeconds) ended
    again.ack()
    assert q.fire().payload["n"] == 1


def test_an_ack_whose_release_was_lost_does_not_stall_the_shard_past_the_hold(ignis: Ignis) -> None:
    """A crash between the settle and the hold's release: the claim that finds the held message settled takes the
    next one (once the hold ends); nothing is delivered twice or skipped."""
    q = declare(ignis, shards=1, handlerTimeoutSeconds=1)
    for n in range(2):
        q.publish({"k": "a", "n": n}, key="a")
    m = q.fire()
    q.store.delete([m.ref], ids=[m.id])  # the ack's settle, and no release (the process died)
    assert q.fire() is None
    nxt = q.fire(timeout=10)
    assert nxt is not None and nxt.payload["n"] == 1 and nxt.attempts == 1
    nxt.ack()
    assert q.fire() is None


def test_push_consumers_keep_per_key_order_with_failures(ignis: Ignis) -> None:
    q = declare(ignis, shards=8, concurrency=6, maxDeliveries=10)
    publish_keyed(q, keys=24, per_key=6)
    check = OrderCheck()
    failed: set[str] = set()
    consumer = Consumer(ignis, poll_interval=0.05)

    @consumer.handler("seq")
    def handle(message: Any) -> bool:
        check.begin(message)
        try:
            time.sleep(0.001)
            if message.payload["n"] % 3 == 1 and message.id not in failed:  # every third fails once
                failed.add(message.id)
                return False
            return True
        finally:
            check.end(message)

    assert consumer.drain(timeout=60)
    consumer.stop(5)
    assert check.overlaps == 0
    assert check.violations() == 0, dict(check.by_key)
    assert all(check.handled(f"key-{k}") == list(range(6)) for k in range(24))
    assert q.stats().depth == 0 and q.stats().sidelined == 0


def test_batching_consumer_keeps_per_key_order(ignis: Ignis) -> None:
    q = declare(ignis, shards=4, concurrency=2, batching={"maxBatchSize": 10, "maxWaitSeconds": 1})
    publish_keyed(q, keys=8, per_key=5)
    check = OrderCheck()
    consumer = Consumer(ignis, poll_interval=0.05)
    sizes: list[int] = []

    @consumer.batch_handler("seq")
    def handle(messages: Any) -> bool:
        sizes.append(len(messages))
        assert len({m.ref.shard for m in messages}) == len(messages)  # at most one per shard per batch
        for m in messages:
            check.begin(m)
        for m in messages:
            check.end(m)
        return True

    assert consumer.drain(timeout=60)
    consumer.stop(5)
    assert check.overlaps == 0 and check.violations() == 0
    assert all(check.handled(f"key-{k}") == list(range(5)) for k in range(8))
    assert max(sizes) <= 4


def test_async_consumers_keep_per_key_order(backend: Any) -> None:
    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await ig.apply(QueueSpec.build(name="aseq", handlerType="aseq", shards=4, ordered=True,
                                           concurrency=4))
            q = ig.queue("aseq")
            for n in range(5):
                for k in range(8):
                    await q.publish({"k": f"key-{k}", "n": n}, key=f"key-{k}")
            check = OrderCheck()
            consumer = AsyncConsumer(ig, queues=["aseq"], grace=5)
            done = asyncio.Event()
            retried: set[str] = set()

            @consumer.handler("aseq")
            async def handle(message: Any) -> bool:
                check.begin(message)
                try:
                    await asyncio.sleep(0.001)
                    if message.payload["n"] == 2 and message.id not in retried:
                        retried.add(message.id)
                        return False
                    return True
                finally:
                    check.end(message)
                    if sum(len(set(v)) for v in check.by_key.values()) >= 40:
                        done.set()

            task = asyncio.create_task(consumer.run())
            await asyncio.wait_for(done.wait(), 60)
            consumer.stop()
            await asyncio.wait_for(task, 10)
            assert check.overlaps == 0 and check.violations() == 0
            assert all(check.handled(f"key-{k}") == list(range(5)) for k in range(8))

            # the pull side of the async API: one in flight per shard
            await q.publish({"k": "x", "n": 0}, key="x")
            await q.publish({"k": "x", "n": 1}, key="x")
            m = await q.fire()
            assert m.message.payload["n"] == 0 and await q.fire() is None
            await m.ack()
            assert (await q.fire()).message.payload["n"] == 1

    asyncio.run(main())


def test_a_delayed_message_takes_its_place_when_due(ignis: Ignis) -> None:
    q = declare(ignis, shards=1)
    q.publish({"k": "a", "n": 1}, key="a", delay=0.5)  # published first, due later
    q.publish({"k": "a", "n": 0}, key="a")
    first = q.fire()
    assert first.payload["n"] == 0
    first.ack()
    later = q.fire(timeout=10)
    assert later is not None and later.payload["n"] == 1
    # once due it is the shard's message in flight like any other: the next one waits for it
    q.publish({"k": "a", "n": 2}, key="a")
    assert q.fire() is None
    later.ack()
    assert q.fire().payload["n"] == 2


def test_ordered_is_immutable_and_its_rules_are_checked(ignis: Ignis) -> None:
    declare(ignis, "fixed", ordered=True)
    with pytest.raises(InvalidSpecError, match="ordered=false: ordered is immutable"):
        ignis.apply(QueueSpec.build(name="fixed", handlerType="fixed", shards=4))
    declare(ignis, "plain", ordered=False)
    with pytest.raises(InvalidSpecError, match="ordered=true: ordered is immutable"):
        declare(ignis, "plain", ordered=True)
    record = ignis.store.get_queue("fixed")
    assert record.bins["ordered"] == 1
    assert QueueSpec.from_bins("fixed", record.bins).ordered is True
    with pytest.raises(InvalidSpecError, match="ordered: a bounded queue"):
        QueueSpec.build(name="b", handlerType="b", ordered=True, maxLength=100)
    with pytest.raises(InvalidSpecError, match="ordered: a subscription"):
        QueueSpec.build(name="s", handlerType="s", ordered=True, subscribe={"topic": "t"})


def test_unordered_queues_are_unchanged(ignis: Ignis) -> None:
    q = declare(ignis, "free", ordered=False, shards=2)
    assert "ordered" not in ignis.store.get_queue("free").bins  # the record keeps its layout
    assert type(q.main) is Magazine and not isinstance(q.main, OrderedMagazine)
    q.publish_many([{"n": n} for n in range(10)])
    got = q.fire_many(10)
    assert len(got) == 10  # several per shard in flight at once
    q.ack(got)


def test_the_store_holds_a_shard_in_the_claims_own_write(ignis: Ignis) -> None:
    """Storage.claim_held / release_hold themselves (no handle's bookkeeping in between): a second claim of a held
    shard gets nothing and is told until when; a hold that ended gives the same slot again; a release lets the
    next slot go; a release of a slot that is not the held head changes nothing."""
    q = declare(ignis, shards=1)
    store = q.store
    for n in range(3):
        q.publish({"k": "a", "n": n}, key="a")
    t0 = now_ms()  # (then made-up times after it: the store compares the times it is given)
    first = store.claim_held("seq", 0, t0, 1000)
    [claimed] = first.claimed
    assert first.held_until == 0 and claimed.envelope is not None and claimed.ref.slot == 1
    blocked = store.claim_held("seq", 0, t0 + 10, 1000)
    assert blocked.claimed == [] and blocked.held_until == t0 + 1000
    again = store.claim_held("seq", 0, t0 + 1000, 1000)  # the hold ended: the same head, one more attempt
    assert [c.ref.slot for c in again.claimed] == [1] and again.claimed[0].envelope.attempts == 2
    assert store.release_hold("seq", 0, 2) is False  # not the held head
    assert store.claim_held("seq", 0, t0 + 1500, 1000).held_until == t0 + 2000
    store.delete([claimed.ref], ids=[claimed.envelope.msg_id])
    assert store.release_hold("seq", 0, 1) is True
    nxt = store.claim_held("seq", 0, t0 + 1600, 1000)
    assert [c.ref.slot for c in nxt.claimed] == [2]
    assert store.release_hold("seq", 0, 2, until_ms=t0 + 5000) is True  # a backoff: held until then
    assert store.claim_held("seq", 0, t0 + 4999, 1000).held_until == t0 + 5000
    assert [c.ref.slot for c in store.claim_held("seq", 0, t0 + 5000, 1000).claimed] == [2]
    # the settle of a held head: its record deleted and its hold released (lmdb: one transaction)
    head = nxt.claimed[0]
    assert store.settle_held([head.ref], [head.envelope.msg_id]) == 1
    assert store.read([head.ref]) == [None]
    last = store.claim_held("seq", 0, t0 + 5001, 1000)
    assert [c.ref.slot for c in last.claimed] == [3] and last.claimed[0].envelope.attempts == 1
    assert store.settle_held([last.claimed[0].ref], [last.claimed[0].envelope.msg_id]) == 1
    assert store.claim_held("seq", 0, t0 + 5002, 1000) == HeldClaim([])  # drained: nothing held, nothing left
    assert store.pointers("seq", 1)[0].fire == 3


@pytest.mark.parametrize("how", ["crash", "backoff"])
def test_a_shards_last_message_held_or_failed_still_counts_as_work(ignis: Ignis, how: str) -> None:
    """The held message stays after its shard's fire pointer until settled, so a consumer that reads the pointers
    afresh (another process's watcher; here the handle's own active shards, re-read) still sees the shard's work
    and takes the message once its hold or backoff ends. Fails if a held last message looked drained."""
    q = declare(ignis, shards=1, handlerTimeoutSeconds=1, retry={"minBackoffSeconds": 0.5, "maxBackoffSeconds": 1})
    q.publish({"k": "a", "n": 0}, key="a")
    m = q.fire()
    if how == "backoff":
        m.nack("rejected")
    assert q.stats().depth == 1  # (an ordered queue's held head counts as waiting until it is settled)
    q.main.invalidate()  # the next fire re-reads the pointers
    again = q.fire(timeout=10)
    assert again is not None and again.id == m.id and again.attempts == 2
    again.ack()
    assert q.stats().depth == 0 and q.fire() is None
