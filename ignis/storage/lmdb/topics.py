"""The lmdb store's topics: the topic registry, and the cursors subscriptions read them through.

A topic's messages are a magazine named after it (loaded as any magazine is, with the subject in the record). A
subscription reads it through its cursor magazine (`names.cursor_of`), whose records live in an LMDB environment of
their own (ignis.storage.lmdb.cursor_environments): per topic shard, the cursor's meta record holds its position as
the fire pointer (the load pointer is the topic's), and a claim writes, in the cursor's slot of the same number, a
small claim record (the message's id, fireTS, attempts; no payload) that an ack deletes and a sweep moves on, the
message itself staying in the topic. A claim is one transaction of the cursor's environment, with the topic read in
a read transaction of the store's: it reads the topic's load pointer, moves the cursor over the slots it takes,
skips what the filter does not select and what expired (counted on the cursor's hole record: what the subscription
lost to retention), and writes the claim records; so no claim record is ever missing for a slot a subscription
took. Reads of a cursor magazine (`peek`, `read`) join each claim record to its topic record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lmdb

from ignis import names
from ignis.envelope import Envelope, now_ms
from ignis.storage.base import Claimed, CursorClaim, QueueRecord, SlotRef
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.cursor_environments import CursorEnvironments
from ignis.storage.lmdb.records import (
    _DATA,
    _expired,
    _fire_pointer,
    _load_pointer,
    _new_ref,
    _plain_head,
    _record,
    _unpack,
    _unpack_data,
    _unpack_data_head,
    _unpack_data_header,
)
from ignis.subjects import SubjectFilter

CREATED_AT = "createdAt"
SCAN_LIMIT = 10_000  # topic slots one claim looks at, at most (a filter that selects little: the next claim goes on)


class Topics:
    """Topic records (`Storage.apply_topic`, ...) and cursor claims, reads and moves (`Storage.claim_cursor`, ...)."""

    def __init__(self, ctx: StoreContext, cursors: CursorEnvironments, farm_id: str) -> None:
        self._ctx = ctx
        self._cursors = cursors
        self._set = names.topic_set(farm_id, ctx.client_id)
        self._db: Any = None

    @property
    def db(self) -> Any:
        """The topic set's database, opened on first use (a store without topics has none)."""
        if self._db is None:
            self._db = self._ctx.env.db(self._set)
        return self._db

    # ---- registry -----------------------------------------------------------------------------------
    def apply_topic(self, name: str, config: Mapping[str, Any]) -> bool:
        key, db = name.encode(), self.db  # (the database opened before a transaction that reads it begins)
        now = now_ms()
        with self._ctx.write("apply_topic") as txn:
            current = self._ctx.get_bins(txn, db, key, now)
            bins = {CREATED_AT: now} if current is None else current[0]
            bins.update(config)
            txn.put(key, _record(bins), db=db)  # topics do not expire: they are deleted
        return current is None

    def get_topic(self, name: str) -> QueueRecord | None:
        db = self.db
        found = self._ctx.read("get_topic", lambda txn: self._ctx.get_bins(txn, db, name.encode(), now_ms()))
        return QueueRecord(name, found[0]) if found else None

    def list_topics(self) -> list[QueueRecord]:
        db = self.db

        def scan(txn: Any) -> list[QueueRecord]:
            now = now_ms()
            return [QueueRecord(bytes(key).decode(), _unpack(bytes(raw)))
                    for key, raw in txn.cursor(db=db) if not _expired(raw, now)]

        return sorted(self._ctx.read("list_topics", scan), key=lambda r: r.name)

    def delete_topic(self, name: str) -> bool:
        db = self.db
        with self._ctx.write("delete_topic") as txn:
            raw = txn.pop(name.encode(), db=db)
        return raw is not None

    # ---- cursors --------------------------------------------------------------------------------------
    # A cursor's records are in its own environment (ignis.storage.lmdb.cursor_environments); its topic's messages
    # and load pointers in the store's, read in a read transaction there: only the cursor's write lock is taken.
    def set_cursor(self, cursor: str, positions: Mapping[int, int]) -> None:
        own = self._cursors.of(cursor)
        with own.write("set_cursor") as txn:
            for shard, position in positions.items():
                own.meta_put(txn, own.keys(cursor, shard)[0], 0, max(int(position), 0))

    def claim_cursor(self, cursor: str, shard: int, max_slots: int, now: int, only: SubjectFilter | None,
                     up_to: int | None = None, count_attempt: bool = True) -> CursorClaim:
        topic = names.cursor_topic(cursor)
        assert topic is not None
        main, own = self._ctx, self._cursors.of(cursor)
        topic_meta, topic_prefix = main.keys(topic, shard)
        cursor_meta, cursor_prefix = own.keys(cursor, shard)
        main_env, main_data, main_meta = main.env.env, main.data, main.meta
        own_data, selects = own.data, None if only is None or only.matches_all else only.matches

        if main.closed or main.env.forked:  # (the look below opens its transactions directly)
            main.opened("claim")  # raises: closed, or inherited through fork
        # A look first, without the cursor's write lock: a caught-up cursor waits for no commit of its own.
        try:
            with main_env.begin(None, None, False) as txn:
                load = _load_pointer(txn.get(topic_meta, None, main_meta))
            with own.env.env.begin(None, None, False) as txn:
                fire = _fire_pointer(txn.get(cursor_meta, None, own.meta))
        except lmdb.Error as exc:
            raise main.map_error(exc) from None
        if fire >= (load if up_to is None else min(load, up_to)):
            # (Caught up with what is committed. A cursor's listener is rung after a publish's commit, never before
            # it, so there is no commit it was woken for that it might not see yet: ignis.storage.lmdb.doorbell.)
            return CursorClaim([], 0, True)

        def write(txn: Any) -> CursorClaim:  # in the cursor's environment, its write lock held: one claimer at once
            put = txn.put
            fire = _fire_pointer(txn.get(cursor_meta, None, own.meta))
            with main_env.begin(None, None, False) as topic_txn:
                get = topic_txn.get
                load = _load_pointer(get(topic_meta, None, main_meta))
                limit = load if up_to is None else min(load, up_to)
                if fire >= limit:
                    return CursorClaim([], 0, True)
                expired = 0
                slot = fire
                if _gone(get(topic_prefix + b"%d" % (fire + 1), None, main_data), now):  # fell behind the retention
                    slot = _first_retained(get, topic_prefix, main_data, fire + 1, limit, now) - 1
                    expired = slot - fire
                claimed: list[Claimed] = []
                scanned = 0
                while slot < limit and len(claimed) < max_slots and scanned < SCAN_LIMIT:
                    slot += 1
                    scanned += 1
                    raw = get(topic_prefix + b"%d" % slot, None, main_data)
                    if _gone(raw, now):  # expired (or trimmed) since: lost to retention too
                        expired += 1
                        continue
                    envelope = _unpack_data(raw, f"{topic}/{shard}/{slot}")
                    if selects is not None and not selects(envelope.subject):
                        continue
                    envelope.fire_ts, envelope.attempts = now, 1 if count_attempt else 0
                    put(cursor_prefix + b"%d" % slot, _claim_record(envelope, raw), True, True, False, own_data)
                    claimed.append(_new_ref(Claimed, (_new_ref(SlotRef, (cursor, shard, slot)), envelope, False)))
            own.meta_put(txn, cursor_meta, 0, slot)
            if expired:
                own.add_holes(txn, cursor, shard, claimed=expired)
            return CursorClaim(claimed, expired, slot >= limit)

        if own.sync:  # handed out before the commit's flush, committed with this process's other writes; led in
            # this thread when nothing else commits (group_commit.LEAD_WHEN_IDLE: the cursor's environment is its own)
            return own.grouped("claim", write, early=True, lead_when_idle=True)
        try:  # durability=fast: its own transaction (see StoreContext.grouped)
            with own.begin("claim", True) as txn:
                return write(txn)
        except lmdb.Error as exc:
            raise own.map_error(exc) from None

    def restamp_cursor(self, refs: Sequence[SlotRef], now: int, only: SubjectFilter | None,
                       count_attempt: bool = True) -> list[Claimed]:
        """Stamp the claim records again (a kept message handed out late), or write the claim of a slot whose topic
        record was awaited (never, here: a topic publish is one transaction); each joined to its message."""
        out: list[Claimed] = []
        by_cursor: dict[str, list[int]] = {}
        for i, ref in enumerate(refs):
            by_cursor.setdefault(ref[0], []).append(i)
        placed: dict[int, Claimed] = {}
        for cursor, indexes in by_cursor.items():
            own = self._cursors.of(cursor)
            with own.write("restamp", durable=False) as txn, self._ctx.env.env.begin(None, None, False) as topic_txn:
                for i in indexes:
                    ref = refs[i]
                    topic_raw = topic_txn.get(self._topic_key(ref), db=self._ctx.data)
                    if _gone(topic_raw, now):
                        placed[i] = Claimed(ref, None, False)  # expired meanwhile: a hole
                        continue
                    envelope = _unpack_data(topic_raw, ref)
                    key = own.data_key(ref)
                    claim = txn.get(key, db=own.data)
                    if claim is None or _expired(claim, now):
                        if only is not None and not only.matches(envelope.subject):
                            placed[i] = Claimed(ref, None, None)  # not for this subscription: passed over
                            continue
                        attempts = 1 if count_attempt else 0
                    else:
                        attempts = _unpack_data_header(claim)[2] + (1 if count_attempt else 0)
                    envelope.fire_ts, envelope.attempts = now, attempts
                    txn.put(key, _claim_record(envelope, topic_raw), db=own.data)
                    placed[i] = Claimed(ref, envelope, False)
        out.extend(placed[i] for i in range(len(refs)))
        return out

    def seal_cursor(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool | None]:
        """Awaited topic slots given up: here a topic record is never in flight, so a missing one is gone for good
        (sealed, True) and a present one landed (False)."""
        def look(txn: Any) -> list[bool | None]:
            now = now_ms()
            return [_gone(txn.get(self._topic_key(ref), db=self._ctx.data), now) for ref in refs]

        return self._ctx.read("seal", look)

    def _topic_key(self, ref: SlotRef) -> bytes:
        topic = names.cursor_topic(ref[0])
        assert topic is not None
        return self._ctx.keys(topic, ref[1])[1] + b"%d" % ref[2]


def _gone(raw: bytes | None, now: int) -> bool:
    return raw is None or _expired(raw, now)


def _claim_record(envelope: Envelope, topic_raw: bytes) -> bytes:
    """A claim record: the claim's fireTS and attempts in the fixed header, the message's id and load time; no
    payload (the message is the topic's), and it expires with the topic's record. Packed from the topic record's
    header and id as they are (one per message a subscription claims)."""
    expire_at, _, _, fmt, loaded_at, codec, _, id_length = _unpack_data_head(topic_raw)
    return _plain_head(id_length).pack(expire_at, envelope.fire_ts or 0, envelope.attempts, fmt, loaded_at, codec, 0,
                                       id_length, topic_raw[_DATA.size:_DATA.size + id_length], 0)


def _first_retained(get: Any, prefix: bytes, db: Any, low: int, high: int, now: int) -> int:
    """The first slot in low..high whose record is still there (high + 1 if none): records leave a topic oldest
    first (by age, or by a trim to its byte bound), so presence is monotonic in the slot and a binary search
    finds the edge."""
    while low <= high:
        mid = (low + high) // 2
        if _gone(get(prefix + b"%d" % mid, None, db), now):
            low = mid + 1
        else:
            high = mid - 1
    return low

