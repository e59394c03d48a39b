"""Aerospike-only behaviour on the emulator: client policies, calls per operation, acks that survive a
cold restart of Community Edition, retries and in-doubt writes, error mapping, credential redaction."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import aerospike
import pytest
from aerospike import exception as ex
from prometheus_client import REGISTRY, generate_latest
from support.aerospike_emulator import EmulatedServer

from ignis import Ignis, QueueSpec, TopicSpec, names
from ignis.envelope import CODEC_BYTES, CODEC_UNREADABLE, PROBLEM_HEADER, Envelope, NewMessages, now_ms
from ignis.errors import InvalidInputError, StoreError, StoreFull, StoreUnavailable
from ignis.storage import SlotRef, open_store
from ignis.storage.aerospike import AerospikeStore, context
from ignis.storage.aerospike.errors import map_error
from ignis.subjects import SubjectFilter

URL = "aerospike://emulator:3000/test?farm=f1&client=c1"
SECRET = "s3cr3t-Pa55"


@pytest.fixture
def make(server: EmulatedServer) -> Iterator[Callable[..., AerospikeStore]]:
    opened: list[AerospikeStore] = []

    def open_(url: str = URL) -> AerospikeStore:
        store = open_store(url)
        assert isinstance(store, AerospikeStore)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def calls(operation: str) -> float:
    return REGISTRY.get_sample_value("ignis_storage_calls_total", {"operation": operation}) or 0.0


def retries(operation: str) -> float:
    return REGISTRY.get_sample_value("ignis_storage_retries_total", {"operation": operation}) or 0.0


def errors(operation: str) -> float:
    return REGISTRY.get_sample_value("ignis_storage_errors_total", {"operation": operation}) or 0.0


def env(msg_id: str = "m") -> Envelope:
    return Envelope(b"x", msg_id, now_ms())


# ---- client policies --------------------------------------------------------------------------------
def test_client_policies_follow_the_design(server: EmulatedServer, make) -> None:
    make("aerospike://h1:3000,h2:3100/test?farm=f1&client=c1&max_conns_per_node=7&thread_pool_size=3")
    config = server.configs[0]
    assert config["hosts"] == [("h1", 3000), ("h2", 3100)]
    write = config["policies"]["write"]
    assert write["commit_level"] == aerospike.POLICY_COMMIT_LEVEL_ALL
    assert write["key"] == aerospike.POLICY_KEY_SEND
    assert write["replica"] == config["policies"]["read"]["replica"] == aerospike.POLICY_REPLICA_SEQUENCE
    assert write["max_retries"] == 0  # tenacity retries, and only where safe
    assert config["max_conns_per_node"] == 7 and config["thread_pool_size"] == 3


# ---- cost per message -------------------------------------------------------------------------------
def test_storage_calls_per_operation(server: EmulatedServer, make) -> None:
    with Ignis(make()) as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="orders", shards=1))
        q = ignis.queue("orders")
        # Warm-up: the handle's first shard-pointer read (a magazine fire: a Queue fire that finds nothing has
        # the process's watcher follow the queue, whose reads in the background would be counted here), and
        # the queue's beacon, which a process bumps at most once a second (Storage.beacon).
        q.main.fire(1)
        q.publish("warm-up")
        q.ack(q.fire_many(1))

        def cost(action: Callable[[], Any]) -> tuple[int, int]:
            before_metric = sum(calls(op) for op in ("load", "claim", "delete", "pointers", "read"))
            before_server = sum(server.calls.values())
            action()
            metric = sum(calls(op) for op in ("load", "claim", "delete", "pointers", "read")) - before_metric
            return int(metric), sum(server.calls.values()) - before_server

        publish_metric, publish_real = cost(lambda: q.publish("one"))
        assert publish_metric == publish_real <= 2
        fired: list[Any] = []
        fire_metric, fire_real = cost(lambda: fired.append(q.fire()))
        assert fired[0] is not None and fire_metric == fire_real <= 2
        ack_metric, ack_real = cost(fired[0].ack)
        assert ack_metric == ack_real == 1

        q.publish_many(range(50))
        batch = q.fire_many(50)
        assert len(batch) == 50
        batch_metric, batch_real = cost(lambda: q.ack(batch))
        assert batch_metric == batch_real == 1  # 1/N per message


def test_a_caught_up_cursor_claim_reads_the_topics_load_pointer_again_unless_vouched_for(server: EmulatedServer,
                                                                                          make) -> None:
    """A cursor's move is bounded by the topic's load pointer as this process last saw it. Caught up with it, a
    claim reads it again (another process may have published since), in one call more; the caller's watcher, reading
    it every few milliseconds, can vouch for it instead (`recheck=False`): then the claim says drained at once."""
    with Ignis(make()) as publisher, Ignis(make()) as subscriber:
        publisher.apply(TopicSpec.build(name="feed", shards=1, retentionSeconds=3600))
        publisher.apply(QueueSpec.build(name="all", handlerType="all", shards=1,
                                        subscribe={"topic": "feed", "start": "earliest"}))
        store, cursor = subscriber.store, names.cursor_of("all", "feed")
        publisher.topic("feed").publish(b"a", subject="s")
        assert [c.envelope.payload for c in store.claim_cursor(cursor, 0, 10, now_ms(), None).claimed] == [b"a"]
        publisher.topic("feed").publish(b"b", subject="s")  # (another process: this one has not seen it)
        before = sum(server.calls.values())
        vouched = store.claim_cursor(cursor, 0, 10, now_ms(), None, recheck=False)
        assert vouched.claimed == [] and vouched.drained and sum(server.calls.values()) - before == 1
        rechecked = store.claim_cursor(cursor, 0, 10, now_ms(), None)
        # (and perhaps a slot the publisher reserved ahead, awaited: nothing written there)
        assert [c.envelope.payload for c in rechecked.claimed if c.envelope is not None] == [b"b"]
        while not store.claim_cursor(cursor, 0, 10, now_ms(), None).drained:  # (past the reserved slots)
            pass
        before = sum(server.calls.values())
        again = store.claim_cursor(cursor, 0, 10, now_ms(), None)  # caught up, and nothing new: no second move
        assert again.claimed == [] and again.drained and sum(server.calls.values()) - before == 2


def test_small_batches_are_processed_inline_by_the_server(server: EmulatedServer, make) -> None:
    """A small batch (at most INLINE_BATCH_MAX records) is processed by the server thread that receives it on a
    device namespace too (allow_inline_ssd): handed to the batch threads, a watcher's read of 32 pointers took twice
    as long on CE 8.1 (0.46 against 0.24 ms, measured). Large ones keep the client's default."""
    store = make()
    ctx = store._ctx  # (the policy each batch call is given)
    assert ctx.batch_policy(3)["allow_inline_ssd"] is True and ctx.batch_policy(3)["allow_inline"] is True
    assert ctx.batch_policy(3, ctx.batch_all)["read_mode_ap"] == aerospike.POLICY_READ_MODE_AP_ALL
    assert ctx.batch_policy(3, ctx.batch_all)["allow_inline_ssd"] is True
    assert ctx.batch_policy(context.INLINE_BATCH_MAX + 1) is None
    assert ctx.batch_policy(context.INLINE_BATCH_MAX + 1, ctx.batch_all) is ctx.batch_all


