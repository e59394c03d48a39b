"""The lmdb store's fenced moves: records taken out of one magazine and loaded into another, all or nothing.

The sweeper moves claimed-and-abandoned or expired-for-delivery messages to the sideline (and back) with
`move`: in one transaction it checks the sweeper epoch against the newest handed out (the fence), checks each
source record is still the one that was seen (its fireTS), writes it into the target's next slots and deletes
the source, counting a hole where a record left a slot no claim had reached. A subscription's claims are in its
cursor's own environment, so a move out of a cursor commits the target first and deletes the sources after.
Separate from allocation and claims: it is the one primitive that spans two magazines and the farm-wide epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ignis.envelope import CODEC_UNREADABLE, now_ms
from ignis.errors import StaleEpoch
from ignis.names import CURSOR_INFIX as _CURSOR
from ignis.storage.base import Move
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.cursor_environments import CursorEnvironments
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

    def __init__(self, ctx: StoreContext, cursors: CursorEnvironments) -> None:
        self._ctx = ctx
        self._cursors = cursors

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        if not moves:
            return []
        if any(_CURSOR in m.source.magazine for m in moves):
            return self._move_from_cursors(target, moves, ttl_seconds, epoch, fired_before)
        now = now_ms()
        values = [_pack_data(m.envelope, _expire_at(ttl_seconds, now)) for m in moves]
        ctx = self._ctx
        with ctx.write("move") as txn:
            self._fence(txn, moves, epoch)
            done: list[bool] = []
            targets = _Targets(ctx, txn, target)
            for m, value in zip(moves, values, strict=True):
                key = ctx.data_key(m.source)
                if not _still_as_seen(txn.get(key, db=ctx.data), m, now, fired_before):
                    done.append(False)  # settled, moved by someone else, or not the record that was seen
                    continue
                if ctx.meta_get(txn, m.source.magazine, m.source.shard)[2] < m.source.slot:
                    # taken out before any claim reached it: its slot is a hole now
                    ctx.add_holes(txn, m.source.magazine, m.source.shard, made=1)
                targets.put(m.shard, value)
                txn.delete(key, db=ctx.data)
                done.append(True)
            targets.close()
        if targets.shards:
            ctx.ring(target, targets.shards)
        return done

    def _move_from_cursors(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
                           fired_before: int | None) -> list[bool]:
        """Moves out of subscriptions' cursors, whose claim records are in the cursors' own environments
        (ignis.storage.lmdb.cursor_environments), into `target` in the store's: per source magazine, with the
        source's write lock held (no claim, ack or other move of it meanwhile), the claims are checked, the
        target written and committed (durably) in the store's environment, and only then the sources deleted.
        A crash between the two commits leaves a message both moved and still claimed, which is delivered twice,
        never lost (at least once)."""
        done: dict[int, bool] = {}
        by_source: dict[str, list[int]] = {}
        for i, m in enumerate(moves):
            by_source.setdefault(m.source.magazine, []).append(i)
        for source, indexes in by_source.items():
            group = [moves[i] for i in indexes]
            if _CURSOR not in source:
                results = self.move(target, group, ttl_seconds, epoch, fired_before)
            else:
                results = self._move_from_cursor(self._cursors.of(source), target, group, ttl_seconds, epoch,
                                                 fired_before)
            done.update(zip(indexes, results, strict=True))
        return [done[i] for i in range(len(moves))]

    def _move_from_cursor(self, own: StoreContext, target: str, moves: Sequence[Move], ttl_seconds: int,
                          epoch: int, fired_before: int | None) -> list[bool]:
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        ctx = self._ctx
        with own.write("move") as source_txn:
            keys = [own.data_key(m.source) for m in moves]
            seen = [_still_as_seen(source_txn.get(key, db=own.data), m, now, fired_before)
                    for key, m in zip(keys, moves, strict=True)]
            with ctx.write("move") as txn:  # the target first: durable before any source is deleted
                self._fence(txn, moves, epoch)
                targets = _Targets(ctx, txn, target)
                for m, ok in zip(moves, seen, strict=True):
                    if ok:
                        targets.put(m.shard, _pack_data(m.envelope, expire_at))
                targets.close()
            for key, ok in zip(keys, seen, strict=True):
                if ok:
                    source_txn.delete(key, db=own.data)
        if targets.shards:
            ctx.ring(target, targets.shards)
        return seen

    def _fence(self, txn: Any, moves: Sequence[Move], epoch: int) -> None:
        """The fence, in the move's own transaction: only the newest epoch handed out may move."""
        raw = txn.get(EPOCH_KEY, db=self._ctx.system)
        newest = _unpack(raw)["epoch"] if raw else 0
        if epoch < newest:
            raise StaleEpoch(moves[0].source.magazine, epoch, newest)


class _Targets:
    """The target magazine's shards a move loads into, each shard's load pointer advanced once at the end."""

    def __init__(self, ctx: StoreContext, txn: Any, target: str) -> None:
        self._ctx, self._txn, self._target = ctx, txn, target
        self._state: dict[int, list[Any]] = {}

    @property
    def shards(self) -> list[int]:
        return list(self._state)

    def put(self, shard: int, value: bytes) -> None:
        state = self._state.get(shard)
        if state is None:
            state = self._state[shard] = [*self._ctx.meta_get(self._txn, self._target, shard),
                                          self._ctx.keys(self._target, shard)[1]]
        state[1] += 1
        self._txn.put(state[4] + b"%d" % state[1], value, db=self._ctx.data)

    def close(self) -> None:
        for meta_key, load, fire, tail, _ in self._state.values():
            self._ctx.meta_put(self._txn, meta_key, load, fire, tail)


def _still_as_seen(raw: bytes | None, m: Move, now: int, fired_before: int | None) -> bool:
    """Whether a source record is still the one the sweeper saw (its fireTS), so the move may take it."""
    if raw is None or _expired(raw, now):
        return False
    if m.envelope.codec == CODEC_UNREADABLE:  # moved on as it is: nobody holds an unreadable record
        return True
    fire_ts = None if len(raw) < _DATA_HEADER.size else (_unpack_data_header(raw)[1] or None)
    return fire_ts == m.fired_at if fired_before is None else fire_ts is not None and fire_ts < fired_before
