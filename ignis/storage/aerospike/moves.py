"""Fenced moves of messages between magazines (sweep, shovel, dead-letter): each source is claimed for an
epoch a newer one wins, copied into slots allocated in the target, then deleted only where the claim still
holds; a journal in the system set lets a newer epoch take an unfinished move over. Separate because it is the
sweeper's one multi-step protocol, composed of allocation, seals and batch reads."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import CODEC_UNREADABLE, FIRE_TS, MSG_ID, now_ms
from ignis.errors import StaleEpoch
from ignis.storage.aerospike.allocation import Allocation
from ignis.storage.aerospike.context import ANSWERED, FILTERED_OUT, LIVE, NOT_FOUND, TOMBSTONE, AerospikeContext
from ignis.storage.aerospike.reads import Reads
from ignis.storage.aerospike.seals import Seals
from ignis.storage.base import FIRE_POINTER, HOLES, Move, SlotRef

MOVE_EPOCH, MOVE_TO = "mvEpoch", "mvTo"  # a move's claim on its source record (see the package doc)
# A move's journal, in the system set under its token (the mvTo of its claims): the source keys and the
# target slot keys, in order. Kept as long as the copies.
MOVE_TOKEN_MARK = "mv:"
JOURNAL_SOURCES, JOURNAL_TARGETS = "src", "dst"
MOVE_CHUNK = 4000  # moves per journal (a journal of 4,000 pairs of keys is about 200 KB)
# A move reads the target of an earlier claim while writing its own. A plain read of mvTo would come
# back overwritten by the write's None (a batch write answers every operation, later ones winning), so
# it is read by an expression under its own name; a missing bin reads as None.
MOVE_TO_BEFORE = "mvToBefore"
_READ_MOVE_TO_BEFORE = expr_ops.expression_read(MOVE_TO_BEFORE, exp.StrBin(MOVE_TO).compile(),
                                                aerospike.EXP_READ_EVAL_NO_FAIL)


class Moves:
    """`Storage.move`: the epoch-fenced claim, copy and delete of records, with their journals."""

    def __init__(self, ctx: AerospikeContext, allocation: Allocation, seals: Seals, reads: Reads) -> None:
        self._ctx = ctx
        self._allocation = allocation
        self._seals = seals
        self._reads = reads

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        if not moves:
            return []
        bins_list = [m.envelope.to_bins() for m in moves]
        for bins in bins_list:
            self._ctx.check_size(target, bins)
        ttl = self._ctx.ttl(ttl_seconds)
        out: list[bool] = []
        try:
            for start in range(0, len(moves), MOVE_CHUNK):
                out += self._move(target, moves[start:start + MOVE_CHUNK], bins_list[start:start + MOVE_CHUNK], ttl,
                                  epoch, fired_before)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "move", self._ctx.data_set) from None
        return out

    def _move(self, target: str, moves: Sequence[Move], bins_list: list[dict[str, Any]], ttl: int, epoch: int,
              fired_before: int | None) -> list[bool]:
        dests = self._allocation.allocate("move", target, [m.shard for m in moves])
        dest_keys = [names.data_key(*ref) for ref in dests]
        sources = [self._ctx.data_key(m.source) for m in moves]
        # 0. The journal of this move: which target slot each source goes to, under a token of its own, so
        #    that a newer epoch taking a claim over finds the claim's target slots (step 2), and the claims of
        #    step 1 are one operation list for every record (a batch the client converts once).
        token = f"{MOVE_TOKEN_MARK}{epoch}:{uuid.uuid4().hex[:16]}"
        self._ctx.call("move", self._ctx.client.put, self._ctx.key(self._ctx.system_set, token),
                       {JOURNAL_SOURCES: [key[2] for key in sources], JOURNAL_TARGETS: dest_keys}, None,
                       {**self._ctx.wp, "ttl": ttl})
        # 1. Claim each source for this epoch (a newer epoch's claim refuses it), reading the token of any
        #    earlier claim. Repeating it is harmless: it finds its own token there. The claim holds only for
        #    the record as it was seen: fired before `fired_before` (a sweep: a holder that took the claim
        #    back stamped it since), or with the very fireTS it was seen with (records grouped by it).
        claim_ops = [_READ_MOVE_TO_BEFORE, ops.write(MOVE_EPOCH, epoch), ops.write(MOVE_TO, token)]
        not_newer = exp.Or(exp.Not(exp.BinExists(MOVE_EPOCH)), exp.LE(exp.IntBin(MOVE_EPOCH), epoch))
        groups: dict[int | str | None, list[int]] = {}
        for i, m in enumerate(moves):
            if m.envelope.codec == CODEC_UNREADABLE:  # moved on as it is: nobody holds an unreadable record
                group: int | str | None = CODEC_UNREADABLE
            else:
                group = "before" if fired_before is not None else m.fired_at
            groups.setdefault(group, []).append(i)
        answers: list[Any] = [None] * len(moves)
        for at, members in groups.items():
            if at == CODEC_UNREADABLE:
                fired: Any = exp.Val(True)
            elif at == "before":
                fired = exp.And(exp.BinExists(FIRE_TS), exp.LT(exp.IntBin(FIRE_TS), fired_before))
            else:
                fired = exp.Not(exp.BinExists(FIRE_TS)) if at is None else exp.Eq(exp.IntBin(FIRE_TS), at)
            policy = {**self._ctx.update, "expressions": exp.And(LIVE, fired, not_newer).compile()}
            done = self._ctx.call("move", self._ctx.client.batch_operate, [sources[i] for i in members], claim_ops,
                                  None, policy)
            for i, record in zip(members, self._ctx.answers("move", done, len(members), self._ctx.data_set),
                                 strict=True):
                answers[i] = record
        claimed: list[int] = []
        earlier: dict[int, str] = {}  # move -> the token (or target key) of an earlier, unfinished claim
        for i, record in enumerate(answers):
            if record.result == 0:
                claimed.append(i)
                before = (record.record[2] or {}).get(MOVE_TO_BEFORE) if record.record else None
                if before and before != token:
                    earlier[i] = before
            elif record.result not in (NOT_FOUND, FILTERED_OUT):
                # The claims that did land are harmless: a later move of the same epoch (or a newer one) finds
                # its own claim, or takes it over.
                raise self._ctx.record_failure("move", record, self._ctx.data_set)
        refused = sorted(set(range(len(moves))) - set(claimed))
        if refused:
            held = [int((bins or {}).get(MOVE_EPOCH, 0)) for bins in
                    self._reads.batch_get("move", [sources[i] for i in refused])]
            if max(held, default=0) > epoch:  # a newer leader holds records of this batch: write nothing
                self._seals.seal_slots("move", dests, ttl)
                raise StaleEpoch(moves[0].source.magazine, epoch, max(held))
        # 2. Take over earlier claims: seal their target slot so a late copy there is refused, or find
        #    that copy already landed (then this move only deletes the source).
        copied_before: set[int] = set()
        if earlier:
            targets = self._earlier_targets(earlier, sources)
            order = [i for i in earlier if i in targets]
            refs = [SlotRef(*names.parse_data_key(targets[i])) for i in order]
            landed = [i for i, sealed in zip(order, self._seals.seal_slots("move", refs, ttl), strict=True)
                      if not sealed]
            if landed:
                found = self._reads.batch_get("move", [(self._ctx.ns, self._ctx.data_set, targets[i]) for i in landed])
                copied_before = {i for i, bins in zip(landed, found, strict=True)
                                 if bins is not None and bins.get(MSG_ID) == moves[i].envelope.msg_id}
        # 3. Copy. A slot sealed meanwhile means a newer epoch took the source over: it moves it.
        to_copy = [i for i in claimed if i not in copied_before]
        written = self._allocation.write_new("move", [dests[i] for i in to_copy], [bins_list[i] for i in to_copy], ttl)
        copied = [i for i, ok in zip(to_copy, written, strict=True) if ok]
        unused = sorted(set(range(len(moves))) - set(copied))
        if unused:  # target slots this move allocated and will not fill: holes at once, not after a grace
            self._seals.seal_slots("move", [dests[i] for i in unused], ttl)
        # 4. Delete the sources, only where this epoch's claim still holds (one operation list for all). A
        #    source no claim had reached (fire pointer below it, read before the delete: a claim after it finds
        #    the record moved) leaves a hole where a message was counted: counted (HOLES) below.
        moved = sorted([*copied, *copied_before])
        unclaimed = self._unclaimed([moves[i].source for i in moved if moves[i].fired_at is None])
        if moved:
            guard = exp.And(LIVE, exp.Eq(exp.IntBin(MOVE_EPOCH), epoch)).compile()
            keys = [sources[i] for i in moved]
            if self._ctx.durable:
                done = self._ctx.call("move", self._ctx.client.batch_remove, keys,
                                      policy_batch_remove={"durable_delete": True, "expressions": guard})
            else:
                done = self._ctx.call("move", self._ctx.client.batch_operate, keys, [ops.write(TOMBSTONE, now_ms())],
                                      None, {**self._ctx.keep, "exists": aerospike.POLICY_EXISTS_REPLACE,
                                       "expressions": guard})
            records = self._ctx.answers("move", done, len(keys), self._ctx.data_set)
            failed = [r for r in records if r.result not in ANSWERED]
            if failed:  # copied, not deleted: the record stays claimed and the next pass finishes it
                raise self._ctx.record_failure("move", failed[0], self._ctx.data_set)
            gone = {(r[0], r[1], r[2]) for r in unclaimed}
            self._seals.count_holes(HOLES, [moves[i].source for i, record in zip(moved, records, strict=True)
                                            if record.result == 0 and tuple(moves[i].source) in gone])
        done_flags = [False] * len(moves)
        for i in moved:
            done_flags[i] = True
        return done_flags

    def _earlier_targets(self, earlier: Mapping[int, str], sources: Sequence[tuple[str, str, str]]) -> dict[int, str]:
        """The target slot key of each earlier claim, from its move's journal (or, for a claim written before
        journals existed, the key itself). A claim whose journal is gone (expired) has none to seal."""
        targets: dict[int, str] = {}
        tokens: dict[str, list[int]] = {}
        for i, mark in earlier.items():
            if mark.startswith(MOVE_TOKEN_MARK):
                tokens.setdefault(mark, []).append(i)
            else:
                targets[i] = mark
        if tokens:
            order = list(tokens)
            journals = self._reads.batch_get("move", [self._ctx.key(self._ctx.system_set, t) for t in order])
            for token, journal in zip(order, journals, strict=True):
                if not journal:
                    continue
                where = dict(zip(journal.get(JOURNAL_SOURCES) or [], journal.get(JOURNAL_TARGETS) or [], strict=False))
                for i in tokens[token]:
                    if sources[i][2] in where:
                        targets[i] = where[sources[i][2]]
        return targets

    def _unclaimed(self, refs: Sequence[SlotRef]) -> list[SlotRef]:
        """Those of `refs` above their shard's fire pointer (never claimed), one batch read of meta records."""
        if not refs:
            return []
        shards = sorted({(ref[0], ref[1]) for ref in refs})
        found = self._reads.batch_get("move", [self._ctx.meta_key(magazine, shard) for magazine, shard in shards])
        fire = {key: int((bins or {}).get(FIRE_POINTER, 0)) for key, bins in zip(shards, found, strict=True)}
        return [ref for ref in refs if ref[2] > fire[(ref[0], ref[1])]]
