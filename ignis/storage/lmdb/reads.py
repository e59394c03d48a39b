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
from ignis.storage.lmdb.context import StoreContext, _delete_keys
from ignis.storage.lmdb.records import (
    _DATA_HEADER,
    _HOLD_SUFFIX,
    _HOLES_SUFFIX,
    _META,
    _META_BYTES,
    _expired,
    _unpack,
    _unpack_data,
    _unpack_data_header,
    _unpack_header,
    _unpack_holes,
    _unpack_meta,
    _unpack_meta_bytes,
)
from ignis.subjects import SubjectFilter


class Reads:
    """Reads, peeks, pointers, settles, deletes and purges (`Storage.read`, `peek`, `pointers`, `delete`, ...)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        def read(txn: Any) -> list[tuple[list[int], int]]:
            get, meta_db, unpack = txn.get, self._ctx.meta, _unpack_meta
            out = []
            for magazine, shards in magazines:
                with_work, loaded = [], 0
                if names.cursor_topic(magazine) is not None:  # a subscription's cursor: its topic's load pointers
                    for shard in range(shards):
                        load, fire = self._ctx.load_and_fire(txn, magazine, shard)
                        loaded += load
                        if load > fire:
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
        def get_all(txn: Any) -> list[Envelope | None]:
            now = now_ms()
            out: list[Envelope | None] = []
            for ref in refs:
                raw = txn.get(self._ctx.data_key(ref), db=self._ctx.data)
                if names.cursor_topic(ref[0]) is not None:
                    out.append(self._joined(txn, ref, raw, now))
                else:
                    out.append(None if raw is None or _expired(raw, now) else _unpack_data(raw, ref))
            return out

        return self._ctx.read("read", get_all)

    def peek(self, magazine: str, shard: int, first: int, last: int, only: SubjectFilter | None = None
             ) -> list[tuple[SlotRef, Envelope]]:
        cursor = names.cursor_topic(magazine) is not None
        selects = None if only is None or only.matches_all or cursor else only.matches

        def scan(txn: Any) -> list[tuple[SlotRef, Envelope]]:
            now = now_ms()
            out = []
            prefix = self._ctx.keys(magazine, shard)[1]
            for slot in range(max(first, 1), last + 1):
                raw = txn.get(prefix + b"%d" % slot, db=self._ctx.data)
                if cursor:
                    ref = SlotRef(magazine, shard, slot)
                    joined = self._joined(txn, ref, raw, now)
                    if joined is not None:
                        out.append((ref, joined))
                elif raw is not None and not _expired(raw, now):
                    envelope = _unpack_data(raw, f"{magazine}/{shard}/{slot}")
                    if selects is None or selects(envelope.subject):
                        out.append((SlotRef(magazine, shard, slot), envelope))
            return out

        return self._ctx.read("peek", scan)

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
        if len(refs) == 1:  # one message's ack (Message.ack, the per-message path): its key inline, no helper's list
            magazine, shard, slot = refs[0]
            keys: Sequence[bytes] = ((ctx.key_cache.get((magazine, shard)) or ctx.keys(magazine, shard))[1]
                                     + b"%d" % slot,)
        else:
            keys = ctx.data_keys(refs)
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

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        def get_all(txn: Any) -> dict[int, ShardPointers]:
            out = {}
            for shard in range(shards):
                load, fire = self._ctx.load_and_fire(txn, magazine, shard)
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
        for prefix in prefixes:
            more = True
            while more:  # in chunks, so producers on other queues are not blocked for long
                with self._ctx.write("purge_magazine") as txn:
                    more = False
                    for db in (self._ctx.data, self._ctx.meta):
                        n, more_here = _delete_prefix(txn.cursor(db=db), prefix, 5000)
                        removed += n if db is self._ctx.data else 0
                        more = more or more_here
        return removed

    # ---- introspection for tools and tests ----------------------------------------------------
    def raw_record(self, set_name: str, key: str) -> tuple[int, dict[str, Any]] | None:
        """(expire-at ms, bins) of any record, expired or not — what `aql` would show."""
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
