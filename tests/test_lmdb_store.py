"""lmdb-only behaviour: layout on disk, URL options, background purge, clear errors."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from support.polling import wait_for

from ignis import Ignis, QueueSpec
from ignis.envelope import Envelope, now_ms
from ignis.errors import InvalidInputError, QueueFull, StoreFull, StoreUnavailable
from ignis.storage import open_store
from ignis.storage.lmdb import LmdbStore


def test_layout_matches_the_aerospike_design(tmp_path: Path) -> None:
    with Ignis(f"lmdb://{tmp_path}?farm=dc1&client=shop&durability=fast") as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="orders.v1", shards=2, messageExpirySeconds=600))
        ref = ignis.queue("orders").publish("hello", id="m-1").ref
        store = ignis.store
        assert isinstance(store, LmdbStore)
        expire_at, record = store.raw_record("dc1_shop_ignis_queues", "orders")
        assert record["active"] == "true" and record["shards"] == 2 and record["handlerType"] == "orders.v1"
        assert expire_at > now_ms() + (2 * 30 * 86400 - 60) * 1000  # TTL = queueExpiry x 2
        expire_at, data = store.raw_record("shop_data_set", f"orders_SHARD_{ref.shard}_1")
        assert data["payload"] == b"hello" and data["msgId"] == "m-1" and data["codec"] == "str"
        assert 0 < expire_at - now_ms() <= 600_000  # TTL = messageExpiry
        _, meta = store.raw_record("shop_meta_set", f"orders_SHARD_{ref.shard}_METADATA")
        assert meta == {"LOAD_POINTER": 1, "FIRE_POINTER": 0}
    env = lmdb.open(str(tmp_path), max_dbs=16, readonly=True, lock=False)
    with env.begin() as txn:
        dbs = {bytes(k).decode() for k, _ in txn.cursor()}
    env.close()
    assert {"dc1_shop_ignis_queues", "dc1_shop_ignis_queues_active", "shop_data_set", "shop_meta_set"} <= dbs


def test_runtime_updates_keep_the_record_ttl(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path), durability="fast")
    store.apply_queue("orders", {"handlerType": "h"}, 3600)
    before, _ = store.raw_record("local_default_ignis_queues", "orders")
    time.sleep(0.01)
    store.advance_sweep("orders", "main", store.next_epoch(), {0: 3}, 1)
    store.set_queue_active("orders", False)
    after, _ = store.raw_record("local_default_ignis_queues", "orders")
    assert after == before
    store.close()


def test_background_purge_removes_expired_records(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path), durability="fast", purge_interval=0)
    store.load("q", [(0, Envelope(b"a", "a", now_ms()))], 1)
    store.load("q", [(0, Envelope(b"b", "b", now_ms()))], 3600)
    store.apply_queue("gone", {"handlerType": "h"}, 1)
    time.sleep(1.1)
    assert store.raw_record("default_data_set", "q_SHARD_0_1") is not None  # expired, not yet purged
    assert store.purge_expired() == 2
    assert store.raw_record("default_data_set", "q_SHARD_0_1") is None
    assert store.raw_record("local_default_ignis_queues", "gone") is None
    assert store.raw_record("default_data_set", "q_SHARD_0_2") is not None
    store.close()


def test_purge_thread_runs_in_the_background(tmp_path: Path) -> None:
    store = LmdbStore(str(tmp_path), durability="fast", purge_interval=0.2)
    store.load("q", [(0, Envelope(b"a", "a", now_ms()))], 1)
    deadline = time.monotonic() + 10
    while store.raw_record("default_data_set", "q_SHARD_0_1") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert store.raw_record("default_data_set", "q_SHARD_0_1") is None
    store.close()


def test_url_options(tmp_path: Path) -> None:
    store = open_store(f"lmdb://{tmp_path}/s?durability=fast&map_size=256m&farm=f1&client=c1")
    assert (store.farm_id, store.client_id) == ("f1", "c1")
    assert "durability=fast" in store.url
    store.close()
    for bad, expected in [
        (f"lmdb://{tmp_path}/s?durability=sometimes", "durability='sometimes'"),
        (f"lmdb://{tmp_path}/s?colour=blue", "unknown lmdb option"),
        (f"lmdb://{tmp_path}/s?map_size=lots", "map_size='lots'"),
        ("redis://localhost", "unknown scheme 'redis'"),
        (str(tmp_path), "has no scheme"),
        ("lmdb://", "has no path"),
        (f"lmdb://{tmp_path}/s?client=bad_client", "clientId='bad_client'"),
    ]:
        with pytest.raises(InvalidInputError, match=expected):
            open_store(bad)


def test_unreachable_store_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot open lmdb store"):
        open_store(f"lmdb://{blocker}/store")


def test_full_store_is_a_clear_error_and_keeps_earlier_data(tmp_path: Path) -> None:
    with Ignis(f"lmdb://{tmp_path}?durability=fast&map_size=1m") as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="h", shards=1))
        q = ignis.queue("orders")
        q.publish("first")
        with pytest.raises(StoreFull, match="map_size"):
            for _ in range(100):
                q.publish_many([b"x" * 4000] * 50)
        assert q.fire().payload == "first"


def test_two_handles_in_one_process_share_the_environment(tmp_path: Path) -> None:
    a = open_store(f"lmdb://{tmp_path}?durability=fast")
    b = open_store(f"lmdb://{tmp_path}?durability=fast")
    a.apply_queue("orders", {"handlerType": "h"}, 60)
    assert b.get_queue("orders") is not None
    a.close()
    assert b.get_queue("orders") is not None  # still open for the other user
    with pytest.raises(InvalidInputError, match="already open"):
        open_store(f"lmdb://{tmp_path}?durability=fsync")
    b.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        b.get_queue("orders")
    c = open_store(f"lmdb://{tmp_path}?durability=fsync")  # all closed: reopen in another mode
    assert c.get_queue("orders") is not None
    c.close()


def test_a_forked_child_gets_a_clear_error(tmp_path: Path) -> None:
    import os

    store = open_store(f"lmdb://{tmp_path}?durability=fast")
    store.apply_queue("orders", {"handlerType": "h"}, 60)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the inherited handle refuses, and so does a new open, each saying why
        code = 1
        try:
            try:
                store.get_queue("orders")
            except StoreUnavailable as exc:
                if "opened before this process forked" in str(exc):
                    code = 2
                    try:
                        open_store(f"lmdb://{tmp_path}?durability=fast")
                    except StoreUnavailable as again:
                        code = 0 if "'spawn'" in str(again) else 3
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"\x00"
    assert store.get_queue("orders") is not None  # the parent's handle is untouched
    store.close()


def test_data_records_carry_a_format_version(tmp_path: Path) -> None:
    import struct

    from ignis.errors import StoreError
    from ignis.storage.base import SlotRef

    store = LmdbStore(str(tmp_path), durability="fast")
    ref = store.load("q", [(0, Envelope(b"a", "a", now_ms(), "bytes", {"h": "v"}, "k"))], 60)[0]
    _, bins = store.raw_record("default_data_set", "q_SHARD_0_1")
    assert bins == {"payload": b"a", "msgId": "a", "loadedAt": bins["loadedAt"], "codec": "bytes",
                    "headers": {"h": "v"}, "pkey": "k", "attempts": 0}
    env = store._ctx.env.env
    with env.begin(write=True) as txn:  # a record written by a future version of the format
        raw = bytearray(txn.get(b"q_SHARD_0_1", db=store._ctx.data))
        struct.pack_into(">B", raw, 20, 9)
        txn.put(b"q_SHARD_0_1", bytes(raw), db=store._ctx.data)
    with pytest.raises(StoreError, match="format 9"):
        store.read([ref])
    assert store.read([SlotRef("q", 0, 2)]) == [None]
    store.close()


_OPEN_WHILE_WRITING = """
import sys, threading
from ignis.storage.lmdb import LmdbStore
store = LmdbStore(sys.argv[1], durability="fast")
holding, opened = threading.Event(), threading.Event()

