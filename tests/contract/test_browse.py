"""Browsing without claiming (Queue.read, Queue.browse), on every store (lmdb, the Aerospike emulator, a real server
with IGNIS_TEST_AEROSPIKE): what a browse shows is what a consumer then gets, exactly as before (nothing claimed, no
attempt counted); a message is found by its reference in any state; a reference to nothing is MessageNotFound."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ignis import Ignis, InvalidInputError, MessageNotFound, QueueSpec, SlotRef, TopicSpec


def queue(ignis: Ignis, name: str = "orders", shards: int = 3, **fields: Any):
    ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=shards, **fields))
    return ignis.queue(name)


def test_browse_shows_the_waiting_messages_oldest_first_and_claims_nothing(ignis: Ignis) -> None:
    q = queue(ignis)
    published = []
    for i in range(7):
        published.append(q.publish({"n": i}, key=f"k{i}"))
        time.sleep(0.002)  # distinct publish times: "oldest first" is by publish time across shards
    before = q.stats()
    shown = q.browse(10)
    assert [m.payload for m in shown] == [{"n": i} for i in range(7)]
    assert [m.id for m in shown] == [r.id for r in published]
    assert all(m.state == "waiting" and m.attempts == 0 for m in shown)
    assert [m.key for m in shown] == [f"k{i}" for i in range(7)]
    assert [m.published_at for m in shown] == sorted(m.published_at for m in shown)
    assert q.browse(3) == shown[:3]  # the limit keeps the oldest
    after = q.stats()
    assert (after.depth, after.consumed) == (before.depth, before.consumed) == (7, 0)

    # A consumer gets each one exactly as before: all of them, first attempt.
    got = []
    while (m := q.fire()) is not None:
        got.append(m)
    assert sorted(m.id for m in got) == sorted(r.id for r in published)
    assert all(m.attempts == 1 for m in got)
    assert q.browse(10) == []  # claimed: none waits any more

    # Read by reference: in flight while held, "not found" once acked.
    first = got[0]
    seen = q.read(str(first.ref))
    assert (seen.state, seen.id, seen.payload, seen.attempts) == ("in flight", first.id, first.payload, 1)
    assert q.read(first.ref).envelope.fire_ts
    first.ack()
    with pytest.raises(MessageNotFound, match=str(first.ref)):
        q.read(first.ref)


def test_browse_one_shard_and_bad_arguments(ignis: Ignis) -> None:
    q = queue(ignis, shards=4)
    q.publish_many([f"m{i}" for i in range(40)])
    for shard in range(4):
        shown = q.browse(100, shard=shard)
        assert shown and {m.ref.shard for m in shown} == {shard}
    assert sum(len(q.browse(100, shard=s)) for s in range(4)) == 40
    assert len(q.browse(5)) == 5
    for bad, words in (({"limit": 0}, "limit=0"), ({"limit": 1001}, "limit=1001"), ({"limit": 10, "shard": 4},
                       "shard=4"), ({"limit": 10, "shard": -1}, "shard=-1")):
        with pytest.raises(InvalidInputError, match=words):
            q.browse(**bad)
    assert q.stats().depth == 40  # nothing claimed by any of it


def test_read_finds_a_message_in_the_sideline_and_the_dead_letters(ignis: Ignis) -> None:
    for name, max_deliveries, state in (("retried", 5, "sidelined"), ("given-up", 1, "dead")):
        q = queue(ignis, name, shards=1, maxDeliveries=max_deliveries)
        q.publish(f"to {state}")
        m = q.fire()
        assert m is not None
        m.nack("broken")
        [(ref, _)] = (q.sideline if state == "sidelined" else q.dead).browse(10)
        seen = q.read(str(ref))
        assert (seen.state, seen.payload, seen.id) == (state, f"to {state}", m.id)
        assert q.browse(10) == []  # it left main


def test_read_refuses_a_reference_of_another_queue_or_malformed_and_misses_are_not_found(ignis: Ignis) -> None:
    q, other = queue(ignis), queue(ignis, "other")
    ref = other.publish("elsewhere")
    with pytest.raises(InvalidInputError, match="not one of queue 'orders'"):
        q.read(ref)
    assert other.read(ref).payload == other.read(str(ref)).payload == other.read(ref.ref).payload == "elsewhere"
    with pytest.raises(MessageNotFound, match="holds message"):
        other.read(f"{ref.ref}#not-{ref.id}")
    for text in ("orders", "orders/x/1", "orders/0/0", "orders/-1/3"):
        with pytest.raises(InvalidInputError, match="message reference"):
            q.read(text)
    with pytest.raises(MessageNotFound, match=r"orders/0/999. not found \(no message there\)"):
        q.read(SlotRef("orders", 0, 999))
    with pytest.raises(MessageNotFound, match="3 shard"):
        q.read("orders/7/1")


def test_a_subscription_browses_its_topics_messages_past_its_position_that_its_filter_selects(ignis: Ignis) -> None:
    ignis.apply(TopicSpec.build(name="sensors", shards=2))
    t = ignis.topic("sensors")
    ignis.apply(QueueSpec.build(name="temps", handlerType="temps", shards=2,
                                subscribe={"topic": "sensors", "filter": "sensors/+/temp"}))
    sub = ignis.queue("temps")
    subjects = ["sensors/kitchen/temp", "sensors/kitchen/humidity", "sensors/hall/temp", "alerts"]
    for s in subjects:
        t.publish(s, subject=s)
        time.sleep(0.002)
    before = sub.stats()
    shown = sub.browse(10)
    assert [(m.subject, m.payload) for m in shown] == [("sensors/kitchen/temp", "sensors/kitchen/temp"),
                                                       ("sensors/hall/temp", "sensors/hall/temp")]
    assert all(m.state == "waiting" for m in shown)
    assert sub.read(shown[1].ref).payload == "sensors/hall/temp"  # an unreached slot, by its cursor reference
    after = sub.stats()  # positions in the topic: nothing moved (the depth may count a publisher's reserved slots)
    assert (after.consumed, after.depth) == (before.consumed, before.depth) and after.consumed == 0

    got = sub.fire()
    assert got is not None and got.attempts == 1
    [same] = [m for m in shown if m.ref == got.ref]  # the reference the browse gave is the delivered message's
    assert (same.id, same.subject) == (got.id, got.subject)
    assert sub.read(got.ref).state == "in flight"
    got.ack()
    with pytest.raises(MessageNotFound):
        sub.read(got.ref)
    assert [m.ref for m in sub.browse(10)] == [m.ref for m in shown if m.ref != got.ref]


def test_the_async_api_browses_and_reads_without_claiming(backend: Any) -> None:
    from ignis.aio import AsyncIgnis

    async def main() -> None:
        async with AsyncIgnis(backend.url) as ig:
            await ig.apply(QueueSpec.build(name="aq", handlerType="aq", shards=1))
            q = ig.queue("aq")
            ref = await q.publish("hello", key="k")
            [shown] = await q.browse(5)
            assert (shown.payload, shown.key, shown.state, shown.ref) == ("hello", "k", "waiting", ref.ref)
            assert (await q.read(ref)).id == ref.id
            m = await q.fire()
            assert m is not None and m.attempts == 1 and m.id == ref.id
            assert (await q.read(str(ref))).state == "in flight"
            await m.ack()
            with pytest.raises(MessageNotFound):
                await q.read(ref)

    asyncio.run(main())
