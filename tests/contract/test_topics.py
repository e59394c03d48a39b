"""Topics and subscriptions, on every store (lmdb, the Aerospike emulator, a real server with IGNIS_TEST_AEROSPIKE):
one publish reaches every subscription whose filter selects its subject; a subscription is a queue (acks, nacks,
retries, dead letters, consumers, figures) with its own position, which survives a reopen, starts where it is told
and seeks; bad input is refused with the problem named and nothing written."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from ignis import Consumer, Ignis, InvalidInputError, InvalidSpecError, QueueSpec, TopicNotFound, TopicSpec
from ignis.envelope import now_ms
from ignis.topics.retention import trim_to_bytes


def topic(ignis: Ignis, name: str = "sensors", **fields: Any):
    fields.setdefault("shards", 4)
    ignis.apply(TopicSpec.build(name=name, **fields))
    return ignis.topic(name)


def subscribe(ignis: Ignis, name: str, topic_name: str = "sensors", **sub: Any):
    fields = {k: sub.pop(k) for k in list(sub) if k not in ("filter", "start")}
    ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=2, subscribe={"topic": topic_name, **sub},
                                **fields))
    return ignis.queue(name)


def drain(q, limit: int = 1000) -> list[Any]:
    got = []
    for _ in range(limit):
        m = q.fire()
        if m is None:
            return got
        got.append(m)
        m.ack()
    raise AssertionError("did not drain")


def test_one_publish_reaches_every_subscription_whose_filter_selects_it(ignis: Ignis) -> None:
    t = topic(ignis)
    everything = subscribe(ignis, "everything")
    temps = subscribe(ignis, "temps", filter="sensors/+/temp")
    kitchen = subscribe(ignis, "kitchen", filter="sensors/kitchen/#")
    subjects = ["sensors/kitchen/temp", "sensors/kitchen/humidity", "sensors/hall/temp", "alerts", "sensors/kitchen"]
    refs = {s: t.publish(s.encode(), subject=s) for s in subjects}
    assert {m.payload.decode() for m in drain(everything)} == set(subjects)
    assert sorted(m.payload.decode() for m in drain(temps)) == ["sensors/hall/temp", "sensors/kitchen/temp"]
    got = drain(kitchen)
    assert sorted(m.payload.decode() for m in got) == ["sensors/kitchen", "sensors/kitchen/humidity",
                                                       "sensors/kitchen/temp"]
    assert {(m.id, m.envelope.subject) for m in got} == {(refs[m.envelope.subject].id, m.envelope.subject)
                                                         for m in got}  # the topic's message, with its subject
    assert all(m.attempts == 1 for m in got)
    assert t.stats().published == len(subjects)


def test_a_subscription_starts_where_it_is_told(ignis: Ignis) -> None:
    t = topic(ignis)
    t.publish_many([b"a1", b"a2"], subject="a")
    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    t.publish(b"b1", subject="b")
    earliest = subscribe(ignis, "earliest", start="earliest")
    latest = subscribe(ignis, "latest")  # the default
    since = subscribe(ignis, "since", start=datetime.fromtimestamp(middle / 1000, UTC).isoformat())
    since_ms = subscribe(ignis, "sincems", start=middle)
    t.publish(b"c1", subject="c")
    assert sorted(m.payload for m in drain(earliest)) == [b"a1", b"a2", b"b1", b"c1"]
    assert [m.payload for m in drain(latest)] == [b"c1"]
    assert sorted(m.payload for m in drain(since)) == [b"b1", b"c1"]
    assert sorted(m.payload for m in drain(since_ms)) == [b"b1", b"c1"]


def test_a_subscription_keeps_its_position_across_a_reopen(backend: Any) -> None:
    with backend.ignis() as ignis:
        t = topic(ignis)
        q = subscribe(ignis, "billing")
        t.publish_many([b"1", b"2", b"3"], subject="x")
        got = drain(q)
        assert len(got) == 3
        t.publish_many([b"4", b"5"], subject="x")
    with backend.ignis() as again:  # another process's handle, or a restart
        q = again.queue("billing")
        assert sorted(m.payload for m in drain(q)) == [b"4", b"5"]  # not what it acked before
        assert q.fire() is None


def test_a_closed_publishers_spare_reserved_slots_are_passed_at_once(backend: Any) -> None:
    """A publisher that closes seals the topic slots it reserved and did not write (as a queue's does), so its
    subscriptions pass them at once instead of awaiting each one for the write deadline."""
    with backend.ignis() as ignis:
        t = topic(ignis, shards=1)
        subscribe(ignis, "late", start="earliest")
        for i in range(50):  # one at a time, quickly: a reserving store reserves ahead for the next ones
            t.publish(b"%d" % i, subject="s")
    with backend.ignis() as again:
        q = again.queue("late")
        got = drain(q)
        assert sorted(int(m.payload) for m in got) == list(range(50))
        assert q.cursor.awaiting() == 0  # nothing left to wait for: the spare slots were sealed at close
        assert q.cursor.pointers()[0].fire == q.cursor.pointers()[0].load


def test_seek_moves_a_subscription_back_and_forth(ignis: Ignis) -> None:
    t = topic(ignis, shards=2)
    q = subscribe(ignis, "audit", start="earliest")
    t.publish_many([b"early1", b"early2"], subject="x")
    time.sleep(0.05)
    middle = now_ms()
    time.sleep(0.05)
    t.publish_many([b"late1", b"late2"], subject="x")
    assert len(drain(q)) == 4
    ignis.seek("audit", middle)  # back: what it acked since is delivered again
    assert sorted(m.payload for m in drain(q)) == [b"late1", b"late2"]
    ignis.seek("audit", "earliest")
    assert len(drain(q)) == 4
    ignis.seek("audit", "latest")
    assert q.fire() is None
    with pytest.raises(InvalidInputError, match="is no subscription"):
        ignis.apply(QueueSpec.build(name="plain", handlerType="plain"))
        ignis.seek("plain", "earliest")
    with pytest.raises(InvalidInputError, match="seek to"):
        ignis.seek("audit", "yesterday")


def test_a_subscription_is_a_queue_nacks_retries_and_dead_letters(ignis: Ignis) -> None:
    t = topic(ignis)
    q = subscribe(ignis, "work", maxDeliveries=2)
    t.publish(b"job", subject="jobs")
    first = q.fire()
    assert first is not None and first.attempts == 1
    first.nack("rejected", delay=0.2)  # back for a retry, into the subscription's own magazines
    second = q.fire(timeout=5)
    assert second is not None and second.payload == b"job" and second.attempts == 2
    assert second.envelope.subject == "jobs"  # carried along the copies
    second.nack("rejected")
    assert q.fire() is None
    stats = q.stats()
    assert stats.dead == 1 and stats.depth == 0 and stats.topic == "sensors"
    other = subscribe(ignis, "other", start="earliest")  # a crashed or failing subscription delays no other
    assert [m.payload for m in drain(other)] == [b"job"]


def test_a_consumer_handles_a_subscription_and_release_returns_claims(ignis: Ignis) -> None:
    t = topic(ignis)
    subscribe(ignis, "handled", concurrency=2)
    seen: list[bytes] = []
    consumer = Consumer(ignis)
    consumer.register("handled", lambda m: seen.append(m.payload))
    t.publish_many([b"m%d" % i for i in range(20)], subject="s")
    assert consumer.drain(timeout=30)
    consumer.stop()
    assert sorted(seen) == sorted(b"m%d" % i for i in range(20))
    q = ignis.queue("handled")
    t.publish(b"held", subject="s")
    held = q.fire()
    assert held is not None and q.release([held]) == 1  # handed back at once, as any queue's
    again = q.fire(timeout=5)
    assert again is not None and again.payload == b"held"
    again.ack()


def test_threads_that_fire_first_on_a_new_handle_share_one_cursor(ignis: Ignis, monkeypatch: Any) -> None:
    """A consumer's threads fire at once on a new subscription handle: one cursor is built, so what one fire
    prefetches for the others is handed out by the next fires (a second cursor kept it out of every fire's sight,
    and out of Consumer.drain's, until a sweep). The topic's record read slowly, as over a busy network."""
    t = topic(ignis)
    subscribe(ignis, "fanned")
    t.publish_many([b"m%d" % i for i in range(40)], subject="s")
    q = ignis.queue("fanned")
    get_topic = q.store.get_topic

    def slow_get_topic(name: str) -> Any:
        time.sleep(0.05)
        return get_topic(name)

    monkeypatch.setattr(q.store, "get_topic", slow_get_topic)
    start = threading.Barrier(8)
    cursors: list[Any] = []
    fired: list[bytes] = []

    def first_fire() -> None:
        start.wait()
        cursors.append(q.cursor)
        fired.extend(m.payload for m in q.fire_many(1))

    threads = [threading.Thread(target=first_fire) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(c) for c in cursors}) == 1 and cursors[0] is q.cursor
    rest = [m.payload for m in drain(q)]
    assert sorted(fired + rest) == sorted(b"m%d" % i for i in range(40))


def test_a_message_that_left_the_topic_before_a_subscription_came_is_counted_expired(ignis: Ignis) -> None:
    t = topic(ignis, retentionSeconds=1)
    q = subscribe(ignis, "slow", start="earliest")
    t.publish_many([b"gone1", b"gone2", b"gone3"], subject="x")
    deadline = time.monotonic() + 6
    while t.stats().retained and time.monotonic() < deadline:  # (TTLs are whole seconds on Aerospike)
        time.sleep(0.25)
    t.publish(b"kept", subject="x")

    def expired_total() -> float:
        return REGISTRY.get_sample_value("ignis_subscription_expired_total", {"queue": "slow"}) or 0.0

    before = expired_total()
    assert [m.payload for m in drain(q)] == [b"kept"]
    # On a two-step store (Aerospike) a claim that finds a slot empty with nothing published after it in its shard
    # cannot tell a message gone from one on its way: it awaits it for the write deadline, then seals it. So the
    # figure is exact within that deadline (plus a second for the re-reads).
    deadline = time.monotonic() + ignis.store.write_grace_ms / 1000 + 5
    while q.stats().expired < 3 and time.monotonic() < deadline:
        assert q.fire(timeout=0.2) is None
    stats = q.stats()
    assert stats.expired == 3 and expired_total() - before == 3
    assert stats.published == stats.consumed + stats.depth + stats.expired == 4


def test_a_topic_over_its_byte_bound_drops_its_oldest_messages_and_a_subscription_counts_them(ignis: Ignis) -> None:
    t = topic(ignis, shards=2, retentionBytes=4000)
    behind = subscribe(ignis, "behind", start="earliest")
    refs = [t.publish(b"%03d" % i + b"x" * 97, subject="a") for i in range(60)]
    size = 100 + len(refs[0].id) + 1  # what a message counts: payload, id, subject
    trim = trim_to_bytes(t)
    assert trim.dropped > 0 and trim.retained_bytes > 4000
    assert t.stats().retained_bytes <= 4000 + 2 * size  # the estimate, within a message per shard of the bound
    kept = {int(m.payload[:3]) for m in drain(behind)}
    assert 4000 - 6 * size <= len(kept) * size <= 4000 + 2 * size
    # Oldest first in each shard: what is left of a shard is its newest messages.
    for shard in (0, 1):
        numbers = [i for i, ref in enumerate(refs) if ref.shard == shard]
        assert [i in kept for i in numbers] == sorted(i in kept for i in numbers), shard
    # Counted as lost to retention, each of them (a publisher's reservation given up is not).
    deadline = time.monotonic() + ignis.store.write_grace_ms / 1000 + 5
    while behind.stats().expired < 60 - len(kept) and time.monotonic() < deadline:
        assert behind.fire(timeout=0.2) is None
    assert behind.stats().expired == 60 - len(kept)
    # Within its bound: nothing more goes.
    assert trim_to_bytes(t).dropped == 0
    unbounded = topic(ignis, "unbounded", shards=2)
    unbounded.publish_many([b"y" * 1000] * 20, subject="a")
    assert trim_to_bytes(unbounded).dropped == 0 and unbounded.stats().retained == 20


def test_figures_of_a_topic_and_a_subscription(ignis: Ignis) -> None:
    t = topic(ignis)
    t.publish_many([b"before"] * 2, subject="a")  # before the subscription: behind its start (latest)
    q = subscribe(ignis, "figures")
    t.publish_many([b"x" * 100] * 5, subject="a")
    stats = q.stats()
    assert stats.depth == 5 and stats.expired == 0 and stats.oldest_age_seconds is not None
    # Positions in the topic, as offsets: published = consumed + depth + expired.
    assert (stats.published, stats.consumed) == (7, 2)
    m = q.fire()
    assert m is not None
    assert q.stats(in_flight=True).in_flight == 1
    m.ack()
    stats = q.stats()
    assert (stats.published, stats.consumed, stats.depth) == (7, 3, 4)
    ts = t.stats()
    assert ts.published == 7 and ts.retained == 7 and ts.subscriptions == ["figures"]
    assert 5 * 100 <= ts.retained_bytes < 5 * 1024


@pytest.mark.parametrize(("subscribe_fields", "words"), [
    ({"topic": "sensors", "filter": "a/#/b"}, "'#' must be a whole level and the last one"),
    ({"topic": "sensors", "filter": "a+"}, "'\\+' must be a whole level"),
    ({"topic": "sensors", "start": "soon"}, "must be earliest, latest"),
    ({"topic": "Bad_Name"}, "subscribe.topic"),
])
def test_bad_subscriptions_are_refused_with_the_problem_named(ignis: Ignis, subscribe_fields, words) -> None:
    topic(ignis)
    with pytest.raises(InvalidSpecError, match=words):
        ignis.apply(QueueSpec.build(name="bad", handlerType="bad", subscribe=subscribe_fields))
    assert ignis.store.get_queue("bad") is None


def test_bad_input_to_topics_is_refused_and_writes_nothing(ignis: Ignis) -> None:
    t = topic(ignis)
    for subject, words in (("a/+/b", "'\\+' is not allowed"), ("a/#", "'#' is not allowed"), ("x" * 256, "1-255"),
                           ("", "1-255")):
        with pytest.raises(InvalidInputError, match=words):
            t.publish(b"x", subject=subject)
    with pytest.raises(InvalidInputError, match="does not exist"):
        ignis.apply(QueueSpec.build(name="orphan", handlerType="o", subscribe={"topic": "nosuch"}))
    assert ignis.store.get_queue("orphan") is None
    subscribe(ignis, "reader")
    topic(ignis, "other")
    with pytest.raises(InvalidInputError, match="its topic cannot change"):
        ignis.apply(QueueSpec.build(name="reader", handlerType="reader", shards=2, subscribe={"topic": "other"}))
    with pytest.raises(InvalidInputError, match="read by subscription\\(s\\) reader"):
        ignis.delete_topic("sensors")
    assert ignis.topic_spec("sensors").name == "sensors"  # still there
    with pytest.raises(InvalidInputError, match=r"a queue of client .* has that name"):
        ignis.apply(TopicSpec.build(name="reader"))
    with pytest.raises(InvalidInputError, match=r"a topic of client .* has that name"):
        ignis.apply(QueueSpec.build(name="other", handlerType="x"))
    with pytest.raises(InvalidInputError, match="publish to the topic"):
        ignis.queue("reader").publish(b"x")
    with pytest.raises(TopicNotFound):
        ignis.topic("nosuch")
    assert t.stats().published == 0
    ignis.delete_topic("sensors", force=True)
    with pytest.raises(TopicNotFound):
        ignis.topic_spec("sensors")


def test_a_publish_writes_the_message_once_whatever_the_subscriptions(backend: Any) -> None:
    """The store calls of a topic publish do not grow with its subscriptions (fan-out is at delivery)."""
    def calls() -> float:
        return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)

    per_publish = {}
    with backend.ignis() as ignis:
        for subscriptions in (1, 10):
            name = f"fan{subscriptions}"
            t = topic(ignis, name)
            for i in range(subscriptions):
                subscribe(ignis, f"{name}-sub{i}", topic_name=name)
            t.publish(b"warm", subject="x")
            before = calls()
            for _ in range(200):
                t.publish(b"x" * 1024, subject="x")
            per_publish[subscriptions] = (calls() - before) / 200
    assert per_publish[10] <= per_publish[1] * 1.1 + 0.01, per_publish
    assert per_publish[10] <= 1.1, per_publish


def test_the_async_api_publishes_to_a_topic_and_consumes_a_subscription(backend: Any) -> None:
    import asyncio

    from ignis.aio import AsyncIgnis

    async def main() -> list[tuple[bytes, str | None]]:
        async with AsyncIgnis(backend.url) as aio:
            await aio.apply(TopicSpec.build(name="events", shards=2))
            await aio.apply(QueueSpec.build(name="reader", handlerType="r", subscribe={"topic": "events"}))
            topic = aio.topic("events")
            await topic.publish(b"one", subject="a/b")
            await topic.publish_many([b"two", b"three"], subject="a/c")
            got = []
            reader = aio.queue("reader")
            while len(got) < 3 and (message := await reader.fire(timeout=5)) is not None:
                got.append((message.payload, message.envelope.subject))
                await message.ack()
            assert (await topic.stats()).published == 3
            with pytest.raises(InvalidInputError, match="publish to the topic"):
                await reader.publish(b"x")
            return got

    assert sorted(asyncio.run(main())) == [(b"one", "a/b"), (b"three", "a/c"), (b"two", "a/c")]


def test_a_waiting_consumer_of_a_subscription_wakes_for_its_cursors_awaited_slots(ignis: Ignis, monkeypatch: Any
                                                                                ) -> None:
    """A slot the cursor claimed before its record landed is re-read on a schedule of milliseconds: a consumer that
    found nothing else waits on the subscription's main magazine no longer than that (it waited for the next publish,
    or its whole poll interval when none came: a message 10 s late, found in the latency benchmark)."""
    topic(ignis)
    q = subscribe(ignis, "awaiting")
    monkeypatch.setattr(q.cursor, "next_check_in", lambda: 0.002)  # an awaited slot due in 2 ms
    timeouts: list[float] = []
    monkeypatch.setattr(q.main._active_shards, "wait_for_work",
                        lambda _main, _seen, timeout: timeouts.append(timeout) or False)
    q.main.wait_for_work(q.main.changes, 10.0)
    assert timeouts == [0.002]


def test_a_message_claimed_again_after_a_seek_back_is_held_live_for_the_sweeper(ignis: Ignis) -> None:
    """A seek back claims again slots whose earlier claims were acked: the new claim is live (on Aerospike the
    claim write clears the ack's tombstone), so the sweeper sees it and delivers it again should its consumer die,
    and its ack settles it. A claim left tombstoned would read as acked: lost for this pass if the consumer died."""
    t = topic(ignis, shards=1)
    q = subscribe(ignis, "again", start="earliest")
    t.publish_many([b"a", b"b"], subject="x")
    assert len(drain(q)) == 2
    ignis.seek("again", "earliest")
    m = q.fire()
    assert m is not None and m.payload == b"a"
    held = q.store.read([m.ref])[0]  # (what the sweeper's peek of the subscription's claims sees)
    assert held is not None and held.payload == b"a" and held.attempts >= 1
    m.ack()
    assert q.store.read([m.ref])[0] is None


def test_publish_each_publishes_rows_with_their_own_subjects_and_checks_every_row_first(ignis: Ignis) -> None:
    t = topic(ignis)
    everything = subscribe(ignis, "everything", start="earliest")
    temps = subscribe(ignis, "temps", filter="sensors/+/temp", start="earliest")
    refs = t.publish_each([b"21", b"40", b'"warn"'], subjects=["sensors/hall/temp", "sensors/hall/hum", "alerts"],
                          ids=["t-1", None, "a-1"], codecs=["bytes", None, "json"], keys=["hall", "hall", None],
                          headers=[{"src": "x"}, None, None])
    assert [r.id for r in refs][0::2] == ["t-1", "a-1"] and refs[1].id
    assert refs[0].shard == refs[1].shard  # one key, one shard
    got = {m.id: m for m in drain(everything)}
    assert {i: (m.envelope.subject, m.data, m.key, m.headers or None) for i, m in got.items()} == {
        "t-1": ("sensors/hall/temp", b"21", "hall", {"src": "x"}),
        refs[1].id: ("sensors/hall/hum", b"40", "hall", None), "a-1": ("alerts", b'"warn"', None, None)}
    assert got["a-1"].payload == "warn"  # its codec kept
    assert [m.id for m in drain(temps)] == ["t-1"]
    # A bad row anywhere in the call: refused naming it, nothing of the call written.
    for subjects, words in ((["ok", "a/+"], "message 1: subject='a/\\+'"), (["ok", ""], "message 1: subject of 0"),
                            (["ok"], "subjects has 1 entries for 2 payloads")):
        with pytest.raises(InvalidInputError, match=words):
            t.publish_each([b"x", b"y"], subjects=subjects)
    with pytest.raises(InvalidInputError, match="message 0: codec 'yaml'"):
        t.publish_each([b"x"], subjects=["s"], codecs=["yaml"])
    assert t.stats().published == 3


def test_first_published_at_passes_over_no_message_for_a_hole_in_the_log(ignis: Ignis) -> None:
    from ignis.storage.base import SlotRef
    from ignis.topics.topic import first_published_at

    t = topic(ignis, "log", shards=1)
    old = t.publish_many([b"o%d" % i for i in range(10)], subject="s")
    time.sleep(0.01)
    at = now_ms()
    time.sleep(0.01)
    new = t.publish_many([b"n%d" % i for i in range(10)], subject="s")
    load = new[-1].slot
    assert first_published_at(ignis.store, "log", 0, 1, load, at) == new[0].slot
    # A hole where the search first looks among the new ones (a sealed reservation, say): it reads on to the next
    # message instead of taking the hole for an old one and passing over the new ones before it.
    assert (old[0].slot + load) // 2 == old[-1].slot  # the first look: an old one
    ignis.store.delete([SlotRef("log", 0, (new[0].slot + load) // 2)])  # the second
    assert first_published_at(ignis.store, "log", 0, 1, load, at) == new[0].slot
    assert first_published_at(ignis.store, "log", 0, 1, load, now_ms() + 1000) == load + 1
    assert first_published_at(ignis.store, "log", 0, 1, load, 0) == old[0].slot


def test_a_sealed_reservation_inside_the_log_is_no_edge_of_what_the_topic_retains(ignis: Ignis) -> None:
    """A publisher's stale reservation is sealed and left empty (ignis.magazine.reservations): a hole among the
    retained messages, which the searches must not take for the gone head of the log (they then passed over every
    message before it: a Spark read, a subscription starting at `earliest`, the figures)."""
    from ignis.storage.base import SlotRef
    from ignis.topics.topic import first_published_at, first_retained

    if not ignis.store.write_grace_ms:
        pytest.skip("lmdb writes a slot in the transaction that allocates it: no reservations, no such holes")
    t = topic(ignis, "log", shards=1)
    head = t.publish_many([b"h%d" % i for i in range(3)], subject="s")
    first = ignis.store.reserve("log", 0, 5)  # reserved, never written: sealed
    ignis.store.seal([SlotRef("log", 0, slot) for slot in range(first, first + 5)], 60)
    rest = t.publish_many([b"r%d" % i for i in range(12)], subject="s")
    load = rest[-1].slot
    assert (head[-1].slot, first, rest[0].slot) == (3, 4, 9) and load == 20
    assert first_retained(ignis.store, "log", 0, 1, load) == 1
    assert first_published_at(ignis.store, "log", 0, 1, load, 0) == 1
    everything = subscribe(ignis, "all", topic_name="log", start="earliest")
    assert {m.id for m in drain(everything)} == {r.id for r in head + rest}
    assert t.stats().retained == 20  # from the first slot held to the last written (the hole's slots among them)


def test_a_peek_of_a_topic_with_a_subject_filter_returns_only_what_it_selects(ignis: Ignis) -> None:
    """The Spark reader's filter pushed to the store (Storage.peek `only`): on Aerospike the server applies it (its
    peek does not filter in the client, so this fails if the expression were not sent); on lmdb the read does."""
    from ignis.subjects import subject_filter

    t = topic(ignis, shards=1)
    subjects = ["sensors/kitchen/temp", "sensors/kitchen/humidity", "sensors/hall/temp", "alerts"]
    refs = [t.publish(s.encode(), subject=s) for s in subjects]
    last = max(r.slot for r in refs)
    everything = ignis.store.peek("sensors", 0, 1, last)
    assert sorted(e.subject for _, e in everything) == sorted(subjects)
    temps = ignis.store.peek("sensors", 0, 1, last, subject_filter("sensors/+/temp"))
    assert [(ref.slot, e.subject) for ref, e in temps] == [(r.slot, s) for r, s in zip(refs, subjects, strict=True)
                                                           if s.endswith("/temp")]
    assert ignis.store.peek("sensors", 0, 1, last, subject_filter("#")) == everything
