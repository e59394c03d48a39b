"""A kopf operator running in-process against kmock's Kubernetes API emulator and an lmdb store."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from ignis_operator.emulation import declare_resources, kube_configuration, start_operator
from ignis_operator.handlers import GROUP, PLURAL, VERSION, OperatorConfig, OperatorContext
from ignis_operator.topics import TOPIC_PLURAL
from ignis_operator.wiring import build_registry
from kmock import KubernetesEmulator
from support.kmock_naming import NamingEmulator

from ignis.errors import StoreUnavailable
from ignis.storage import Storage, open_store

BASE = f"/apis/{GROUP}/{VERSION}"
NAMESPACES = ("ns1", "ns2")


@pytest.fixture
def kmock_options(kmock_options: dict[str, Any]) -> dict[str, Any]:
    """The `kmock` fixture's options (kmock's own fixture) with the emulator that names Events."""
    return {**kmock_options, "cls": NamingEmulator}


class Outage:
    """A switch shared by a store and its per-client views: when down, every call fails as unreachable."""

    def __init__(self) -> None:
        self.down = False


class FlakyStore:
    """A Storage proxy that raises StoreUnavailable while its outage switch is on."""

    def __init__(self, inner: Storage, outage: Outage) -> None:
        self._inner = inner
        self._outage = outage

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._outage.down:
                raise StoreUnavailable(f"store unreachable (test outage) in {name}")
            result = attr(*args, **kwargs)
            return FlakyStore(result, self._outage) if name == "with_client" else result

        return call


@dataclass
class Harness:
    emulator: KubernetesEmulator
    session: aiohttp.ClientSession
    store: Storage
    ctx: OperatorContext
    outage: Outage
    _uids: itertools.count = field(default_factory=lambda: itertools.count(1))

    async def create(self, name: str, namespace: str = "ns1", *, created: str | None = None, **spec: Any
                     ) -> dict[str, Any]:
        spec.setdefault("handlerType", f"{name}.v1")
        uid = f"uid-{next(self._uids)}"
        metadata = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1", "generation": 1,
                    "creationTimestamp": created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue", "metadata": metadata, "spec": spec}
        async with self.session.post(f"{BASE}/namespaces/{namespace}/{PLURAL}", json=body) as resp:
            assert resp.status < 300, await resp.text()
        return body

    async def create_topic(self, name: str, namespace: str = "ns1", *, created: str | None = None, **spec: Any
                           ) -> dict[str, Any]:
        """An IgnisTopic object (spec as given: the emulator runs no CRD defaulting)."""
        uid = f"uid-{next(self._uids)}"
        metadata = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1", "generation": 1,
                    "creationTimestamp": created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisTopic", "metadata": metadata, "spec": spec}
        async with self.session.post(f"{BASE}/namespaces/{namespace}/{TOPIC_PLURAL}", json=body) as resp:
            assert resp.status < 300, await resp.text()
        return body

    async def edit(self, name: str, namespace: str = "ns1", *, plural: str = PLURAL, **spec: Any) -> None:
        generation = int(self.obj(name, namespace, plural=plural)["metadata"].get("generation", 1)) + 1
        patch = {"metadata": {"generation": generation}, "spec": spec}
        async with self.session.patch(f"{BASE}/namespaces/{namespace}/{plural}/{name}", json=patch,
                                      headers={"Content-Type": "application/merge-patch+json"}) as resp:
            assert resp.status < 300, await resp.text()

    async def delete(self, name: str, namespace: str = "ns1", *, plural: str = PLURAL) -> None:
        async with self.session.delete(f"{BASE}/namespaces/{namespace}/{plural}/{name}") as resp:
            assert resp.status < 300, await resp.text()

    def obj(self, name: str, namespace: str = "ns1", *, plural: str = PLURAL) -> dict[str, Any] | None:
        for (resource, ns, nm), obj in self.emulator.objects.items():
            if resource.plural == plural and ns == namespace and nm == name and not obj.deleted:
                return _plain(obj.raw)
        return None

    def condition(self, name: str, namespace: str = "ns1", type_: str = "Ready", *, plural: str = PLURAL
                  ) -> dict[str, Any]:
        obj = self.obj(name, namespace, plural=plural) or {}
        return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})

    def topic(self, name: str, namespace: str = "ns1") -> dict[str, Any] | None:
        return self.obj(name, namespace, plural=TOPIC_PLURAL)

    def topic_condition(self, name: str, namespace: str = "ns1", type_: str = "Ready") -> dict[str, Any]:
        return self.condition(name, namespace, type_, plural=TOPIC_PLURAL)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (resource, _, _), obj in self.emulator.objects.items():
            if resource.plural == "events":
                raw = _plain(obj.raw if not obj.deleted else obj.last.raw)
                if reason is None or raw.get("reason") == reason:
                    found.append(raw)
        return found

    async def until(self, check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            assert time.monotonic() < deadline, f"{what} not met within {timeout}s"
            await asyncio.sleep(0.05)


def _plain(value: Any) -> Any:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def fast_config(**overrides: Any) -> OperatorConfig:
    values = {"figures_interval_seconds": 0.3, "resync_interval_seconds": 0.5, "resync_jitter_seconds": 0.1,
              "figures_queues_per_second": 1000, "status_writes_per_second": 1000,
              "finalizer_timeout_seconds": 30.0, "backoff_seconds": 0.1, "backoff_max_seconds": 0.5}
    return OperatorConfig(**{**values, **overrides})


@pytest.fixture
def operator_config() -> OperatorConfig:
    return fast_config()


@pytest_asyncio.fixture
async def harness(kmock: KubernetesEmulator, tmp_path: Path, operator_config: OperatorConfig
                  ) -> AsyncIterator[Harness]:
    declare_resources(kmock)
    outage = Outage()
    inner = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    store: Any = FlakyStore(inner, outage)
    server = str(kmock.url).rstrip("/")
    ctx = OperatorContext(store, operator_config, kube=kube_configuration(server))
    registry = build_registry(ctx, cluster_login=False)
    thread, stop, ready = start_operator(registry, server, list(NAMESPACES))
    async with aiohttp.ClientSession(base_url=server) as session:
        await asyncio.to_thread(ready.wait, 30)
        yield Harness(kmock, session, inner, ctx, outage)
        stop.set()
        await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive(), "the operator did not stop"
    inner.close()
