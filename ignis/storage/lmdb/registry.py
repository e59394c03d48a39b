"""The lmdb store's queue registry: queue records, their active/inactive index, the sweep epoch and pointers.

A queue record lives in the `{farm}_{client}_ignis_queues` database, and the `_active` database beside it plays
Aerospike's secondary index (`b"true\\0name"` / `b"false\\0name"` keys), kept in step in the same transaction.
The sweeper's fence (`next_epoch`, a farm-wide system record) and its forward-only sweep pointers
(`advance_sweep`) are here because `Storage` names them with the registry: they are bins of the queue record
checked against the epoch. Separate from the magazine primitives: this is configuration, written rarely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ignis import names
from ignis.envelope import now_ms
from ignis.errors import QueueNotFound, StaleEpoch
from ignis.storage.base import (
    ACTIVE,
    SWEEP_EPOCH,
    MagazineKind,
    QueueRecord,
    check_queue_config,
    new_queue_bins,
    sweep_bins,
)
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.records import EPOCH_KEY, _expire_at, _expired, _record, _unpack


class QueueRegistry:
    """Queue records and their index, the sweep epoch and sweep pointers (`Storage`'s queue registry)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    # ---- queue registry ---------------------------------------------------------------------
    def ensure_index(self) -> None:
        """The index database is opened with the store; nothing else to create."""

    def _index_key(self, active: bool, name: str) -> bytes:
        return (b"true\x00" if active else b"false\x00") + name.encode()

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        check_queue_config(config)
        key = name.encode()
        now = now_ms()
        with self._ctx.write("apply_queue") as txn:
            current = self._ctx.get_bins(txn, self._ctx.queues, key, now)
            created = current is None
            if current is None:
                bins = new_queue_bins(config, now)
            else:
                bins = current[0]
                bins.update(config)
                txn.delete(self._index_key(bins.get(ACTIVE) == "true", name), db=self._ctx.index)
            bins[ACTIVE] = "true"
            txn.put(key, _record(bins, _expire_at(ttl_seconds, now)), db=self._ctx.queues)
            txn.put(self._index_key(True, name), b"", db=self._ctx.index)
        return created

    def get_queue(self, name: str) -> QueueRecord | None:
        found = self._ctx.read("get_queue",
                               lambda txn: self._ctx.get_bins(txn, self._ctx.queues, name.encode(), now_ms()))
        return QueueRecord(name, found[0]) if found else None

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        def scan(txn: Any) -> list[QueueRecord]:
            now = now_ms()
            flags = [True, False] if active is None else [active]
            found = []
            for flag in flags:
                prefix = self._index_key(flag, "")
                cursor = txn.cursor(db=self._ctx.index)
                if not cursor.set_range(prefix):
                    continue
                for index_key in cursor.iternext(values=False):
                    index_key = bytes(index_key)
                    if not index_key.startswith(prefix):
                        break
                    name = index_key[len(prefix):].decode()
                    hit = self._ctx.get_bins(txn, self._ctx.queues, name.encode(), now)
                    if hit is not None and (hit[0].get(ACTIVE) == "true") == flag:
                        found.append(QueueRecord(name, hit[0]))
            return sorted(found, key=lambda r: r.name)

        return self._ctx.read("list_queues", scan)

    def set_queue_active(self, name: str, active: bool) -> bool:
        key = name.encode()
        with self._ctx.write("set_queue_active") as txn:
            current = self._ctx.get_bins(txn, self._ctx.queues, key, now_ms())
            if current is None:
                return False
            bins, expire_at = current
            txn.delete(self._index_key(bins.get(ACTIVE) == "true", name), db=self._ctx.index)
            bins[ACTIVE] = "true" if active else "false"
            txn.put(key, _record(bins, expire_at), db=self._ctx.queues)
            txn.put(self._index_key(active, name), b"", db=self._ctx.index)
        return True

    def delete_queue(self, name: str) -> bool:
        key = name.encode()
        with self._ctx.write("delete_queue") as txn:
            txn.delete(self._index_key(True, name), db=self._ctx.index)
            txn.delete(self._index_key(False, name), db=self._ctx.index)
            raw = txn.pop(key, db=self._ctx.queues)
        return raw is not None and not _expired(raw, now_ms())

    def next_epoch(self) -> int:
        with self._ctx.write("next_epoch") as txn:
            raw = txn.get(EPOCH_KEY, db=self._ctx.system)
            epoch = (_unpack(raw)["epoch"] if raw else 0) + 1
            txn.put(EPOCH_KEY, _record({"epoch": epoch}), db=self._ctx.system)
        return epoch

    def rewind_sweep(self, name: str, kind: MagazineKind, pointers: Mapping[int, int]) -> None:
        pointer_bin = sweep_bins(kind)[0]
        key = name.encode()
        with self._ctx.write("rewind_sweep", durable=False) as txn:
            current = self._ctx.get_bins(txn, self._ctx.queues, key, now_ms())
            if current is None:
                raise QueueNotFound(name, self._ctx.client_id)
            bins, expire_at = current
            merged = dict(bins.get(pointer_bin) or {})
            for shard, pointer in pointers.items():
                label = names.shard_label(shard)
                merged[label] = min(int(merged.get(label, pointer)), int(pointer))  # backward-only
            bins[pointer_bin] = merged
            txn.put(key, _record(bins, expire_at), db=self._ctx.queues)  # TTL untouched

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        pointer_bin, counter_bin = sweep_bins(kind)
        key = name.encode()
        with self._ctx.write("advance_sweep", durable=False) as txn:
            current = self._ctx.get_bins(txn, self._ctx.queues, key, now_ms())
            if current is None:
                raise QueueNotFound(name, self._ctx.client_id)
            bins, expire_at = current
            held = int(bins.get(SWEEP_EPOCH, 0))
            if epoch < held:
                raise StaleEpoch(name, epoch, held)
            merged = dict(bins.get(pointer_bin) or {})
            for shard, pointer in pointers.items():
                label = names.shard_label(shard)
                merged[label] = max(int(merged.get(label, 0)), int(pointer))  # forward-only
            bins[pointer_bin] = merged
            bins[counter_bin] = int(bins.get(counter_bin, 0)) + swept
            bins[SWEEP_EPOCH] = epoch
            txn.put(key, _record(bins, expire_at), db=self._ctx.queues)  # TTL untouched
