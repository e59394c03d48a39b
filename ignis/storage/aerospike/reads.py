"""Reads of message records and the deletes that stay deleted: batch reads that never take an outage for an
empty slot (`batch_get`), `read`, `peek`, `settled`, `stamp_unfired`, and `delete` with its durable-delete or
tombstone removals (`remove_one`, `remove_many`). Separate because every other concern builds on these reads
and removals (registry, allocation, moves, delayed messages), while they need nothing but the context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import FIRE_TS, MSG_ID, Envelope, now_ms
from ignis.storage.aerospike.context import (
    BATCH_CHUNK,
    FILTERED_OUT,
    MISSING,
    NOT_FOUND,
    NOT_TOMBSTONED,
    PURGED,
    READ_ENVELOPE,
    TOMBSTONE,
    AerospikeContext,
    ExpressionTemplate,
)
from ignis.storage.base import SlotRef

# One message's settle filter (Reads._this_message), and the settle of a message as its claim stamped it (the
# fireTS the stamp wrote, with the generation it left: Reads.delete).
_THIS_MESSAGE = ExpressionTemplate(lambda msg_id: exp.Eq(exp.StrBin(MSG_ID), msg_id), "\0ignis-message-id\0")
_AS_STAMPED = ExpressionTemplate(lambda fired_at: exp.Eq(exp.IntBin(FIRE_TS), fired_at), -1)

# What an ack, a delete or a seal leaves in a slot. Not a purge's mark: slot numbering starts afresh
# after a purge, so a new message may still be written over it.
_SETTLED_BINS = [TOMBSTONE]
_IS_TOMBSTONE = exp.BinExists(TOMBSTONE).compile()  # (drop_settled: only an ack's tombstone goes)
_HELD_BINS = [MSG_ID, TOMBSTONE, PURGED]  # (a tombstone's or a purge mark's bins: batch_get answers None for those)


class Reads:
    """Batch reads, peeks and settled checks of data records, and their removal (durable delete or tombstone)."""

    def __init__(self, ctx: AerospikeContext) -> None:
        self._ctx = ctx
        # ack_check=generation: an ack's tombstone checks the generation alone (see delete)
        self._by_generation = ctx.shared.settings.ack_check == "generation"

    def batch_get(self, operation: str, keys: list[tuple[str, str, str]], bins: list[str] | None = None,
                  policy: dict[str, Any] | None = None) -> list[dict[str, Any] | None]:
        """The bins of each key (only `bins`, when given; None: the server said not found, or a tombstone).
        Any other answer, or none, raises: an outage never reads as an empty slot."""
        out: list[dict[str, Any] | None] = []
        set_name = keys[0][1] if keys else ""
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            done = self._ctx.call(operation, self._ctx.client.batch_read, chunk, bins,
                                  self._ctx.batch_policy(len(chunk), policy))
            for record in self._ctx.answers(operation, done, len(chunk), set_name):
                if record.result == 0:
                    found = record.record[2] if record.record is not None else None
                    out.append(None if self._ctx.tombstoned(found) else found)
                elif record.result in (NOT_FOUND, FILTERED_OUT):  # (FILTERED_OUT: a filter expression refused it)
                    out.append(None)
                else:
                    raise self._ctx.record_failure(operation, record, set_name)
        return out

    def held(self, refs: Sequence[SlotRef]) -> list[bool]:
        """Storage.held: a live message's id, read without its payload (a topic's figures probe many slots)."""
        if not refs:
            return []
        try:
            found = self.batch_get("held", self._ctx.data_keys(refs), _HELD_BINS, self._ctx.batch_all)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "held", self._ctx.data_set) from None
        return [bins is not None and bins.get(MSG_ID) is not None for bins in found]

    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        if not refs:
            return []
        try:
            found = self.batch_get("read", self._ctx.data_keys(refs))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "read", self._ctx.data_set) from None
        return [None if bins is None else self._ctx.envelope(bins, None, ref)
                for ref, bins in zip(refs, found, strict=True)]

    def peek(self, magazine: str, shard: int, first: int, last: int, expression: Any = None
             ) -> list[tuple[SlotRef, Envelope]]:
        """Storage.peek; `expression`: a server-side filter (a topic's subject filter), whose refused records come
        back without their bins (FILTERED_OUT)."""
        refs = [SlotRef(magazine, shard, slot) for slot in range(max(first, 1), last + 1)]
        if not refs:
            return []
        policy = None if expression is None else {**self._ctx.batch_all, "expressions": expression}
        try:
            found = self.batch_get("peek", self._ctx.data_keys(refs), None, policy)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "peek", self._ctx.data_set) from None
        return [(ref, self._ctx.envelope(bins, None, ref)) for ref, bins in zip(refs, found, strict=True)
                if bins is not None]

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        if not refs:
            return []
        out = []
        try:
            keys = self._ctx.data_keys(refs)
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._ctx.call("settled", self._ctx.client.batch_read, chunk, _SETTLED_BINS)
                for record in self._ctx.answers("settled", done, len(chunk), self._ctx.data_set):
                    if record.result not in (0, NOT_FOUND):
                        raise self._ctx.record_failure("settled", record, self._ctx.data_set)
                    bins = record.record[2] if record.result == 0 and record.record is not None else None
                    out.append(bool(bins) and bins.get(TOMBSTONE) is not None)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "settled", self._ctx.data_set) from None
        return out

    def remove_one(self, operation: str, key: tuple[str, str, str], only: Any = None) -> bool:
        """Delete so it stays deleted: a durable delete, or a tombstone. True if it was present. `only`: a
        compiled filter the record must also pass (see _this_message)."""
        try:
            if self._ctx.durable:
                policy = self._ctx.durable_remove if only is None else {**self._ctx.durable_remove, "expressions": only}
                self._ctx.call(operation, self._ctx.client.remove, key, policy=policy)
            else:
                policy = self._ctx.replace_live if only is None else {**self._ctx.replace_live, "expressions": only}
                self._ctx.call(operation, self._ctx.client.put, key, {TOMBSTONE: now_ms()}, None, policy)
            return True
        except MISSING:
            return False

    def remove_many(self, operation: str, keys: list[tuple[str, str, str]], only: Any = None) -> int:
        """remove_one for many keys, in batches of one operation list and one policy (which the client converts
        once: per-record policies cost it about three times the CPU, measured). `only`: a compiled filter every
        record must also pass, in the batch policy, which applies it to each key ("filterExp": BatchPolicy)."""
        present = 0
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            batch_policy = self._ctx.batch_policy(len(chunk), None if only is None else
                                                  {**self._ctx.batch, "expressions": only})
            if self._ctx.durable:
                done = self._ctx.call(operation, self._ctx.client.batch_remove, chunk, batch_policy,
                                      {"durable_delete": True})
            elif only is None:
                done = self._ctx.call(operation, self._ctx.client.batch_operate, chunk,
                                      [ops.write(TOMBSTONE, now_ms())], batch_policy, self._ctx.replace_live)
            else:
                done = self._ctx.call(operation, self._ctx.client.batch_operate, chunk,
                                      [ops.write(TOMBSTONE, now_ms())], batch_policy, self._ctx.replace)
            for record in self._ctx.answers(operation, done, len(chunk), self._ctx.data_set):
                if record.result == 0:
                    present += 1
                elif record.result not in (NOT_FOUND, FILTERED_OUT):
                    raise self._ctx.record_failure(operation, record, self._ctx.data_set)
        return present

    # A settle's filter: the live record of this message. After a store rollback lost a claimed record, its slot
    # can hold a newer message (rollback.py): the claimer's late ack must not delete that one. The record's msgId
    # decides, and only a live record has one: every write that leaves a tombstone, a seal or a purge mark
    # replaces the record's bins (POLICY_EXISTS_REPLACE), so no LIVE test is needed (the client converts an
    # expression per call: its size is a visible share of an ack's CPU). One message's filter is built from a
    # template compiled once (compiling it per ack cost the client more than the ack's call, measured); a batch's
    # is one filter for all its records: the record holds one of the batch's messages (a copy of another message
    # of the batch being settled is settled with it: harmless).
    @staticmethod
    def _this_message(msg_id: str | None) -> Any:
        """The filter of one message's settle (None: any live record)."""
        if msg_id is None:
            return NOT_TOMBSTONED
        return _THIS_MESSAGE(msg_id)

    @staticmethod
    def _these_messages(ids: Sequence[str]) -> Any:
        """The filter of a batch's settle: a live record holding one of `ids`."""
        return exp.GT(exp.ListGetByValue(None, aerospike.LIST_RETURN_COUNT, exp.StrBin(MSG_ID), exp.Val(list(ids))),
                      0).compile()

    # An ack settles a message as its claim stamped it when it can: the tombstone is written only if the record's
    # generation and its fireTS are still what the stamp left (Envelope.version), in one call. The fireTS as well as
    # the generation: a newer message in a slot reused after a rollback (rollback.py) can reach the same generation,
    # not the same fire time. A record written since (a sweeper's restamp, a move's claim) or gone fails it, and the
    # id decides. The check's filter expression is most of an ack's client CPU (the client converts it on every
    # call: 13.9-14.6 against 7.7 us for a put, measured); `ack_check=generation` leaves it out and checks the
    # generation alone, exact only where the store never loses an acknowledged write (docs/aerospike/index.md).
    def delete(self, refs: Sequence[SlotRef], versions: Sequence[Any] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        if versions and len(refs) == 1 and ids is not None and not self._ctx.durable:
            # An ack of one message: first as its claim stamped it (a cursor's claim has no version). Its hot path,
            # ahead of the checks below.
            version = versions[0]
            if version is not None and version[1] is not None:
                key = self._ctx.data_key(refs[0])
                try:
                    try:
                        self._ctx.call("delete", self._ctx.client.put, key, {TOMBSTONE: now_ms()},
                                       {"gen": version[0]},
                                       self._ctx.replace_same if self._by_generation else
                                       {**self._ctx.replace_same, "expressions": _AS_STAMPED(version[1])})
                        return 1
                    except (*MISSING, ex.RecordGenerationError):  # written since, or gone: the id decides
                        return int(self.remove_one("delete", key, self._this_message(ids[0])))
                except ex.AerospikeError as exc:
                    raise self._ctx.fail(exc, "delete", self._ctx.data_set) from None
        if not refs:
            return 0
        deferred = self._ctx.shared.deferred
        if deferred is not None and deferred.pending:  # acks of claims whose records are still owed (deferred.py)
            rest = deferred.settle(self._ctx.data_keys(refs))
            if len(rest) < len(refs):
                settled = len(refs) - len(rest)
                if not rest:
                    return settled
                return settled + self.delete([refs[i] for i in rest], None if versions is None else
                                             [versions[i] for i in rest],
                                             None if ids is None else [ids[i] for i in rest])
        if ids is not None and versions and self._by_generation and len(refs) > 1:
            # ack_check=generation, a batch of acks (versions: of messages as claimed): the live records are settled
            # without the filter of the batch's ids, as IgnisMQ's earlier releases did; the trade of one message's
            # ack under that setting (docs/aerospike/durability.md). The ids' list is most of the batch's filter to
            # convert: 1,400 of the batched drain's 113,400 instructions a message (counted: bench/instructions.py).
            ids = None
        if ids is not None:
            # A subscription's claim record holds no message id (topics.py): the live record in a cursor's slot is the
            # claim of the topic's message in the slot of the same number, whichever delivery of it is acked.
            magazines = {ref[0] for ref in refs}  # (an ack's: one)
            cursors = {magazine for magazine in magazines if names.cursor_topic(magazine) is not None}
            if cursors:
                ids = [None] * len(refs) if len(cursors) == len(magazines) else \
                    [None if ref[0] in cursors else msg_id for ref, msg_id in zip(refs, ids, strict=True)]
        try:
            if ids is not None:  # (the id decides: see above)
                if len(refs) == 1:
                    return int(self.remove_one("delete", self._ctx.data_key(refs[0]), self._this_message(ids[0])))
                keys = self._ctx.data_keys(refs)
                known = [i for i, msg_id in enumerate(ids) if msg_id is not None]
                if len(known) == len(refs):
                    return self.remove_many("delete", keys, self._these_messages(ids))  # type: ignore[arg-type]
                # Records that were no IgnisMQ message (an id of None) are settled whatever they hold.
                anything = [keys[i] for i, msg_id in enumerate(ids) if msg_id is None]
                return (self.remove_many("delete", [keys[i] for i in known],
                                         self._these_messages([ids[i] for i in known]))  # type: ignore[misc]
                        if known else 0) + self.remove_many("delete", anything)
            if len(refs) == 1:
                return int(self.remove_one("delete", self._ctx.data_key(refs[0])))
            return self.remove_many("delete", self._ctx.data_keys(refs))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "delete", self._ctx.data_set) from None

    def drop_settled(self, magazine: str, shard: int, first: int, last: int) -> int:
        """Storage.drop_settled: a batch delete of the slots' records that are tombstones (a server-side filter:
        a live record is never touched). Plain deletes: nothing reads behind a sweep pointer, so one that a
        node's cold restart brings back on Community Edition costs a few bytes until its TTL, never a delivery."""
        keys = [self._ctx.data_key(SlotRef(magazine, shard, slot)) for slot in range(first, last + 1)]
        dropped = 0
        try:
            policy = {**self._ctx.batch, "expressions": _IS_TOMBSTONE}
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._ctx.call("drop_settled", self._ctx.client.batch_remove, chunk, policy,
                                      {"durable_delete": False})
                for record in self._ctx.answers("drop_settled", done, len(chunk), self._ctx.data_set):
                    if record.result == 0:
                        dropped += 1
                    elif record.result not in (NOT_FOUND, FILTERED_OUT):
                        raise self._ctx.record_failure("drop_settled", record, self._ctx.data_set)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "drop_settled", self._ctx.data_set) from None
        return dropped

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        # Create-only expression write with "no fail": stamps only a record that has no fireTS yet.
        stamp = expr_ops.expression_write(FIRE_TS, exp.Val(now_ms_).compile(),
                                          aerospike.EXP_WRITE_CREATE_ONLY | aerospike.EXP_WRITE_POLICY_NO_FAIL)
        try:
            _, _, bins = self._ctx.call("stamp_unfired", self._ctx.client.operate, self._ctx.data_key(ref),
                                        [stamp, *READ_ENVELOPE], None, self._ctx.update_live)
        except MISSING:
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "stamp_unfired", self._ctx.data_set) from None
        return self._ctx.envelope(bins, None, ref)
