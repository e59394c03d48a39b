"""The lmdb store's reads and deletes: records and pointers read back, messages settled and magazines purged.

`read` and `peek` return stored envelopes (an expired record reads as absent), `pointers` and `watch_pointers`
a shard's LOAD/FIRE pointers and hole counters, `delete` settles messages (group-committed with
durability=fsync), `purge_magazine` drops a whole magazine in chunks, and `raw_record` shows any record with
its bin names for tools and tests. The watcher's beacons are here too, as the no-ops they are on lmdb: the
doorbell replaces them, and `watch_pointers` is what the watcher reads instead. Separate from claims and
loads: nothing here allocates or stamps a slot.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import lmdb

from ignis import names
from ignis.bounds import LOAD_BYTES
from ignis.envelope import Envelope, now_ms
from ignis.storage.base import FIRE_POINTER, HOLD_UNTIL, HOLES, HOLES_CLAIMED, LOAD_POINTER, ShardPointers, SlotRef
from ignis.storage.lmdb.context import CursorElsewhere, StoreContext, _delete_keys
from ignis.storage.lmdb.cursor_environments import CursorEnvironments
from ignis.storage.lmdb.records import (
    _DATA_HEADER,
    _HOLD_SUFFIX,
    _HOLES_SUFFIX,
    _META,
    _META_BYTES,
    _expired,
    _fire_pointer,
    _load_pointer,
    _unpack,
    _unpack_data,
    _unpack_data_header,
    _unpack_header,
    _unpack_holes,
    _unpack_meta,
    _unpack_meta_bytes,
)
from ignis.subjects import SubjectFilter

_CURSOR = names.CURSOR_INFIX  # in a magazine's name only if it is a subscription's cursor (queue names have no '_')


class Reads:
    """Reads, peeks, pointers, settles, deletes and purges (`Storage.read`, `peek`, `pointers`, `delete`, ...)."""

    def __init__(self, ctx: StoreContext, cursors: CursorEnvironments) -> None:
        self._ctx = ctx
        self._cursors = cursors

    def _cursor_pointers(self, txn: Any, cursor: str, shards: int, holes: bool = True) -> list[ShardPointers]:
        """A subscription's cursor's pointers per shard: the load pointer its topic's (read in `txn`, the store's
        environment), the fire pointer and hole counts its own (read in the cursor's environment)."""
        topic = names.cursor_topic(cursor)
        main, own = self._ctx, self._cursors.of(cursor)
        loads = [_load_pointer(txn.get(main.keys(topic, shard)[0], None, main.meta))  # type: ignore[arg-type]
                 for shard in range(shards)]
        out = []
        with own.env.env.begin(None, None, False) as own_txn:
            for shard, load in enumerate(loads):
                fire = _fire_pointer(own_txn.get(own.keys(cursor, shard)[0], None, own.meta))
                raw = own_txn.get(own.holes_key(cursor, shard), None, own.meta) if holes else None
                _, made, passed = _unpack_holes(raw) if raw is not None else (0, 0, 0)
                out.append(ShardPointers(load, fire, made, passed))
        return out

    def _claim_records(self, cursor: str, refs: Sequence[SlotRef]) -> list[bytes | None]:
        """The claim records of a cursor's slots, read in the cursor's environment."""
        own = self._cursors.of(cursor)
        try:
            with own.env.env.begin(None, None, False) as txn:
                return [txn.get(own.data_key(ref), None, own.data) for ref in refs]
        except lmdb.Error as exc:
            raise own.map_error(exc) from None

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        def read(txn: Any) -> list[tuple[list[int], int]]:
            get, meta_db, unpack = txn.get, self._ctx.meta, _unpack_meta
            out = []
            for magazine, shards in magazines:
                with_work, loaded = [], 0
                if _CURSOR in magazine:  # a subscription's cursor: its topic's load pointers, its own fire pointers
                    for shard, pointers in enumerate(self._cursor_pointers(txn, magazine, shards, holes=False)):
                        loaded += pointers.load
                        if pointers.load > pointers.fire:
                            with_work.append(shard)
                    out.append((with_work, loaded))
                    continue
                for shard in range(shards):
                    raw = get(self._ctx.keys(magazine, shard)[0], None, meta_db)
                    if raw is not None:
                        _, load, fire = unpack(raw)
                        loaded += load
                        if load > fire:
                            with_work.append(shard)
                out.append((with_work, loaded))
            return out

        return self._ctx.read("watch", read)

    def beacon(self, magazine: str) -> None:
        """Nothing: a load into a main magazine rang the doorbell already (StoreContext.ring)."""

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        return [0] * len(magazines)

    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        claims: dict[int, bytes | None] = {}  # a cursor slot's claim record, from the cursor's environment
        by_cursor: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            if _CURSOR in ref[0]:
                by_cursor.setdefault(ref[0], []).append(i)
        for cursor, indexes in by_cursor.items():
            claims.update(zip(indexes, self._claim_records(cursor, [refs[i] for i in indexes]), strict=True))

        def get_all(txn: Any) -> list[Envelope | None]:
            now = now_ms()
            out: list[Envelope | None] = []
            for i, ref in enumerate(refs):
                if i in claims:
                    out.append(self._joined(txn, ref, claims[i], now))
                    continue
                raw = txn.get(self._ctx.data_key(ref), db=self._ctx.data)
                out.append(None if raw is None or _expired(raw, now) else _unpack_data(raw, ref))
            return out

        return self._ctx.read("read", get_all)

    def peek(self, magazine: str, shard: int, first: int, last: int, only: SubjectFilter | None = None
             ) -> list[tuple[SlotRef, Envelope]]:
        cursor = names.cursor_topic(magazine) is not None
        selects = None if only is None or only.matches_all or cursor else only.matches

        if cursor:  # the claim records there are, from the cursor's environment, joined to the topic's records
            claims = self._cursor_claims_between(magazine, shard, max(first, 1), last)

            def join(txn: Any) -> list[tuple[SlotRef, Envelope]]:
                now = now_ms()
                return [(ref, joined) for ref, claim in claims
                        if (joined := self._joined(txn, ref, claim, now)) is not None]

            return self._ctx.read("peek", join)

        def scan(txn: Any) -> list[tuple[SlotRef, Envelope]]:
            now = now_ms()
            out = []
            prefix = self._ctx.keys(magazine, shard)[1]
            for slot in range(max(first, 1), last + 1):
                raw = txn.get(prefix + b"%d" % slot, db=self._ctx.data)
                if raw is not None and not _expired(raw, now):
                    envelope = _unpack_data(raw, f"{magazine}/{shard}/{slot}")
                    if selects is None or selects(envelope.subject):
                        out.append((SlotRef(magazine, shard, slot), envelope))
            return out

        return self._ctx.read("peek", scan)

    def _cursor_claims_between(self, cursor: str, shard: int, first: int, last: int) -> list[tuple[SlotRef, bytes]]:
        """The claim records of a cursor's shard in first..last, in slot order: the records there are, by one scan
        of the cursor's environment (a cursor's claims are few next to the slots it passed)."""
        own = self._cursors.of(cursor)
        prefix = own.keys(cursor, shard)[1]
        out: list[tuple[SlotRef, bytes]] = []
        if first > last:
            return out
        try:
            with own.env.env.begin(None, None, False) as txn:
                records = txn.cursor(own.data)
                found = records.set_range(prefix)
                while found:
                    key = records.key()
                    if not key.startswith(prefix):
                        break
                    slot = int(key[len(prefix):])  # (decimal: the keys' order is not the slots')
                    if first <= slot <= last:
                        out.append((SlotRef(cursor, shard, slot), records.value()))
                    found = records.next()
        except lmdb.Error as exc:
            raise own.map_error(exc) from None
        out.sort(key=lambda item: item[0].slot)
        return out

    def _joined(self, txn: Any, ref: SlotRef, claim: bytes | None, now: int) -> Envelope | None:
        """A cursor slot's message as its subscription holds it: the topic's record, with the claim record's fireTS
        and attempts (None without a claim record, or once the message left the topic)."""
        if claim is None or _expired(claim, now) or len(claim) < _DATA_HEADER.size:
            return None
        topic = names.cursor_topic(ref[0])
        raw = txn.get(self._ctx.keys(topic, ref[1])[1] + b"%d" % ref[2], None, self._ctx.data)  # type: ignore[arg-type]
        if raw is None or _expired(raw, now):
            return None
        envelope = _unpack_data(raw, ref)
        _, fire_ts, attempts = _unpack_data_header(claim)
        envelope.fire_ts, envelope.attempts = fire_ts or None, attempts
        return envelope

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        # A delete leaves no trace here; nor is one needed: a publish writes its slot in the transaction
        # that allocates it, so no slot below a fire pointer waits for its write (write_grace_ms = 0).
        return [False] * len(refs)

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[Any] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        # (ids: an lmdb environment never hands a slot out twice: a commit that a crash undid took every
        # process that saw it down with it, claims included.)
        ctx = self._ctx
        try:  # (a subscription's claims are in its cursor's environment: CursorElsewhere, on a key cache miss only)
            if len(refs) == 1:  # one message's ack (Message.ack, the per-message path): its key inline, no list
                magazine, shard, slot = refs[0]
                keys: Sequence[bytes] = ((ctx.key_cache.get((magazine, shard)) or ctx.keys(magazine, shard))[1]
                                         + b"%d" % slot,)
            else:
                keys = ctx.data_keys(refs)
        except CursorElsewhere:
            return self._delete_by_environment(refs)
        if ctx.sync:
            return ctx.grouped("delete", functools.partial(_delete_keys, keys=keys, db=ctx.data))
        present = 0
        try:  # durability=fast: its own transaction (see StoreContext.grouped), without the indirection: a hot path
            with ctx.begin("delete", True) as txn:
                delete, data_db = txn.delete, ctx.data
                for key in keys:
                    present += delete(key, b"", data_db)  # an expired, unpurged record counts too
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None
        return present

    def _delete_by_environment(self, refs: Sequence[SlotRef]) -> int:
        """Delete refs of several magazines, some of them cursors: each environment's in its own transaction."""
        groups: dict[str, list[SlotRef]] = {}
        for ref in refs:
            groups.setdefault(ref[0] if _CURSOR in ref[0] else "", []).append(ref)
        present = 0
        for cursor, group in groups.items():
            present += self._delete_keys_of(self._cursors.of(cursor) if cursor else self._ctx, group)
        return present

    def _delete_keys_of(self, ctx: StoreContext, refs: Sequence[SlotRef]) -> int:
        keys = ctx.data_keys(refs)
        if ctx.sync:
            return ctx.grouped("delete", functools.partial(_delete_keys, keys=keys, db=ctx.data))
        try:
            with ctx.begin("delete", True) as txn:
                return _delete_keys(txn, keys, ctx.data)
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        def get_all(txn: Any) -> dict[int, ShardPointers]:
            if _CURSOR in magazine:
                return dict(enumerate(self._cursor_pointers(txn, magazine, shards)))
            out = {}
            for shard in range(shards):
                _, load, fire, _ = self._ctx.meta_get(txn, magazine, shard)
                raw = txn.get(self._ctx.holes_key(magazine, shard), db=self._ctx.meta)
                _, holes, passed = _unpack_holes(raw) if raw is not None else (0, 0, 0)
                out[shard] = ShardPointers(load, fire, holes, passed)
            return out

        return self._ctx.read("pointers", get_all)

    def purge_magazine(self, magazine: str) -> int:
        removed = 0
        prefixes = [names.magazine_prefix(magazine).encode()]
        if names.queue_and_kind(magazine)[1] == "main":  # and the queue's delayed messages, and their record
            prefixes.append(names.delayed_prefix(magazine).encode())
        ctx = self._cursors.of(magazine) if _CURSOR in magazine else self._ctx  # (a cursor: its own environment)
        for prefix in prefixes:
            more = True
            while more:  # in chunks, so producers on other queues are not blocked for long
                with ctx.write("purge_magazine") as txn:
                    more = False
                    for db in (ctx.data, ctx.meta):
                        n, more_here = _delete_prefix(txn.cursor(db=db), prefix, 5000)
                        removed += n if db is ctx.data else 0
                        more = more or more_here
        return removed

    # ---- introspection for tools and tests ----------------------------------------------------
    def raw_record(self, set_name: str, key: str) -> tuple[int, dict[str, Any]] | None:
        """(expire-at ms, bins) of any record, expired or not — what `aql` would show (a cursor's records from the
        cursor's own environment)."""
        magazine = key.partition("_SHARD_")[0]
        client = self._ctx.client_id
        if _CURSOR in magazine and set_name in (names.data_set(client), names.meta_set(client)):
            return _RawReader(self._cursors.of(magazine)).get(set_name, key)
        return _RawReader(self._ctx).get(set_name, key)


class _RawReader:
    """raw_record's reading of one environment's record."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def get(self, set_name: str, key: str) -> tuple[int, dict[str, Any]] | None:
        db = self._ctx.env.db(set_name)

        def get(txn: Any) -> tuple[int, dict[str, Any]] | None:
            raw = txn.get(key.encode(), db=db)
            if raw is None:
                return None
            if db is self._ctx.data:
                return _unpack_header(raw)[0], _unpack_data(bytes(raw)).to_bins()
            if db is self._ctx.meta and key.endswith("_METADATA") and len(raw) == _META_BYTES.size:
                expire_at, load, fire, load_bytes = _unpack_meta_bytes(raw)  # a shard bounded by bytes
                return expire_at, {LOAD_POINTER: load, FIRE_POINTER: fire, LOAD_BYTES: load_bytes}
            if db is self._ctx.meta and len(raw) == _META.size:  # (a queue's delay record is a bin map)
                expire_at, first, second = _unpack_meta(raw)
                if key.encode().endswith(_HOLES_SUFFIX):
                    return expire_at, {HOLES: first, HOLES_CLAIMED: second}
                if key.encode().endswith(_HOLD_SUFFIX):  # an ordered queue's shard hold
                    return expire_at, {HOLD_UNTIL: first}
                if key.encode().endswith(b"_BYTES"):  # a bounded shard's, as stores before 2026-11-30 kept it
                    return expire_at, {LOAD_BYTES: first}
                return expire_at, {LOAD_POINTER: first, FIRE_POINTER: second}
            return _unpack_header(raw)[0], _unpack(bytes(raw))

        return self._ctx.read("raw_record", get)



def _delete_prefix(cursor: Any, prefix: bytes, limit: int) -> tuple[int, bool]:
    removed = 0
    if not cursor.set_range(prefix):
        return 0, False
    while bytes(cursor.key()).startswith(prefix):
        if removed >= limit:
            return removed, True
        removed += 1
        if not cursor.delete():
            break
    return removed, False
