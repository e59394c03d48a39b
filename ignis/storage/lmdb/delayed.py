"""The lmdb store's delayed-message primitives (ignis.delay): messages held until their due time.

A delayed message is a data record keyed `{queue}_DELAYED_{due:013d}_{msgId}`, so key order is due order and
the due ones are one prefix read; the queue's count and the lease of the process moving the due ones are bins
of its delay record in the meta database. A due message is moved into main in one transaction (`move_delayed`:
the copy into main's next slot, the delete of its delayed record and the count's decrement), so `delayed` and
`depth` are exact at every moment: no reader sees a message counted in both, or in neither. `change_mark` (the
environment's last transaction id) tells a waiter cheaply whether anything was committed since it last looked.
Separate from the magazine primitives: these records have no shard or slot, and only ignis.delay uses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lmdb

from ignis import names
from ignis.envelope import Envelope, now_ms
from ignis.storage.base import DELAY_LEADER, DELAY_UNTIL, DELAYED_COUNT, DelayState, SlotRef
from ignis.storage.lmdb.context import StoreContext, _delete_keys
from ignis.storage.lmdb.records import _expire_at, _expired, _new_ref, _pack_data, _record, _unpack_data


class DelayedMessages:
    """Delayed messages: load, list the due ones, settle, lead the mover, state (`Storage.*_delayed`, ...)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    # ---- delayed messages (ignis.delay) -------------------------------------------------------
    # Data records under `{queue}_DELAYED_{due:013d}_{msgId}` (key order is due order, so the due ones are a
    # prefix read); the count and the mover's lease in the meta record `{queue}_DELAYED_METADATA`.
    def _delay_bins(self, txn: Any, queue: str, now: int) -> tuple[bytes, dict[str, Any]]:
        key = names.delayed_meta_key(queue).encode()
        found = self._ctx.get_bins(txn, self._ctx.meta, key, now)
        return key, (found[0] if found is not None else {})

    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        if not envelopes:
            return
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        packed = [(names.delayed_key(queue, env.due_at or 0, env.msg_id).encode(), _pack_data(env, expire_at))
                  for env in envelopes]

        def write(txn: Any) -> None:
            key, bins = self._delay_bins(txn, queue, now)
            bins[DELAYED_COUNT] = int(bins.get(DELAYED_COUNT, 0)) + len(packed)
            txn.put(key, _record(bins), db=self._ctx.meta)
            for data_key, value in packed:
                txn.put(data_key, value, db=self._ctx.data)

        self._ctx.grouped("load_delayed", write, durable=True)

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        prefix = names.delayed_prefix(queue).encode()
        last = names.delayed_key(queue, now_ms_, "~").encode()  # every key due at or before now_ms_

        def scan(txn: Any) -> list[Envelope]:
            out: list[Envelope] = []
            cursor = txn.cursor(db=self._ctx.data)
            if not cursor.set_range(prefix):
                return out
            for key, raw in cursor:
                if not key.startswith(prefix) or key > last or len(out) >= limit:
                    break
                if _expired(raw, now_ms_):
                    continue
                out.append(_unpack_data(raw, key.decode(errors="replace")))
            return out

        return self._ctx.read("due_delayed", scan)

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        keys = [names.delayed_key(queue, env.due_at or 0, env.msg_id).encode() for env in envelopes]

        def write(txn: Any) -> int:
            gone = _delete_keys(txn, keys, self._ctx.data)
            key, bins = self._delay_bins(txn, queue, now_ms())
            bins[DELAYED_COUNT] = max(int(bins.get(DELAYED_COUNT, 0)) - gone, 0)
            txn.put(key, _record(bins), db=self._ctx.meta)
            return gone

        return self._ctx.grouped("settle_delayed", write, durable=True)

    def move_delayed(self, queue: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        """`Storage.move_delayed`: one write transaction appends each copy whose delayed record is still there to
        its shard of main, deletes that record and takes the moved ones off the queue's count; it rings main's
        doorbell as a load does and is durable as a load is."""
        if not items:
            return []
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        packed = [(names.delayed_key(queue, env.due_at or 0, env.msg_id).encode(), shard, _pack_data(env, expire_at))
                  for shard, env in items]
        ctx, data_db = self._ctx, self._ctx.data
        refs: list[SlotRef] = []
        try:
            with ctx.begin("move_delayed", True) as txn:
                shards: dict[int, list[Any]] = {}
                gone = 0
                for delayed_key, shard, value in packed:
                    raw = txn.get(delayed_key, None, data_db)
                    if raw is None:
                        continue  # moved or settled already: never copied twice
                    txn.delete(delayed_key, b"", data_db)
                    gone += 1
                    if _expired(raw, now):
                        continue  # expired meanwhile: absent, so uncounted and not delivered
                    state = shards.get(shard)
                    if state is None:
                        state = shards[shard] = [*ctx.meta_get(txn, queue, shard), ctx.keys(queue, shard)[1]]
                    slot = state[1] = state[1] + 1
                    txn.put(state[4] + b"%d" % slot, value, db=data_db)
                    refs.append(_new_ref(SlotRef, (queue, shard, slot)))
                for meta_key, load, fire, tail, _ in shards.values():
                    ctx.meta_put(txn, meta_key, load, fire, tail)
                if gone:
                    key, bins = self._delay_bins(txn, queue, now)
                    bins[DELAYED_COUNT] = max(int(bins.get(DELAYED_COUNT, 0)) - gone, 0)
                    txn.put(key, _record(bins), db=ctx.meta)
                if shards:
                    ctx.ring_committing(queue, shards)
            if shards:
                ctx.ring(queue, shards, after_committing=True)
            ctx.flush()
        except lmdb.Error as exc:
            raise ctx.map_error(exc) from None
        return refs

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        def write(txn: Any) -> bool:
            key, bins = self._delay_bins(txn, queue, now_ms_)
            if bins.get(DELAY_LEADER) not in (None, holder) and int(bins.get(DELAY_UNTIL, 0)) > now_ms_:
                return False
            bins[DELAY_LEADER], bins[DELAY_UNTIL] = holder, now_ms_ + hold_ms
            txn.put(key, _record(bins), db=self._ctx.meta)
            return True

        return self._ctx.grouped("lead_delayed", write)

    def change_mark(self) -> int | None:
        # The last committed transaction's id, from the environment's meta pages (mdb_env_info): every commit of
        # every process moves it.
        return int(self._ctx.env.env.info()["last_txnid"])

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        now = now_ms()

        def read(txn: Any) -> list[DelayState]:
            out = []
            cursor = txn.cursor(db=self._ctx.data)
            for queue in queues:
                bins = self._delay_bins(txn, queue, now)[1]
                count = int(bins.get(DELAYED_COUNT, 0))
                next_due = None
                prefix = names.delayed_prefix(queue).encode()
                if count and cursor.set_range(prefix) and cursor.key().startswith(prefix):
                    due = cursor.key()[len(prefix):len(prefix) + 13]
                    next_due = int(due) if due.isdigit() else None
                out.append(DelayState(count, next_due))
            return out

        return self._ctx.read("delay_states", read)
