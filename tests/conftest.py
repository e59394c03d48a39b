"""Shared fixtures. The contract suite runs once per backend: lmdb always, aerospike when
IGNIS_TEST_AEROSPIKE=host:port[/namespace] points at a server (skipped otherwise, and said so)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.aerospike_emulator import EmulatedServer
from support.aerospike_support import AEROSPIKE_ENV, AEROSPIKE_SKIP

from ignis import Ignis, QueueSpec
from ignis.storage import Storage, open_store
from ignis.storage.aerospike import context


@dataclass(frozen=True)
class Backend:
    """How to reach one store, from this process or from a child process."""

    name: str
    url: str
    emulator: Any = field(default=None, compare=False)  # the EmulatedServer behind "aerospike-emu"

    def open(self, **kwargs: Any) -> Storage:
        return open_store(self.url, **kwargs)

    def ignis(self, **kwargs: Any) -> Ignis:
        return Ignis(self.url, **kwargs)


@pytest.fixture(params=["lmdb", "aerospike-emu", "aerospike"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "lmdb":
        yield Backend("lmdb", f"lmdb://{tmp_path}/store?durability=fast")
        return
    run = uuid.uuid4().hex[:8]  # a unique set prefix per test, so runs never see each other's records
    if request.param == "aerospike-emu":
        from support.aerospike_support import emulated_backend

        yield from emulated_backend(request, run, Backend)
        return
    target = os.environ.get(AEROSPIKE_ENV)
    if not target:
        pytest.skip(AEROSPIKE_SKIP)
    hostport, _, namespace = target.partition("/")
    from support.aerospike_support import clean_up_run, empty_shared_sets

    backend = Backend("aerospike", f"aerospike://{hostport}/{namespace or 'test'}?farm=t{run}&client=c{run}")
    empty_shared_sets(backend.url)
    yield backend
    clean_up_run(backend.url, run)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> EmulatedServer:
    """The Aerospike emulator, patched in as the client every AerospikeStore opens (a module may override)."""
    server = EmulatedServer()
    monkeypatch.setattr(context, "client_factory", server.client)
    return server


@pytest.fixture
def store(backend: Backend) -> Iterator[Storage]:
    s = backend.open()
    yield s
    s.close()


@pytest.fixture
def ignis(backend: Backend) -> Iterator[Ignis]:
    client = backend.ignis()
    yield client
    client.close()


@pytest.fixture
def make_queue(ignis: Ignis) -> Callable[..., Any]:
    """Declare a queue (defaults: 4 shards) and return its handle."""

    def make(name: str = "orders", **fields: Any):
        fields.setdefault("handlerType", name)
        fields.setdefault("shards", 4)
        ignis.apply(QueueSpec.build(name=name, **fields))
        return ignis.queue(name)

    return make


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not os.environ.get(AEROSPIKE_ENV):
        terminalreporter.write_line(f"NOTE: {AEROSPIKE_SKIP}", yellow=True)
