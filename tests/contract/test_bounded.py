"""Contract: bounded queues (QueueSpec.maxLength / maxBytes, overflow rejectPublish | dropHead; ignis.bounds), on
every store: a full queue refuses a publish and writes nothing (QueueFull, counted), publish_many says which it
refused, dropHead dead-letters the oldest waiting messages with reason overflow (counted), and the bound holds
under concurrent publishers, threads and processes."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ignis import Ignis, QueueSpec
from ignis.bounds import OVERFLOW, ShardLimit, room, shard_limits
from ignis.delay import move_due
from ignis.errors import QueueFull


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def bounded(ignis: Ignis, **fields: Any) -> Any:
    name = f"b-{uuid.uuid4().hex[:8]}"
    fields.setdefault("shards", 4)
    ignis.apply(QueueSpec.build(name=name, handlerType="h", **fields))
    return ignis.queue(name)


def waiting_ids(q: Any) -> set[str]:
    ids = set()
    for shard, p in q.store.pointers(q.name, q.spec.shards).items():
        ids.update(e.msg_id for _, e in q.store.peek(q.name, shard, p.fire + 1, p.load))
    return ids


def test_the_shares_add_up_to_the_bound() -> None:
    spec = QueueSpec.build(name="q", handlerType="h", shards=8, maxLength=101, maxBytes=1003)
    limits = shard_limits(spec)
    assert sum(limit.length for limit in limits) == 101 and sum(limit.bytes for limit in limits) == 1003
    assert {limit.length for limit in limits} == {12, 13}
    assert shard_limits(QueueSpec.build(name="q", handlerType="h")) is None


def test_room_is_the_longest_prefix_within_both_shares() -> None:
    assert room(ShardLimit(None, 250), 0, 0, 0, [100, 100, 100]) == 2
    assert room(ShardLimit(None, 250), 0, 0, 0, [100, 150, 1]) == 2  # exactly the share fits
    assert room(ShardLimit(None, 250), 0, 0, 0, [300, 1]) == 0  # a prefix: the small one behind waits too
    assert room(ShardLimit(1, 250), 0, 0, 0, [100, 100]) == 1
    assert room(ShardLimit(5, None), 10, 7, 0, [1] * 9) == 2  # 3 waiting of 5
    assert room(ShardLimit(None, 1000), 10, 5, 1000, [100] * 9) == 5  # 5 waiting of 100 bytes each: 500 free


def test_a_full_queue_refuses_a_publish_and_writes_nothing(ignis: Ignis) -> None:
    q = bounded(ignis, maxLength=12)
    refs = [q.publish(f"m{i}") for i in range(12)]  # unkeyed: a full shard sends it to one with room
    assert q.stats().depth == 12
    before = q.main.pointers()
    rejected = counted("ignis_publish_rejected_total", queue=q.name)
    with pytest.raises(QueueFull) as raised:
        q.publish("one too many")
    assert raised.value.refused == [0] and raised.value.published == []
    assert "maxLength 12" in str(raised.value)
    assert q.main.pointers() == before  # no slot allocated: nothing written
    assert waiting_ids(q) == {r.id for r in refs}
    assert counted("ignis_publish_rejected_total", queue=q.name) == rejected + 1
    with pytest.raises(QueueFull):  # the lean path and the keyed one refuse alike
        q.publish(b"bytes")
    with pytest.raises(QueueFull):
        q.publish("keyed", key="k")
    assert counted("ignis_publish_rejected_total", queue=q.name) == rejected + 3
    # room made by a consumer is room again
    q.fire().ack()
    assert q.publish("fits again").id
    with pytest.raises(QueueFull):
        q.publish("full again")


def test_claimed_messages_do_not_count(ignis: Ignis) -> None:
    """As RabbitMQ counts ready messages: a delivered, unsettled message leaves room."""
    q = bounded(ignis, shards=1, maxLength=3)
    q.publish_many(["a", "b", "c"])
    held = q.fire()
    assert held is not None
    q.publish("d")
    with pytest.raises(QueueFull):
        q.publish("e")
    held.ack()


def test_publish_many_says_which_it_refused(ignis: Ignis) -> None:
    q = bounded(ignis, shards=2, maxLength=6)
    q.publish_many(["x", "y"])
    with pytest.raises(QueueFull) as raised:
        q.publish_many([f"p{i}" for i in range(7)])
    exc = raised.value
    assert len(exc.results) == 7 and len(exc.refused) == 3 and len(exc.published) == 4
    assert sorted(exc.refused) == exc.refused
    assert all((ref is None) == (i in exc.refused) for i, ref in enumerate(exc.results))
    stored = {m.id: m.payload for m in q.fire_many(10)}
    assert stored.keys() == {r.id for r in exc.published} | set(stored) and len(stored) == 6
    assert {f"p{i}" for i in range(7) if i not in exc.refused} <= set(stored.values())
    assert not {f"p{i}" for i in exc.refused} & set(stored.values())


def test_a_keyed_publish_is_refused_when_its_shard_is_full(ignis: Ignis) -> None:
    q = bounded(ignis, shards=4, maxLength=8)  # 2 per shard
    q.publish_many(["a", "b"], key="k")
    with pytest.raises(QueueFull) as raised:
        q.publish("c", key="k")
    assert "key 'k'" in str(raised.value)
    assert q.stats().depth == 2
    q.publish("d")  # an unkeyed one finds room elsewhere


def test_publish_each_is_bounded_too(ignis: Ignis) -> None:
    q = bounded(ignis, shards=1, maxLength=2)
    with pytest.raises(QueueFull) as raised:
        q.publish_each([b"1", b"2", b"3"], keys=["a", "a", None])
    assert len(raised.value.published) == 2 and len(raised.value.refused) == 1
    assert q.stats().depth == 2


def test_max_bytes_bounds_the_payload_bytes(ignis: Ignis) -> None:
    q = bounded(ignis, shards=2, maxBytes=2000)  # 1000 bytes a shard
    stored = 0
    with pytest.raises(QueueFull):
        for _ in range(100):
            q.publish(b"x" * 100)
            stored += 1
    assert stored == 20
    with pytest.raises(QueueFull):  # bigger than a shard's share: never fits
        bounded(ignis, shards=2, maxBytes=2000).publish(b"y" * 1001)


def test_publish_many_is_bounded_by_bytes_and_counts_them(ignis: Ignis) -> None:
    q = bounded(ignis, shards=2, maxBytes=2000)  # 1000 bytes a shard: ten of 100
    with pytest.raises(QueueFull) as raised:
        q.publish_many([b"x" * 100] * 30)
    assert (len(raised.value.published), len(raised.value.refused)) == (20, 10)
    with pytest.raises(QueueFull):  # the batch's bytes were counted with its slots
        q.publish(b"z" * 100)
    assert len(q.fire_many(50)) == 20


def test_the_byte_count_survives_claims_and_moves(ignis: Ignis) -> None:
    """A claim, a nack's move back into main and a sweep each rewrite the shard's pointers; the bytes counted so far
    must stay with them (lmdb keeps LOAD_BYTES in the same record), or the estimate of the waiting bytes drops and the
    bound lets more in."""
    q = bounded(ignis, shards=1, maxBytes=1000)  # ten of 100
    q.publish_many([b"x" * 100] * 5)
    held = q.fire_many(2)
    assert len(held) == 2
    held[0].nack(delay=0)  # due at once: into main again by move_due, a load that is not a publish
    held[1].ack()
    moved, deadline = 0, time.monotonic() + 10
    while not moved and time.monotonic() < deadline:  # (as test_delayed: a due time is a millisecond's)
        moved = move_due(q.main) or 0
    assert moved == 1
    # One publish_many: a run of single publishes on Aerospike takes reservations, which a stall past their
    # freshness (under load) seals, and a sealed slot counts until a claim passes it: an early refusal, by design.
    with pytest.raises(QueueFull) as raised:
        q.publish_many([b"y" * 100] * 20)
    assert len(raised.value.published) == 6  # 4 waiting (3 + the nacked one) + 6 = ten of 100 bytes
    assert q.stats().depth == 10


def test_drop_head_moves_the_oldest_to_the_dead_letters(ignis: Ignis) -> None:
    q = bounded(ignis, shards=1, maxLength=3, overflow="dropHead")
    dropped = counted("ignis_overflow_dropped_total", queue=q.name)
    dead_lettered = counted("ignis_dead_lettered_total", queue=q.name, reason=OVERFLOW)
    for i in range(5):
        q.publish(f"m{i}")
    stats = q.stats()
    assert stats.depth == 3 and stats.dead == 2
    assert [m.payload for m in q.fire_many(10)] == ["m2", "m3", "m4"]
    dead = [e for _, e in q.store.peek(q.dead.name, 0, 1, 10)]
    assert [e.decoded() for e in dead] == ["m0", "m1"] and {e.reason for e in dead} == {OVERFLOW}
    assert counted("ignis_overflow_dropped_total", queue=q.name) == dropped + 2
    assert counted("ignis_dead_lettered_total", queue=q.name, reason=OVERFLOW) == dead_lettered + 2


def test_drop_head_makes_room_for_a_keyed_batch_bigger_than_the_room(ignis: Ignis) -> None:
    """As RabbitMQ's drop-head: the newest messages are kept, the oldest dead-lettered, even some of the batch."""
    q = bounded(ignis, shards=2, maxLength=4, overflow="dropHead")  # 2 a shard
    q.publish_many(["k0", "k1"], key="same")
    refs = q.publish_many(["late0", "late1", "late2"], key="same")
    assert len(refs) == 3
    stats = q.stats()
    assert stats.depth == 2 and stats.dead == 3
    assert [m.payload for m in q.fire_many(10)] == ["late1", "late2"]
    shard = refs[0].shard
    assert [e.decoded() for _, e in q.store.peek(q.dead.name, 0, 1, 10) + q.store.peek(q.dead.name, 1, 1, 10)
            ] != [] and sorted(e.decoded() for s in range(2) for _, e in q.store.peek(q.dead.name, s, 1, 10)) == [
        "k0", "k1", "late0"]
    assert all(r.shard == shard for r in refs)


