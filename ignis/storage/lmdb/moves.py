"""The lmdb store's fenced moves: records taken out of one magazine and loaded into another, all or nothing.

The sweeper moves claimed-and-abandoned or expired-for-delivery messages to the sideline (and back) with
`move`: in one transaction it checks the sweeper epoch against the newest handed out (the fence), checks each
source record is still the one that was seen (its fireTS), writes it into the target's next slots and deletes
the source, counting a hole where a record left a slot no claim had reached. Separate from allocation and
claims: it is the one primitive that spans two magazines and the farm-wide epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ignis.envelope import CODEC_UNREADABLE, now_ms
from ignis.errors import StaleEpoch
from ignis.storage.base import Move
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.records import (
    _DATA_HEADER,
    EPOCH_KEY,
    _expire_at,
    _expired,
    _pack_data,
    _unpack,
    _unpack_data_header,
)


class Moves:
    """Fenced moves between magazines (`Storage.move`)."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        if not moves:
            return []
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        values = [_pack_data(m.envelope, expire_at) for m in moves]
        done: list[bool] = []
        with self._ctx.write("move") as txn:
            # The fence, in the move's own transaction: only the newest epoch handed out may move.
            raw = txn.get(EPOCH_KEY, db=self._ctx.system)
            newest = _unpack(raw)["epoch"] if raw else 0
            if epoch < newest:
                raise StaleEpoch(moves[0].source.magazine, epoch, newest)
            shards: dict[int, list[Any]] = {}
            for m, value in zip(moves, values, strict=True):
                key = self._ctx.data_key(m.source)
                raw = txn.get(key, db=self._ctx.data)
                fire_ts = None if raw is None or len(raw) < _DATA_HEADER.size else \
                    (_unpack_data_header(raw)[1] or None)
                seen = fire_ts == m.fired_at if fired_before is None else \
                    fire_ts is not None and fire_ts < fired_before
                if m.envelope.codec == CODEC_UNREADABLE:  # moved on as it is: nobody holds an unreadable record
                    seen = True
                if raw is None or _expired(raw, now) or not seen:
                    done.append(False)  # settled, moved by someone else, or not the record that was seen
                    continue
                if self._ctx.meta_get(txn, m.source.magazine, m.source.shard)[2] < m.source.slot:
                    # taken out before any claim reached it: its slot is a hole now
                    self._ctx.add_holes(txn, m.source.magazine, m.source.shard, made=1)
                state = shards.get(m.shard)
                if state is None:
                    state = shards[m.shard] = [*self._ctx.meta_get(txn, target, m.shard),
                                               self._ctx.keys(target, m.shard)[1]]
                state[1] += 1
                txn.put(state[4] + b"%d" % state[1], value, db=self._ctx.data)
                txn.delete(key, db=self._ctx.data)
                done.append(True)
            for meta_key, load, fire, tail, _ in shards.values():
                self._ctx.meta_put(txn, meta_key, load, fire, tail)
        if shards:
            self._ctx.ring(target, shards)
        return done
