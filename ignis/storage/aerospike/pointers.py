"""What watchers and monitors read of a magazine's progress: the shard pointers (`pointers`, checked against the
highest this process has seen and repaired after a rollback; `watch_pointers`, the cheap read of the idle
watcher), and the beacon record a publish bumps and watchers poll (`beacon`, `read_beacons`; no doorbell:
processes share only the records). Separate because it serves the watchers and stats, not the data path."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.bounds import LOAD_BYTES
from ignis.outage import store_failed
from ignis.storage.aerospike.allocation import Allocation
from ignis.storage.aerospike.context import BATCH_CHUNK, NOT_FOUND, AerospikeContext
from ignis.storage.aerospike.reads import Reads
from ignis.storage.base import BEACON_SECONDS, FIRE_POINTER, HOLES, HOLES_CLAIMED, LOAD_POINTER, ShardPointers

BEACON_BIN = "BEACON"  # the counter of a magazine's beacon record (Storage.beacon)
# When a shard's meta record was last written (a cursor's: a claim's move, a seek): the server's last-update time, in
# ns (Aerospike docs, "Expressions": record metadata, last_update_time). No bin of its own: a claim writes nothing more.
MOVED_AT = "movedAt"
_READ_MOVED_AT = expr_ops.expression_read(MOVED_AT, exp.LastUpdateTime().compile())


class Pointers:
    """Reads of shard pointers and beacons (and `doorbell`: none on Aerospike)."""

    def __init__(self, ctx: AerospikeContext, allocation: Allocation, reads: Reads) -> None:
        self._ctx = ctx
        self._allocation = allocation
        self._reads = reads

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        if shards <= 0:
            return {}
        keys = [self._ctx.meta_key(magazine, shard) for shard in range(shards)]
        marks = self._ctx.shared.marks
        before = [(marks.mark((k[1], k[2], LOAD_POINTER)), marks.mark((k[1], k[2], FIRE_POINTER))) for k in keys]
        try:
            found = self._reads.batch_get("pointers", keys)
            out = {}
            for shard, (key, bins, (load_high, fire_high)) in enumerate(zip(keys, found, before, strict=True)):
                load, fire = int((bins or {}).get(LOAD_POINTER, 0)), int((bins or {}).get(FIRE_POINTER, 0))
                if bins is not None and (load < load_high or fire < fire_high):  # (absent: a purge, no telling)
                    which, stored = ("load", load) if load < load_high else ("fire", fire)
                    if not self._allocation.renumbered(magazine, shard, stored + 1,
                                                       (key[1], key[2], f"{which.upper()}_POINTER")):
                        self._allocation.roll_forward(magazine, shard, f"{which} pointer", stored)
                        load, fire = max(load, load_high), max(fire, min(fire_high, max(load, load_high)))
                marks.saw((key[1], key[2], LOAD_POINTER), load)
                marks.saw((key[1], key[2], FIRE_POINTER), fire)
                out[shard] = ShardPointers(load, fire, int((bins or {}).get(HOLES, 0)),
                                           int((bins or {}).get(HOLES_CLAIMED, 0)))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "pointers", self._ctx.meta_set) from None
        return out

    def moved_at(self, magazine: str, shard: int) -> int | None:
        """Storage.cursor_moved_at: the shard's meta record's last write (epoch ms, the server's clock)."""
        try:
            _, _, got = self._ctx.call("moved_at", self._ctx.client.operate, self._ctx.meta_key(magazine, shard),
                                       [_READ_MOVED_AT], None, None)
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "moved_at", self._ctx.meta_set) from None
        moved = (got or {}).get(MOVED_AT)
        return int(moved) // 1_000_000 if moved else None

    def loaded_bytes(self, magazine: str, shards: int) -> list[int]:
        if shards <= 0:
            return []
        try:
            found = self._reads.batch_get("pointers", [self._ctx.meta_key(magazine, shard) for shard in range(shards)])
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "pointers", self._ctx.meta_set) from None
        return [int((bins or {}).get(LOAD_BYTES, 0) or 0) for bins in found]

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        # One batch for every magazine watched, only the two pointer bins. A subscription's cursor (names.cursor_of)
        # is two rows per shard: its topic's meta record (the load pointer) and its own (the fire pointer); a
        # topic's load seen here feeds this process's high marks, which a caught-up cursor claim trusts.
        keys = []
        for magazine, shards in magazines:
            topic = names.cursor_topic(magazine)
            if topic is not None:
                keys += [self._ctx.meta_key(topic, shard) for shard in range(shards)]
            keys += [self._ctx.meta_key(magazine, shard) for shard in range(shards)]
        records: list[Any] = []
        try:
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._ctx.call("watch", self._ctx.client.batch_read, chunk, [LOAD_POINTER, FIRE_POINTER],
                                      self._ctx.batch_policy(len(chunk)))
                records += self._ctx.answers("watch", done, len(chunk), self._ctx.meta_set)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "watch", self._ctx.meta_set) from None
        bins = [self._bins(record) for record in records]
        out, at, marks = [], 0, self._ctx.shared.marks
        for magazine, shards in magazines:
            if names.cursor_topic(magazine) is None:
                loads = [b.get(LOAD_POINTER) or 0 for b in bins[at:at + shards]]
            else:
                loads = []
                for key, b in zip(keys[at:at + shards], bins[at:at + shards], strict=True):
                    mark = (key[1], key[2], LOAD_POINTER)
                    marks.saw(mark, b.get(LOAD_POINTER) or 0)
                    loads.append(marks.mark(mark))
                at += shards
            fires = [b.get(FIRE_POINTER) or 0 for b in bins[at:at + shards]]
            out.append(([shard for shard, (load, fire) in enumerate(zip(loads, fires, strict=True)) if load > fire],
                        sum(loads)))
            at += shards
        return out

    def _bins(self, record: Any) -> dict[str, Any]:
        """A watched meta record's bins ({} when it does not exist yet); any other failure raises."""
        if record.result == 0 and record.record is not None:
            return record.record[2] or {}
        if record.result != NOT_FOUND:
            raise self._ctx.record_failure("watch", record, self._ctx.meta_set)
        return {}

    def beacon(self, magazine: str) -> None:
        beacons, key = self._ctx.shared.beacons, (self._ctx.meta_set, magazine)
        now = time.monotonic()
        if now - beacons.get(key, -BEACON_SECONDS) < BEACON_SECONDS:
            return
        beacons[key] = now
        try:  # an increment is not repeated when in doubt: a lost bump only delays an idle watcher's wake
            self._ctx.call("beacon", self._ctx.client.operate,
                           self._ctx.key(self._ctx.meta_set, names.beacon_key(magazine)),
                           [ops.increment(BEACON_BIN, 1)], None, self._ctx.never, idempotent=False)
        except ex.AerospikeError as exc:
            beacons.pop(key, None)  # bump again with the next publish
            store_failed(f"bump the beacon of {magazine}", self._ctx.fail(exc, "beacon", self._ctx.meta_set))

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        if not magazines:
            return []
        keys = [self._ctx.key(self._ctx.meta_set, names.beacon_key(m)) for m in magazines]
        out: list[int] = []
        try:
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._ctx.call("watch", self._ctx.client.batch_read, chunk, [BEACON_BIN],
                                      self._ctx.batch_policy(len(chunk)))
                for record in self._ctx.answers("watch", done, len(chunk), self._ctx.meta_set):
                    if record.result == 0 and record.record is not None:
                        out.append(int((record.record[2] or {}).get(BEACON_BIN) or 0))
                    elif record.result == NOT_FOUND:
                        out.append(0)
                    else:
                        raise self._ctx.record_failure("watch", record, self._ctx.meta_set)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "watch", self._ctx.meta_set) from None
        return out

    def doorbell(self) -> None:
        """None: consumers in other processes poll the shard pointers (ignis.watch), there being no channel
        between clients but the records themselves."""
        return None
