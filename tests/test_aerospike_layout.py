"""The exact DESIGN §3 layout, read back through the raw Aerospike client: set names, keys, bin names and
types, TTLs, the secondary index. Runs on the emulator always, and on a real server when
IGNIS_TEST_AEROSPIKE=host:port[/namespace] is set."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.aerospike_emulator import EmulatedServer
from support.aerospike_support import AEROSPIKE_ENV, AEROSPIKE_SKIP, clean_up_run

from ignis import QueueSpec
from ignis.envelope import Envelope, now_ms
from ignis.errors import InvalidInputError
from ignis.storage import LeaseRecord, SlotRef, open_store
from ignis.storage.aerospike import AerospikeStore, context

QUEUE_BIN_TYPES = {
    "handlerType": str, "shards": int, "queueExpiry": int, "messageExpiry": int, "concurrency": int,
    "shovelConcur": int, "shovelInterval": int, "createdAt": int, "active": str, "sweepPointers": dict,
    "sidelineSweep": dict, "sweptCounter": int, "sidelineSwept": int, "sweepDuration": int, "maxBatchSize": int,
    "maxWaitTime": int, "sweepEpoch": int,
}


@pytest.fixture(params=["emulator", "server"])
def target(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[AerospikeStore, str]]:
    run = uuid.uuid4().hex[:8]
    if request.param == "emulator":
        monkeypatch.setattr(context, "client_factory", EmulatedServer().client)
        url = f"aerospike://emulator:3000/test?farm=f{run}&client=c{run}"
    else:
        given = os.environ.get(AEROSPIKE_ENV)
        if not given:
            pytest.skip(AEROSPIKE_SKIP)
        hostport, _, namespace = given.partition("/")
        url = f"aerospike://{hostport}/{namespace or 'test'}?farm=f{run}&client=c{run}"
    store = open_store(url)
    assert isinstance(store, AerospikeStore)
    yield store, run
    store.close()
    if request.param == "server":
        clean_up_run(url, run)


def raw(store: AerospikeStore, set_name: str, key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    _, meta, bins = store.client.get((store._ns, set_name, key))
    return meta, bins


def test_queue_record_set_key_bins_types_and_ttl(target) -> None:
    store, run = target
    spec = QueueSpec.build(name="orders", handlerType="orders.v1", shards=8)
    store.apply_queue("orders", spec.config_bins(), spec.record_ttl_seconds)
    set_name = f"f{run}_c{run}_ignis_queues"
    meta, bins = raw(store, set_name, "orders")
    assert {name: type(bins.get(name)) for name in QUEUE_BIN_TYPES} == QUEUE_BIN_TYPES  # more bins are allowed
    assert bins["active"] == "true" and bins["handlerType"] == "orders.v1" and bins["shards"] == 8
    assert bins["sweepPointers"] == {} and bins["sidelineSweep"] == {}
    assert all(len(name) <= 15 for name in bins)
    assert spec.record_ttl_seconds - 5 <= meta["ttl"] <= spec.record_ttl_seconds
    assert spec.record_ttl_seconds == bins["queueExpiry"] * 2

    # The key is stored (sendKey): a scan shows it, as aql would.
    query = store.client.query(store._ns, set_name)
    assert [key[2] for key, _, _ in query.results()] == ["orders"]

    # Runtime updates keep the TTL ("don't update"): after a second it has run down, not been reset.
    time.sleep(1.1)
    store.advance_sweep("orders", "main", store.next_epoch(), {2: 5}, 3)
    store.set_queue_active("orders", False)
    later, bins = raw(store, set_name, "orders")
    assert later["ttl"] <= meta["ttl"] - 1
    assert bins["sweepPointers"] == {"SHARD_2": 5} and bins["sweptCounter"] == 3 and bins["active"] == "false"


def test_active_index_exists_as_a_string_index(target) -> None:
    store, run = target
    answers = store.client.info_all(f"sindex-list:ns={store._ns}")
    text = " ".join(str(answer[1]) for answer in answers.values()).lower()
    entry = next(e for e in text.replace("\t", ";").split(";") if f"indexname=f{run}_c{run}_ignis_queues_active" in e)
    assert f"set=f{run}_c{run}_ignis_queues" in entry
    assert ("bin=active" in entry or "bins=active" in entry) and ("type=string" in entry or "type=text" in entry)
    store.ensure_index()  # "already exists" is fine


def test_data_and_meta_records(target) -> None:
    store, run = target
    envelope = Envelope(b"\x00payload", "id-1", now_ms(), headers={"h": "v"}, key="k")
    assert store.load("orders", [(3, envelope)], 600) == [SlotRef("orders", 3, 1)]
    data_set, meta_set = f"c{run}_data_set", f"c{run}_meta_set"
    meta, bins = raw(store, data_set, "orders_SHARD_3_1")
    assert bins == {**envelope.to_bins(), "payload": bins["payload"]} and bytes(bins["payload"]) == b"\x00payload"
    assert "fireTS" not in bins and bins["attempts"] == 0
    assert 595 <= meta["ttl"] <= 600
    pointer_meta, pointers = raw(store, meta_set, "orders_SHARD_3_METADATA")
    assert pointers == {"LOAD_POINTER": 1, "FIRE_POINTER": 0}
    assert pointer_meta["ttl"] in (-1, 0xFFFFFFFF)  # shard pointers never expire

    at = now_ms()
    store.claim("orders", 3, 1, at)
    stamped_meta, stamped = raw(store, data_set, "orders_SHARD_3_1")
    assert stamped["fireTS"] == at and stamped["attempts"] == 1 and stamped_meta["ttl"] <= meta["ttl"]
    pointers = raw(store, meta_set, "orders_SHARD_3_METADATA")[1]
    # The claim leaves its token, so a claimer whose answer was lost can tell later what it took.
    token = pointers.pop("lastClaim")
    assert pointers == {"LOAD_POINTER": 1, "FIRE_POINTER": 1} and isinstance(token, str) and token


def test_system_records(target) -> None:
    store, run = target
    system_set = f"f{run}_ignis_system"
    epoch = store.next_epoch()
    assert raw(store, system_set, "sweeperEpoch")[1] == {"epoch": epoch}
    store.register_client("billing")
    clients = raw(store, system_set, "clients")[1]["clients"]
    assert isinstance(clients, dict) and list(clients) == ["billing"] and isinstance(clients["billing"], int)
    held = store.replace_lease("sweeper", LeaseRecord("pod-a", 1, 2, 15.0), 0)
    meta, bins = raw(store, system_set, "lease:sweeper")
    assert held is not None and held.version == meta["gen"] == 1
    assert bins == {"holder": "pod-a", "acquired_ms": 1, "renewed_ms": 2, "duration_s": 15.0, "transitions": 0}


def test_payload_near_the_record_limit(target) -> None:
    store, _ = target
    limit = store._shared.settings.max_record_bytes
    fits = Envelope(b"x" * (limit - 4096), "big", now_ms())
    ref = store.load("big", [(0, fits)], 60)[0]
    assert store.read([ref])[0].payload == fits.payload
    with pytest.raises(InvalidInputError, match=r"accepts at most \d+ bytes per record"):
        store.load("big", [(0, Envelope(b"x" * limit, "too-big", now_ms()))], 60)
    assert store.pointers("big", 1)[0].load == 1  # refused before any write: no hole


@pytest.mark.parametrize(("farm", "client", "problem"), [
    ("bad_farm", "c", "farmId"), ("f", "has space", "clientId"), ("f", "c" * 60, "set name"),
])
def test_hostile_ids_are_refused_clearly(target, farm: str, client: str, problem: str) -> None:
    store, _ = target
    with pytest.raises(InvalidInputError, match=problem):
        AerospikeStore(store._shared.settings, farm_id=farm, client_id=client, _shared=store._shared)


def test_hostile_queue_config_and_names(target) -> None:
    store, _ = target
    with pytest.raises(InvalidInputError, match="longer than 15"):
        store.apply_queue("orders", {"aVeryLongBinName16": 1}, 60)
    with pytest.raises(InvalidInputError, match="runtime bins"):
        store.apply_queue("orders", {"createdAt": 1}, 60)
    name = "ordérs-✓-\"quoted\""  # the store takes any key; QueueSpec is what restricts queue names
    store.apply_queue(name, {"handlerType": "h"}, 60)
    assert store.get_queue(name).bins["handlerType"] == "h"