# ---- acks that stay acked -----------------------------------------------------------------------------
def test_community_plain_delete_comes_back_after_a_cold_restart(server: EmulatedServer, make) -> None:
    """The hazard itself, so the tests below prove something: a plain delete is undone by a restart."""
    store = make()
    key = ("test", "c1_data_set", "x")
    store.client.put(key, {"a": 1})
    store.client.remove(key)
    server.cold_restart()
    assert store.client.get(key)[2] == {"a": 1}


def test_community_acks_are_tombstones_that_survive_a_cold_restart(server: EmulatedServer, make) -> None:
    store = make()
    assert not store.durable_deletes
    refs = store.load("q", [(0, env("a")), (0, env("b")), (0, env("c"))], 600)
    claimed = store.claim("q", 0, 3, now_ms())
    assert store.delete([claimed[0].ref]) == 1  # single ack
    assert store.delete([c.ref for c in claimed[1:]]) == 2  # batched ack
    raw = server.raw("test", "c1_data_set", "q_SHARD_0_1")
    assert raw is not None and set(raw.bins) == {"deletedAt"}  # payload gone, TTL kept
    server.cold_restart()
    assert store.read(refs) == [None, None, None]
    assert store.peek("q", 0, 1, 3) == []
    assert store.stamp_unfired(refs[0], now_ms()) is None
    assert store.delete(refs) == 0


def test_tombstoned_slot_is_a_hole_for_claim(server: EmulatedServer, make) -> None:
    store = make()
    refs = store.load("q", [(0, env("a")), (0, env("b"))], 600)
    store.delete([refs[0]])  # e.g. a sweeper moved it while unclaimed
    claimed = store.claim("q", 0, 2, now_ms())
    assert claimed[0].envelope is None and claimed[1].envelope.msg_id == "b"
    assert server.raw("test", "c1_data_set", "q_SHARD_0_1").bins.keys() == {"deletedAt"}  # not stamped


