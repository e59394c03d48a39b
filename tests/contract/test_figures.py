"""Queue figures count messages, not slots (issue: Aerospike faults, part 1; pipeline issue, part 4).

A slot can be a hole: reserved by a publish and sealed unused, awaited and sealed after its writer's
deadline, emptied before any claim (a move out of an unclaimed slot: a redrive), or a message that expired
unclaimed. `published`, `consumed`, `depth`, `sidelined` and `dead` leave them out, on every backend."""

from __future__ import annotations

import time
from typing import Any

from ignis.envelope import now_ms


def _drain(q: Any) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = q.fire_many(50)
        got += batch
        q.ack(batch)
        if not batch and q.main.awaiting() == 0 and q.main.pending() == 0:
            break
        if not batch:
            time.sleep(q.main.next_check_in() or 0.005)
    return got


def test_a_publish_loop_then_stats_counts_the_messages_published(ignis: Any, make_queue: Any) -> None:
    q = make_queue("loop", shards=1)
    for i in range(6):  # one by one, fast: a two-step store reserves slots ahead for the next publishes
        q.publish(b"m%d" % i)
    stats = q.stats()
    assert (stats.published, stats.depth, stats.consumed) == (6, 6, 0)
    q.main.release_reserved()  # what close() does: the slots reserved ahead become holes
    stats = q.stats()
    assert (stats.published, stats.depth, stats.consumed) == (6, 6, 0)
    assert len(_drain(q)) == 6
    stats = q.stats()
    assert (stats.published, stats.depth, stats.consumed) == (6, 0, 6)
    more = [q.publish(b"n%d" % i) for i in range(40)]
    q.main.release_reserved()
    assert len(_drain(q)) == 40 and q.stats().published == 46
    assert (q.stats().consumed, q.stats().depth, len(more)) == (46, 0, 40)


def test_moving_unclaimed_messages_out_keeps_the_figures_right(ignis: Any, make_queue: Any) -> None:
    """A redrive of chosen dead letters or sidelined messages moves them out of slots no claim reached
    (the pipeline's redrive does exactly that): both magazines' figures follow."""
    q = make_queue("redrive", shards=2, maxDeliveries=1)
    q.publish_many([b"m%d" % i for i in range(20)])
    q.nack(q.fire_many(12), "rejected")  # attempts 1 = maxDeliveries: 12 dead letters
    q.main.fire(3)  # claimed...
    sidelined = make_queue("sidelined", shards=2, maxDeliveries=5)
    sidelined.publish_many([b"s%d" % i for i in range(10)])
    sidelined.nack(sidelined.fire_many(10), "rejected")  # 10 in the sideline
    assert (q.stats().dead, sidelined.stats().sidelined) == (12, 10)
    epoch = ignis.store.next_epoch()
    for magazine, handle, count in ((q.dead, q, 5), (sidelined.sideline, sidelined, 4)):
        chosen = magazine.browse(100)[:count]  # unclaimed, picked by content (a --where), not claimed
        moves = [(ref, env.fire_ts, env.for_transfer(None, now_ms())) for ref, env in chosen]
        assert sum(handle.main.move_in(epoch, moves)) == count
    assert q.stats().dead == 7 and sidelined.stats().sidelined == 6
    # Claiming what is left passes the emptied slots: the figures stay right after that too.
    assert len(q.dead.fire(100)) == 7 and q.stats().dead == 0
    assert len(sidelined.sideline.fire(100)) == 6 and sidelined.stats().sidelined == 0
    assert q.stats().depth == 20 - 12 - 3 + 5 and sidelined.stats().depth == 4


def test_messages_that_expire_unclaimed_leave_the_figures(ignis: Any, make_queue: Any) -> None:
    q = make_queue("short", shards=1, messageExpirySeconds=1, queueExpirySeconds=60)
    q.publish_many([b"a", b"b", b"c"])
    time.sleep(2.2)  # void times have a resolution of a second
    q.publish(b"fresh")
    got = _drain(q)
    assert [m.data for m in got] == [b"fresh"]
    stats = q.stats()
    assert (stats.published, stats.consumed, stats.depth) == (1, 1, 0)
