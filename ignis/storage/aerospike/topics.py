"""The Aerospike store's topics: the topic registry, and the cursors subscriptions read them through.

Layout (docs/aerospike/layout.md): a topic record per topic in `{farm}_{client}_ignis_topics` (key: the topic name;
config bins, createdAt; no TTL). A topic's messages are the magazine named after it, loaded as any magazine is,
with a `subject` bin, and its meta records hold its load pointer. A subscription's cursor magazine
(`names.cursor_of`) has, per topic shard, a meta record whose FIRE_POINTER is the subscription's position, and, in
the slots it claimed, claim records: fireTS and attempts only (the message stays in the topic; a cursor's slot n
claims the topic's slot n, so the slot says which message, and an ack settles the live claim record there),
expiring with the topic's record.

A claim here is two round trips and a write: the cursor's fire pointer moves over the next slots (never past the
topic's load pointer as last seen by this process: the highest its allocations, pointer reads and watcher saw, the
marks of ignis.storage.rollback; read again when the cursor catches up, unless the caller's watcher vouches for what
was seen: `recheck`), the topic's records of those slots are read with the subscription's filter applied by the
server (a regular expression on `subject`: what it does not select comes back filtered out, with no payload), and
the claim records of the selected ones are written: late, by the connection's DeferredClaims, and never if an ack
comes first (deferred.py), except over slots a seek went back over (REPLAYED_TO). A process that stops before the
write leaves slots its cursor passed without claim records: the sweeper finds those (its `_claim_stranded`) and
stamps them, so they are delivered again, never lost.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import ATTEMPTS, FIRE_TS, LOADED_AT, MSG_ID, Envelope, now_ms
from ignis.errors import StoreUnavailable
from ignis.storage.aerospike.claims import _ANSWER_LOST, LAST_CLAIM, LAST_FROM, applied_claim
from ignis.storage.aerospike.context import (
    BATCH_CHUNK,
    FILTERED_OUT,
    LOST,
    NOT_FOUND,
    PURGED,
    RECORD_EXISTS,
    SEALED,
    TOMBSTONE,
    AerospikeContext,
    ExpressionTemplate,
)
from ignis.storage.aerospike.deferred import LateClaim
from ignis.storage.aerospike.errors import error_field, is_transient
from ignis.storage.aerospike.reads import Reads
from ignis.storage.aerospike.seals import Seals
from ignis.storage.base import (
    FIRE_POINTER,
    HOLES_CLAIMED,
    LOAD_POINTER,
    RESERVATION_FRESH_MS,
    Claimed,
    ClaimInDoubt,
    ClaimInterrupted,
    ClaimTicket,
    CursorClaim,
    QueueRecord,
    SlotRef,
)
from ignis.subjects import SubjectFilter

# The client (19.x) says CmpRegex is deprecated for the string expression RegexCompare, which Aerospike 8.1.2 CE
# refuses (result -15 for every record, measured): the filter stays a CmpRegex, and that warning is silenced here.
warnings.filterwarnings("ignore", message="CmpRegex expression is deprecated", category=DeprecationWarning)

CREATED_AT = "createdAt"
CLAIM_FROM = "claimFrom"
# In a cursor's meta record: the furthest position a seek moved it back from. Slots up to it may hold an earlier
# pass's claim records or acks' tombstones, so their claims write the claim records at once (a late one is written
# only where no record is: deferred.py).
REPLAYED_TO = "replayedTo"
SUBJECT_BIN = "subject"
LOOK_BACK = 8  # topic slots read before an awaited one given up, for a live record that says it was never written
SCAN_LIMIT = 1_000  # topic slots one claim looks at, at most (a filter that selects little: the next claim goes on)
# A cursor's move (Topics._advance): behind `limit`, it takes min(fire + count, limit) and notes where it began.
_FIRE = exp.IntBin(FIRE_POINTER)
_BEHIND = ExpressionTemplate(lambda limit: exp.LT(_FIRE, limit), -7772)
_ADVANCED = ExpressionTemplate(lambda count, limit: arithmetic.Min(arithmetic.Add(_FIRE, count), limit), -7771, -7772)
_WRITE_LAST_FROM = expr_ops.expression_write(LAST_FROM, _FIRE.compile())
_READ_FIRE, _READ_LAST_FROM, _READ_REPLAYED_TO = ops.read(FIRE_POINTER), ops.read(LAST_FROM), ops.read(REPLAYED_TO)
_FIRE_OR_0 = exp.Cond(exp.BinExists(FIRE_POINTER), _FIRE, 0)
# A seek's mark: REPLAYED_TO becomes the highest position the cursor ever had (written before the seek's own).
_MARK_REPLAYED = expr_ops.expression_write(REPLAYED_TO, exp.Cond(
    exp.BinExists(REPLAYED_TO), arithmetic.Max(exp.IntBin(REPLAYED_TO), _FIRE_OR_0), _FIRE_OR_0).compile())


class _Read(NamedTuple):
    """A topic record as a batch read answers it (result code, record), the filter applied by the client."""

    result: int
    record: Any


class Topics:
    """Topic records (`Storage.apply_topic`, ...) and cursor claims, reads and seals (`Storage.claim_cursor`, ...)."""

    def __init__(self, ctx: AerospikeContext, reads: Reads, seals: Seals) -> None:
        self._ctx = ctx
        self._reads = reads
        self._seals = seals
        self._set = names.topic_set(ctx.farm_id, ctx.client_id)
        self._filters: dict[str, list[Any]] = {}  # filter text -> its compiled expression

    # ---- registry -----------------------------------------------------------------------------------
    def apply_topic(self, name: str, config: Mapping[str, Any]) -> bool:
        key = self._ctx.key(self._set, name)
        created = self.get_topic(name) is None  # (none, or a deleted one's tombstone: written afresh)
        try:
            if created:
                self._ctx.call("apply_topic", self._ctx.client.put, key, {**config, CREATED_AT: now_ms()}, None,
                               {**self._ctx.never, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE})
            else:
                self._ctx.call("apply_topic", self._ctx.client.put, key, dict(config), None,
                               {**self._ctx.never, "exists": aerospike.POLICY_EXISTS_UPDATE})
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "apply_topic", self._set) from None
        return created

    def get_topic(self, name: str) -> QueueRecord | None:
        try:
            _, _, bins = self._ctx.call("get_topic", self._ctx.client.get, self._ctx.key(self._set, name))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "get_topic", self._set) from None
        return None if self._ctx.tombstoned(bins) else QueueRecord(name, dict(bins))

    def list_topics(self) -> list[QueueRecord]:
        def scan() -> list[Any]:
            found: list[Any] = []
            self._ctx.client.query(self._ctx.ns, self._set).foreach(found.append)
            return found

        try:
            records = self._ctx.call("list_topics", scan)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "list_topics", self._set) from None
        return sorted((QueueRecord(key[2], dict(bins)) for key, _, bins in records
                       if key[2] is not None and not self._ctx.tombstoned(bins)), key=lambda r: r.name)

    def delete_topic(self, name: str) -> bool:
        try:
            return self._reads.remove_one("delete_topic", self._ctx.key(self._set, name))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "delete_topic", self._set) from None

    # ---- cursors --------------------------------------------------------------------------------------
    def set_cursor(self, cursor: str, positions: Mapping[int, int]) -> None:
        try:
            for shard, position in positions.items():
                self._ctx.call("set_cursor", self._ctx.client.operate, self._ctx.meta_key(cursor, shard),
                               [_MARK_REPLAYED, ops.write(FIRE_POINTER, max(int(position), 0))], None,
                               self._ctx.never)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "set_cursor", self._ctx.meta_set) from None

    def _load_mark(self, topic: str, shard: int) -> tuple[str, str, str]:
        """The key of a topic shard's load pointer among the process's high marks (allocations note theirs there)."""
        key = self._ctx.meta_key(topic, shard)
        return key[1], key[2], LOAD_POINTER

    def topic_load(self, topic: str, shard: int, fresh: bool = False) -> int:
        """The topic shard's load pointer: the highest this process has seen (read now when `fresh`, or never seen)."""
        known = self._ctx.shared.marks.mark(self._load_mark(topic, shard))
        if not known or fresh:
            bins = self._reads.batch_get("claim", [self._ctx.meta_key(topic, shard)], [LOAD_POINTER])[0]
            known = self.saw_load(topic, shard, int((bins or {}).get(LOAD_POINTER) or 0))
        return known

    def saw_load(self, topic: str, shard: int, load: int) -> int:
        """Note a topic shard's load pointer read elsewhere (pointers, the watcher); the highest seen."""
        mark = self._load_mark(topic, shard)
        self._ctx.shared.marks.saw(mark, load)
        return max(self._ctx.shared.marks.mark(mark), load)

    def claim_cursor(self, cursor: str, shard: int, max_slots: int, now: int, only: SubjectFilter | None,
                     up_to: int | None = None, count_attempt: bool = True, recheck: bool = True) -> CursorClaim:
        topic = names.cursor_topic(cursor)
        assert topic is not None
        try:
            limit = self.topic_load(topic, shard)
            taken = self._advance(cursor, shard, max_slots, limit if up_to is None else min(limit, up_to))
            if taken is None:  # caught up with the load pointer as known: read it again (if it may have moved)
                fresh = self.topic_load(topic, shard, fresh=True) if recheck else limit
                if fresh <= limit or (up_to is not None and up_to <= limit):
                    return CursorClaim([], 0, True)
                limit = fresh
                taken = self._advance(cursor, shard, max_slots, limit if up_to is None else min(limit, up_to))
                if taken is None:
                    return CursorClaim([], 0, True)
            first, last, replayed_to = taken
            refs = [SlotRef(cursor, shard, slot) for slot in range(first, last + 1)]
            try:
                return self._claim_taken(cursor, topic, shard, refs, limit, now, only, count_attempt,
                                         limit if up_to is None else min(limit, up_to), first > replayed_to)
            except (ex.AerospikeError, StoreUnavailable) as exc:
                # The slots are taken: still this claimer's, awaited, to read and claim again once the store answers
                # (not left for the sweeper, a sweepDuration away). Found in the 3-node fault run.
                error = self._ctx.fail(exc, "claim", self._ctx.data_set) if isinstance(exc, ex.AerospikeError) else exc
                if not isinstance(error, StoreUnavailable):
                    raise error from None
                raise ClaimInterrupted(str(error), [Claimed(ref, None, True) for ref in refs]) from None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "claim", self._ctx.meta_set) from None

    def _claim_taken(self, cursor: str, topic: str, shard: int, refs: list[SlotRef], limit: int, now: int,
                     only: SubjectFilter | None, count_attempt: bool, bound: int, fresh: bool) -> CursorClaim:
        """The second half of `claim_cursor`, over the slots the cursor's move took: read, claim, count the gone.
        Drained when the move reached `bound` (the topic's load pointer as known, or up_to): its claimer then need
        not claim again to learn it (an empty claim a message at 1,000 msg/s, each a round trip). `fresh`: slots
        no claim passed before (past any seek's REPLAYED_TO), whose claim records may be written late."""
        expired: list[int] = []
        claimed = self._claim_slots(refs, now, only, count_attempt, expired=expired, late=fresh)
        gone = len(expired)
        missing = [c for c in claimed if c.envelope is None and c.awaiting]
        last = refs[-1][2]
        if missing and len(missing) + gone == len(refs) and last < limit:
            # Nothing here but missing records: the subscription fell behind the retention, or publishes are on
            # their way. A record after them published more than the write deadline ago tells which.
            skipped = self._skip_gone(cursor, topic, shard, last, limit, now)
            if skipped is not None:
                gone += len(missing) + skipped
                claimed = [c for c in claimed if c not in missing]
        if gone:
            self._ctx.call("claim", self._ctx.client.operate, self._ctx.meta_key(cursor, shard),
                           [ops.increment(HOLES_CLAIMED, gone)], None, self._ctx.never, idempotent=False)
        return CursorClaim(claimed, gone, last >= bound)

    def resolve_cursor_claim(self, ticket: ClaimTicket) -> list[Claimed] | None:
        """`Storage.resolve_claim` of a cursor's claim: the slots its move took, if it was applied and no move came
        after it (else None: the sweeper finds them), awaited, to be read and claimed by the claimer's re-reads."""
        got = applied_claim(self._ctx, ticket)
        if got is None:
            return None
        first, last = int(got.get(LAST_FROM) or 0) + 1, int(got.get(FIRE_POINTER) or 0)
        return [Claimed(SlotRef(ticket.magazine, ticket.shard, slot), None, True) for slot in range(first, last + 1)]

    def _settled_after(self, bins: Mapping[str, Any] | None, now: int) -> bool:
        """Whether a present topic record vouches that every slot before it is settled: it was published more than
        the write deadline ago, and slots are allocated in order, so a missing one before it never comes."""
        loaded = (bins or {}).get(LOADED_AT)
        return isinstance(loaded, int) and loaded + self._ctx.write_grace_ms < now

    def _skip_gone(self, cursor: str, topic: str, shard: int, last: int, limit: int, now: int) -> int | None:
        """Past `last`, the slots whose messages left the topic (a binary search for the first one it holds, in
        about log2(limit - last) reads); the cursor moves past them (never back). How many it skipped; None when no
        record after `last` vouches that the slots up to it are settled (publishes may be on their way)."""
        low, high = last + 1, limit
        first_held, held_bins = limit + 1, None
        while low <= high:
            mid = (low + high) // 2
            bins = self._reads.batch_get("claim", [self._ctx.data_key(SlotRef(topic, shard, mid))], None,
                                         self._ctx.batch_all)[0]
            if self._ctx.tombstoned(bins):  # (gone: expired, trimmed to the byte bound, or sealed)
                low = mid + 1
            else:
                first_held, held_bins, high = mid, bins, mid - 1
        if first_held > limit or not self._settled_after(held_bins, now):
            return None  # nothing held after them yet (a publish may be on its way): the next claims look again
        target = first_held - 1
        if target <= last:
            return 0  # (the next slot is held: only the claim's own slots were gone)
        fire = exp.IntBin(FIRE_POINTER)
        _, _, got = self._ctx.call("claim", self._ctx.client.operate, self._ctx.meta_key(cursor, shard),
                                   [expr_ops.expression_read(CLAIM_FROM, fire.compile()),
                                    expr_ops.expression_write(FIRE_POINTER, arithmetic.Max(fire, target).compile())],
                                   None, self._ctx.update, idempotent=False)
        return max(target - max(int(got[CLAIM_FROM]), last), 0)  # (another claimer may have passed some first)

    def _advance(self, cursor: str, shard: int, count: int, limit: int) -> tuple[int, int, int] | None:
        """Move the cursor over up to `count` slots, not past `limit`: the slots taken (first, last) and the cursor's
        REPLAYED_TO (0: never sought back), None when none is left. An
        answer lost on the way (the server may have applied it) raises ClaimInDoubt: the move leaves its token and
        where it began in the cursor's meta record (as a queue's claim does), so `resolve_claim` finds the slots."""
        token = f"{self._ctx.shared.claim_prefix}{next(self._ctx.shared.claim_seq)}"
        # (where it began: LAST_FROM read back after its write, a plain read; a claim's expressions compiled once)
        operations = [_WRITE_LAST_FROM, expr_ops.expression_write(FIRE_POINTER, _ADVANCED(count, limit)),
                      _READ_FIRE, _READ_LAST_FROM, _READ_REPLAYED_TO, ops.write(LAST_CLAIM, token)]
        key = self._ctx.meta_key(cursor, shard)
        try:
            try:
                _, _, got = self._ctx.call("claim", self._ctx.client.operate, key, operations, None,
                                           {**self._ctx.update, "expressions": _BEHIND(limit)}, idempotent=False)
            except ex.AerospikeError as exc:
                if is_transient(exc, True) and (error_field(exc, "in_doubt", False) or isinstance(exc, _ANSWER_LOST)):
                    error = self._ctx.fail(exc, "claim", self._ctx.meta_set)
                    raise ClaimInDoubt(str(error), ClaimTicket(cursor, shard, False, token, True)) from None
                raise
        except ex.RecordNotFound:  # a cursor never set (a subscription applied before its first claim)
            with contextlib.suppress(ex.RecordExistsError):  # (another claimer made it first)
                self._ctx.call("claim", self._ctx.client.put, key, {FIRE_POINTER: 0}, None,
                               {**self._ctx.never, "exists": aerospike.POLICY_EXISTS_CREATE})
            return self._advance(cursor, shard, count, limit) if limit > 0 else None
        except ex.FilteredOut:  # FIRE >= limit: caught up
            return None
        return int(got[LAST_FROM]) + 1, int(got[FIRE_POINTER]), int(got.get(REPLAYED_TO) or 0)

    def filter_expression(self, only: SubjectFilter | None) -> list[Any] | None:
        """The server-side form of a subject filter, a subscription's or a reader's (None: it selects every
        message): records it refuses answer FILTERED_OUT, their bins never sent."""
        if only is None or only.matches_all:
            return None
        compiled = self._filters.get(only.text)
        if compiled is None:
            compiled = self._filters[only.text] = exp.CmpRegex(aerospike.REGEX_EXTENDED, only.regex,
                                                               exp.StrBin(SUBJECT_BIN)).compile()
        return compiled

    def _claim_slots(self, refs: list[SlotRef], now: int, only: SubjectFilter | None, count_attempt: bool,
                     attempts: Mapping[SlotRef, int] | None = None, expired: list[int] | None = None,
                     records: list[Any] | None = None, late: bool = False) -> list[Claimed]:
        """Read the topic's records of cursor slots (the filter applied by the server; or take `records`, read
        so by the caller), write the claim records of those selected (`late`: owe them, deferred.py, where the
        connection defers them), and return them joined: the selected ones, an awaited slot for each record that
        may still be on its way, and (`attempts` given: a restamp) a passed-over marker for each one the filter
        refuses."""
        if records is None:
            topic = names.cursor_topic(refs[0][0])
            assert topic is not None
            filtered = self.filter_expression(only)
            topic_keys = self._ctx.data_keys(refs, topic)
            if len(refs) == 1 and filtered is None:
                records = [self._read_one(topic_keys[0])]
            else:
                policy = self._ctx.batch_all if filtered is None else {**self._ctx.batch_all, "expressions": filtered}
                records = []
                for start in range(0, len(topic_keys), BATCH_CHUNK):
                    chunk = topic_keys[start:start + BATCH_CHUNK]
                    done = self._ctx.call("claim", self._ctx.client.batch_read, chunk, None,
                                          self._ctx.batch_policy(len(chunk), policy))
                    records += self._ctx.answers("claim", done, len(chunk), self._ctx.data_set)
        out: list[Claimed] = []
        writes: list[tuple[SlotRef, Envelope]] = []
        ttl = 1
        # A missing record before one published more than the write deadline ago will never come: its message left
        # the topic (`expired`, counted by the caller), unless the caller only restamps.
        # But one after a live record was never written (a publish that failed after its reservation, and whose seal
        # failed too: an outage), for a topic's records leave it oldest first (by TTL, or by the byte bound's trim):
        # a hole, not a loss to retention (the publisher was told it failed). Found in the 3-node fault run.
        # (Worked out from every record at the first slot without a live one: most claims find none.)
        bounds: tuple[int, int | None] | None = None
        new, counted = tuple.__new__, (1 if count_attempt else 0)
        for ref, record in zip(refs, records, strict=True):  # (per message: tombstoned and Claimed inlined)
            result = record.result
            if result == FILTERED_OUT:
                if attempts is not None:
                    out.append(new(Claimed, (ref, None, None)))  # landed, not for this subscription
                continue
            got = record.record if result == 0 else None
            bins = got[2] if got is not None else None
            if bins is None or bins.get(TOMBSTONE) is not None or bins.get(PURGED) is not None:
                if result not in (0, NOT_FOUND):
                    raise self._ctx.record_failure("claim", record, self._ctx.data_set)
                if bins is not None and bins.get(SEALED) is not None and bins.get(LOST) is None:
                    # A publisher's reservation it gave up: no message was ever there, nothing lost.
                    if attempts is not None:
                        out.append(Claimed(ref, None, None))
                    continue
                if expired is not None:
                    if bounds is None:
                        bounds = self._settled_bounds(refs, records, now)
                    settled_before, first_live = bounds
                    if bins is None and first_live is not None and first_live < ref[2] < settled_before:
                        continue  # never written (above): nothing lost, nothing to claim
                    if (bins is None and ref[2] < settled_before) or (bins is not None and
                                                                      bins.get(SEALED) is not None):
                        expired.append(ref[2])  # gone before this subscription came to it (or another found it so)
                        continue
                # Not written yet (a publish in flight), sealed, or gone: awaited, then sealed (ignis.magazine).
                out.append(Claimed(ref, None, bins is None))
                continue
            envelope = self._ctx.envelope(bins, None, ref)
            envelope.fire_ts = now
            envelope.attempts = counted if attempts is None else attempts.get(ref, 0) + counted
            record_ttl = (got[1] or {}).get("ttl") or 1
            if record_ttl > ttl:
                ttl = int(record_ttl)
            writes.append((ref, envelope))
            out.append(new(Claimed, (ref, envelope, False)))
        if writes:
            deferred = self._ctx.shared.deferred
            if late and deferred is not None:  # (a claim's records share its fireTS and attempts)
                deferred.note(self._ctx.data_keys([ref for ref, _ in writes]), now, counted, ttl)
            else:
                self._write_claims(writes, ttl)
        return out

    def _read_one(self, key: tuple[str, str, str]) -> _Read:
        """One topic record as a batch read answers it, read alone: a lone slot is most claims of a subscription that
        keeps up (a message at a time at 1,000 msg/s), and a batch of one costs the client more CPU than a read (49
        against 35 µs; a batch write of one, 52 against 42 for an operate: measured on CE 8.1, client 19). Every copy
        consulted, as the batch's (read_mode_ap ALL). Only where no filter applies: a batch's filter expression
        refuses a tombstone too (it has no subject), which a read here would not."""
        try:
            return _Read(0, self._ctx.call("claim", self._ctx.client.get, key, self._ctx.read_all))
        except ex.RecordNotFound:
            return _Read(NOT_FOUND, None)

    def _settled_bounds(self, refs: list[SlotRef], records: list[Any], now: int) -> tuple[int, int | None]:
        """(settled_before, first_live) of a claim's records (_claim_slots): the last slot before which every missing
        record is settled, and the first live record far from its own expiry (None: none)."""
        settled_before, first_live = 0, None
        for ref, record in zip(refs, records, strict=True):
            if record.result == 0 and record.record is not None and not self._ctx.tombstoned(record.record[2]):
                ttl = int((record.record[1] or {}).get("ttl") or 0)
                if first_live is None and (ttl <= 0 or ttl > self._ctx.write_grace_ms // 1000 + 1):
                    first_live = ref[2]  # (far from its own expiry: one written near it may have expired first)
                if self._settled_after(record.record[2], now):
                    settled_before = ref[2]
        return settled_before, first_live

    def _write_claims(self, writes: list[tuple[SlotRef, Envelope]], ttl: int) -> None:
        """The claim records: fireTS and attempts, nothing of the message (DESIGN §8b; the slot says which message:
        a cursor's slot claims the topic's slot of the same number, for good), expiring no sooner than the messages
        they claim, live (an ack's tombstone from an earlier pass over the slot, a seek back, is cleared). Every
        record of a claim shares its fireTS and attempts (a restamp's attempts may differ: one call per value), so a
        claim is one `batch_operate`, whose single operation list the client converts once: per-record writes cost
        it 1.6 ms of CPU per 100 records, this 0.43 ms (measured), half a subscription's drain. A lone record's is
        an `operate` (a batch of one costs the client more: `_read_one`)."""
        policy = {**self._ctx.wp, "ttl": ttl}
        groups: dict[tuple[int | None, int], list[tuple[str, str, str]]] = {}
        if len({(env.fire_ts, env.attempts) for _, env in writes}) == 1:  # a claim's (a restamp's may differ)
            groups[(writes[0][1].fire_ts, writes[0][1].attempts)] = self._ctx.data_keys([ref for ref, _ in writes])
        else:
            for ref, env in writes:
                groups.setdefault((env.fire_ts, env.attempts), []).append(self._ctx.data_key(ref))
        for (fire_ts, attempts), keys in groups.items():
            self._operate_each("claim", keys, [ops.write(FIRE_TS, fire_ts), ops.write(ATTEMPTS, attempts),
                                               ops.write(TOMBSTONE, None), ops.write(PURGED, None)], policy)

    def _operate_each(self, operation: str, keys: list[tuple[str, str, str]], operations: list[Any],
                      policy: dict[str, Any], exists_ok: bool = False) -> None:
        """One operation list on every key, with one policy (which the client converts once): an `operate` for a
        lone key (a batch of one costs the client more: `_read_one`), else batches. A record that fails raises its
        error (one that exists already passes, `exists_ok`: a create-only write); Aerospike errors propagate raw."""
        if len(keys) == 1:
            try:
                self._ctx.call(operation, self._ctx.client.operate, keys[0], operations, None, policy)
            except ex.RecordExistsError:
                if not exists_ok:
                    raise
            return
        passing = (0, RECORD_EXISTS) if exists_ok else (0,)
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            done = self._ctx.call(operation, self._ctx.client.batch_operate, chunk, operations,
                                  self._ctx.batch_policy(len(chunk)), policy)
            failed = [r for r in self._ctx.answers(operation, done, len(chunk), self._ctx.data_set)
                      if r.result not in passing]
            if failed:
                raise self._ctx.record_failure(operation, failed[0], self._ctx.data_set)

    def write_late(self, claims: list[LateClaim]) -> None:
        """DeferredClaims' writes: claim records owed, created only where no record is (a record there is the
        sweeper's claim of a slot it found unclaimed, or an ack's tombstone: either stays). One batch per fireTS,
        attempts and TTL (claims of one call share them)."""
        groups: dict[tuple[int, int, int], list[tuple[str, str, str]]] = {}
        for claim in claims:
            groups.setdefault((claim.fire_ts, claim.attempts, claim.ttl), []).append(claim.key)
        try:
            for (fire_ts, attempts, ttl), keys in groups.items():
                self._operate_each("claim", keys, [ops.write(FIRE_TS, fire_ts), ops.write(ATTEMPTS, attempts)],
                                   {**self._ctx.wp, "ttl": ttl, "exists": aerospike.POLICY_EXISTS_CREATE}, True)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "claim", self._ctx.data_set) from None

    def settle_late(self, claims: list[LateClaim]) -> None:
        """DeferredClaims' acks: the tombstones of slots whose claim records were never written, created with the
        TTL the claim record would have had (replacing whatever is there: the sweeper's claim of the slot)."""
        groups: dict[int, list[tuple[str, str, str]]] = {}
        for claim in claims:
            groups.setdefault(claim.ttl, []).append(claim.key)
        operations = [ops.write(TOMBSTONE, now_ms())]
        try:
            for ttl, keys in groups.items():
                self._operate_each("delete", keys, operations,
                                   {**self._ctx.wp, "ttl": ttl, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE})
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "delete", self._ctx.data_set) from None

    def restamp_cursor(self, refs: Sequence[SlotRef], now: int, only: SubjectFilter | None,
                       count_attempt: bool = True) -> list[Claimed]:
        if not refs:
            return []
        topic = names.cursor_topic(refs[0][0])
        assert topic is not None
        try:
            # One round trip reads both halves: the claim records (their attempts) and the topic's records, the
            # filter applied here (a miss, the common case of an awaited slot's re-read, costs nothing more).
            keys = [self._ctx.data_key(ref) for ref in refs]
            keys += [self._ctx.data_key(SlotRef(topic, ref[1], ref[2])) for ref in refs]
            both: list[Any] = []
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._ctx.call("restamp", self._ctx.client.batch_read, chunk, None,
                                      self._ctx.batch_policy(len(chunk), self._ctx.batch_all))
                both += self._ctx.answers("restamp", done, len(chunk), self._ctx.data_set)
            claims, messages = both[:len(refs)], both[len(refs):]
            attempts = {}
            for ref, record in zip(refs, claims, strict=True):
                bins = record.record[2] if record.result == 0 and record.record is not None else None
                if record.result not in (0, NOT_FOUND):
                    raise self._ctx.record_failure("restamp", record, self._ctx.data_set)
                attempts[ref] = 0 if bins is None or self._ctx.tombstoned(bins) else int(bins.get(ATTEMPTS) or 0)
            selects = None if only is None or only.matches_all else only.matches
            read = [_Read(FILTERED_OUT, None) if selects is not None and r.result == 0 and r.record is not None
                    and not self._ctx.tombstoned(r.record[2]) and not selects(r.record[2].get(SUBJECT_BIN))
                    else r for r in messages]
            return self._claim_slots(list(refs), now, only, count_attempt, attempts, records=read)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "restamp", self._ctx.data_set) from None

    def seal_cursor(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool | None]:
        if not refs:
            return []
        topic = names.cursor_topic(refs[0][0])
        assert topic is not None
        try:
            unwritten = self._never_written(topic, refs)
            out: list[bool | None] = [False] * len(refs)
            for lost in (True, False):
                picked = [i for i, ref in enumerate(refs) if (ref[1] not in unwritten or ref[2] <= unwritten[ref[1]])
                          == lost]
                if not picked:
                    continue
                sealed = self._seals.seal_slots("seal", [SlotRef(topic, refs[i][1], refs[i][2]) for i in picked],
                                                self._ctx.ttl(ttl_seconds), lost=lost)
                for i, done in zip(picked, sealed, strict=True):
                    out[i] = (True if lost else None) if done else False
            return out
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "seal", self._ctx.data_set) from None

    def _never_written(self, topic: str, refs: Sequence[SlotRef]) -> dict[int, int]:
        """Per shard, the live topic slot (found among the LOOK_BACK slots before the lowest of `refs`) after which a
        missing record was never written, not gone. A topic's records leave it oldest first, and a slot is allocated
        after every slot before it: had a message been written in a later slot, it would expire no sooner than that
        live record's expiry less a reservation's life and the write deadline. So while the live record is further
        than that from its own expiry, a missing record after it was never written (a publisher that stopped after
        reserving its slot: SIGKILLed, say) and is a hole, not a message lost to retention. Found in the kill test
        on a real server, where such holes raised the lost-to-retention warning and counted as expired."""
        lowest: dict[int, int] = {}
        for ref in refs:
            lowest[ref[1]] = min(lowest.get(ref[1], ref[2]), ref[2])
        probes = [SlotRef(topic, shard, slot) for shard, low in lowest.items()
                  for slot in range(max(1, low - LOOK_BACK), low)]
        if not probes:
            return {}
        keys = [self._ctx.data_key(ref) for ref in probes]
        done = self._ctx.call("seal", self._ctx.client.batch_read, keys, [MSG_ID],
                              self._ctx.batch_policy(len(keys), self._ctx.batch_all))
        margin_s = (self._ctx.write_grace_ms + RESERVATION_FRESH_MS) // 1000 + 1
        live: dict[int, int] = {}
        for ref, record in zip(probes, self._ctx.answers("seal", done, len(keys), self._ctx.data_set), strict=True):
            if record.result == 0 and record.record is not None and not self._ctx.tombstoned(record.record[2]):
                ttl = int((record.record[1] or {}).get("ttl") or 0)
                if ttl <= 0 or ttl > margin_s:
                    live[ref[1]] = max(live.get(ref[1], 0), ref[2])
            elif record.result not in (0, NOT_FOUND):
                raise self._ctx.record_failure("seal", record, self._ctx.data_set)
        return live

    def joined(self, operation: str, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        """Cursor slots' messages as their subscription holds them: the topic's records with the claim records'
        fireTS and attempts (None without a claim record, or once the message left the topic)."""
        if not refs:
            return []
        topic = names.cursor_topic(refs[0][0])
        assert topic is not None
        claims = self._reads.batch_get(operation, [self._ctx.data_key(ref) for ref in refs],  # (settled: none)
                                       [FIRE_TS, ATTEMPTS, TOMBSTONE, PURGED], self._ctx.batch_all)
        present = [ref for ref, bins in zip(refs, claims, strict=True) if bins is not None]
        messages = dict(zip(present, self._reads.batch_get(
            operation, [self._ctx.data_key(SlotRef(topic, ref[1], ref[2])) for ref in present], None,
            self._ctx.batch_all), strict=True))
        out: list[Envelope | None] = []
        for ref, claim in zip(refs, claims, strict=True):
            bins = messages.get(ref) if claim is not None else None
            if bins is None:
                out.append(None)
                continue
            envelope = self._ctx.envelope(bins, None, ref)
            envelope.fire_ts, envelope.attempts = claim.get(FIRE_TS), int(claim.get(ATTEMPTS) or 0)  # type: ignore[union-attr]
            out.append(envelope)
        return out