def test_enterprise_acks_are_durable_deletes(monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmulatedServer(edition="enterprise")
    monkeypatch.setattr(context, "client_factory", server.client)
    store = open_store(URL)
    assert store.durable_deletes
    refs = store.load("q", [(0, env("a")), (0, env("b"))], 600)
    assert store.delete(refs) == 2
    assert server.raw("test", "c1_data_set", "q_SHARD_0_1") is None
    server.cold_restart()
    assert store.read(refs) == [None, None]
    store.close()


def test_durable_delete_on_community_is_a_clear_error(server: EmulatedServer, make) -> None:
    store = make(URL + "&ack_mode=durable-delete")
    ref = store.load("q", [(0, env())], 600)[0]
    with pytest.raises(StoreError, match="aerospike delete"):
        store.delete([ref])


def test_deleted_queue_and_purged_magazine_stay_gone_and_can_be_reused(server: EmulatedServer, make) -> None:
    store = make()
    store.apply_queue("orders", {"handlerType": "h", "shards": 2}, 3600)
    store.load("orders", [(0, env("a")), (1, env("b"))], 600)
    assert store.purge_magazine("orders") == 2
    assert store.delete_queue("orders") is True and store.delete_queue("orders") is False
    server.cold_restart()
    assert store.get_queue("orders") is None and store.list_queues(None) == []
    assert [(p.load, p.fire) for p in store.pointers("orders", 2).values()] == [(0, 0), (0, 0)]
    assert store.peek("orders", 0, 1, 5) == [] and store.claim("orders", 0, 5, now_ms()) == []
    # Re-declared and reused: a fresh record, slots from 1 again.
    assert store.apply_queue("orders", {"handlerType": "h2", "shards": 2}, 3600) is True
    assert store.get_queue("orders").bins["sweptCounter"] == 0
    assert store.load("orders", [(0, env("new"))], 600) == [SlotRef("orders", 0, 1)]
    assert [c.envelope.msg_id for c in store.claim("orders", 0, 5, now_ms())] == ["new"]


# ---- retries and in-doubt writes ---------------------------------------------------------------------
def test_transient_read_errors_are_retried(server: EmulatedServer, make) -> None:
    store = make()
    store.apply_queue("orders", {"handlerType": "h"}, 60)
    before = retries("get_queue")
    server.fail_next("get", ex.TimeoutError, times=2)
    assert store.get_queue("orders") is not None
    assert retries("get_queue") - before == 2


def test_retries_give_up_with_a_clear_error(server: EmulatedServer, make) -> None:
    store = make()
    before = errors("get_queue")
    server.fail_next("get", ex.TimeoutError, times=10)
    with pytest.raises(StoreUnavailable, match=r"get_queue .*timed out"):
        store.get_queue("orders")
    assert errors("get_queue") - before == 1  # one failed call, however many attempts


def test_storage_errors_count_failures_not_answers(server: EmulatedServer, make) -> None:
    store = make()
    before = errors("get_queue")
    server.fail_next("get", ex.TimeoutError, times=2)
    assert store.get_queue("orders") is None  # retried, then answered "not found": no error
    assert errors("get_queue") == before
    store.load("q", [(0, env("a"))], 600)
    claims = errors("claim")
    server.fail_next("operate", ex.TimeoutError, apply_first=True)  # in doubt: never retried
    with pytest.raises(StoreUnavailable):
        store.claim("q", 0, 1, now_ms())
    assert errors("claim") - claims == 1


def test_in_doubt_claim_is_not_repeated(server: EmulatedServer, make) -> None:
    store = make()
    store.load("q", [(0, env("a")), (0, env("b"))], 600)
    server.fail_next("operate", ex.TimeoutError, apply_first=True)  # applied, reply lost
    with pytest.raises(StoreUnavailable, match="may or may not have been applied"):
        store.claim("q", 0, 1, now_ms())
    assert store.pointers("q", 1)[0].fire == 1  # exactly one claim happened: nobody else gets slot 1
    assert [c.ref.slot for c in store.claim("q", 0, 5, now_ms())] == [2]


def test_claim_failed_for_sure_is_repeated(server: EmulatedServer, make) -> None:
    store = make()
    store.load("q", [(0, env("a"))], 600)
    server.fail_next("operate", ex.TimeoutError)  # in_doubt False: the server did nothing
    assert [c.envelope.msg_id for c in store.claim("q", 0, 1, now_ms())] == ["a"]


def test_in_doubt_load_increment_leaves_a_hole_never_a_shared_slot(server: EmulatedServer, make) -> None:
    store = make()
    server.fail_next("operate", ex.TimeoutError, apply_first=True)
    refs = store.load("q", [(0, env("a"))], 600)
    assert refs == [SlotRef("q", 0, 2)]  # slot 1 was allocated by the lost reply: a hole
    claimed = store.claim("q", 0, 5, now_ms())
    assert [(c.ref.slot, c.envelope and c.envelope.msg_id) for c in claimed] == [(1, None), (2, "a")]


def test_in_doubt_sweep_update_is_not_repeated(server: EmulatedServer, make) -> None:
    store = make()
    store.apply_queue("orders", {"handlerType": "h"}, 60)
    epoch = store.next_epoch()
    server.fail_next("operate", ex.TimeoutError, apply_first=True)
    with pytest.raises(StoreUnavailable):
        store.advance_sweep("orders", "main", epoch, {0: 5}, 5)
    assert store.get_queue("orders").bins["sweptCounter"] == 5  # applied once, not twice


# ---- error mapping ---------------------------------------------------------------------------------------
def test_missing_namespace(server: EmulatedServer, make) -> None:
    with pytest.raises(StoreError, match="namespace does not exist"):
        make("aerospike://emulator:3000/nope?farm=f1&client=c1")


def test_ttl_refused_without_nsup_period(monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmulatedServer(nsup_period=0)
    monkeypatch.setattr(context, "client_factory", server.client)
    store = open_store(URL)
    with pytest.raises(StoreError, match="nsup-period"):
        store.apply_queue("orders", {"handlerType": "h"}, 60)
    store.close()


def test_record_too_big_on_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmulatedServer(max_record_bytes=4096)  # a namespace smaller than the configured limit
    monkeypatch.setattr(context, "client_factory", server.client)
    store = open_store(URL)
    with pytest.raises(InvalidInputError, match="record too big"):
        store.load("q", [(0, Envelope(b"x" * 8000, "m", now_ms()))], 60)
    store.close()


def test_unreachable_cluster(server: EmulatedServer, make) -> None:
    server.reachable = False
    with pytest.raises(StoreUnavailable, match="cluster unreachable"):
        make()


@pytest.mark.parametrize(("error", "match", "kind"), [
    (ex.NotAuthenticated, "authentication", StoreUnavailable), (ex.TLSError, "TLS", StoreUnavailable),
    (ex.ServerFull, "full", StoreFull), (ex.DeviceOverload, "busy", StoreUnavailable),
    (ex.InvalidNodeError, "cluster unreachable", StoreUnavailable),  # the client's "cluster is empty"
    (ex.NoResponse, "cluster unreachable", StoreUnavailable), (ex.ParamError, "failed", StoreError),
    (ex.BinIncompatibleType, "failed", StoreError),
])
def test_server_errors_map_to_ignis_errors(server: EmulatedServer, make, error, match: str, kind: type) -> None:
    store = make(URL + "&retries=0")
    server.fail_next("get", error)
    with pytest.raises(StoreError, match=match) as caught:
        store.get_queue("orders")
    assert type(caught.value) is kind


def test_index_errors_other_than_already_exists_are_reported(server: EmulatedServer, make) -> None:
    store = make()
    server.fail_next("index_single_value_create", ex.IndexOOM)
    store.ensure_index()  # exists: an info call says so, and no create is sent (it would wait ~2 s)
    store.client.index_remove("test", "f1_c1_ignis_queues_active")
    with pytest.raises(StoreError, match="cannot create secondary index 'f1_c1_ignis_queues_active'"):
        store.ensure_index()  # gone: created again, and this create fails


# ---- credentials ----------------------------------------------------------------------------------------
def test_credentials_never_leak(server: EmulatedServer, make, caplog: pytest.LogCaptureFixture,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    store = make(f"aerospike://admin:{SECRET}@emulator:3000/test?farm=f1&client=c1")
    assert server.configs[-1]["user"] == "admin" and server.configs[-1]["password"] == SECRET  # used...
    texts = [store.url, repr(store), str(store._shared.settings), repr(store._shared.settings)]
    server.fail_next("get", ex.InvalidPassword)
    with pytest.raises(StoreError) as failure:
        store.get_queue("orders")
    texts.append(str(failure.value))
    server.reachable = False
    with pytest.raises(StoreUnavailable) as unreachable:
        open_store(f"aerospike://admin:{SECRET}@emulator:3000/test")
    texts.append(str(unreachable.value))
    monkeypatch.setenv("IGNIS_AEROSPIKE_PASSWORD", SECRET)
    with pytest.raises(InvalidInputError) as bad_setting:
        open_store("aerospike://emulator:99999/test")
    texts.append(str(bad_setting.value))
    for bad_url in (f"aerospike://admin:{SECRET}@h/test?x", f"aerospik://admin:{SECRET}@h/test"):
        with pytest.raises(InvalidInputError) as bad:
            open_store(bad_url)
        texts.append(str(bad.value))
    texts += [record.getMessage() for record in caplog.records]
    texts.append(generate_latest(REGISTRY).decode())
    assert all(SECRET not in text for text in texts)  # ...and shown nowhere
    assert "admin" not in store.url


# ---- the emulator follows the server ----------------------------------------------------------------------
def test_emulator_generation_ttl_and_exists_policies(server: EmulatedServer) -> None:
    client = server.client({})
    key = ("test", "s", "k")
    client.put(key, {"a": 1}, policy={"ttl": 100})
    _, meta, _ = client.get(key)
    assert meta["gen"] == 1 and 99 <= meta["ttl"] <= 100
    client.put(key, {"b": 2}, policy={"ttl": aerospike.TTL_DONT_UPDATE})
    _, meta, bins = client.get(key)
    assert meta["gen"] == 2 and 99 <= meta["ttl"] <= 100 and bins == {"a": 1, "b": 2}
    with pytest.raises(ex.RecordExistsError):
        client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    with pytest.raises(ex.RecordNotFound):
        client.put(("test", "s", "other"), {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_UPDATE})
    with pytest.raises(ex.RecordGenerationError):
        client.put(key, {"a": 3}, {"gen": 1}, {"gen": aerospike.POLICY_GEN_EQ})
    client.put(key, {"c": 3}, None, {"exists": aerospike.POLICY_EXISTS_REPLACE, "ttl": -1})
    _, meta, bins = client.get(key)
    assert bins == {"c": 3} and meta["ttl"] == -1
    with pytest.warns(DeprecationWarning, match=r'meta\["ttl"\] is deprecated'):  # as the client warns
        client.put(key, {"d": 4}, {"ttl": 100})
    with pytest.raises(ex.BinNameError):
        client.put(key, {"x" * 16: 1})
    with pytest.raises(ex.NamespaceNotFound):
        client.get(("nope", "s", "k"))


def test_emulator_refuses_what_it_does_not_emulate(server: EmulatedServer) -> None:
    from aerospike_helpers import expressions as exp

    client = server.client({})
    client.put(("test", "s", "k"), {"a": "text"})
    unknown = exp.Eq(exp.DigestMod(3), 1).compile()
    with pytest.raises(NotImplementedError, match="expression op"):
        client.get(("test", "s", "k"), {"expressions": unknown})
    basic = exp.CmpRegex(0, "t.*", exp.StrBin("a")).compile()  # (IgnisMQ writes extended ones only)
    with pytest.raises(NotImplementedError, match="only REGEX_EXTENDED"):
        client.get(("test", "s", "k"), {"expressions": basic})
    extended = exp.CmpRegex(aerospike.REGEX_EXTENDED, "^t(e|x)+t$", exp.StrBin("a")).compile()
    assert client.get(("test", "s", "k"), {"expressions": extended})[2] == {"a": "text"}


def test_client_views_share_one_connection(server: EmulatedServer, make) -> None:
    store = make()
    view = store.with_client("other-app")
    assert store.with_client("other-app") is view and view.client is store.client
    assert store.with_client(store.client_id) is store
    view.apply_queue("orders", {"handlerType": "h"}, 60)
    assert store.get_queue("orders") is None and view.get_queue("orders") is not None
    view.close()  # a view leaves the shared connection open
    assert store.client.is_connected() and store.get_queue("orders") is None
    store.close()
    assert not store.client.is_connected()


def test_enterprise_purge_and_queue_delete_are_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    server = EmulatedServer(edition="enterprise")
    monkeypatch.setattr(context, "client_factory", server.client)
    store = open_store(URL)
    store.apply_queue("orders", {"handlerType": "h"}, 3600)
    store.load("orders", [(0, env("a")), (0, env("b")), (1, env("c"))], 600)
    assert store.purge_magazine("orders") == 3
    assert store.delete_queue("orders") is True
    server.cold_restart()
    assert store.get_queue("orders") is None and store.peek("orders", 0, 1, 5) == []
    assert server.raw("test", "c1_meta_set", "orders_SHARD_0_METADATA") is None
    store.close()


@pytest.mark.parametrize(("error", "kind", "match"), [
    (ex.NamespaceNotFound, StoreError, "namespace does not exist"),
    (ex.ForbiddenError, StoreError, "nsup-period"),
    (ex.RecordTooBig, InvalidInputError, "record too big"),
    (ex.BinNameError, InvalidInputError, "bin name too long"),
    (ex.ServerFull, StoreFull, "full"),
    (ex.InvalidPassword, StoreUnavailable, "authentication"),
    (ex.TLSError, StoreUnavailable, "TLS"),
    (ex.TimeoutError, StoreUnavailable, "timed out"),
    (ex.ConnectionError, StoreUnavailable, "cluster unreachable"),
    (ex.IndexOOM, StoreError, "secondary index"),
    (ex.UDFError, StoreError, "failed"),
])
def test_every_aerospike_error_maps_to_an_ignis_error(error, kind, match: str) -> None:
    exc = error(error.code, "server says no", "file.c", 1, False)
    exc.code, exc.msg, exc.in_doubt = error.code, "server says no", False
    mapped = map_error(exc, "load", "aerospike://h:3000/test set 'c_data_set'")
    assert type(mapped) is kind and re.search(match, str(mapped))
    assert "load" in str(mapped) and "c_data_set" in str(mapped) and "server says no" in str(mapped)


def test_a_user_without_index_privilege_can_still_publish(server: EmulatedServer, make,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    server.fail_next("index_single_value_create", ex.RoleViolation)
    store = make()  # opens, with a warning naming what is missing
    assert "sindex-admin" in caplog.text
    assert store.load("q", [(0, env())], 60) == [SlotRef("q", 0, 1)]
    server.fail_next("index_single_value_create", ex.IndexOOM)
    with pytest.raises(StoreError, match="cannot create secondary index"):
        make("aerospike://emulator:3000/test?farm=f2&client=c2")  # any other index error stops the open
    assert not server.clients[-1].is_connected()  # and the failed open leaks no connection


def test_load_new_refuses_a_placement_that_misses_or_repeats_a_message(make) -> None:
    store = make()
    batch = NewMessages([b"a", b"b"], ["i0", "i1"], None, now_ms())
    for placement in ([(0, [0])], [(0, [0, 1]), (1, [1])], [(0, [0, 2])]):
        with pytest.raises(ValueError, match="placement must name each of the 2 messages exactly once"):
            store.load_new("q", batch, placement, 600)
    assert [p.load for p in store.pointers("q", 2).values()] == [0, 0]  # nothing was written
    assert store.load_new("q", batch, [(1, [1, 0])], 600) == [range(1, 3)]
    assert [e.msg_id for e in store.read([SlotRef("q", 1, 1), SlotRef("q", 1, 2)])] == ["i1", "i0"]


def test_queues_are_listed_while_the_index_is_not_queryable(server: EmulatedServer, make) -> None:
    # A new index reaches each node through system metadata and is then built; meanwhile a query says
    # "index not found" or "not readable". A sweeper must still find every active queue.
    store = make()
    store.apply_queue("orders", {"handlerType": "h"}, 3600)
    store.apply_queue("quiet", {"handlerType": "h"}, 3600)
    store.set_queue_active("quiet", False)
    index = "f1_c1_ignis_queues_active"
    server.building.add(index)
    assert [r.name for r in store.list_queues(True)] == ["orders"]
    assert [r.name for r in store.list_queues(None)] == ["orders", "quiet"]
    server.building.discard(index)
    store.client.index_remove("test", index)
    assert [r.name for r in store.list_queues(False)] == ["quiet"]
    store.ensure_index()
    queries = server.calls["query"]
    assert [r.name for r in store.list_queues(True)] == ["orders"] and server.calls["query"] == queries + 1


def test_a_settles_filter_built_from_its_template_is_the_compiled_expression() -> None:
    """One message's settle filter is a template compiled once with the id put in (Reads._this_message): it must
    be exactly what compiling the expression for that id gives, whatever the id holds."""
    from aerospike_helpers import expressions as exp

    from ignis.envelope import MSG_ID
    from ignis.storage.aerospike.reads import Reads

    for msg_id in ("0190c6d3a1b2c3d4e5f60718293a4b5c", "", "a\0b", "ünïcode"):
        assert Reads._this_message(msg_id) == exp.Eq(exp.StrBin(MSG_ID), msg_id).compile()


@pytest.mark.parametrize("delay_ms", [0, 30])
def test_a_subscriptions_claim_record_holds_its_fire_time_and_attempts_only(server: EmulatedServer, make,
                                                                            delay_ms: int) -> None:
    """DESIGN §8b: a claim writes a small per-(subscription, slot) record, fire time and attempts, whatever the
    payload (the cursor's slot n claims the topic's slot n: the slot says which message); an ack settles it. Late
    (claim_write_delay_ms), it is the same record once written."""
    store = make(f"{URL}&claim_write_delay_ms={delay_ms}")
    with Ignis(store) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=1, retentionSeconds=3600))
        ignis.apply(QueueSpec.build(name="all", handlerType="all", shards=1,
                                    subscribe={"topic": "feed", "start": "earliest"}))
        ignis.topic("feed").publish(b"p" * 4000, subject="s")
        message = ignis.queue("all").fire()
        assert message is not None and message.payload == b"p" * 4000
        deadline = time.monotonic() + 10
        while delay_ms and store._shared.deferred.pending and time.monotonic() < deadline:
            time.sleep(0.01)  # (written by the connection's thread once due)
        _, meta, bins = store.client.get(store._ctx.data_key(message.ref))
        assert set(bins) == {"fireTS", "attempts"} and bins["attempts"] == 1 and meta["ttl"] > 3000
        assert bins["fireTS"] == message.envelope.fire_ts
        message.ack()
        _, _, bins = store.client.get(store._ctx.data_key(message.ref))
        assert context.TOMBSTONE in bins and "fireTS" not in bins


@contextmanager
def _feed_and_subscription(store: AerospikeStore) -> Iterator[Ignis]:
    """An Ignis on `store` with topic `feed` and its subscription `all` (from the earliest message)."""
    with Ignis(store) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=1, retentionSeconds=3600))
        ignis.apply(QueueSpec.build(name="all", handlerType="all", shards=1,
                                    subscribe={"topic": "feed", "start": "earliest"}))
        yield ignis


