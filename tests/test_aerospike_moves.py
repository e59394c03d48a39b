"""Aerospike's fences, step by step (the emulator, and a real server when IGNIS_TEST_AEROSPIKE is set):
sealed slots that refuse a late write, and moves whose per-record claim a newer epoch wins. lmdb needs
neither (a publish and a move are each one transaction): its side is in the contract suite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aerospike_helpers.operations import operations as ops
from support.races import paused_publish_write

from ignis import Ignis, QueueSpec
from ignis.envelope import FIRE_TS, MSG_ID, now_ms
from ignis.errors import StaleEpoch
from ignis.queue import Queue
from ignis.storage import SlotRef, open_store
from ignis.storage.aerospike import MOVE_EPOCH, SEALED, TOMBSTONE, AerospikeStore


@pytest.fixture
def aero(backend) -> Iterator[AerospikeStore]:
    if backend.name == "lmdb":
        pytest.skip("Aerospike only: lmdb publishes and moves in one transaction each")
    store = backend.open()
    yield store
    store.close()


@pytest.fixture
def queue(aero: AerospikeStore) -> Queue:
    ignis = Ignis(aero)
    ignis.apply(QueueSpec.build(name="orders", handlerType="x", shards=1))
    return ignis.queue("orders")


def raw(store: AerospikeStore, ref: SlotRef) -> dict[str, Any] | None:
    """The bins of a data record as stored, tombstones included (None when there is no record)."""
    from aerospike import exception as ex

    try:
        return store.client.get(store._ctx.data_key(ref))[2]
    except ex.RecordNotFound:
        return None


# ---- sealed slots --------------------------------------------------------------------------------------
def test_a_missing_record_is_awaited_and_a_deleted_one_is_a_hole(aero: AerospikeStore, queue: Queue) -> None:
    refs = [r.ref for r in queue.publish_many([b"a", b"b", b"c"])]
    aero.delete([refs[1]])  # acked: a hole for good
    aero.client.remove(aero._ctx.data_key(refs[2]))  # not there at all: maybe a write in flight
    claimed = aero.claim("orders", 0, 3, now_ms())
    assert [(c.envelope is not None, c.awaiting) for c in claimed] == [(True, False), (False, False), (False, True)]


def test_a_write_that_comes_after_its_slot_was_sealed_is_published_again(aero: AerospikeStore, queue: Queue
                                                                         ) -> None:
    published: list = []
    with paused_publish_write(aero) as gate:
        publisher = threading.Thread(target=lambda: published.append(queue.publish(b"late")))
        publisher.start()
        assert gate.reached.wait(10)
        [claimed] = aero.claim("orders", 0, 1, now_ms())  # a consumer claims the empty slot ...
        assert claimed.awaiting
        assert aero.seal([claimed.ref], 60) == [True]  # ... and, its grace over, gives it up
        gate.release.set()
        publisher.join(10)
    [ref] = published
    assert ref.slot == 2  # refused by the seal, then published into the next slot
    assert set(raw(aero, SlotRef("orders", 0, 1))) == {TOMBSTONE, SEALED}
    assert aero.restamp([claimed.ref], now_ms()) == [(claimed.ref, None, False)]  # sealed: a hole for good
    message = queue.fire()
    assert message is not None and message.payload == b"late" and message.ref.slot == 2


def test_seal_loses_to_a_record_that_landed(aero: AerospikeStore, queue: Queue) -> None:
    ref = queue.publish(b"x").ref
    assert aero.seal([ref, SlotRef("orders", 0, 2)], 60) == [False, True]
    assert aero.read([ref])[0].payload == b"x"


def test_a_magazine_seals_an_awaited_slot_once_the_producers_deadline_has_passed(aero: AerospikeStore,
                                                                                 queue: Queue) -> None:
    from prometheus_client import REGISTRY

    def holes() -> float:
        return REGISTRY.get_sample_value("ignis_holes_skipped_total", {"queue": "orders", "magazine": "main"}) or 0

    before = holes()
    refs = [r.ref for r in queue.publish_many([b"a", b"b"])]
    aero.client.remove(aero._ctx.data_key(refs[0]))  # a producer that died between its increment and its write
    queue.main._awaited_slots.grace = 0.05  # this store's grace is the whole write deadline (seconds): shorter here
    assert queue.fire().payload == b"b"  # the empty slot is awaited, the next one delivered
    assert queue.main.awaiting() == 1 and holes() == before
    deadline = now_ms() + 5000
    while queue.main.awaiting() and now_ms() < deadline:
        assert queue.fire() is None
    assert queue.main.awaiting() == 0 and holes() == before + 1
    assert set(raw(aero, refs[0])) == {TOMBSTONE, SEALED}


# ---- fenced moves ---------------------------------------------------------------------------------------
class PausingClient:
    """The raw client, with one batch call (picked by `which` from its operations) paused after (or before)
    it ran. A move's claims and deletes go out as batch_operate (one operation list for every key), its
    copies as batch_write (a Write per record)."""

    def __init__(self, inner: Any, which: Callable[[list[dict]], bool], after: bool = True) -> None:
        self._inner = inner
        self._which = which
        self._after = after
        self.reached = threading.Event()
        self.release = threading.Event()
        self.deletes_applied = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _paused(self, ops: list[dict], call: Callable[[], Any]) -> Any:
        pause = not self.reached.is_set() and self._which(ops)
        if pause and not self._after:
            self.reached.set()
            self.release.wait(30)
        done = call()
        if is_delete(ops):
            self.deletes_applied += sum(r.result == 0 for r in done.batch_records)
        if pause and self._after:
            self.reached.set()
            self.release.wait(30)
        return done

    def batch_write(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        return self._paused(ops_of(batch), lambda: self._inner.batch_write(batch, *args, **kwargs) or batch)

    def batch_operate(self, keys: list, ops: list[dict], *args: Any, **kwargs: Any) -> Any:
        return self._paused(ops, lambda: self._inner.batch_operate(keys, ops, *args, **kwargs))


def ops_of(batch: Any) -> list[dict]:
    return batch.batch_records[0].ops if batch.batch_records and hasattr(batch.batch_records[0], "ops") else []


def is_claim(ops: list[dict]) -> bool:
    return any(op.get("bin") == MOVE_EPOCH for op in ops)


def is_copy(ops: list[dict]) -> bool:
    return any(op.get("bin") == "payload" for op in ops)


def is_delete(ops: list[dict]) -> bool:
    return len(ops) == 1 and ops[0].get("bin") == TOMBSTONE


def sweep_moves(queue: Queue, count: int) -> list[tuple[SlotRef, int | None, Any]]:
    queue.publish_many([b"m%d" % i for i in range(count)])
    return [(m.ref, m.envelope.fire_ts, m.envelope.for_transfer("swept", now_ms())) for m in queue.fire_many(count)]


def race(backend, aero: AerospikeStore, queue: Queue, which: Callable[[Any], bool]) -> tuple[list, list, int]:
    """An old leader's move paused at `which`; a newer leader moves the same records; the old one resumes.
    Returns (the old move's outcome, the newer move's outcome, deletes the old one got applied)."""
    moves = sweep_moves(queue, 3)
    old_epoch, new_epoch = aero.next_epoch(), aero.next_epoch()
    own = backend.open()  # the old leader's own connection, paused where asked
    try:
        pausing = own._ctx.client = PausingClient(own._ctx.client, which)
        old_queue = Queue(own, queue.spec)
        outcome: list = []

        def run_old() -> None:
            try:
                outcome.append(old_queue.sideline.move_in(old_epoch, moves))
            except StaleEpoch as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run_old)
        thread.start()
        assert pausing.reached.wait(10)
        newer = queue.sideline.move_in(new_epoch, moves)
        pausing.release.set()
        thread.join(30)
        return outcome, newer, pausing.deletes_applied
    finally:
        own.close()


def sidelined(queue: Queue) -> list[str]:
    return sorted(env.msg_id for _, env in queue.sideline.browse(100))


def test_a_mover_paused_after_its_claim_is_refused_its_copy_and_its_delete(backend, aero, queue) -> None:
    outcome, newer, deletes = race(backend, aero, queue, is_claim)
    ids = sorted(env.msg_id for _, env in queue.sideline.browse(100))
    assert newer == [True, True, True]
    assert outcome == [[False, False, False]] and deletes == 0
    assert len(ids) == 3 and sidelined(queue) == ids  # one copy each: the newer leader's
    assert aero.peek("orders", 0, 1, 10) == []


def test_a_mover_paused_after_its_copy_leaves_one_copy_and_deletes_nothing(backend, aero, queue) -> None:
    outcome, newer, deletes = race(backend, aero, queue, is_copy)
    assert newer == [True, True, True]  # it found the copies already there and only deleted the sources
    assert outcome == [[True, True, True]] and deletes == 0  # the old copies stand; its deletes refused
    assert len(sidelined(queue)) == 3 and len(set(sidelined(queue))) == 3
    assert aero.peek("orders", 0, 1, 10) == []
    pointers = queue.sideline.pointers()[0]
    assert pointers.load == 6  # both movers took 3 slots; the newer one sealed its unused ones at once
    assert [c.awaiting for c in aero.claim("orders_SIDELINE", 0, 6, now_ms()) if c.envelope is None] == [False] * 3


def test_a_mover_paused_before_its_claim_finds_a_newer_epoch_and_writes_nothing(backend, aero, queue) -> None:
    moves = sweep_moves(queue, 2)
    old_epoch, new_epoch = aero.next_epoch(), aero.next_epoch()
    own = backend.open()
    try:
        # The newer leader claims the records and stops (it will finish later); the old one comes.
        newer_client = PausingClient(aero._ctx.client, is_claim)
        aero._ctx.client = newer_client
        thread = threading.Thread(target=lambda: queue.sideline.move_in(new_epoch, moves))
        thread.start()
        assert newer_client.reached.wait(10)
        with pytest.raises(StaleEpoch):
            Queue(own, queue.spec).sideline.move_in(old_epoch, moves)
        newer_client.release.set()
        thread.join(30)
        aero._ctx.client = newer_client._inner
    finally:
        own.close()
    assert len(sidelined(queue)) == 2 and aero.peek("orders", 0, 1, 10) == []


def test_a_move_cut_between_its_copy_and_its_delete_is_finished_without_a_second_copy(aero, queue) -> None:
    moves = sweep_moves(queue, 3)
    epoch = aero.next_epoch()

    class Cut(RuntimeError):
        pass

    real = aero._ctx.client

    class Cutting(PausingClient):
        def batch_operate(self, keys: list, ops: list[dict], *args: Any, **kwargs: Any) -> Any:
            if is_delete(ops):
                raise Cut("the process died here")
            return real.batch_operate(keys, ops, *args, **kwargs)

    aero._ctx.client = Cutting(real, lambda _: False)
    with pytest.raises(Cut):
        queue.sideline.move_in(epoch, moves)
    aero._ctx.client = real
    assert len(sidelined(queue)) == 3 and len(aero.peek("orders", 0, 1, 10)) == 3  # copied, not deleted
    assert queue.sideline.move_in(epoch, moves) == [True, True, True]  # the next pass finishes it
    assert len(sidelined(queue)) == 3 and aero.peek("orders", 0, 1, 10) == []


def test_purge_counts_live_records_once_and_clears_tombstones_and_seals(aero: AerospikeStore, queue: Queue) -> None:
    refs = [r.ref for r in queue.publish_many([b"a", b"b", b"c", b"d"])]
    queue.ack([queue.fire()])  # slot 1: an ack tombstone
    aero.seal([SlotRef("orders", 0, 9)], 60)  # beyond the load pointer: not the magazine's
    aero.client.remove(aero._ctx.data_key(refs[3]))
    aero.seal([refs[3]], 60)  # slot 4: a seal
    assert aero.purge_magazine("orders") == 2  # slots 2 and 3 were live
    for ref in refs:
        assert set(raw(aero, ref) or {"purgedAt"}) == {"purgedAt"}
    again = Queue(aero, queue.spec)  # the queue declared again: slots start at 1 and take the places
    first = again.publish(b"n1")  # one by one: a create-only write meets the purge leftover, then replaces it
    assert [first.ref.slot] + [r.ref.slot for r in again.publish_many([b"n2", b"n3", b"n4"])] == [1, 2, 3, 4]
    got = []
    while batch := again.fire_many(10):
        got += [m.payload for m in batch]
        again.ack(batch)
    assert sorted(got) == [b"n1", b"n2", b"n3", b"n4"]


# ---- acks --------------------------------------------------------------------------------------------
def deletes() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("ignis_storage_calls_total", {"operation": "delete"}) or 0.0


def a_newer_message_took_the_slot(store: AerospikeStore, ref: SlotRef) -> None:
    """A rollback lost the claimed record in `ref` and a newer message took its slot (rollback.py), claimed in turn:
    the same generation as the old claim saw, a later fire time."""
    key = store._ctx.data_key(ref)
    meta, bins = store.client.get(key)[1:]
    store.client.remove(key)  # lost ...
    time.sleep(0.002)
    store.client.put(key, {**bins, MSG_ID: "newer"})  # ... its slot a newer message's ...
    store.client.operate(key, [ops.write(FIRE_TS, now_ms())])  # ... which is claimed too
    assert store.client.get(key)[1]["gen"] == meta["gen"]  # the generation the old claim saw


@contextmanager
def orders_checked_by(backend, ack_check: str) -> Iterator[tuple[AerospikeStore, Queue]]:
    """A store whose acks check `ack_check` (Aerospike, tombstones), and a queue "orders" of one shard in it."""
    if backend.name == "lmdb":
        pytest.skip("Aerospike only")
    store = open_store(f"{backend.url}&ack_check={ack_check}")
    try:
        assert isinstance(store, AerospikeStore)
        if store._ctx.durable:
            pytest.skip("durable deletes on Enterprise: no tombstones")
        ignis = Ignis(store)
        ignis.apply(QueueSpec.build(name="orders", handlerType="x", shards=1))
        yield store, ignis.queue("orders")
    finally:
        store.close()


def test_an_ack_tombstones_the_record_as_claimed_in_one_call_and_one_written_since_checked_by_its_id(
        aero: AerospikeStore, queue: Queue) -> None:
    if aero._ctx.durable:
        pytest.skip("durable deletes on Enterprise: no tombstones")
    queue.publish_many([b"a", b"b", b"c"])
    untouched, moved_meanwhile, purged_meanwhile = (queue.fire() for _ in range(3))
    before = deletes()
    untouched.ack()  # as stamped (its generation and fire time): one call
    assert deletes() - before == 1 and set(raw(aero, untouched.ref)) == {TOMBSTONE}
    # A sweeper's move claimed this one since (a write: its generation moved on); the ack still deletes
    # it, in a second call whose filter asks for this message's id (the first, as stamped, is refused).
    aero.client.operate(aero._ctx.data_key(moved_meanwhile.ref), [ops.write(MOVE_EPOCH, 7)])
    before = deletes()
    moved_meanwhile.ack()
    assert deletes() - before == 2
    assert set(raw(aero, moved_meanwhile.ref)) == {TOMBSTONE}
    # Purged since: the purge tombstone stays what it is (a new message may yet be published there).
    aero.purge_magazine("orders")
    purged_meanwhile.ack()
    assert set(raw(aero, purged_meanwhile.ref)) == {"purgedAt"}


def test_an_ack_as_stamped_leaves_a_newer_message_that_reached_the_same_generation(aero: AerospikeStore,
                                                                                   queue: Queue) -> None:
    """A rollback lost the claimed record and a newer message took its slot (rollback.py), claimed in turn: the same
    generation as the old claim saw, a later fire time. The old claim's ack must not settle it."""
    if aero._ctx.durable:
        pytest.skip("durable deletes on Enterprise: no tombstones")
    queue.publish(b"old")
    held = queue.fire()
    assert held is not None
    a_newer_message_took_the_slot(aero, held.ref)
    assert aero.client.get(aero._ctx.data_key(held.ref))[1]["gen"] == held.envelope.version[0]
    held.ack()
    after = raw(aero, held.ref) or {}
    assert after.get(MSG_ID) == "newer" and TOMBSTONE not in after