def writer():
    with store._ctx.write("test") as txn:  # a write transaction held while another thread opens sets
        holding.set()
        opened.wait(1)  # with the bug, this never returns: the opener holds the GIL
        txn.put(b"k", b"v", db=store._ctx.system)

thread = threading.Thread(target=writer)
thread.start()
holding.wait()
threading.Thread(target=lambda: (store.with_client("newcomer"), opened.set()), daemon=True).start()
thread.join()
print("ok")
"""


def test_opening_a_clients_sets_while_another_thread_writes_does_not_deadlock(tmp_path: Path) -> None:
    # py-lmdb's open_db without a transaction begins one while holding the GIL: if another thread holds
    # the write lock, neither can proceed and the whole process freezes (seen in `ignis operator`).
    result = subprocess.run([sys.executable, "-c", _OPEN_WHILE_WRITING, str(tmp_path / "store")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_a_move_under_an_epoch_older_than_the_newest_is_refused_whole(tmp_path: Path) -> None:
    from ignis.errors import StaleEpoch
    from ignis.storage.base import Move

    store = LmdbStore(str(tmp_path / "s"), durability="fast")
    try:
        store.load("q", [(0, Envelope(b"a", "a", now_ms())), (0, Envelope(b"b", "b", now_ms()))], 60)
        claimed = store.claim("q", 0, 2, 1000)
        moves = [Move(c.ref, 1000, 0, c.envelope.for_transfer("swept", 2000)) for c in claimed]
        old = store.next_epoch()
        store.next_epoch()  # a newer leader exists: the old one's move writes nothing at all
        with pytest.raises(StaleEpoch):
            store.move("q_SIDELINE", moves, 60, old)
        assert len(store.peek("q", 0, 1, 2)) == 2 and store.peek("q_SIDELINE", 0, 1, 2) == []
        assert store.pointers("q_SIDELINE", 1)[0].load == 0
        assert store.write_grace_ms == 0  # one transaction per publish: a claim never awaits a write
    finally:
        store.close()


_PUBLISH_WITH_A_SLOW_COMMIT = """
import sys, time
from ignis import Ignis
from ignis.storage.lmdb.context import StoreContext

