"""Records IgnisMQ did not write (issue: Aerospike faults, part 6): a record that does not decode as an
envelope — a bin of the wrong type, a missing payload or id, an unknown codec, bytes that are no record at
all — never reaches a handler as something else, never blocks the claims around it, and goes to the
sideline as `unreadable` with what was wrong (the ignis-unreadable header). Forged with the raw client on
Aerospike (emulator, and a real server with IGNIS_TEST_AEROSPIKE) and through the lmdb store's internals."""

from __future__ import annotations

import json
import threading
from typing import Any

from ignis import Consumer, Ignis
from ignis.envelope import CODEC_UNREADABLE, PROBLEM_HEADER, now_ms
from ignis.storage import SlotRef

GOOD = {"payload": b"ok", "codec": "bytes"}


def _forge(store: Any, ref: SlotRef, change: dict[str, Any] | bytes) -> None:
    """Overwrite a stored record: its bins changed as given (Aerospike; a value None removes the bin), or, on
    lmdb, the given bytes for the whole record (or its msgpack extras)."""
    if hasattr(store, "client"):
        key = store._ctx.data_key(ref)
        bins = dict(store.client.get(key)[2])
        bins.update(change)
        store.client.put(key, {k: v for k, v in bins.items() if v is not None},
                         policy={"exists": 3, "ttl": -2})  # replace: removed bins are gone
        return
    with store._ctx.env.env.begin(write=True) as txn:
        txn.put(store._ctx.data_key(ref), change, db=store._ctx.data)


def _lmdb_record(payload: bytes, msg_id: str, codec_id: int = 0, extras: bytes | None = None) -> bytes:
    from ignis.storage.lmdb.records import _DATA, _FORMAT, _HAS_EXTRAS, _PAYLOAD_LEN

    head = _DATA.pack(0, 0, 0, _FORMAT, now_ms(), codec_id, _HAS_EXTRAS if extras is not None else 0, len(msg_id))
    return head + msg_id.encode() + _PAYLOAD_LEN.pack(len(payload)) + payload + (extras or b"")


def _forged_queue(backend: Any, ignis: Ignis, make_queue: Any) -> tuple[Any, list[str], dict[int, str]]:
    """A 1-shard queue of 7 messages; slots 1, 2, 3, 5 and 6 overwritten with records that are not
    envelopes. Returns the queue, the ids of the intact ones, and the forged slots with what each lacks."""
    q = make_queue("forged", shards=1, maxDeliveries=3)
    refs = [q.publish(GOOD["payload"] + bytes([i]), key="k") for i in range(7)]
    store = ignis.store
    if backend.name == "lmdb":
        forged = {1: (b"\x00\x01\x02", "does not decode"),
                  2: (_lmdb_record(b"x", "id-2", codec_id=9), "does not decode"),
                  3: (_lmdb_record(b"x", "id-3", extras=b"\xc1\xc1garbage"), "does not decode"),
                  5: (_lmdb_record(b"x", "id-5", extras=b"\x81\xa7headers\x05"), "headers"),
                  6: (_lmdb_record(b"x", ""), "does not decode")}
    else:
        forged = {1: ({"payload": 12345}, "bin payload is int"),
                  2: ({"attempts": "lots"}, "bin attempts is str"),
                  3: ({"msgId": None, "loadedAt": "yesterday"}, "bin msgId is missing"),
                  5: ({"codec": "yaml"}, "bin codec is 'yaml'"),
                  6: ({"payload": None}, "bin payload is missing")}
    for slot, (change, _) in forged.items():
        _forge(store, refs[slot - 1].ref, change)
    intact = [refs[i].id for i in (3, 6)]  # slots 4 and 7
    return q, intact, {slot: problem for slot, (_, problem) in forged.items()}


def _sidelined(q: Any) -> list[Any]:
    return [env for _, env in q.sideline.browse(100)]


def test_a_consumer_gets_only_the_messages_and_the_rest_is_sidelined_as_unreadable(backend: Any, ignis: Ignis,
                                                                                   make_queue: Any) -> None:
    q, intact, problems = _forged_queue(backend, ignis, make_queue)
    handled: list[Any] = []
    lock = threading.Lock()
    consumer = Consumer(ignis, queues=["forged"], poll_interval=0.02)

    @consumer.handler("forged")
    def handle(message: Any) -> None:
        with lock:
            handled.append((message.id, message.payload))

    assert consumer.drain(timeout=30)
    assert sorted(i for i, _ in handled) == sorted(intact)
    assert all(isinstance(p, bytes) and p.startswith(b"ok") for _, p in handled)
    side = _sidelined(q)
    assert len(side) == len(problems) and {e.reason for e in side} == {"unreadable"}
    assert {e.codec for e in side} == {CODEC_UNREADABLE}
    found = sorted(e.headers[PROBLEM_HEADER] for e in side)
    for expected in problems.values():
        assert any(expected in text for text in found), (expected, found)
    for env in side:  # the record as it was found, for a person to look at
        described = json.loads(env.payload)
        assert described["problem"] == env.headers[PROBLEM_HEADER] and "bins" in described
    assert q.stats().depth == 0 and q.main.pending() == 0


def test_the_pull_api_never_returns_an_unreadable_record_and_the_shovel_dead_letters_it(
        backend: Any, ignis: Ignis, make_queue: Any) -> None:
    q, intact, problems = _forged_queue(backend, ignis, make_queue)
    got = []
    while batch := q.fire_many(3):  # small batches: the bad records sit between the good ones
        got += batch
    assert sorted(m.id for m in got) == sorted(intact)
    assert len(_sidelined(q)) == len(problems)
    from ignis_workers.shovel import Shovel

    epoch = ignis.store.next_epoch()
    report = Shovel(ignis.store, epoch_source=lambda: epoch).shovel_queue(ignis.client_id, "forged")
    assert (report.moved, report.dead_lettered) == (0, len(problems))  # never back to main
    assert q.fire_many(10) == [] and len(q.dead.browse(100)) == len(problems)


def test_the_sweeper_moves_unreadable_claims_to_the_sideline(backend: Any, ignis: Ignis, make_queue: Any) -> None:
    q, intact, problems = _forged_queue(backend, ignis, make_queue)
    ignis.store.claim("forged", 0, 7, now_ms() - 10**9)  # claimed long ago by a consumer that died
    from ignis_workers.sweeper import Sweeper

    epoch = ignis.store.next_epoch()
    report = Sweeper(ignis.store, epoch_source=lambda: epoch, threads=2).sweep_queue(ignis.client_id, "forged")
    assert report.ok and report.main.moved == 7  # the forged ones, and the two intact ones long abandoned
    side = _sidelined(q)
    assert sorted(e.msg_id for e in side if e.codec != CODEC_UNREADABLE) == sorted(intact)
    assert len([e for e in side if e.codec == CODEC_UNREADABLE]) == len(problems)