def _owed(store: AerospikeStore) -> dict:
    deferred = store._shared.deferred
    assert deferred is not None
    return deferred.pending


def test_subscription_claims_acked_within_the_delay_write_only_their_tombstones(server: EmulatedServer, make) -> None:
    """A claim of a subscription is the cursor's move and the topic's read; its claim records are owed
    (claim_write_delay_ms), and an ack within the delay writes the slots' tombstones in their place: one write per
    message, as a queue's claim and ack, not two. The tombstones expire with the messages, as the claim records
    would have."""
    store = make(f"{URL}&claim_write_delay_ms=3000")
    with _feed_and_subscription(store) as ignis:
        ignis.topic("feed").publish_many([b"a", b"b", b"c"], subject="s")
        ignis.topic("feed").publish(b"d", subject="s")
        queue = ignis.queue("all")

        def writes_since(before: dict[str, int]) -> dict[str, int]:
            return {method: n - before.get(method, 0) for method, n in server.calls.items()
                    if n != before.get(method, 0) and method in ("put", "operate", "batch_operate", "batch_write")}

        before = dict(server.calls)
        messages = queue.fire_many(3)
        assert [m.payload for m in messages] == [b"a", b"b", b"c"]
        assert writes_since(before) == {"operate": 1}  # (the cursor's move: no claim record written)
        assert sorted(_owed(store)) == sorted(store._ctx.data_key(m.ref) for m in messages)
        for key in _owed(store):
            with pytest.raises(ex.RecordNotFound):
                store.client.get(key)
        before = dict(server.calls)
        queue.ack(messages)
        assert sum(writes_since(before).values()) == 1  # (one batch of tombstones)
        lone = queue.fire()
        assert lone is not None and lone.payload == b"d"
        before = dict(server.calls)
        lone.ack()
        assert writes_since(before) == {"operate": 1}
        assert not _owed(store)
        for m in [*messages, lone]:
            _, meta, bins = store.client.get(store._ctx.data_key(m.ref))
            assert set(bins) == {context.TOMBSTONE} and meta["ttl"] > 3000
        assert store.settled([m.ref for m in [*messages, lone]]) == [True] * 4
        assert queue.fire() is None


