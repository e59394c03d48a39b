"""Each subscription's claim state in an LMDB environment of its own (ignis.storage.lmdb.cursor_environments): where
its records are, that a publish and a subscription's claims and acks do not wait for each other's write lock, and
that a sweeper's move out of a cursor commits its target before it deletes the claim."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest

from ignis import Ignis, QueueSpec, TopicSpec, names
from ignis.errors import StaleEpoch, StoreError
from ignis.storage.base import Move
from ignis.storage.lmdb.cursor_environments import CURSORS_DIR
from ignis.storage.lmdb.store import LmdbStore

SUB, TOPIC = "audit", "orders"
CURSOR = names.cursor_of(SUB, TOPIC)


@pytest.fixture
def ignis(tmp_path: Path) -> Iterator[Ignis]:
    with Ignis(f"lmdb://{tmp_path}/store") as client:
        client.apply(TopicSpec.build(name=TOPIC, shards=1))
        client.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC}))
        yield client


def _store(ignis: Ignis) -> LmdbStore:
    """The subscription's store, once the cursor's commits so far are done (a claim is handed out before its commit
    flushes: ignis.storage.lmdb.group_commit; a write queued after it commits after it)."""
    store = ignis.queue(SUB).store
    assert isinstance(store, LmdbStore)
    store._cursors.of(CURSOR).grouped("test", lambda txn: None)
    return store


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() in a thread; its result, or a failure naming the wait if it did not return within `seconds`."""
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still waiting after {seconds} s"
    return out[0]


def test_a_subscriptions_position_and_claims_live_in_its_own_environment(ignis: Ignis, tmp_path: Path) -> None:
    ignis.topic(TOPIC).publish(b"one", subject="orders/eu")
    message = ignis.queue(SUB).fire()
    assert message is not None and message.payload == b"one"
    store = _store(ignis)
    own = tmp_path / "store" / CURSORS_DIR / CURSOR
    assert (own / "data.mdb").exists()
    client = store.client_id
    claim_key = f"{names.data_key_prefix(CURSOR, 0)}{message.ref.slot}"
    position_key = names.meta_key(CURSOR, 0)
    # The store's own environment holds the topic's message and none of the subscription's records.
    main = store._ctx
    with main.env.env.begin() as txn:
        assert txn.get(claim_key.encode(), db=main.data) is None
        assert txn.get(position_key.encode(), db=main.meta) is None
        assert txn.get(f"{names.data_key_prefix(TOPIC, 0)}{message.ref.slot}".encode(), db=main.data) is not None
    # ... which are in the cursor's environment, as raw_record (and aql) shows them.
    assert store.raw_record(names.data_set(client), claim_key) is not None
    assert store.raw_record(names.meta_set(client), position_key)[1]["FIRE_POINTER"] == message.ref.slot
    message.ack()
    assert _store(ignis).raw_record(names.data_set(client), claim_key) is None


def test_a_publish_does_not_wait_for_a_subscriptions_commit_nor_an_ack_for_a_publishers(ignis: Ignis) -> None:
    """The point of the separate environments: LMDB has one writer per environment, and a durable commit holds the
    lock while it flushes. A subscription's write transaction held open (a slow flush) must not hold a publish up,
    and the store's (a slow publish) must not hold up an ack of a subscription's message."""
    ignis.topic(TOPIC).publish(b"first", subject="orders/eu")
    message = ignis.queue(SUB).fire()
    assert message is not None
    store = _store(ignis)
    own = store._cursors.of(CURSOR)
    held = own.env.env.begin(write=True)  # the cursor's write lock, as a claim's commit flushing holds it
    try:
        _within(10, lambda: ignis.topic(TOPIC).publish(b"second", subject="orders/eu"))
    finally:
        held.abort()
    held = store._ctx.env.env.begin(write=True)  # the store's write lock, as a publish's commit holds it
    try:
        _within(10, message.ack)
    finally:
        held.abort()
    later = ignis.queue(SUB).fire()
    assert later is not None and later.payload == b"second"
    later.ack()


