"""Magazine purges: every data record of a magazine's slots and its meta records replaced by purge tombstones
(or durably deleted), its beacon removed, and for a main magazine its queue's delayed messages. Separate
because a purge is a bulk, rare operation across every other concern's records, and the only one that
restarts a magazine's slot numbering."""

from __future__ import annotations

import contextlib
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch.records import BatchRecords, Remove, Write
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import now_ms
from ignis.storage.aerospike.context import (
    BATCH_CHUNK,
    FILTERED_OUT,
    NOT_FOUND,
    NOT_TOMBSTONED,
    PURGED,
    TOMBSTONE,
    AerospikeContext,
)
from ignis.storage.aerospike.delayed import DELAY_INDEX_BIN, DELAY_QUEUE_BIN, Delayed
from ignis.storage.base import LOAD_POINTER, SlotRef


class Purge:
    """`Storage.purge_magazine` and the batch purges it is made of."""

    def __init__(self, ctx: AerospikeContext, delayed: Delayed) -> None:
        self._ctx = ctx
        self._delayed = delayed

    def _purge_delayed(self, queue: str) -> int:
        """A queue's delayed messages (by the index) and its delay record."""
        keys: list[Any] = []

        def run() -> None:
            keys.clear()
            query = self._ctx.client.query(self._ctx.ns, self._ctx.data_set)
            query.select(DELAY_QUEUE_BIN)
            query.where(aerospike.predicates.between(DELAY_INDEX_BIN, 0, 2**62))
            query.foreach(lambda record: keys.append(record[0][:3]),
                          {"expressions": exp.Eq(exp.StrBin(DELAY_QUEUE_BIN), queue).compile()})

        try:
            self._delayed.delay_index()
            self._ctx.call("purge_magazine", run)
        except (ex.IndexNotFound, ex.IndexNotReadable):
            pass
        removed = self._purge_keys([(k[0], k[1], k[2]) for k in keys]) if keys else 0
        with contextlib.suppress(ex.RecordNotFound):
            self._ctx.call("purge_magazine", self._ctx.client.remove, self._delayed.delay_meta(queue))
        return removed

    def purge_magazine(self, magazine: str) -> int:
        """Find the magazine's shards by a scan of the meta set (small: one record per shard), then turn
        every record of data slots 1..LOAD_POINTER and the meta records into purge tombstones (durable
        deletes on Enterprise): deletes that stay deleted, and a slot numbering that starts afresh."""
        prefix, suffix = names.magazine_prefix(magazine), "_METADATA"
        # The numbering starts afresh on purpose: forget the pointers this process saw (no rollback).
        self._ctx.shared.marks.forget(lambda k: k[0] == self._ctx.meta_set and str(k[1]).startswith(prefix))

        def scan() -> list[Any]:
            query = self._ctx.client.query(self._ctx.ns, self._ctx.meta_set)
            query.select(LOAD_POINTER, TOMBSTONE, PURGED)
            return query.results()

        try:
            shards: dict[int, int] = {}
            for key, _, bins in self._ctx.call("purge_magazine", scan):
                user_key = key[2]
                if not isinstance(user_key, str) or not user_key.startswith(prefix) or not user_key.endswith(suffix):
                    continue
                shard_text = user_key[len(prefix):-len(suffix)]
                if shard_text.isdigit() and not self._ctx.tombstoned(bins):
                    shards[int(shard_text)] = int(bins.get(LOAD_POINTER, 0))
            removed = 0
            for shard, load in sorted(shards.items()):
                keys = [self._ctx.data_key(SlotRef(magazine, shard, slot)) for slot in range(1, load + 1)]
                removed += self._purge_keys(keys)
            self._purge_keys([self._ctx.meta_key(magazine, shard) for shard in sorted(shards)])
            with contextlib.suppress(ex.RecordNotFound):
                self._ctx.call("purge_magazine", self._ctx.client.remove,
                               self._ctx.key(self._ctx.meta_set, names.beacon_key(magazine)))
            if names.queue_and_kind(magazine)[1] == "main":
                removed += self._purge_delayed(magazine)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "purge_magazine", self._ctx.data_set) from None
        return removed

    def _purge_keys(self, keys: list[tuple[str, str, str]]) -> int:
        """Purge tombstones (or durable deletes) over every record at `keys`, in two passes: the live
        records, counted; then ack tombstones and seals, which a new message at the slot must not meet.
        Returns the live records removed."""
        live = 0
        passes = ((NOT_TOMBSTONED, True), (exp.BinExists(TOMBSTONE).compile(), False))
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            for guard, count in passes:
                if self._ctx.durable:
                    records: list[Any] = [Remove(key, policy={**self._ctx.durable_remove, "expressions": guard})
                                          for key in chunk]
                else:
                    purge = [ops.write(PURGED, now_ms())]
                    policy = {**self._ctx.keep, "exists": aerospike.POLICY_EXISTS_REPLACE, "expressions": guard}
                    records = [Write(key, purge, policy=policy) for key in chunk]
                batch = BatchRecords(records)
                done = self._ctx.call("purge_magazine", self._ctx.client.batch_write, batch) or batch
                for record in self._ctx.answers("purge_magazine", done, len(records), self._ctx.data_set):
                    if record.result == 0:
                        live += count
                    elif record.result not in (NOT_FOUND, FILTERED_OUT):
                        raise self._ctx.record_failure("purge_magazine", record, self._ctx.data_set)
        return live
