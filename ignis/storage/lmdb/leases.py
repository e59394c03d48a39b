"""The lmdb store's farm-wide system records: the client list and the named leases.

Both live in the `{farm}_ignis_system` database, shared by every client of the farm: `register_client` adds a
client once (read first, so the common case takes no write lock), and a lease is replaced only at the version
its caller read (`replace_lease`, compare-and-set in one transaction), which is what leader election builds on.
Separate from the queue registry because these records are per farm, not per client.
"""

from __future__ import annotations

from ignis import names
from ignis.envelope import now_ms
from ignis.storage.base import LeaseRecord
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.records import CLIENTS_KEY, LEASE_PREFIX, _record, _unpack


class Leases:
    """Clients and leases: the farm-wide system records (`Storage`'s farm-wide section)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    # ---- farm-wide system records -------------------------------------------------------------
    def register_client(self, client_id: str) -> None:
        client_id = names.check_id("clientId", client_id)
        if client_id in self.list_clients():  # the common case: no write transaction at all
            return
        with self._ctx.write("register_client") as txn:
            raw = txn.get(CLIENTS_KEY, db=self._ctx.system)
            clients = dict(_unpack(raw)["clients"]) if raw else {}
            clients.setdefault(client_id, now_ms())
            txn.put(CLIENTS_KEY, _record({"clients": clients}), db=self._ctx.system)

    def list_clients(self) -> list[str]:
        raw = self._ctx.read("list_clients", lambda txn: txn.get(CLIENTS_KEY, db=self._ctx.system))
        return sorted(_unpack(raw)["clients"]) if raw else []

    def get_lease(self, name: str) -> LeaseRecord | None:
        raw = self._ctx.read("get_lease", lambda txn: txn.get(LEASE_PREFIX + name.encode(), db=self._ctx.system))
        return LeaseRecord(**_unpack(raw)) if raw else None

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        key = LEASE_PREFIX + name.encode()
        with self._ctx.write("replace_lease") as txn:
            raw = txn.get(key, db=self._ctx.system)
            if (_unpack(raw)["version"] if raw else 0) != expected_version:
                return None
            stored = LeaseRecord(lease.holder, lease.acquired_ms, lease.renewed_ms, lease.duration_s,
                                 lease.transitions, expected_version + 1)
            txn.put(key, _record({f: getattr(stored, f) for f in LeaseRecord.__slots__}), db=self._ctx.system)
        return stored
