"""Claims of slots and their stamps: the fenced increment of the fire pointer (`claim`), the recovery of a
claim whose answer was lost (`resolve_claim`, by the token it left), and the stamp that marks each claimed
record fired and reads it back (`_stamp_slots`, `restamp`). Separate because it is the consumers' hot path;
it depends on allocation only for the repair of a fire pointer a rollback set back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis.envelope import ATTEMPTS, FIRE_TS
from ignis.errors import IgnisError, StoreUnavailable
from ignis.storage.aerospike.allocation import Allocation
from ignis.storage.aerospike.context import (
    ANSWERED,
    BIN_INCOMPATIBLE,
    FILTERED_OUT,
    MISSING,
    NOT_FOUND,
    PURGED,
    READ_ENVELOPE,
    TOMBSTONE,
    AerospikeContext,
    ExpressionTemplate,
)
from ignis.storage.aerospike.errors import error_field, is_transient
from ignis.storage.base import (
    FIRE_POINTER,
    HOLD_UNTIL,
    LOAD_POINTER,
    Claimed,
    ClaimInDoubt,
    ClaimInterrupted,
    ClaimTicket,
    HeldClaim,
    SlotRef,
)

# A claim of k writes where it began (LAST_FROM: the fire pointer before it) and reads it back after the write: a
# plain read, where an expression read would be one more expression the client converts on every claim.
# Every claim leaves its token (and, for a claim of several slots, the fire pointer before it) on the meta
# record, so a claimer whose answer was lost can tell later whether the claim was applied and what it took.
LAST_CLAIM, LAST_FROM = "lastClaim", "lastFrom"
# A claim stamps every record but a deletedAt tombstone: a purge leftover is stamped (harmlessly) and
# reported awaiting, since the slot's new message may be on its way.
_STAMPABLE = exp.Not(exp.BinExists(TOMBSTONE)).compile()
_CLAIM_GUARD = exp.LT(exp.IntBin(FIRE_POINTER), exp.IntBin(LOAD_POINTER)).compile()
# A claim of one slot needs no expression: under the guard FIRE < LOAD an increment by one cannot pass
# the load pointer (a claim of k takes min(FIRE + k, LOAD), an expression write).
_CLAIM_ONE = [ops.increment(FIRE_POINTER, 1), ops.read(FIRE_POINTER)]
_READ_STAMPED = [*READ_ENVELOPE, ops.read(PURGED)]
_READ_TOMBSTONE = ops.read(TOMBSTONE)
_ANSWER_LOST = (ex.TimeoutError, ex.NoResponse)  # sent, maybe applied, no answer
# An ordered queue's claims (Storage.claim_held): the shard's hold (HOLD_UNTIL, 0 or absent = none) is read and
# written by the claim's own operate() on the meta record, under a filter expression, so two claimers never both
# hold a shard; the held slot is the one after the FIRE_POINTER, which its settle moves past it.
_HOLD = exp.Cond(exp.BinExists(HOLD_UNTIL), exp.IntBin(HOLD_UNTIL), 0)
_HELD = exp.GT(_HOLD, 0)
# An ordered claim's guard: no hold, or one ended by `now`, and a slot after the fire pointer; a release's: the hold
# of the slot after the fire pointer (both filled per call: ExpressionTemplate).
_CLAIMABLE_AT = ExpressionTemplate(lambda now: exp.And(exp.LE(_HOLD, now), exp.LT(exp.IntBin(FIRE_POINTER),
                                                                                   exp.IntBin(LOAD_POINTER))), -7)
_HELD_AFTER = ExpressionTemplate(lambda fire: exp.And(exp.Eq(exp.IntBin(FIRE_POINTER), fire), _HELD), -7)
HEAD = "heldHead"  # expression-read result: the slot the claim took (the one after the fire pointer)
_HEAD_READ = expr_ops.expression_read(HEAD, arithmetic.Add(exp.IntBin(FIRE_POINTER), 1).compile())


def _stamp_only(now: int) -> list[dict[str, Any]]:
    """A claim's stamp and read without the attempts increment, for a record whose attempts bin is not a
    number (it is then read back as an unreadable envelope)."""
    return [ops.write(FIRE_TS, now), *_READ_STAMPED]


def applied_claim(ctx: AerospikeContext, ticket: ClaimTicket) -> Mapping[str, Any] | None:
    """The meta record of a claim whose answer was lost, if that claim was applied and no claim came after it (its
    token is the last one written there); None otherwise: then there is no telling what it took."""
    try:
        _, _, got = ctx.call("claim", ctx.client.get, ctx.meta_key(ticket.magazine, ticket.shard))
    except ex.RecordNotFound:
        return None
    except ex.AerospikeError as exc:
        raise ctx.fail(exc, "claim", ctx.meta_set) from None
    return got if got.get(LAST_CLAIM) == ticket.token else None


class Claims:
    """Claims slots of a shard and stamps the claimed records."""

    def __init__(self, ctx: AerospikeContext, allocation: Allocation) -> None:
        self._ctx = ctx
        self._allocation = allocation
        self._claim_exprs: dict[int, list] = {}
        self._stamp = {**ctx.update, "expressions": _STAMPABLE}
        self._claim_policy = {**ctx.update, "expressions": _CLAIM_GUARD}

    def _claim_ops(self, k: int) -> list[dict[str, Any]]:
        cached = self._claim_exprs.get(k)
        if cached is None:
            advanced = arithmetic.Min(arithmetic.Add(exp.IntBin(FIRE_POINTER), k), exp.IntBin(LOAD_POINTER))
            cached = [expr_ops.expression_write(LAST_FROM, exp.IntBin(FIRE_POINTER).compile()),
                      expr_ops.expression_write(FIRE_POINTER, advanced.compile()),
                      ops.read(FIRE_POINTER), ops.read(LAST_FROM)]
            if len(self._claim_exprs) < 1024:
                self._claim_exprs[k] = cached
        return cached

    def _bounded_claim(self, k: int, up_to: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The claim's operations and policy when it may not pass slot `up_to` (not cached: the bound varies)."""
        fire, load = exp.IntBin(FIRE_POINTER), exp.IntBin(LOAD_POINTER)
        guard = exp.And(exp.LT(fire, load), exp.LT(fire, up_to)).compile()
        advanced = arithmetic.Min(arithmetic.Add(fire, k), load, up_to)
        operations = [expr_ops.expression_write(LAST_FROM, fire.compile()),
                      expr_ops.expression_write(FIRE_POINTER, advanced.compile()), ops.read(FIRE_POINTER),
                      ops.read(LAST_FROM)]
        return operations, {**self._ctx.update, "expressions": guard}

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        if max_slots <= 0:
            return []
        if up_to is None:
            operations, policy = _CLAIM_ONE if max_slots == 1 else self._claim_ops(max_slots), self._claim_policy
        else:
            operations, policy = self._bounded_claim(max_slots, up_to)
        key = self._ctx.meta_key(magazine, shard)
        marks, mark = self._ctx.shared.marks, (key[1], key[2], FIRE_POINTER)
        before = marks.mark(mark)  # taken before the call: see rollback.py
        token = f"{self._ctx.shared.claim_prefix}{next(self._ctx.shared.claim_seq)}"
        try:
            try:
                _, _, got = self._ctx.call("claim", self._ctx.client.operate, key,
                                           [*operations, {"op": aerospike.OPERATOR_WRITE, "bin": LAST_CLAIM,
                                                          "val": token}],  # (ops.write, inlined: every claim)
                                           None, policy, idempotent=False)
            except MISSING:  # no meta record, or FIRE == LOAD: drained
                return []
        except ex.AerospikeError as exc:
            error = self._ctx.fail(exc, "claim", self._ctx.meta_set)
            if is_transient(exc, True) and (error_field(exc, "in_doubt", False) or isinstance(exc, _ANSWER_LOST)):
                ticket = ClaimTicket(magazine, shard, max_slots == 1 and up_to is None, token, count_attempt)
                raise ClaimInDoubt(str(error), ticket) from None
            raise error from None
        return self._claimed(magazine, shard, max_slots == 1 and up_to is None, got, before, now_ms_, count_attempt)

    def claim_held(self, magazine: str, shard: int, now_ms_: int, hold_ms: int, count_attempt: bool = True
                   ) -> HeldClaim:
        key = self._ctx.meta_key(magazine, shard)
        policy = {**self._ctx.update, "expressions": _CLAIMABLE_AT(now_ms_)}
        operations = [_HEAD_READ, ops.write(HOLD_UNTIL, now_ms_ + hold_ms)]
        try:
            try:
                # Not retried blindly (a hold it took and did not hear of ends by itself: hold_ms), nor resolved: an
                # answer lost is an outage, and the message comes again when the hold ends.
                _, _, got = self._ctx.call("claim", self._ctx.client.operate, key, operations, None, policy,
                                           idempotent=False)
            except MISSING:  # no meta record, nothing left, or held: tell which
                return self._not_claimable(key, now_ms_)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "claim", self._ctx.meta_set) from None
        slot = int(got[HEAD])
        item = self._stamp_slots("claim", [SlotRef(magazine, shard, slot)], now_ms_, count_attempt)[0]
        if item.envelope is None and not item.awaiting:  # settled or sealed: passed (an awaited one stays held)
            self.release_hold(magazine, shard, slot)
        return HeldClaim([item])

    def _not_claimable(self, key: tuple[str, str, str], now_ms_: int) -> HeldClaim:
        """Why a claim of an ordered shard took nothing: held (until when), or drained."""
        try:
            _, _, bins = self._ctx.call("claim", self._ctx.client.get, key)
        except ex.RecordNotFound:
            return HeldClaim([])
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "claim", self._ctx.meta_set) from None
        until = int(bins.get(HOLD_UNTIL) or 0)
        return HeldClaim([], until if until > now_ms_ else 0)

    def release_hold(self, magazine: str, shard: int, slot: int, until_ms: int = 0) -> bool:
        guard = _HELD_AFTER(slot - 1)
        # settled: the fire pointer passes the slot; failed: held until then, the slot still the next claim's
        operations = [ops.write(HOLD_UNTIL, until_ms)] if until_ms else [ops.write(HOLD_UNTIL, 0),
                                                                         ops.write(FIRE_POINTER, slot)]
        try:
            self._ctx.call("release_hold", self._ctx.client.operate, self._ctx.meta_key(magazine, shard), operations,
                           None, {**self._ctx.update, "expressions": guard})
        except MISSING:
            return False
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "release_hold", self._ctx.meta_set) from None
        return True

    def resolve_claim(self, ticket: ClaimTicket, now_ms_: int) -> list[Claimed] | None:
        got = applied_claim(self._ctx, ticket)
        if got is None:
            return None
        answer = {FIRE_POINTER: got.get(FIRE_POINTER, 0), LAST_FROM: got.get(LAST_FROM, 0)}
        return self._claimed(ticket.magazine, ticket.shard, ticket.single, answer, 0, now_ms_, ticket.count_attempt)

    def _claimed(self, magazine: str, shard: int, single: bool, got: Mapping[str, Any], before: int, now_ms_: int,
                 count_attempt: bool) -> list[Claimed]:
        """The slots a claim answered `got` took (checked against the fire pointer's mark `before`), stamped."""
        key = self._ctx.meta_key(magazine, shard)
        marks, mark = self._ctx.shared.marks, (key[1], key[2], FIRE_POINTER)
        last = int(got[FIRE_POINTER])
        first = last if single else int(got[LAST_FROM]) + 1
        if first <= before:  # the fire pointer was below one seen before this claim: a rollback, or a purge
            try:
                if not self._allocation.renumbered(magazine, shard, first, mark):
                    self._allocation.roll_forward(magazine, shard, "fire pointer", first - 1)
                    first = before + 1  # slots up to the mark were claimed before the rollback: not this claim's
            except ex.AerospikeError as exc:
                raise self._ctx.fail(exc, "claim", self._ctx.meta_set) from None
        marks.saw(mark, last)
        if first > last:
            return []
        new = tuple.__new__  # a NamedTuple's own __new__ is a Python call: too slow per claimed slot
        return self._stamp_slots("claim", [new(SlotRef, (magazine, shard, slot)) for slot in range(first, last + 1)],
                                 now_ms_, count_attempt)

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        return self._stamp_slots("restamp", refs, now_ms_, count_attempt)

    @staticmethod
    def _slot(ref: SlotRef, bins: Mapping[str, Any] | None, result: int, version: Any = None
              ) -> Claimed:
        """A claimed slot from its stamp's outcome: the record; an awaited hole (not found, or a purge
        leftover a new message may still replace); or a hole for good (deleted or sealed)."""
        if result == 0 and bins is not None and bins.get(PURGED) is None:
            return Claimed(ref, AerospikeContext.envelope(bins, version, ref), False)
        return Claimed(ref, None, result != FILTERED_OUT)

    def _stamp_slots(self, operation: str, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool
                     ) -> list[Claimed]:
        """Stamp fireTS (and attempts + 1) and read each record, in one call; update-only, so a missing
        record is not created. Repeated on a transient error: at worst one extra attempt is counted.

        The slots are the caller's (claimed): a record the store did not answer for is returned as an
        awaited hole, to re-read later, never dropped. When nothing was read at all because the store failed,
        ClaimInterrupted carries every slot back to the caller."""
        if not refs:
            return []
        # A claimed message's Envelope.version is its record's generation after this stamp and the fireTS it wrote:
        # an ack settles the message only while both are still the stamp's (Reads.delete).
        stamp = [ops.write(FIRE_TS, now_ms_), *([ops.increment(ATTEMPTS, 1)] if count_attempt else []),
                 *_READ_STAMPED]
        try:
            if len(refs) == 1:
                # One record: no filter expression (converting one costs the client more than the rest of
                # the call, measured); a deletedAt tombstone is told by reading the bin instead. Stamping
                # one writes two bins into a tombstone, which stays a tombstone: harmless, and rare.
                try:
                    _, meta, bins = self._ctx.call(operation, self._ctx.client.operate, self._ctx.data_key(refs[0]),
                                                   [*stamp, _READ_TOMBSTONE], None, self._ctx.update)
                except ex.RecordNotFound:
                    return [self._slot(refs[0], None, NOT_FOUND)]
                except ex.BinIncompatibleType:  # attempts is not a number: not an envelope, stamp it only
                    _, meta, bins = self._ctx.call(operation, self._ctx.client.operate, self._ctx.data_key(refs[0]),
                                                   [*_stamp_only(now_ms_), _READ_TOMBSTONE], None, self._ctx.update)
                if bins.get(TOMBSTONE) is not None:
                    return [self._slot(refs[0], None, FILTERED_OUT)]
                return [self._slot(refs[0], bins, 0, ((meta or {}).get("gen"), now_ms_))]
            # batch_operate: one operation list and one policy for every key, which the client converts
            # once (per-record Write objects cost about three times the client CPU, measured).
            done = self._ctx.call(operation, self._ctx.client.batch_operate,
                                  self._ctx.data_keys(refs), stamp,
                                  self._ctx.batch_policy(len(refs)), self._stamp)
            records = self._ctx.answers(operation, done, len(refs), self._ctx.data_set)
        except ex.AerospikeError as exc:
            error = self._ctx.fail(exc, operation, self._ctx.data_set)
            raise self._interrupted(error, refs) from None
        except StoreUnavailable as error:
            raise self._interrupted(error, refs) from None
        incompatible = [i for i, record in enumerate(records) if record.result == BIN_INCOMPATIBLE]
        if incompatible:  # attempts is not a number (another tool wrote the record): stamp it only
            records = list(records)
            try:
                keys = [self._ctx.data_key(refs[i]) for i in incompatible]
                again = self._ctx.call(operation, self._ctx.client.batch_operate, keys, _stamp_only(now_ms_), None,
                                       self._stamp)
                for i, record in zip(incompatible,
                                     self._ctx.answers(operation, again, len(incompatible), self._ctx.data_set),
                                     strict=True):
                    records[i] = record
            except (ex.AerospikeError, StoreUnavailable):
                pass  # those records stay failed: re-read later, like any record the store did not answer for
        out = []
        new, envelope = tuple.__new__, self._ctx.envelope
        failure: IgnisError | None = None
        for ref, record in zip(refs, records, strict=True):
            result, got = record.result, record.record
            bins = got[2] if got else None
            if result == 0 and bins is not None and bins.get(PURGED) is None:  # _slot, inlined: per message
                out.append(new(Claimed, (ref, envelope(bins, ((got[1] or {}).get("gen"), now_ms_),
                                                       ref), False)))
            elif result in ANSWERED:
                out.append(self._slot(ref, bins, result))
            else:  # not answered: still this caller's slot, re-read later
                failure = failure or self._ctx.record_failure(operation, record, self._ctx.data_set)
                out.append(new(Claimed, (ref, None, True)))
        if failure is not None and not any(c.envelope is not None for c in out):
            raise ClaimInterrupted(str(failure), out) if isinstance(failure, StoreUnavailable) else failure
        return out

    @staticmethod
    def _interrupted(error: Exception, refs: Sequence[SlotRef]) -> Exception:
        """A failed stamp of claimed slots: the slots go back to the caller, awaited (see _stamp_slots)."""
        if not isinstance(error, StoreUnavailable):
            return error
        return ClaimInterrupted(str(error), [Claimed(ref, None, True) for ref in refs])