def test_an_owed_claim_record_is_written_before_whatever_reads_or_moves_it_and_at_close(server: EmulatedServer,
                                                                                      make) -> None:
    """A nack moves the claimed message (a fenced move that checks the claim record's fireTS), a read joins the
    claim record: each has the owed record written first. A store's close writes what it still owes: a consumer
    that holds a message when its process stops cleanly is not left to the sweeper's write deadline."""
    store = make(f"{URL}&claim_write_delay_ms=3000")
    with _feed_and_subscription(store) as ignis:
        ignis.topic("feed").publish_many([b"a", b"b", b"c"], subject="s")
        queue = ignis.queue("all")
        first, second, third = queue.fire_many(3)
        [joined] = store.read([second.ref])
        assert joined is not None and joined.attempts == 1 and joined.fire_ts == second.envelope.fire_ts
        first.nack(delay=0)
        deadline, again = time.monotonic() + 10, None
        while again is None and time.monotonic() < deadline:  # (moved back by the queue's delay mover)
            again = queue.fire()
            time.sleep(0.02)
        assert again is not None and again.payload == b"a" and again.attempts == 2
        again.ack()
        second.ack()
        assert list(_owed(store)) == [store._ctx.data_key(third.ref)]
    store.close()
    other = make()
    _, _, bins = other.client.get(other._ctx.data_key(third.ref))
    assert set(bins) == {"fireTS", "attempts"} and bins["attempts"] == 1


