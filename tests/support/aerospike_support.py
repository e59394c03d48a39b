"""Test plumbing for the Aerospike backend: the emulated backend of the contract suite and the clean-up
of a real-server run. Imported by tests/conftest.py only when an aerospike backend is selected."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from support.aerospike_emulator import EmulatedServer

from ignis import names
from ignis.storage import aerospike_store

AEROSPIKE_ENV = "IGNIS_TEST_AEROSPIKE"
AEROSPIKE_SKIP = f"aerospike contract run skipped: set {AEROSPIKE_ENV}=host:port[/namespace] to run it against a server"
EMULATOR_IN_PROCESS = ("the Aerospike emulator lives in this process; cross-process tests need a real server "
                       "(set IGNIS_TEST_AEROSPIKE=host:port[/namespace])")
OTHER_CLIENTS = ("other-app", "other", "billing", "alpha")  # clientIds the contract tests use besides c{run}


def emulated_backend(request: pytest.FixtureRequest, run: str, make: Callable[..., Any]) -> Iterator[Any]:
    """A fresh emulated cluster per test; every store opened in this process during the test reaches it."""
    if request.module.__name__.endswith("test_processes"):
        pytest.skip(EMULATOR_IN_PROCESS)
    server = EmulatedServer()
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setattr(aerospike_store, "client_factory", server.client)
    yield make("aerospike-emu", f"aerospike://emulator:3000/test?farm=t{run}&client=c{run}", server)


def run_sets(farm: str, client: str) -> list[str]:
    sets = [names.system_set(farm)]
    for c in (client, *OTHER_CLIENTS):
        sets.append(names.queue_set(farm, c))
    sets += [names.data_set(client), names.meta_set(client)]
    return sets


def clean_up_run(url: str, run: str) -> None:
    """Truncate every set a real-server test run wrote (their names carry the run id) and drop its indexes."""
    import aerospike

    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    namespace = parts.path.strip("/")
    hosts = [(h.rpartition(":")[0], int(h.rpartition(":")[2])) for h in parts.netloc.split(",")]
    client = aerospike.client({"hosts": hosts})
    try:
        for set_name in run_sets(query["farm"], query["client"]):
            client.truncate(namespace, set_name, 0)
        for c in (query["client"], *OTHER_CLIENTS):
            with contextlib.suppress(aerospike.exception.AerospikeError):  # never created for this client
                client.index_remove(namespace, names.active_index(query["farm"], c))
    finally:
        client.close()
