"""Seals and hole counts: a slot given up for good is sealed (a tombstone marked `sealedAt` that refuses any
later write to the slot) and counted as a hole on its shard's meta record. Separate from claims because
allocation (after a rollback) and moves seal slots too, and claims depend on allocation: seals sit below
both, so no two concern modules import each other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as ops

from ignis.envelope import now_ms
from ignis.storage.aerospike.context import FILTERED_OUT, LOST, PURGED, SEALED, TOMBSTONE, AerospikeContext
from ignis.storage.base import HOLES, HOLES_CLAIMED, SlotRef

# A seal turns a missing record or a tombstone into a seal, once: a slot sealed already refuses (so each
# hole is counted once, by whoever sealed it).
_SEALABLE = exp.And(exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)), exp.Not(exp.BinExists(SEALED))).compile()


class Seals:
    """`Storage.seal` and `note_claimed_holes`, and the sealing and hole counting allocation and moves use."""

    def __init__(self, ctx: AerospikeContext) -> None:
        self._ctx = ctx

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        if not refs:
            return []
        try:
            return self.seal_slots("seal", refs, self._ctx.ttl(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "seal", self._ctx.data_set) from None

    def seal_slots(self, operation: str, refs: Sequence[SlotRef], ttl: int, lost: bool = False) -> list[bool]:
        """Create a seal in each slot, or turn a tombstone there into one; a live record, or a seal already
        there, wins (False). Each slot sealed here is a hole, counted (HOLES) on its shard's meta record.
        `lost`: marked as a message gone (LOST: a topic's slot a subscription found missing)."""
        now = now_ms()
        policy = {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "expressions": _SEALABLE,
                  "ttl": ttl}
        seal = [ops.write(TOMBSTONE, now), ops.write(SEALED, now), *([ops.write(LOST, now)] if lost else [])]
        done = self._ctx.call(operation, self._ctx.client.batch_operate, [self._ctx.data_key(ref) for ref in refs],
                              seal, None, policy)
        records = self._ctx.answers(operation, done, len(refs), self._ctx.data_set)
        failed = [r for r in records if r.result not in (0, FILTERED_OUT)]
        if failed:
            raise self._ctx.record_failure(operation, failed[0], self._ctx.data_set)
        sealed = [r.result == 0 for r in records]
        self.count_holes(HOLES, [ref for ref, done_ in zip(refs, sealed, strict=True) if done_])
        return sealed

    def count_holes(self, counter: str, refs: Sequence[SlotRef]) -> None:
        """Add the holes among `refs` to `counter` (HOLES or HOLES_CLAIMED) of their shards: one increment
        per shard. Repeated when in doubt, like the load pointer: the figures may then be one batch off."""
        per_shard: dict[tuple[str, int], int] = {}
        for ref in refs:
            per_shard[(ref[0], ref[1])] = per_shard.get((ref[0], ref[1]), 0) + 1
        for (magazine, shard), n in per_shard.items():
            self._ctx.call("count_holes", self._ctx.client.operate, self._ctx.meta_key(magazine, shard),
                           [ops.increment(counter, n)], None, self._ctx.never)

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        try:
            self.count_holes(HOLES_CLAIMED, [SlotRef(magazine, shard, 0) for shard, n in holes.items()
                                             for _ in range(n)])
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "count_holes", self._ctx.meta_set) from None