def test_claims_of_slots_a_seek_went_back_over_write_their_records_at_once(server: EmulatedServer, make) -> None:
    """After a seek back, the slots up to where the cursor was hold the acks' tombstones of the first pass: a claim
    of them writes its records at once (replacing the tombstones), since a slot with a tombstone reads as acked to
    the sweeper, and a consumer that died with such a claim owed would lose the message. Past that mark, owed."""
    store = make(f"{URL}&claim_write_delay_ms=3000")
    with _feed_and_subscription(store) as ignis:
        start = now_ms() - 1000
        ignis.topic("feed").publish_many([b"a", b"b"], subject="s")
        queue = ignis.queue("all")
        queue.ack(queue.fire_many(2))
        ignis.topic("feed").publish(b"c", subject="s")
        ignis.seek("all", start)
        replayed = queue.fire_many(2)
        assert [m.payload for m in replayed] == [b"a", b"b"] and not _owed(store)
        for m in replayed:
            _, _, bins = store.client.get(store._ctx.data_key(m.ref))
            assert set(bins) == {"fireTS", "attempts"}
        new = queue.fire()
        assert new is not None and new.payload == b"c"
        assert list(_owed(store)) == [store._ctx.data_key(new.ref)]


def test_an_owed_claim_whose_ack_fails_is_still_owed(server: EmulatedServer, make) -> None:
    """The ack's tombstone write fails (the store is down): the ack raises, and the claim stays owed, to be written
    once the store is back (then swept and delivered again, as an unacked claim is), not forgotten."""
    store = make(f"{URL}&claim_write_delay_ms=3000&retries=0")
    with _feed_and_subscription(store) as ignis:
        ignis.topic("feed").publish(b"a", subject="s")
        message = ignis.queue("all").fire()
        assert message is not None
        server.fail_next("operate", ex.TimeoutError)
        with pytest.raises(StoreError):
            message.ack()
        assert list(_owed(store)) == [store._ctx.data_key(message.ref)]


