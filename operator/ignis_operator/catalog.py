"""What the operator knows about the IgnisQueue objects it serves, kept from the watch stream (every event
of every object passes through the `observe` handler): the background passes (resync.py) read it instead
of asking the API server, so an idle operator makes no API call at all.

`Guards` keep two kinds of work on one queue apart: its store work runs under a per-queue lock (a create,
a resync and the finalizer never interleave), and once its deletion has begun the background passes leave
it alone (a resync must not re-activate a record the finalizer has just deactivated).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ignis.errors import InvalidSpecError
from ignis.topics.spec import TOPIC_KIND
from ignis_operator.reconcile import condition, spec_from_object

Key = tuple[str, str]  # (namespace, name)


def plain(value: Any) -> Any:
    """A deep copy as plain dicts and lists (kopf hands out read-only views of its own body)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


@dataclass(slots=True)
class Declared:
    """One IgnisQueue or IgnisTopic object as last seen on the watch stream (plus what the operator wrote since)."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: str | None  # metadata.creationTimestamp
    spec: dict[str, Any]
    status: dict[str, Any]
    deleting: bool
    finalizers: list[str] = field(default_factory=list)
    resource_version: str = ""
    api_version: str = "ignismq.io/v1alpha1"
    kind: str = "IgnisQueue"

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Declared:
        meta = body.get("metadata") or {}
        return cls(namespace=meta.get("namespace") or "", name=meta["name"], uid=meta.get("uid") or "",
                   generation=int(meta.get("generation") or 0), created=meta.get("creationTimestamp"),
                   spec=plain(body.get("spec") or {}), status=plain(body.get("status") or {}),
                   deleting=bool(meta.get("deletionTimestamp")), finalizers=list(meta.get("finalizers") or []),
                   resource_version=str(meta.get("resourceVersion") or ""),
                   api_version=body.get("apiVersion") or cls.api_version, kind=body.get("kind") or cls.kind)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def ref(self) -> dict[str, Any]:
        """The object reference of an Event about this object."""
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "namespace": self.namespace,
                "uid": self.uid}

    @property
    def meta(self) -> dict[str, Any]:
        return {"creationTimestamp": self.created, "generation": self.generation}

    @property
    def ready(self) -> dict[str, Any]:
        return condition(self.status, "Ready")

    @property
    def client_id(self) -> str:
        """Where its queue lives: what the operator synced it to, else what it declares."""
        return str(self.status.get("clientId") or self.spec.get("clientId") or self.namespace)

    def needs_reconcile(self) -> bool:
        """A generation the operator has not handled yet (or never wrote a status for)."""
        return not self.deleting and (self.status.get("observedGeneration") != self.generation or not self.ready)


@dataclass(frozen=True, slots=True)
class DeclaredBins:
    """The config bins an object declares (cached per generation: the resync compares them every pass)."""

    generation: int
    client_id: str
    bins: dict[str, Any]
    ttl_seconds: int


class Catalog:
    """Every served object, by (namespace, name). Written by the watch handler, read by the passes."""

    def __init__(self) -> None:
        self._entries: dict[Key, Declared] = {}
        self._declared: dict[str, DeclaredBins] = {}  # by uid
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def observe(self, body: Mapping[str, Any]) -> Declared:
        entry = Declared.from_body(body)
        with self._lock:
            self._entries[entry.key] = entry
        return entry

    def forget(self, key: Key, uid: str | None = None) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and (uid is None or entry.uid == uid):
                del self._entries[key]
            if uid:
                self._declared.pop(uid, None)

    def get(self, key: Key) -> Declared | None:
        return self._entries.get(key)

    def snapshot(self) -> list[Declared]:
        with self._lock:
            return list(self._entries.values())

    def wrote(self, entry: Declared, changes: Mapping[str, Any]) -> None:
        """What the operator just wrote to an object's status, until the watch stream shows it (so a pass
        running meanwhile does not write the same again)."""
        with self._lock:
            current = self._entries.get(entry.key)
            if current is not None and current.uid == entry.uid:
                current.status = {**current.status, **plain(changes)}

    def declared(self, entry: Declared) -> DeclaredBins | None:
        """The config bins `entry` declares (None when its spec is invalid)."""
        cached = self._declared.get(entry.uid)
        if cached is not None and cached.generation == entry.generation:
            return cached
        try:
            if entry.kind == TOPIC_KIND:  # (topic records do not expire: no TTL to re-assert)
                from ignis_operator.topics import topic_spec_from_object

                topic = topic_spec_from_object(entry.name, entry.namespace, entry.spec)
                cached = DeclaredBins(entry.generation, topic.client_id or entry.namespace, topic.config_bins(), 0)
            else:
                spec = spec_from_object(entry.name, entry.namespace, entry.spec)
                cached = DeclaredBins(entry.generation, spec.client_id or entry.namespace, spec.config_bins(),
                                      spec.record_ttl_seconds)
        except InvalidSpecError:
            return None
        self._declared[entry.uid] = cached
        return cached


@dataclass
class Guards:
    """Per-queue store locks (striped: a bounded number of locks for any number of queues) and the uids
    whose deletion has begun."""

    stripes: int = 64
    _locks: list[threading.Lock] = field(init=False)
    _deleting: set[str] = field(default_factory=set)
    _asserted: dict[str, float] = field(default_factory=dict)  # uid -> monotonic time of its last record write

    def __post_init__(self) -> None:
        self._locks = [threading.Lock() for _ in range(self.stripes)]

    @contextmanager
    def hold(self, key: Key) -> Iterator[None]:
        with self._locks[hash(key) % self.stripes]:
            yield

    def begin_deletion(self, uid: str) -> None:
        self._deleting.add(uid)

    def deleting(self, uid: str) -> bool:
        return uid in self._deleting

    def gone(self, uid: str) -> None:
        self._deleting.discard(uid)
        self._asserted.pop(uid, None)

    def asserted(self, uid: str) -> None:
        """The queue record of `uid` was just written (its TTL re-asserted)."""
        self._asserted[uid] = time.monotonic()

    def assert_due(self, uid: str, ttl_seconds: int) -> bool:
        """Whether the record's TTL should be re-asserted: a quarter of it has passed since this process
        last wrote it (or it never did)."""
        last = self._asserted.get(uid)
        return last is None or time.monotonic() - last >= ttl_seconds / 4