ring = StoreContext.ring_committing

def ring_then_hold(self, magazine, shards, **options):
    ring(self, magazine, shards, **options)
    time.sleep(float(sys.argv[3]))  # the write lock held, the commit not done: a slow flush

StoreContext.ring_committing = ring_then_hold
with Ignis(sys.argv[1]) as ignis:
    ignis.queue(sys.argv[2]).publish(b"slow")
"""


def test_a_claim_rung_before_the_commit_waits_it_out_and_takes_the_message(tmp_path: Path) -> None:
    # A publish rings before its commit; the consumer's look without the write lock finds nothing yet, and
    # its claim must take the lock anyway (the publisher rings nobody after the commit), or the message
    # would wait for a poll, seconds later.
    hold = 0.5
    url = f"lmdb://{tmp_path}/store"
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="slow", handlerType="slow", shards=2))
        queue = ignis.queue("slow")
        assert queue.fire() is None  # from now on this process listens for the queue's rings
        time.sleep(0.2)  # and the publisher sees the listing (re-read every 50 ms)
        proc = subprocess.Popen([sys.executable, "-c", _PUBLISH_WITH_A_SLOW_COMMIT, url, "slow", str(hold)],
                                stderr=subprocess.PIPE, text=True)
        try:
            message = queue.fire(timeout=10)
        finally:
            _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
        assert message is not None and message.payload == b"slow"
        waited = time.time() - message.envelope.loaded_at / 1000
        assert hold <= waited < hold + 0.35, waited
        message.ack()


class _SlowFlush:
    """Stands in for an LMDB environment whose flush of the meta page (env.sync) takes `seconds`."""

    def __init__(self, env: Any, seconds: float) -> None:
        self._env, self._seconds = env, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def sync(self, force: bool = False) -> None:
        time.sleep(self._seconds)
        self._env.sync(force)


def test_a_consumer_in_the_publishers_process_gets_the_message_while_the_publish_flushes(tmp_path: Path) -> None:
    # The publish wakes this process's waiting consumers before its commit, as it rings other processes;
    # their claim then waits only for the commit, not for the flush after it and the publish's return.
    flush = 0.5
    with Ignis(f"lmdb://{tmp_path}/store") as ignis:
        ignis.apply(QueueSpec.build(name="local", handlerType="local", shards=2))
        publisher, consumer = ignis.queue("local"), ignis.queue("local")
        environment = publisher.store._ctx.env
        environment.env = _SlowFlush(environment.env, flush)
        got: dict[str, Any] = {}

        def consume() -> None:
            got["message"] = consumer.fire(timeout=10)
            got["at"] = time.monotonic()
        thread = threading.Thread(target=consume)
        thread.start()
        # (a publish before it waits wakes nobody)
        wait_for(lambda: consumer.main._active_shards.activity.waiting, 10, "the consumer to wait", 0.01)
        began = time.monotonic()
        publisher.publish(b"m")
        returned = time.monotonic()
        thread.join(10)
        assert got["message"] is not None and got["message"].payload == b"m"
        assert returned - began >= flush
        assert got["at"] < began + flush - 0.2, (got["at"] - began, returned - began)
        got["message"].ack()


def test_a_shard_bounded_by_bytes_counts_them_in_its_meta_record(tmp_path: Path) -> None:
    """LOAD_BYTES (ignis.bounds) rides in the shard's meta record, after the pointers (one record a bounded publish
    reads and writes); a store written when it had a record of its own is read from that record until the next
    publish moves the count over."""
    with Ignis(f"lmdb://{tmp_path}?durability=fast") as ignis:
        ignis.apply(QueueSpec.build(name="b", handlerType="h", shards=1, maxBytes=1000))
        q = ignis.queue("b")
        q.publish(b"x" * 100)
        store = ignis.store
        assert isinstance(store, LmdbStore)
        _, meta = store.raw_record("default_meta_set", "b_SHARD_0_METADATA")
        assert meta == {"LOAD_POINTER": 1, "FIRE_POINTER": 0, "LOAD_BYTES": 100}
        ctx = store._ctx
        with ctx.env.env.begin(write=True) as txn:  # as the store before: 5 of 100 bytes, the count on its own
            txn.put(b"b_SHARD_0_METADATA", struct.pack(">QQQ", 0, 5, 0), db=ctx.meta)
            txn.put(b"b_SHARD_0_BYTES", struct.pack(">QQQ", 0, 500, 0), db=ctx.meta)
        assert store.loaded_bytes("b", 1) == [500]
        stored = 0
        with pytest.raises(QueueFull):
            for _ in range(10):
                q.publish(b"y" * 100)
                stored += 1
        assert stored == 5  # the old count was read: 5 waiting of 100 bytes, room for 5 more
        _, meta = store.raw_record("default_meta_set", "b_SHARD_0_METADATA")
        assert meta == {"LOAD_POINTER": 10, "FIRE_POINTER": 0, "LOAD_BYTES": 1000}