def test_owed_claim_records_wait_out_an_outage_and_are_written_when_the_store_is_back(
        server: EmulatedServer, make, caplog: pytest.LogCaptureFixture) -> None:
    """The connection's writer thread backs off while the store is down (one WARNING for the outage, not a line per
    try), keeps what it owes, and writes it once the store answers again."""
    store = make(f"{URL}&claim_write_delay_ms=20&retries=0")
    with _feed_and_subscription(store) as ignis:
        ignis.topic("feed").publish(b"a", subject="s")
        message = ignis.queue("all").fire()
        assert message is not None
        key = store._ctx.data_key(message.ref)
        with caplog.at_level(logging.WARNING, logger="ignis.store"):
            server.go_down()
            time.sleep(0.5)  # (due after 20 ms: tried, and tried again, while the store is down)
            assert list(_owed(store)) == [key]
            server.come_back()
            deadline = time.monotonic() + 10
            while _owed(store) and time.monotonic() < deadline:
                time.sleep(0.02)
        assert not _owed(store)
        _, _, bins = store.client.get(key)
        assert set(bins) == {"fireTS", "attempts"}
        outage_lines = [r for r in caplog.records if "subscription claim records" in r.getMessage()]
        assert len(outage_lines) == 1, [r.getMessage() for r in outage_lines]


def test_a_lone_topic_slot_is_claimed_with_a_read_and_a_write_of_one_record_not_batches_of_one(
        server: EmulatedServer, make) -> None:
    """A subscription that keeps up claims a message at a time (1,000 msg/s): its topic record is read, and its claim
    record written, by single-record calls (a batch of one costs the client more: topics.Topics._read_one). A claim
    of several slots, or one with a filter (whose expression the server applies to the batch), reads in a batch.
    (Claim records written at once here: claim_write_delay_ms=0.)"""
    store = make(f"{URL}&claim_write_delay_ms=0")

    def calls_since(before: dict[str, int]) -> dict[str, int]:
        return {method: n - before.get(method, 0) for method, n in server.calls.items() if n != before.get(method, 0)}

    with Ignis(store) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=1, retentionSeconds=3600))
        for name, subject_filter in (("all", "#"), ("some", "s/+")):
            ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=1,
                                        subscribe={"topic": "feed", "filter": subject_filter, "start": "earliest"}))
        ignis.topic("feed").publish(b"one", subject="s/a")
        cursor = names.cursor_of("all", "feed")
        before = dict(server.calls)
        [claimed] = store.claim_cursor(cursor, 0, 10, now_ms(), None).claimed
        assert claimed.envelope is not None and claimed.envelope.payload == b"one"
        assert calls_since(before) == {"operate": 2, "get": 1}  # (the cursor's move, the claim record; the message)
        _, meta, bins = store.client.get(store._ctx.data_key(claimed.ref))
        assert set(bins) == {"fireTS", "attempts"} and bins["attempts"] == 1 and meta["ttl"] > 3000

        ignis.topic("feed").publish_many([b"two", b"three"], subject="s/b")
        for _ in range(20):  # (past the slots the first publish reserved and left: awaited, nothing to claim)
            before = dict(server.calls)
            claimed = [c for c in store.claim_cursor(cursor, 0, 10, now_ms(), None).claimed if c.envelope is not None]
            if claimed:
                break
        assert [c.envelope.payload for c in claimed] == [b"two", b"three"]  # type: ignore[union-attr]
        used = calls_since(before)
        assert used.get("batch_read") == 1 and "get" not in used and used.get("operate") == 1  # (the move alone)

        before = dict(server.calls)
        [claimed] = store.claim_cursor(names.cursor_of("some", "feed"), 0, 1, now_ms(), SubjectFilter("s/+")).claimed
        assert claimed.envelope is not None and claimed.envelope.payload == b"one"
        used = calls_since(before)
        assert used.get("batch_read") == 1 and "get" not in used