def test_ack_check_generation_settles_by_the_generation_alone(backend) -> None:
    """`ack_check=generation` (docs/aerospike/index.md) trades the fire-time check for one filter expression less per
    ack: the tombstone then checks the record's generation alone. The trade, both ways: a newer message that reached
    the same generation in a reused slot is settled too (what the default check refuses, above), and a record written
    since the claim is still settled by its id, in a second call."""
    with orders_checked_by(backend, "generation") as (store, queue):
        queue.publish_many([b"old", b"moved"])
        held, moved_meanwhile = queue.fire(), queue.fire()
        assert held is not None and moved_meanwhile is not None
        a_newer_message_took_the_slot(store, held.ref)
        before = deletes()
        held.ack()
        assert deletes() - before == 1 and set(raw(store, held.ref) or {}) == {TOMBSTONE}
        store.client.operate(store._ctx.data_key(moved_meanwhile.ref), [ops.write(MOVE_EPOCH, 7)])
        before = deletes()
        moved_meanwhile.ack()
        assert deletes() - before == 2 and set(raw(store, moved_meanwhile.ref) or {}) == {TOMBSTONE}


@pytest.mark.parametrize("ack_check", ["message", "generation"])
def test_a_batch_of_acks_leaves_a_newer_message_in_a_reused_slot_unless_the_check_is_the_generation(
        backend, ack_check: str) -> None:
    """A batched ack (Queue.ack) of claims whose slot a newer message took after a rollback (as above): under the
    default check the batch's filter of its ids leaves the newer message alone; under `ack_check=generation` the batch
    settles the live records, as earlier releases did, the newer one included: the trade that setting makes for one
    message's ack, in one filter expression less (docs/aerospike/durability.md). The other messages are settled
    either way, in one call."""
    with orders_checked_by(backend, ack_check) as (store, queue):
        queue.publish_many([b"old", b"b", b"c"])
        batch = queue.fire_many(3)
        assert [m.payload for m in batch] == [b"old", b"b", b"c"]
        a_newer_message_took_the_slot(store, batch[0].ref)
        before = deletes()
        queue.ack(batch)
        assert deletes() - before == 1
        for m in batch[1:]:
            assert set(raw(store, m.ref) or {}) == {TOMBSTONE}
        after = raw(store, batch[0].ref) or {}
        if ack_check == "generation":
            assert set(after) == {TOMBSTONE}, after
        else:
            assert after.get(MSG_ID) == "newer" and TOMBSTONE not in after, after
