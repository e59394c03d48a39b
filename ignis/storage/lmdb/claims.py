"""The lmdb store's claims: taking a shard's next messages, stamping and sealing slots, counting holes.

A claim moves the shard's FIRE_POINTER over the next slots and stamps fireTS and attempts into each record's
fixed header in one transaction (group-committed with durability=fsync, and handed out before that commit
flushes: ignis.storage.lmdb.group_commit), deleting the records that expired unclaimed and counting them as
holes; `restamp` and `stamp_unfired` rewrite the same header fields, and
`seal` / `resolve_claim` / `note_claimed_holes` are the hole bookkeeping `Storage` asks of a backend whose
claims are never in doubt. Separate from loads (allocation) because this is the consumers' hot path.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import lmdb

from ignis.envelope import Envelope
from ignis.names import CURSOR_INFIX
from ignis.storage.base import Claimed, ClaimTicket, HeldClaim, SlotRef
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.cursor_environments import CursorEnvironments
from ignis.storage.lmdb.reads import Reads
from ignis.storage.lmdb.records import (
    _DATA_HEADER,
    _HOLD_SUFFIX,
    _expired,
    _new_ref,
    _pack_data_header,
    _pack_hold,
    _pack_meta,
    _unpack_data,
    _unpack_data_header,
    _unpack_hold,
    _unpack_meta,
)


def _available(meta: bytes, max_slots: int, up_to: int | None) -> tuple[int, int, int]:
    """(load pointer, fire pointer, slots a claim takes) of a shard's meta record."""
    _, load, fire = _unpack_meta(meta)
    return load, fire, min(max_slots, (load if up_to is None else min(load, up_to)) - fire)


def _claim_in(ctx: StoreContext, magazine: str, shard: int, meta_key: bytes, prefix: bytes, max_slots: int,
              now_ms_: int, bump: int, up_to: int | None, txn: Any) -> list[tuple[int, bytes | None]]:
    """A claim's write, in `txn`: moves the shard's FIRE_POINTER over its next slots (up to `max_slots`, and to
    `up_to`) and stamps each record's fireTS and attempts (+ `bump`); (slot, record or None) of each. A function of
    its own, not a closure in Claims.claim: a closure's variables are cells, built on every claim (a hot path)."""
    meta_db, data_db = ctx.meta, ctx.data
    header_size = _DATA_HEADER.size
    meta = txn.get(meta_key, None, meta_db)  # positional: see load_one
    if meta is None:
        return []
    _, load, fire = _unpack_meta(meta)  # (_available, inlined: every claim comes here)
    count = min(max_slots, (load if up_to is None else min(load, up_to)) - fire)
    if count <= 0:  # another claimer took them meanwhile
        return []
    raws: list[tuple[int, bytes | None]] = []
    get, put = txn.get, txn.put
    expired = 0
    for slot in range(fire + 1, fire + count + 1):
        key = prefix + b"%d" % slot
        raw = get(key, None, data_db)
        if raw is not None and len(raw) >= header_size:  # (a shorter one: damaged, unreadable)
            expire_at, _, attempts = _unpack_data_header(raw)
            if expire_at and expire_at <= now_ms_:
                txn.delete(key, b"", data_db)
                raw = None
                expired += 1
            else:  # stamp fireTS and attempts in the fixed header: no msgpack in the txn
                raw = _pack_data_header(expire_at, now_ms_, attempts + bump) + raw[header_size:]
                put(key, raw, True, True, False, data_db)
        raws.append((slot, raw))
    put(meta_key, _pack_meta(0, load, fire + count) + meta[24:], True, True, False, meta_db)  # (+ LOAD_BYTES)
    if expired:  # a message that expired unclaimed: a hole made now (the claimer counts it passed)
        ctx.add_holes(txn, magazine, shard, made=expired)
    return raws