def test_a_topic_slot_never_written_after_a_live_one_is_a_hole_not_a_loss_to_retention(
        server: EmulatedServer, make, caplog: pytest.LogCaptureFixture) -> None:
    """A topic's records leave it oldest first (TTL, the byte bound's trim), so a missing record after a live one
    was never written: a publish that failed after its reservation, whose seal failed too (an outage; the
    publisher was told). The subscription passes it, and neither counts nor logs it lost to retention (it did in
    the 3-node fault run); one missing before every live record of the claim still counts as expired."""
    store = make()
    with Ignis(store) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=1, retentionSeconds=3600))
        ignis.apply(QueueSpec.build(name="all", handlerType="all", shards=1,
                                    subscribe={"topic": "feed", "start": "earliest"}))
        first = store.reserve("feed", 0, 4)
        old = now_ms() - 2 * store.write_grace_ms  # (published long enough ago: nothing of theirs still on its way)
        for slot in (first + 1, first + 3):  # slot `first` missing before them all, `first + 2` between them
            env = Envelope(b"m%d" % slot, f"id{slot}", old, subject="s")
            assert store.load_reserved_envelope(SlotRef("feed", 0, slot), env, 3600)
        with caplog.at_level(logging.WARNING, logger="ignis.topics"):
            got = ignis.queue("all").fire_many(10)
        assert sorted(m.payload for m in got) == [b"m%d" % (first + 1), b"m%d" % (first + 3)]
        stats = ignis.queue("all").stats()
        assert stats.expired == 1 and stats.depth == 0
        assert [r.getMessage().split(" lost ")[1][:12] for r in caplog.records if " lost " in r.getMessage()] == \
            ["1 message(s)"]


def test_an_awaited_topic_slot_given_up_after_a_live_one_is_a_hole_not_a_loss_to_retention(
        server: EmulatedServer, make, caplog: pytest.LogCaptureFixture) -> None:
    """A publisher SIGKILLed after reserving its slots leaves them never written. A subscription that claimed one
    awaits it, then seals it past the write deadline: with a live record before it, far from its own expiry, the
    seal says never written (a hole, nothing lost: no expired count, no lost-to-retention warning; the kill test on a
    real server raised both). Without one, nothing tells it apart from a message gone: counted lost, as before."""
    store = make(URL + "&retries=0&total_timeout_ms=200")  # (a short write deadline: the test waits it out)
    with Ignis(store) as ignis:
        for topic in ("feed", "bare"):
            ignis.apply(TopicSpec.build(name=topic, shards=1, retentionSeconds=3600))
            ignis.apply(QueueSpec.build(name=f"{topic}-all", handlerType="all", shards=1,
                                        subscribe={"topic": topic, "start": "earliest"}))
        first = store.reserve("feed", 0, 3)  # `first` and `first + 2` written now, `first + 1` never
        for slot in (first, first + 2):
            assert store.load_reserved_envelope(SlotRef("feed", 0, slot), Envelope(b"m", f"id{slot}", now_ms(),
                                                                                   subject="s"), 3600)
        bare = store.reserve("bare", 0, 1)  # never written, and nothing before it
        with caplog.at_level(logging.WARNING):
            for name, want in (("feed-all", 2), ("bare-all", 0)):
                q, got = ignis.queue(name), 0
                deadline = time.monotonic() + 3 * store.write_grace_ms / 1000 + 2
                while True:  # (at least one claim: the cursor takes the missing slot, then awaits it)
                    for m in q.fire_many(10, timeout=0.2):
                        got += 1
                        m.ack()
                    waiting = q.main.awaiting() + (q.cursor.awaiting() if q.cursor else 0)
                    if time.monotonic() > deadline or (not waiting and got >= want):
                        break
                assert got == want and q.cursor is not None and q.cursor.awaiting() == 0, (name, got)
        assert ignis.queue("feed-all").stats().expired == 0
        assert ignis.queue("bare-all").stats().expired == 1
        lost = [r.getMessage() for r in caplog.records if " lost " in r.getMessage()]
        assert len(lost) == 1 and "bare-all" in lost[0], lost
        assert bare >= 1


def test_data_keys_in_one_step_are_the_data_keys_one_by_one(make) -> None:
    """AerospikeContext.data_keys spells names.data_key's format in a comprehension (it runs per message)."""
    ctx = make()._ctx
    refs = [SlotRef("orders", 3, 17), SlotRef("orders~sub", 0, 0), SlotRef("a_SHARD_b", 12, 10**9)]
    assert ctx.data_keys(refs) == [ctx.data_key(ref) for ref in refs]
    assert ctx.data_keys(refs, "topic") == [ctx.data_key(SlotRef("topic", ref.shard, ref.slot)) for ref in refs]
    assert names.parse_data_key(ctx.data_keys(refs[:1])[0][2]) == ("orders", 3, 17)


def test_an_envelope_reads_alike_from_a_batch_answer_a_record_answer_and_an_odd_one() -> None:
    """AerospikeContext.envelope reads a batch's answer (every bin asked, a missing one as None) in one step, a
    record's answer (missing bins left out) bin by bin, and an answer with as many bins but not these (another
    tool's record) bin by bin too: the same envelope from the first two, an unreadable one from a stranger."""
    sent = Envelope(b"body", "id-1", 1_700_000_000_000, headers={"h": "v"}, fire_ts=1_700_000_000_500, attempts=2,
                    subject="a/b")
    record = sent.to_bins()
    batch = dict.fromkeys(context.ENVELOPE_ORDER) | record | {context.PURGED: None}
    assert len(batch) > len(record)
    from_batch, from_record = context.AerospikeContext.envelope(batch), context.AerospikeContext.envelope(record)
    for got in (from_batch, from_record):
        assert (got.payload, got.msg_id, got.loaded_at, got.headers, got.subject, got.fire_ts, got.attempts) == \
            (b"body", "id-1", 1_700_000_000_000, {"h": "v"}, "a/b", sent.fire_ts, 2)
        assert got.codec == CODEC_BYTES
    stranger = {f"bin{i}": i for i in range(len(context.ENVELOPE_ORDER) + 1)}
    odd = context.AerospikeContext.envelope(stranger, where="k")
    assert odd.codec == CODEC_UNREADABLE and "payload" in odd.headers[PROBLEM_HEADER], odd.headers
