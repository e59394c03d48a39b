"""Test plumbing for the Aerospike backend: the emulated backend of the contract suite and the clean-up
of a real-server run. Imported by tests/conftest.py only when an aerospike backend is selected."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from support.aerospike_emulator import EmulatedServer

from ignis import names
from ignis.storage.aerospike import context

AEROSPIKE_ENV = "IGNIS_TEST_AEROSPIKE"
AEROSPIKE_SKIP = f"aerospike contract run skipped: set {AEROSPIKE_ENV}=host:port[/namespace] to run it against a server"
EMULATOR_IN_PROCESS = ("the Aerospike emulator lives in this process; cross-process tests need a real server "
                       "(set IGNIS_TEST_AEROSPIKE=host:port[/namespace])")
# clientIds the tests use besides c{run}. Their magazine sets ({clientId}_data_set, _meta_set) carry no
# run id (DESIGN §3: magazines belong to the client, in every farm), so a real-server run empties them
# before and after each test: a message left by an earlier test must not be counted by the next one.
OTHER_CLIENTS = ("other-app", "other", "billing", "alpha", "shop", "newcomer")


def emulated_backend(request: pytest.FixtureRequest, run: str, make: Callable[..., Any]) -> Iterator[Any]:
    """A fresh emulated cluster per test; every store opened in this process during the test reaches it."""
    if request.module.__name__.endswith(("test_processes", "test_ordered_processes")):
        pytest.skip(EMULATOR_IN_PROCESS)
    server = EmulatedServer()
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(context, "client_factory", server.client)
    yield make("aerospike-emu", f"aerospike://emulator:3000/test?farm=t{run}&client=c{run}", server)


def run_sets(farm: str, client: str, registered: Iterable[str] = ()) -> list[str]:
    sets = [names.system_set(farm)]
    clients = sorted({client, *OTHER_CLIENTS, *registered})
    for c in clients:
        sets += [names.queue_set(farm, c), names.topic_set(farm, c), names.data_set(c), names.meta_set(c)]
    return sets


# The info command's own timeout (the client's default is 1 s): a server busy deleting millions of records of an
# earlier truncate (a benchmark's) answered later than that, and every real-server test of a file errored.
TRUNCATE_POLICY = {"timeout": 15_000}


def _client_for(url: str) -> tuple[Any, str, dict[str, str]]:
    import aerospike

    parts = urlsplit(url)
    hosts = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in parts.netloc.split(",")]
    return aerospike.client({"hosts": hosts}), parts.path.strip("/"), dict(parse_qsl(parts.query))


def empty_shared_sets(url: str) -> None:
    """Empty the magazine sets of OTHER_CLIENTS (shared by every run) before a real-server test."""
    client, namespace, _ = _client_for(url)
    try:
        for c in OTHER_CLIENTS:
            client.truncate(namespace, names.data_set(c), 0, TRUNCATE_POLICY)
            client.truncate(namespace, names.meta_set(c), 0, TRUNCATE_POLICY)
    finally:
        client.close()


def clean_up_run(url: str, run: str) -> None:
    """Truncate every set a real-server test run wrote (their names carry the run id) and drop its indexes."""
    import aerospike

    client, namespace, query = _client_for(url)
    try:
        try:  # every client this run registered in its farm (DESIGN §3 client registry)
            _, _, bins = client.get((namespace, names.system_set(query["farm"]), "clients"))
            registered = list((bins or {}).get("clients") or {})
        except aerospike.exception.RecordNotFound:
            registered = []
        for set_name in run_sets(query["farm"], query["client"], registered):
            client.truncate(namespace, set_name, 0, TRUNCATE_POLICY)
        for c in {query["client"], *OTHER_CLIENTS, *registered}:
            with contextlib.suppress(aerospike.exception.AerospikeError):  # never created for this client
                client.index_remove(namespace, names.active_index(query["farm"], c))
            with contextlib.suppress(aerospike.exception.AerospikeError):  # the delay index (delayed messages)
                client.index_remove(namespace, f"{names.data_set(c)}_due")
    finally:
        client.close()


def lmdb_or_real_server_url(param: str, tmp_path: Any) -> Iterator[str]:
    """The body of a fixture parametrized over ["lmdb", "aerospike"] for tests that share a store across
    processes (the in-process emulator cannot): an lmdb URL, or a fresh farm/client on the real server
    named by IGNIS_TEST_AEROSPIKE (skipped without one), cleaned up afterwards."""
    import os
    import uuid

    if param == "lmdb":
        yield f"lmdb://{tmp_path}/store?durability=fast"
        return
    if param == "lmdb-defaults":  # durability=fsync, cursors checkpointed (ignis.storage.lmdb.checkpoints)
        yield f"lmdb://{tmp_path}/store"
        return
    target = os.environ.get(AEROSPIKE_ENV)
    if not target:
        pytest.skip(AEROSPIKE_SKIP)
    run = uuid.uuid4().hex[:8]
    hostport, _, namespace = target.partition("/")
    url = f"aerospike://{hostport}/{namespace or 'test'}?farm=t{run}&client=c{run}"
    yield url
    clean_up_run(url, run)
