"""QueueStats.oldest_age_seconds on every backend (issue 28, part 3): the age of the oldest unclaimed
message of main, None when none waits; claims, acks, holes at the head and the sideline do not count."""

from __future__ import annotations

import time
from typing import Any

GAP = 1.0  # seconds between the publishes compared (margins of GAP / 2 absorb a slow machine)


def test_oldest_age_follows_the_oldest_unclaimed_message(make_queue: Any) -> None:
    q = make_queue("aged", shards=1)
    assert q.stats().oldest_age_seconds is None  # nothing published: nothing waits
    first = q.publish(b"first")
    time.sleep(GAP)
    q.publish_many([b"second", b"third"])
    age = q.stats().oldest_age_seconds
    assert age is not None and GAP <= age < GAP + 5
    # Claimed (in flight) is not waiting any more: the next message is the oldest now.
    message = q.fire()
    assert message is not None and message.ref == first.ref
    younger = q.stats(in_flight=True).oldest_age_seconds
    assert younger is not None and younger <= age - GAP / 2
    message.nack("rejected")  # in the sideline now: not main's backlog
    after_nack = q.stats().oldest_age_seconds
    assert after_nack is not None and after_nack < age - GAP / 2
    q.ack(q.fire_many(10))
    stats = q.stats()
    assert (stats.depth, stats.sidelined, stats.oldest_age_seconds) == (0, 1, None)


def test_the_oldest_shard_head_decides_and_a_hole_at_the_head_is_stepped_over(make_queue: Any) -> None:
    q = make_queue("heads", shards=4)
    oldest = q.publish(b"oldest", key="a")  # a key keeps its shard
    second = q.publish(b"second", key="a")  # right behind it, in the same shard
    assert (second.shard, second.slot) == (oldest.shard, oldest.slot + 1)
    time.sleep(GAP)
    q.publish_many([b"m%d" % i for i in range(20)])  # every shard's head, but GAP younger
    age = q.stats().oldest_age_seconds
    assert age is not None and age >= GAP
    # The oldest message's slot emptied before any claim reached it (a redrive takes messages out so): its
    # shard's head is a hole now, and the message right behind it, as old, is the oldest waiting.
    assert q.store.delete([oldest.ref]) == 1
    behind = q.stats().oldest_age_seconds
    assert behind is not None and behind >= GAP