def test_the_bound_holds_under_concurrent_publishing_threads(ignis: Ignis) -> None:
    q = bounded(ignis, shards=4, maxLength=40)
    stored: list[str] = []
    refused = [0]
    lock = threading.Lock()

    def publisher(n: int) -> None:
        for i in range(30):
            try:
                ref = q.publish(f"{n}-{i}")
            except QueueFull:
                with lock:
                    refused[0] += 1
            else:
                with lock:
                    stored.append(ref.id)

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.main.release_reserved()
    assert len(stored) == 40 and refused[0] == 8 * 30 - 40
    assert waiting_ids(q) == set(stored)


PUBLISHER = """
import sys
from ignis import Ignis
from ignis.errors import QueueFull
stored = refused = 0
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue(sys.argv[2])
    for i in range(int(sys.argv[3])):
        try:
            q.publish(f"{sys.argv[4]}-{i}")
            stored += 1
        except QueueFull:
            refused += 1
print(stored, refused)
"""


def test_the_bound_holds_across_processes(backend: Any) -> None:
    if backend.name == "aerospike-emu":
        pytest.skip("the emulator lives in this process; child processes reach lmdb or a real server")
    with backend.ignis() as ignis:
        q = bounded(ignis, shards=4, maxLength=60)
        procs = [subprocess.Popen([sys.executable, "-c", PUBLISHER, backend.url, q.name, "40", f"p{n}"],
                                  stdout=subprocess.PIPE, text=True) for n in range(4)]
        totals = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            totals.append(tuple(map(int, out.split())))
        assert sum(s for s, _ in totals) == 60 and sum(r for _, r in totals) == 4 * 40 - 60
        assert q.stats().depth == 60 and len(waiting_ids(q)) == 60