def _abandoned_claim(ignis: Ignis) -> tuple[LmdbStore, Move]:
    ignis.topic(TOPIC).publish(b"abandoned", subject="orders/eu")
    message = ignis.queue(SUB).fire()
    assert message is not None
    store = _store(ignis)
    envelope = store.read([message.ref])[0]
    assert envelope is not None
    return store, Move(message.ref, envelope.fire_ts, 0, envelope)


def test_a_thread_does_not_claim_a_shard_another_thread_of_the_process_is_claiming(
        ignis: Ignis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two consumer threads of a subscription that claim one shard at once: the second would take the cursor's write
    lock after the first and find the message gone (an empty claim, a turn of the committer thread each). It gets
    nothing at once instead, and the first claim's end wakes it while the shard has work left."""
    queue = ignis.queue(SUB)
    store = queue.store
    claim = store.claim_cursor
    calls: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def held_claim(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            inside.set()
            release.wait(5.0)
        return claim(*args, **kwargs)

    monkeypatch.setattr(store, "claim_cursor", held_claim)
    topic = ignis.topic(TOPIC)
    topic.publish(b"one", subject="orders/eu")
    first: list[Any] = []
    claimer = threading.Thread(target=lambda: first.append(queue.fire()))
    claimer.start()
    assert inside.wait(5.0)
    seen = queue.main.changes
    assert _within(2.0, queue.fire) is None  # not a second claim of the shard: nothing, at once
    assert calls == [1]
    topic.publish(b"two", subject="orders/eu")  # (work left once the first claim took "one")
    woke = threading.Thread(target=lambda: queue.main.wait_for_work(seen, 5.0))
    woke.start()
    release.set()
    claimer.join(5.0)
    assert first and first[0] is not None and first[0].payload == b"one"
    woke.join(5.0)
    assert not woke.is_alive()
    second = _within(5.0, queue.fire)
    assert second is not None and second.payload == b"two"


def test_a_move_out_of_a_cursor_takes_the_claim_to_the_target(ignis: Ignis) -> None:
    store, move = _abandoned_claim(ignis)
    sideline = names.sideline_of(SUB)
    assert store.move(sideline, [move], 3600, store.next_epoch()) == [True]
    assert store.read([move.source]) == [None]
    moved = store.peek(sideline, 0, 1, store.pointers(sideline, 1)[0].load)
    assert [env.payload for _, env in moved] == [b"abandoned"]
    assert store.move(sideline, [move], 3600, store.next_epoch()) == [False]  # gone: not moved twice


def test_a_stale_epochs_move_out_of_a_cursor_moves_and_deletes_nothing(ignis: Ignis) -> None:
    store, move = _abandoned_claim(ignis)
    stale = store.next_epoch()
    store.next_epoch()
    sideline = names.sideline_of(SUB)
    with pytest.raises(StaleEpoch):
        store.move(sideline, [move], 3600, stale)
    assert store.read([move.source])[0] is not None  # still claimed
    assert store.pointers(sideline, 1)[0].load == 0


def test_a_move_out_of_a_cursor_that_fails_after_its_target_committed_leaves_the_claim(
        ignis: Ignis, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between the two environments' commits: the message is in the target and still claimed (delivered
    twice, never lost), because the target commits first."""
    store, move = _abandoned_claim(ignis)
    own = store._cursors.of(CURSOR)
    real_write = own.write

    class Failing:
        def __init__(self, txn: Any) -> None:
            self._txn = txn

        def get(self, *args: Any, **kwargs: Any) -> Any:
            return self._txn.get(*args, **kwargs)

        def delete(self, *args: Any, **kwargs: Any) -> Any:
            raise lmdb.Error("the process died here")

    @contextlib.contextmanager
    def failing_write(operation: str, durable: bool = True) -> Iterator[Any]:
        with real_write(operation, durable) as txn:
            yield Failing(txn)

    monkeypatch.setattr(own, "write", failing_write)
    sideline = names.sideline_of(SUB)
    with pytest.raises(StoreError, match="the process died here"):
        store.move(sideline, [move], 3600, store.next_epoch())
    monkeypatch.undo()
    assert store.read([move.source])[0] is not None  # the claim is still there ...
    assert [env.payload for _, env in store.peek(sideline, 0, 1, 1)] == [b"abandoned"]  # ... and the copy


def test_a_cursor_environment_is_shared_by_the_handles_of_a_process_and_closed_with_the_last(
        tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    with Ignis(f"lmdb://{path}") as first:
        first.apply(TopicSpec.build(name=TOPIC, shards=1))
        first.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC}))
        first.topic(TOPIC).publish(b"x", subject="orders/eu")
        with Ignis(f"lmdb://{path}") as second:
            message = second.queue(SUB).fire()
            assert message is not None
            message.ack()
        assert first.queue(SUB).fire() is None  # the other handle's ack is seen here
        from ignis.storage.lmdb.environment import _Environment
        own = os.path.realpath(os.path.join(path, CURSORS_DIR, CURSOR))
        assert own in _Environment._open
    assert own not in _Environment._open


def test_claims_of_messages_that_left_the_topic_are_purged_from_the_cursors_environment(tmp_path: Path) -> None:
    """A claim record expires with its topic's record (retention): a message that left the topic before its ack
    leaves no claim behind once the purge ran (the background pass, or purge_expired)."""
    import time

    with Ignis(f"lmdb://{tmp_path}/store") as client:
        client.apply(TopicSpec.build(name=TOPIC, shards=1, retentionSeconds=1))
        client.apply(QueueSpec.build(name=SUB, handlerType=SUB, shards=1, subscribe={"topic": TOPIC}))
        client.topic(TOPIC).publish(b"short-lived", subject="orders/eu")
        message = client.queue(SUB).fire()
        assert message is not None
        store = _store(client)
        key = f"{names.data_key_prefix(CURSOR, 0)}{message.ref.slot}"
        assert store.raw_record(names.data_set(store.client_id), key) is not None
        time.sleep(1.2)
        assert store.purge_expired() >= 2  # the topic's record and the claim
        assert store.raw_record(names.data_set(store.client_id), key) is None


def test_one_delete_of_a_subscriptions_claims_and_a_queues_messages_settles_each_in_its_environment(
        ignis: Ignis) -> None:
    """An ack of a batch may mix a subscription's claims (in its cursor's environment) with messages of a magazine
    in the store's own (a subscription's redelivered ones, or another queue's): each is deleted where it is."""
    ignis.apply(QueueSpec.build(name="plain", handlerType="plain", shards=1))
    ignis.topic(TOPIC).publish_many([b"a", b"b"], subject="orders/eu")
    ignis.queue("plain").publish(b"c")
    claims = [ignis.queue(SUB).fire(), ignis.queue(SUB).fire()]
    plain = ignis.queue("plain").fire()
    assert all(m is not None for m in [*claims, plain])
    store = _store(ignis)
    refs = [claims[0].ref, plain.ref, claims[1].ref]
    assert store.delete(refs) == 3
    assert store.read(refs) == [None, None, None]
    assert store.delete([claims[0].ref]) == 0  # gone: nothing left to settle


def test_a_forked_child_claiming_from_an_inherited_cursor_gets_a_clear_error(ignis: Ignis) -> None:
    """LMDB handles do not survive fork(): a child's claim through a cursor its parent opened refuses, saying why,
    instead of opening transactions on the parent's handles (the claim's first look opens them directly)."""
    from ignis.errors import StoreUnavailable

    store = _store(ignis)  # (nothing published: the claim's first look would find nothing, and say nothing)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            try:
                store.claim_cursor(CURSOR, 0, 1, 0, None)
            except StoreUnavailable as exc:
                code = 0 if "opened before this process forked" in str(exc) else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"\x00"
    ignis.topic(TOPIC).publish(b"x", subject="orders/eu")
    message = ignis.queue(SUB).fire()  # the parent's handles are untouched
    assert message is not None and message.payload == b"x"
