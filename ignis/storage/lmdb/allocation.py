"""The lmdb store's allocation: loads, which take a shard's next slots and write their records at once.

Every load here is one transaction that reads the shard's LOAD_POINTER, writes the data records in the slots
after it and moves the pointer, so a publish never leaves a hole or a slot awaiting its write; it rings the
doorbell just before it commits (a committing ring: ignis.storage.lmdb.doorbell) and (durability=fsync)
flushes. The two-step reservation primitives of `Storage` (`reserve`, `load_reserved*`) are refused for that
reason. Separate from claims: loads are the publishers' hot path, claims the consumers'.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import lmdb

from ignis.bounds import ShardLimit, room
from ignis.envelope import Envelope, NewMessages, now_ms
from ignis.storage.base import Placement, SlotRef
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.group_commit import Combined
from ignis.storage.lmdb.records import (
    _FORMAT,
    _META_BYTES,
    _expire_at,
    _new_ref,
    _pack_data,
    _pack_meta,
    _pack_meta_bytes,
    _pack_new,
    _plain_head,
    _unpack_meta,
    _unpack_meta_bytes,
)

_monotonic = time.monotonic
_NO_META = _pack_meta(0, 0, 0)  # a shard's meta record before its first load
_METADATA_SUFFIX = b"_METADATA"  # (names.meta_key)
_LEGACY_BYTES_SUFFIX = b"_BYTES"  # LOAD_BYTES's own record, before it moved into the meta record (_load_bytes_in)
_META_BYTES_SIZE = _META_BYTES.size


def _load_into(meta_key: bytes, prefix: bytes, value: bytes, meta_db: Any, data_db: Any, txn: Any) -> int:
    """Write one record into the shard's next slot and move its load pointer, in `txn`; the slot. An unbounded
    queue's publish (load_one's), which writes the pointers alone: a LOAD_BYTES left from a byte bound since lifted
    is dropped, and counted afresh if one is set again (as for a queue bounded once it had messages: ignis.bounds)."""
    # Positional arguments (get: key, default, db; put: key, value, dupdata, overwrite, append, db): py-lmdb's
    # keyword parsing costs about 0.1 µs a call.
    raw = txn.get(meta_key, None, meta_db)
    _, load, fire = _unpack_meta(raw) if raw is not None else (0, 0, 0)
    load += 1
    txn.put(prefix + b"%d" % load, value, True, True, False, data_db)
    txn.put(meta_key, _pack_meta(0, load, fire), True, True, False, meta_db)
    return load


def _load_envelope(ctx: StoreContext, magazine: str, shard: int, value: bytes, txn: Any) -> int:
    """Write one packed envelope into the shard's next slot and move its load pointer, keeping the rest of the
    meta record (a byte-bounded shard's LOAD_BYTES), in `txn`; the slot. `Allocation.load`'s one message."""
    meta_key, load, fire, tail = ctx.meta_get(txn, magazine, shard)
    txn.put(ctx.keys(magazine, shard)[1] + b"%d" % (load + 1), value, db=ctx.data)
    ctx.meta_put(txn, meta_key, load + 1, fire, tail)
    return load + 1


def _load_within(meta_key: bytes, prefix: bytes, value: bytes, meta_db: Any, data_db: Any, limit: ShardLimit,
                 size: int, txn: Any) -> int:
    """_load_into on a bounded shard (ignis.bounds): 0, writing nothing, when the message (of `size` payload bytes)
    does not fit the shard's share; with a bound of bytes, LOAD_BYTES (in the meta record) moves with the load
    pointer."""
    raw = txn.get(meta_key, None, meta_db)
    if raw is None:
        raw = _NO_META
    _, load, fire = _unpack_meta(raw)
    waiting = load - fire if load > fire else 0
    if limit.length is not None and waiting >= limit.length:  # (room() for one message, inlined)
        return 0
    if limit.bytes is None:
        meta = _pack_meta(0, load + 1, fire) + raw[24:]
    else:  # (_load_bytes_in and _meta_after, inlined for the common case: two calls are a visible share here)
        loaded_bytes = _unpack_meta_bytes(raw)[3] if len(raw) == _META_BYTES_SIZE else \
            _load_bytes_in(txn, raw, meta_key, meta_db)
        # (estimated_bytes, inlined: the waiting slots x the mean size)
        if waiting * (loaded_bytes // load if load else 0) + size > limit.bytes:
            return 0
        meta = _pack_meta_bytes(0, load + 1, fire, loaded_bytes + size)
    load += 1
    txn.put(prefix + b"%d" % load, value, True, True, False, data_db)
    txn.put(meta_key, meta, True, True, False, meta_db)
    return load


def _load_bytes_in(txn: Any, raw: bytes, meta_key: bytes, meta_db: Any) -> int:
    """A bytes-bounded shard's LOAD_BYTES, from its meta record `raw`. One that does not carry it yet: 0, or what a
    store written before LOAD_BYTES moved into the meta record keeps in a record of its own
    (`{magazine}_SHARD_{n}_BYTES`; read until the next load writes the count into the meta record, then ignored)."""
    if len(raw) == _META_BYTES_SIZE:
        return _unpack_meta_bytes(raw)[3]
    old = txn.get(meta_key[: -len(_METADATA_SUFFIX)] + _LEGACY_BYTES_SUFFIX, None, meta_db)
    return _unpack_meta(old)[1] if old is not None else 0


def _meta_after(raw: bytes, load: int, fire: int, limit: ShardLimit, loaded_bytes: int) -> bytes:
    """A bounded shard's meta record after a load: with LOAD_BYTES where the shard is bounded by bytes, else with
    whatever followed the pointers (`raw`'s)."""
    if limit.bytes is None:
        return _pack_meta(0, load, fire) + raw[24:]
    return _pack_meta_bytes(0, load, fire, loaded_bytes)


def _grouped_load(ctx: StoreContext, magazine: str, shard: int, write: Callable[[Any], int]) -> int:
    """A durable (durability=fsync) load into one shard, `write(txn)` returning its slot (0: nothing written), in
    the group commit: rung before the commit and after it, once for all the loads into `magazine` the commit carries
    (group_commit.Combined)."""
    before, after = ctx.load_rings(magazine)
    return ctx.grouped("load", write, durable=True, before=Combined(before, shard), after=Combined(after, shard))


class Allocation:
    """Loads into a shard's next slots (`Storage.load*`); no reservations."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        expire_at = _expire_at(ttl_seconds, now_ms())
        if len(items) == 1:  # publish of one message: no per-shard bookkeeping
            shard, envelope = items[0]
            value = _pack_data(envelope, expire_at)
            if self._ctx.sync:
                # durability=fsync: in the group commit, as a queue's publish (load_one): publishers of this process
                # share one transaction and one flush instead of queueing for the write lock one flush each (a
                # topic's publish comes here: 3.7-5.8 ms at the median with four publisher threads at 1,000 msg/s,
                # against a queue's 1 ms, before this).
                slot = _grouped_load(self._ctx, magazine, shard,
                                     functools.partial(_load_envelope, self._ctx, magazine, shard, value))
                return [_new_ref(SlotRef, (magazine, shard, slot))]
            try:
                with self._ctx.begin("load", True) as txn:
                    slot = _load_envelope(self._ctx, magazine, shard, value, txn)
                    self._ctx.ring_committing(magazine, (shard,))
                self._ctx.ring(magazine, (shard,), after_committing=True)
                self._ctx.flush()
            except lmdb.Error as exc:
                raise self._ctx.map_error(exc) from None
            return [_new_ref(SlotRef, (magazine, shard, slot))]
        packed = [(shard, _pack_data(envelope, expire_at)) for shard, envelope in items]
        refs: list[SlotRef] = []
        try:
            with self._ctx.begin("load", True) as txn:
                put, data_db = txn.put, self._ctx.data
                shards: dict[int, list[Any]] = {}
                for shard, value in packed:
                    state = shards.get(shard)
                    if state is None:
                        state = shards[shard] = [*self._ctx.meta_get(txn, magazine, shard),
                                                 self._ctx.keys(magazine, shard)[1]]
                    slot = state[1] = state[1] + 1
                    put(state[4] + b"%d" % slot, value, db=data_db)
                    refs.append(_new_ref(SlotRef, (magazine, shard, slot)))
                for key, load, fire, tail, _ in shards.values():
                    self._ctx.meta_put(txn, key, load, fire, tail)
                self._ctx.ring_committing(magazine, shards)
            self._ctx.ring(magazine, shards, after_committing=True)
            self._ctx.flush()
        except lmdb.Error as exc:
            raise self._ctx.map_error(exc) from None
        return refs

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        raw_id = msg_id.encode()
        value = _plain_head(len(raw_id)).pack(loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0, 0, 0,
                                              _FORMAT, loaded_at, 0, 0, len(raw_id), raw_id, len(payload)) + payload
        ctx = self._ctx
        meta_key, prefix = ctx.key_cache.get((magazine, shard)) or ctx.keys(magazine, shard)  # (a call saved)
        if ctx.sync:
            return _grouped_load(ctx, magazine, shard,
                                 functools.partial(_load_into, meta_key, prefix, value, ctx.meta, ctx.data))
        # durability=fast: its own transaction, as a claim's (StoreContext.grouped), rung once committed: a commit
        # that flushes nothing is over in microseconds, so ringing before it (to wake consumers during a flush)
        # would only have them wait on the write lock. The publishers' hot path: no closure, and StoreContext.ring
        # inlined (a Python call is a visible share of a publish).
        meta_db, data_db = ctx.meta, ctx.data
        try:
            with ctx.begin("load", True) as txn:  # (_load_into, inlined)
                raw = txn.get(meta_key, None, meta_db)
                _, load, fire = _unpack_meta(raw) if raw is not None else (0, 0, 0)
                load += 1
                txn.put(prefix + b"%d" % load, value, True, True, False, data_db)
                txn.put(meta_key, _pack_meta(0, load, fire), True, True, False, meta_db)
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None
        bell = ctx.bells.get(magazine, False)
        if bell is False:
            bell = ctx.bell_of(magazine)
        if bell is not None and _monotonic() >= bell.quiet_until:
            bell.ring(ctx.client_id, magazine, (shard,))
        return load

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[range]:
        # Records expire ttl_seconds after loadedAt, which publish sets to now.
        expire_at = batch.loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0
        data_db, meta_db = self._ctx.data, self._ctx.meta
        values = _pack_new(batch, expire_at)
        try:
            with self._ctx.begin("load", True) as txn:
                # A shard's records go in together, in slot order: neighbouring keys, so each insert
                # finds its B-tree page already at hand. Per message only C-level calls (map, zip,
                # putmulti): zip hands putmulti one reused tuple, so no pair is allocated either.
                putmulti = txn.cursor(db=data_db).putmulti
                taken = []
                for shard, indices in placement:
                    meta_key, prefix = self._ctx.keys(magazine, shard)
                    raw = txn.get(meta_key, None, meta_db)
                    _, load, fire = _unpack_meta(raw) if raw is not None else (0, 0, 0)
                    slots = range(load + 1, load + 1 + len(indices))
                    key_format = prefix.replace(b"%", b"%%") + b"%d"  # prefix + slot, as one C call
                    putmulti(zip(map(key_format.__mod__, slots), map(values.__getitem__, indices), strict=True))
                    # (an unbounded queue's publish_many: the pointers alone, as _load_into writes them)
                    txn.put(meta_key, _pack_meta(0, slots.stop - 1, fire), True, True, False, meta_db)
                    taken.append(slots)
                self._ctx.ring_committing(magazine, [shard for shard, _ in placement])
            self._ctx.ring(magazine, [shard for shard, _ in placement], after_committing=True)
            self._ctx.flush()
            return taken
        except lmdb.Error as exc:
            raise self._ctx.map_error(exc) from None

    def load_new_bounded(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int,
                         limits: Sequence[ShardLimit]) -> list[Sequence[int]]:
        """load_new within each shard's share: one write transaction that checks each shard's room (as load_bounded)
        and writes what fits, packed as load_new packs (no Envelope per message)."""
        expire_at = batch.loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0
        ctx = self._ctx
        data_db, meta_db = ctx.data, ctx.meta
        values = _pack_new(batch, expire_at)
        payloads = batch.payloads
        taken: list[Sequence[int]] = []
        filled: list[int] = []
        try:
            with ctx.begin("load", True) as txn:
                putmulti = txn.cursor(db=data_db).putmulti
                for shard, indices in placement:
                    limit = limits[shard]
                    meta_key, prefix = ctx.keys(magazine, shard)
                    raw = txn.get(meta_key, None, meta_db) or _NO_META
                    _, load, fire = _unpack_meta(raw)
                    loaded_bytes = 0 if limit.bytes is None else _load_bytes_in(txn, raw, meta_key, meta_db)
                    sizes = list(map(len, map(payloads.__getitem__, indices)))  # (C-level: no bytecode a message)
                    fits = room(limit, load, fire, loaded_bytes, sizes)
                    slots = range(load + 1, load + 1 + fits)
                    taken.append(slots)
                    if not fits:
                        continue
                    key_format = prefix.replace(b"%", b"%%") + b"%d"  # (as load_new)
                    putmulti(zip(map(key_format.__mod__, slots), map(values.__getitem__, indices[:fits]), strict=True))
                    txn.put(meta_key, _meta_after(raw, slots.stop - 1, fire, limit, loaded_bytes + sum(sizes[:fits])),
                            True, True, False, meta_db)
                    filled.append(shard)
                if filled:
                    ctx.ring_committing(magazine, filled)
            if filled:
                ctx.ring(magazine, filled, after_committing=True)
                ctx.flush()
            return taken
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None

    def load_one_bounded(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                         ttl_seconds: int, limit: ShardLimit) -> int:
        """`load_one` into a shard of a bounded queue whose share has room (the check and the allocation one write
        transaction, as load_bounded's); its slot, or 0 when the shard is full (nothing written). The lean path of a
        bounded publish, as load_one is an unbounded one's."""
        raw_id = msg_id.encode()
        value = _plain_head(len(raw_id)).pack(loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0, 0, 0,
                                              _FORMAT, loaded_at, 0, 0, len(raw_id), raw_id, len(payload)) + payload
        ctx = self._ctx
        meta_key, prefix = ctx.key_cache.get((magazine, shard)) or ctx.keys(magazine, shard)  # (as load_one)
        if ctx.sync:
            return _grouped_load(ctx, magazine, shard, functools.partial(
                _load_within, meta_key, prefix, value, ctx.meta, ctx.data, limit, len(payload)))
        # durability=fast: as load_one's, its own transaction, rung once committed (the publishers' hot path)
        try:
            with ctx.begin("load", True) as txn:
                load = _load_within(meta_key, prefix, value, ctx.meta, ctx.data, limit, len(payload), txn)
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None
        if load:
            ctx.ring(magazine, (shard,))  # (load_one inlines it, with a shortcut while nobody listens)
        return load

    def load_bounded(self, magazine: str, shard: int, envelopes: Sequence[Envelope], ttl_seconds: int,
                     limit: ShardLimit) -> list[SlotRef | None]:
        """`load` into one shard of as many of `envelopes` as its share of the bound has room for (the longest
        prefix), in one write transaction that reads the pointers, checks the room and moves the load pointer (and
        LOAD_BYTES): the check and the allocation are one atomic step, so concurrent publishers, in this process
        or others, never take a shard past its share. Per envelope: its slot, or None (refused, nothing written)."""
        expire_at = _expire_at(ttl_seconds, now_ms())
        sizes = [len(env.payload) for env in envelopes]
        packed = [_pack_data(env, expire_at) for env in envelopes]
        ctx = self._ctx
        meta_key, prefix = ctx.keys(magazine, shard)
        try:
            with ctx.begin("load", True) as txn:
                raw = txn.get(meta_key, None, ctx.meta) or _NO_META
                _, load, fire = _unpack_meta(raw)
                loaded_bytes = 0 if limit.bytes is None else _load_bytes_in(txn, raw, meta_key, ctx.meta)
                fits = room(limit, load, fire, loaded_bytes, sizes)
                if fits:
                    for i in range(fits):
                        txn.put(prefix + b"%d" % (load + 1 + i), packed[i], True, True, False, ctx.data)
                    txn.put(meta_key, _meta_after(raw, load + fits, fire, limit, loaded_bytes + sum(sizes[:fits])),
                            True, True, False, ctx.meta)
                    ctx.ring_committing(magazine, (shard,))
            if fits:
                ctx.ring(magazine, (shard,), after_committing=True)
                ctx.flush()
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None
        return [_new_ref(SlotRef, (magazine, shard, load + 1 + i)) if i < fits else None
                for i in range(len(envelopes))]

    def loaded_bytes(self, magazine: str, shards: int) -> list[int]:
        """Each shard's LOAD_BYTES (0 where none was counted)."""
        def get(txn: Any) -> list[int]:
            out = []
            for shard in range(shards):
                meta_key = self._ctx.keys(magazine, shard)[0]
                raw = txn.get(meta_key, None, self._ctx.meta)
                out.append(0 if raw is None else _load_bytes_in(txn, raw, meta_key, self._ctx.meta))
            return out

        return self._ctx.read("pointers", get)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        raise NotImplementedError("lmdb allocates and writes a slot in one transaction: an empty reserved slot "
                                  "would be a hole for good to its consumers (write_grace_ms is 0)")

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        raise NotImplementedError("lmdb has no reserved slots (see reserve)")

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        raise NotImplementedError("lmdb has no reserved slots (see reserve)")