class Claims:
    """Claims, stamps, seals and hole counts (`Storage.claim`, `restamp`, `stamp_unfired`, `seal`, ...)."""

    def __init__(self, ctx: StoreContext, reads: Reads, cursors: CursorEnvironments) -> None:
        self._ctx = ctx
        self._reads = reads  # seal reads the slots
        self._cursors = cursors

    def resolve_claim(self, ticket: ClaimTicket, now_ms: int) -> list[Claimed] | None:
        return None  # a claim here is one local transaction: never in doubt

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        if not holes:
            return
        ctx = self._cursors.of(magazine) if CURSOR_INFIX in magazine else self._ctx  # (a cursor's own environment)
        with ctx.write("count_holes", durable=False) as txn:
            for shard, n in holes.items():
                ctx.add_holes(txn, magazine, shard, claimed=n)

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        bump = 1 if count_attempt else 0
        ctx = self._ctx
        meta_key, prefix = ctx.key_cache.get((magazine, shard)) or ctx.keys(magazine, shard)  # (a call saved)
        if ctx.sync:  # a look first, without the write lock every process shares: a drained shard waits for
            try:      # no other process's flush (with durability=fast the lock is held for microseconds)
                with ctx.env.env.begin(None, None, False) as txn:
                    meta = txn.get(meta_key, None, ctx.meta)
            except lmdb.Error as exc:
                raise ctx.map_error(exc) from None
            drained = meta is None or _available(meta, max_slots, up_to)[2] <= 0
            # Unless a publisher rang before its commit (doorbell): then the write lock waits that commit out.
            if drained and (up_to is not None or not ctx.committing(magazine, shard)):
                return []
            # handed out before the commit's flush
            raws = ctx.grouped("claim", functools.partial(_claim_in, ctx, magazine, shard, meta_key, prefix,
                                                          max_slots, now_ms_, bump, up_to), early=True)
        else:  # durability=fast: its own transaction (see StoreContext.grouped), without the indirection: a hot path
            try:
                with ctx.begin("claim", True) as txn:
                    raws = _claim_in(ctx, magazine, shard, meta_key, prefix, max_slots, now_ms_, bump, up_to, txn)
            except lmdb.Error as exc:
                raise ctx.map_error(exc) from None
        return [_new_ref(Claimed, (_new_ref(SlotRef, (magazine, shard, slot)),
                                   None if raw is None else _unpack_data(raw), False))
                for slot, raw in raws]

    # ---- an ordered queue's claims (Storage.claim_held): the hold is read and written in the claim's transaction --
    def _hold_key(self, magazine: str, shard: int) -> bytes:
        return self._ctx.keys(magazine, shard)[1][:-1] + _HOLD_SUFFIX

    def claim_held(self, magazine: str, shard: int, now_ms_: int, hold_ms: int, count_attempt: bool = True
                   ) -> HeldClaim:
        meta_key, prefix = self._ctx.keys(magazine, shard)
        hold_key = self._hold_key(magazine, shard)
        meta_db, data_db = self._ctx.meta, self._ctx.data
        bump = 1 if count_attempt else 0
        # A look first, without the write lock every process shares: consumers of other processes look at the shards
        # this one holds, and a held shard (or a drained one, as in `claim`) needs no write.
        try:
            with self._ctx.env.env.begin(None, None, False) as txn:
                raw_hold, meta = txn.get(hold_key, None, meta_db), txn.get(meta_key, None, meta_db)
        except lmdb.Error as exc:
            raise self._ctx.map_error(exc) from None
        held = _unpack_hold(raw_hold)[1] if raw_hold is not None else 0
        if held > now_ms_:
            return HeldClaim([], held)
        if (meta is None or _available(meta, 1, None)[2] <= 0) and not self._ctx.committing(magazine, shard):
            return HeldClaim([])

        def write(txn: Any) -> tuple[int, int, bytes | None]:
            """(held until, slot claimed (0: none), its record)."""
            raw_hold = txn.get(hold_key, None, meta_db)
            until = _unpack_hold(raw_hold)[1] if raw_hold is not None else 0
            if until > now_ms_:
                return until, 0, None
            meta = txn.get(meta_key, None, meta_db)
            if meta is None:
                return 0, 0, None
            _, load, fire = _unpack_meta(meta)
            if fire >= load:
                return 0, 0, None
            slot = fire + 1  # the head: held until its settle moves the fire pointer past it
            key = prefix + b"%d" % slot
            raw = txn.get(key, None, data_db)
            if raw is not None and len(raw) >= _DATA_HEADER.size:
                expire_at, _, attempts = _unpack_data_header(raw)
                if expire_at and expire_at <= now_ms_:  # expired unclaimed: a hole made now
                    txn.delete(key, b"", data_db)
                    self._ctx.add_holes(txn, magazine, shard, made=1)
                    raw = None
                else:
                    raw = _pack_data_header(expire_at, now_ms_, attempts + bump) + raw[_DATA_HEADER.size:]
                    txn.put(key, raw, True, True, False, data_db)
            if raw is None:  # a hole (or the head settled, its hold never released): passed, not held
                txn.put(meta_key, _pack_meta(0, load, slot) + meta[24:], True, True, False, meta_db)
                if raw_hold is not None:
                    txn.delete(hold_key, b"", meta_db)
            else:
                txn.put(hold_key, _pack_hold(0, now_ms_ + hold_ms, 0), True, True, False, meta_db)
            return 0, slot, raw

        until, slot, raw = self._ctx.grouped("claim_held", write)
        if until:
            return HeldClaim([], until)
        if not slot:
            return HeldClaim([])
        ref = SlotRef(magazine, shard, slot)
        return HeldClaim([Claimed(ref, None if raw is None else _unpack_data(raw), False)])

    def _release(self, txn: Any, magazine: str, shard: int, slot: int, until_ms: int) -> bool:
        """release_hold, inside a write transaction."""
        meta_key, hold_key = self._ctx.keys(magazine, shard)[0], self._hold_key(magazine, shard)
        meta_db = self._ctx.meta
        meta = txn.get(meta_key, None, meta_db)
        if meta is None or _unpack_meta(meta)[2] != slot - 1 or txn.get(hold_key, None, meta_db) is None:
            return False
        if until_ms:  # held until then, its slot the next claim's
            txn.put(hold_key, _pack_hold(0, until_ms, 0), True, True, False, meta_db)
        else:  # settled: the fire pointer passes it
            txn.put(meta_key, _pack_meta(0, _unpack_meta(meta)[1], slot) + meta[24:], True, True, False, meta_db)
            txn.delete(hold_key, b"", meta_db)
        return True

    def release_hold(self, magazine: str, shard: int, slot: int, until_ms: int = 0) -> bool:
        return self._ctx.grouped("release_hold", lambda txn: self._release(txn, magazine, shard, slot, until_ms))

    def settle_held(self, refs: Sequence[SlotRef], ids: Sequence[str | None] | None = None) -> int:
        data_db, data_key = self._ctx.data, self._ctx.data_key

        def write(txn: Any) -> int:  # the deletes and the releases in one transaction
            present = 0
            for ref in refs:
                present += txn.delete(data_key(ref), b"", data_db)
                self._release(txn, ref.magazine, ref.shard, ref.slot, 0)
            return present

        return self._ctx.grouped("settle_held", write)

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        bump = 1 if count_attempt else 0
        out = []
        with self._ctx.write("restamp", durable=False) as txn:
            for ref in refs:
                key = self._ctx.data_key(ref)
                raw = txn.get(key, db=self._ctx.data)
                if raw is None or _expired(raw, now_ms_):
                    out.append(Claimed(ref, None, False))
                    continue
                if len(raw) >= _DATA_HEADER.size:
                    expire_at, _, attempts = _unpack_data_header(raw)
                    raw = _pack_data_header(expire_at, now_ms_, attempts + bump) + raw[_DATA_HEADER.size:]
                    txn.put(key, raw, db=self._ctx.data)
                out.append(Claimed(ref, _unpack_data(raw, ref), False))
        return out

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        # No write can be late here: a missing record is a hole already, and a present one is no hole.
        return [envelope is None for envelope in self._reads.read(refs)]

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        if CURSOR_INFIX in ref[0]:  # a cursor's claim records always carry their claim's fireTS
            return self._reads.read([ref])[0]
        key = self._ctx.data_key(ref)
        with self._ctx.write("stamp_unfired", durable=False) as txn:
            raw = txn.get(key, db=self._ctx.data)
            if raw is None or _expired(raw, now_ms_):
                return None
            if len(raw) < _DATA_HEADER.size:
                return _unpack_data(raw, ref)  # damaged: unreadable, not stamped
            expire_at, fire_ts, attempts = _unpack_data_header(raw)
            if not fire_ts:
                raw = _pack_data_header(expire_at, now_ms_, attempts) + raw[_DATA_HEADER.size:]
                txn.put(key, raw, db=self._ctx.data)
        return _unpack_data(raw, ref)
