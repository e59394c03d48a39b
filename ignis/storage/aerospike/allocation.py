"""Slot allocation and the loads that fill the slots: `load`, `load_one`, `reserve`, `load_reserved*`, the
increments of the load pointer (`_allocate_slots`, `allocate`), the writes of new records (`write_new` and
the create-only/replace paths), and the repair of shard pointers a store rollback set back (`renumbered`,
`roll_forward`, `_collided`). Separate because it is the producers' path; the pointer repair lives here since
allocation meets a rollback first, and claims and pointer reads reuse it."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.bounds import LOAD_BYTES, ShardLimit, room
from ignis.envelope import ATTEMPTS, CODEC, CODEC_BYTES, LOADED_AT, MSG_ID, PAYLOAD, Envelope
from ignis.errors import InvalidInputError, LoadInterrupted, StoreError, StoreUnavailable
from ignis.metrics import STORAGE_RETRIES
from ignis.storage.aerospike.context import PURGED, RECORD_EXISTS, RECORD_OVERHEAD, SEALED, TOMBSTONE, AerospikeContext
from ignis.storage.aerospike.reads import Reads
from ignis.storage.aerospike.seals import Seals
from ignis.storage.base import FIRE_POINTER, LOAD_POINTER, SlotRef

log = logging.getLogger(__name__)

ROLLBACK_SEAL_TTL = 30 * 86400  # seals of slots left by an allocation that met a rollback (no queue TTL at hand)

_NOT_SEALED = exp.Not(exp.BinExists(SEALED)).compile()  # a new record may go anywhere but a sealed slot
COLLISION_WINDOW = 256  # slots read at a time past a slot found used twice (see _collided)
REPUBLISH_ROUNDS = 5  # a message refused by a sealed slot is written again, at most this many times


def _allocate_ops(n: int) -> list[dict[str, Any]]:
    """Allocate n slots on a meta record: increment the load pointer and read it back; also create the
    fire pointer (the claim guard needs it) and drop a purge tombstone's bins, reading first whether there
    was one (a purge restarts the numbering on purpose: no rollback)."""
    return [ops.read(PURGED), ops.increment(LOAD_POINTER, n), ops.increment(FIRE_POINTER, 0),
            ops.write(TOMBSTONE, None), ops.write(PURGED, None), ops.read(LOAD_POINTER)]


_ALLOCATE_ONE = _allocate_ops(1)  # built once: the per-message publish path
BOUNDED_ROUNDS = 4  # a bounded allocation refused for its whole count tries again with the room it then reads


def _counted(load_bin: str) -> Any:
    """An integer bin of the meta record, 0 when absent (a new shard, a purge tombstone)."""
    return exp.Cond(exp.BinExists(load_bin), exp.IntBin(load_bin), 0)


@functools.lru_cache(maxsize=4096)
def _bound_guard(length: int | None, max_bytes: int | None, count: int, nbytes: int) -> Any:
    """The filter expression of a bounded shard's allocation of `count` slots holding `nbytes` payload bytes
    (ignis.bounds): applied to the meta record, the increment happens only while the shard has room, in the same
    atomic operation (a false filter answers FilteredOut and writes nothing). A record that does not exist yet is
    not filtered (the server applies filter expressions to existing records only), which is right: an empty shard
    has room for any allocation within its share, and the caller never asks for more than that."""
    load, fire = _counted(LOAD_POINTER), _counted(FIRE_POINTER)
    waiting = arithmetic.Sub(load, fire)
    checks = []
    if length is not None:
        checks.append(exp.LE(arithmetic.Add(waiting, count), length))
    if max_bytes is not None:
        # unclaimed slots x mean message size (LOAD_BYTES // LOAD_POINTER): see ignis.bounds
        mean = exp.Cond(exp.GT(load, 0), arithmetic.Div(_counted(LOAD_BYTES), load), 0)
        checks.append(exp.LE(arithmetic.Add(arithmetic.Mul(waiting, mean), nbytes), max_bytes))
    return (checks[0] if len(checks) == 1 else exp.And(*checks)).compile()


class _Full(Exception):
    """A bounded allocation's filter refused it: the shard had no room for the whole count."""


class Allocation:
    """Allocates slots on a shard's meta record and writes new message records into them."""

    def __init__(self, ctx: AerospikeContext, reads: Reads, seals: Seals) -> None:
        self._ctx = ctx
        self._reads = reads
        self._seals = seals
        # write policies of a new record, by TTL: create-only; create-or-replace unless sealed
        self._new_record: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        # load() for one plain message, without its lists: the per-message publish path. Anything out
        # of the ordinary (a record near the size limit, a sealed slot) takes the general path.
        if len(payload) + len(msg_id) + RECORD_OVERHEAD > self._ctx.shared.settings.max_record_bytes:
            return self.load(magazine, [(shard, Envelope(payload, msg_id, loaded_at))], ttl_seconds)[0].slot
        try:
            slot = self._allocate_slots("load", magazine, shard, 1)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "load", self._ctx.data_set) from None
        if self.load_reserved(tuple.__new__(SlotRef, (magazine, shard, slot)), payload, msg_id, loaded_at,
                              ttl_seconds):
            return slot
        # sealed: a consumer gave the slot up; publish it again into a new one
        return self.load(magazine, [(shard, Envelope(payload, msg_id, loaded_at))], ttl_seconds)[0].slot

    def _plain_policies(self, ttl_seconds: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The create-only and the sealed-refusing create-or-replace policy of a new record (cached)."""
        policies = self._new_record.get(ttl_seconds)
        if policies is None:
            ttl = self._ctx.ttl(ttl_seconds)
            policies = self._new_record[ttl_seconds] = (
                {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl},
                {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "expressions": _NOT_SEALED,
                 "ttl": ttl})
        return policies

    def _write_plain(self, data_key: str, bins: dict[str, Any], policies: tuple[dict[str, Any], dict[str, Any]]
                     ) -> bool:
        """Write a new record into its allocated slot; False if the slot is sealed. Aerospike errors raw."""
        key = (self._ctx.ns, self._ctx.data_set, data_key)
        try:
            # A new slot is almost always empty: create-only needs no filter expression (whose
            # conversion costs the client about a third of the call, measured).
            self._ctx.call("load", self._ctx.client.put, key, bins, None, policies[0])
        except ex.RecordExistsError:  # a purge leftover, a seal, or this write's own earlier attempt
            return self._write_over("load", key, bins, policies[1]["ttl"])
        return True

    def _write_over(self, operation: str, key: tuple[str, str, str], bins: Mapping[str, Any], ttl: int) -> bool:
        """A new record's write into a slot that holds one already: it replaces a purge leftover, or this same
        message (its own earlier attempt); it is refused by a seal, and by another message, which a rollback
        put there (the store handed the slot out twice: see rollback.py). False: publish it again elsewhere."""
        replaceable = exp.And(exp.Not(exp.BinExists(SEALED)), exp.Or(
            exp.BinExists(PURGED), exp.Eq(exp.StrBin(MSG_ID), str(bins.get(MSG_ID) or ""))))
        policy = {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "ttl": ttl,
                  "expressions": replaceable.compile()}
        try:
            self._ctx.call(operation, self._ctx.client.put, key, dict(bins), None, policy)
            return True
        except ex.FilteredOut:
            pass
        STORAGE_RETRIES.labels("load_sealed").inc()
        try:
            _, _, held = self._ctx.call(operation, self._ctx.client.get, key)
        except ex.RecordNotFound:
            return False
        if held.get(SEALED) is None:  # not a seal: another message, or its ack
            self._collided(*names.parse_data_key(key[2]))
        return False

    def _collided(self, magazine: str, shard: int, slot: int) -> None:
        """The store handed out a slot that already holds a message (or its ack): its load pointer went back
        (a rollback this process had no mark for, e.g. it started after the crash). Report it, and move the
        load pointer past the messages stored beyond it (read ahead window by window), so the next
        allocations get new slots."""
        last = slot
        while True:
            refs = [SlotRef(magazine, shard, s) for s in range(last + 1, last + 1 + COLLISION_WINDOW)]
            live = self._reads.batch_get("rollback_check", [self._ctx.data_key(ref) for ref in refs])
            used = [ref.slot for ref, bins, done in zip(refs, live, self._reads.settled(refs), strict=True)
                    if bins is not None or done]
            if not used:
                break
            last = used[-1]
        key = self._ctx.meta_key(magazine, shard)
        self._ctx.shared.marks.saw((key[1], key[2], LOAD_POINTER), last)
        self.roll_forward(magazine, shard, f"load pointer (slot {slot} already holds a message)", slot - 1)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        if count < 1:
            raise InvalidInputError(f"reserve {count} slots: count must be at least 1")
        try:
            return self._allocate_slots("reserve", magazine, shard, count)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "reserve", self._ctx.meta_set) from None

    def _plain_bins(self, magazine: str, payload: bytes, msg_id: str, loaded_at: int) -> dict[str, Any]:
        """The bins of a new plain message, checked against the record size limit."""
        bins = {PAYLOAD: payload, MSG_ID: msg_id, LOADED_AT: loaded_at, CODEC: CODEC_BYTES, ATTEMPTS: 0}
        if len(payload) + len(msg_id) + RECORD_OVERHEAD > self._ctx.shared.settings.max_record_bytes:
            self._ctx.check_size(magazine, bins)  # near the limit: the exact estimate, and its clear error
        return bins

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        bins = self._plain_bins(ref.magazine, payload, msg_id, loaded_at)
        try:
            return self._write_plain(names.data_key(ref.magazine, ref.shard, ref.slot), bins,
                                     self._plain_policies(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "load", self._ctx.data_set) from None

    def load_reserved_envelope(self, ref: SlotRef, envelope: Envelope, ttl_seconds: int) -> bool:
        bins = envelope.to_bins()
        self._ctx.check_size(ref.magazine, bins)
        try:
            return self._write_plain(names.data_key(ref.magazine, ref.shard, ref.slot), bins,
                                     self._plain_policies(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "load", self._ctx.data_set) from None

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        bins_list = [self._plain_bins(ref.magazine, payload, msg_id, loaded_at)
                     for ref, payload, msg_id in zip(refs, payloads, ids, strict=True)]
        try:
            return self.write_new("load", refs, bins_list, self._ctx.ttl(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "load", self._ctx.data_set) from None

    def _allocate_slots(self, operation: str, magazine: str, shard: int, count: int,
                        bound: tuple[ShardLimit, int] | None = None) -> int:
        """Allocate `count` consecutive slots of a shard; the first. Checked against the highest load pointer
        this process has seen (the mark is taken before the call, see rollback.py): a lower answer is a
        rollback, and the slots are allocated again past the mark after the pointers are moved there.
        `bound`: (the shard's share of a bounded queue, payload bytes of the slots): the increment is guarded
        by it (raises _Full when the shard has no room for all `count`) and adds the bytes to LOAD_BYTES.
        Aerospike errors raw."""
        key = self._ctx.meta_key(magazine, shard)
        marks, mark = self._ctx.shared.marks, (key[1], key[2], LOAD_POINTER)
        before = marks.mark(mark)
        if bound is None:
            _, _, got = self._ctx.call(operation, self._ctx.client.operate, key,
                                       _ALLOCATE_ONE if count == 1 else _allocate_ops(count), None, self._ctx.never)
        else:
            limit, nbytes = bound
            allocate = _allocate_ops(count)
            if limit.bytes is not None:
                allocate.insert(-1, ops.increment(LOAD_BYTES, nbytes))
            policy = {**self._ctx.never, "expressions": _bound_guard(limit.length, limit.bytes, count, nbytes)}
            try:
                _, _, got = self._ctx.call(operation, self._ctx.client.operate, key, allocate, None, policy)
            except ex.FilteredOut:
                raise _Full() from None
        load = int(got[LOAD_POINTER])
        if got.get(PURGED) is not None:  # purged since: the numbering starts afresh, on purpose
            marks.forget(lambda k: k[:2] == key[1:])
            before = 0
        elif load - count < before and self.renumbered(magazine, shard, load - count + 1, mark):
            before = 0
        if load - count < before and not self.renumbered(magazine, shard, load - count + 1, mark):
            self.roll_forward(magazine, shard, "load pointer", load - count)
            if load > before:  # the part of this allocation past the mark: ours, and unused from now on
                self._seals.seal_slots(operation,
                                       [SlotRef(magazine, shard, slot) for slot in range(before + 1, load + 1)],
                                       ROLLBACK_SEAL_TTL)
            return self._allocate_slots(operation, magazine, shard, count, bound)
        marks.saw(mark, load)
        return load - count + 1

    def allocate_bounded(self, operation: str, magazine: str, shard: int, sizes: Sequence[int],
                         limit: ShardLimit) -> tuple[int, int]:
        """Allocate slots on a bounded shard for messages of `sizes` payload bytes (in order), as many as its share
        has room for (the longest prefix): (first slot, how many), 0 when it is full. One guarded increment when
        all fit (the common case); refused, the meta record is read and the room it leaves asked for, a few times
        at most (concurrent publishers take room meanwhile). Aerospike errors raw."""
        # Never more than an empty shard has room for: the filter is not applied to a meta record that does not
        # exist yet (_bound_guard), so this cap is what bounds a shard's first allocation.
        count = room(limit, 0, 0, 0, sizes)
        for _ in range(BOUNDED_ROUNDS):
            if count <= 0:
                return 0, 0
            try:
                return self._allocate_slots(operation, magazine, shard, count, (limit, sum(sizes[:count]))), count
            except _Full:
                pass
            try:
                _, _, bins = self._ctx.call("bound_check", self._ctx.client.get, self._ctx.meta_key(magazine, shard))
            except ex.RecordNotFound:  # gone since (purged and removed): empty
                bins = {}
            fits = room(limit, int(bins.get(LOAD_POINTER) or 0), int(bins.get(FIRE_POINTER) or 0),
                        int(bins.get(LOAD_BYTES) or 0), sizes)
            count = min(fits, count - 1)  # (less than refused, which may now fit: rounded down by the refusal)
        return 0, 0

    def load_bounded(self, magazine: str, shard: int, envelopes: Sequence[Envelope], ttl_seconds: int,
                     limit: ShardLimit) -> list[SlotRef | None]:
        out: list[SlotRef | None] = [None] * len(envelopes)
        if not envelopes:
            return out
        bins_list = [envelope.to_bins() for envelope in envelopes]
        for bins in bins_list:
            self._ctx.check_size(magazine, bins)
        sizes = [len(envelope.payload) for envelope in envelopes]
        ttl = self._ctx.ttl(ttl_seconds)
        todo = list(range(len(envelopes)))
        for _ in range(REPUBLISH_ROUNDS):
            try:
                first, got = self.allocate_bounded("load", magazine, shard, [sizes[i] for i in todo], limit)
            except ex.AerospikeError as exc:  # nothing written yet for these
                raise self._ctx.fail(exc, "load", self._ctx.data_set) from None
            if not got:
                return out
            taken, rest = todo[:got], todo[got:]
            refs = [SlotRef(magazine, shard, first + k) for k in range(got)]
            try:
                written = self.write_new("load", refs, [bins_list[i] for i in taken], ttl)
            except ex.AerospikeError as exc:  # (LoadInterrupted, from write_new, says which of these landed)
                raise self._interrupted(exc, refs, [False] * len(refs)) from None
            sealed = []
            for i, ref, ok in zip(taken, refs, written, strict=True):
                if ok:
                    out[i] = ref
                else:
                    sealed.append(i)
            if not sealed:  # (`rest`, if any, found no room: refused)
                return out
            # Writes that met a seal (they came after their deadline): published again into new slots, within the room.
            STORAGE_RETRIES.labels("load_sealed").inc(len(sealed))
            todo = sealed + rest
        return out

    def reserve_bounded(self, magazine: str, shard: int, count: int, limit: ShardLimit, size: int
                        ) -> tuple[int, int]:
        if count < 1:
            raise InvalidInputError(f"reserve {count} slots: count must be at least 1")
        try:
            return self.allocate_bounded("reserve", magazine, shard, [size] * count, limit)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "reserve", self._ctx.meta_set) from None

    def renumbered(self, magazine: str, shard: int, slot: int, mark: tuple[str, str, str]) -> bool:
        """Whether a pointer below this process's mark comes from a purge (another process purged the magazine
        and it is used again: numbering afresh, on purpose) rather than a rollback, told by the first slot
        past the pointer: a purge tombstone there, or a message published after the mark was seen. Then the
        shard's marks are forgotten. (A rollback leaves nothing there, or what was there before the mark.)"""
        try:
            _, _, bins = self._ctx.call("rollback_check", self._ctx.client.get,
                                        self._ctx.data_key(SlotRef(magazine, shard, slot)))
        except ex.RecordNotFound:
            return False
        seen_at = self._ctx.shared.marks.seen_at(mark)
        if bins.get(PURGED) is None and not (bins.get(TOMBSTONE) is None and (bins.get(LOADED_AT) or 0) > seen_at):
            return False
        self._ctx.shared.marks.forget(lambda k: k[:2] == mark[:2])
        return True

    def roll_forward(self, magazine: str, shard: int, what: str, stored: int) -> None:
        """After a rollback of a shard's pointers: report it, and move its load and fire pointers up to the
        highest this process has seen (never down: max by expression, one call)."""
        key = self._ctx.meta_key(magazine, shard)
        marks = self._ctx.shared.marks
        load_high = marks.mark((key[1], key[2], LOAD_POINTER))
        fire_high = marks.mark((key[1], key[2], FIRE_POINTER))
        counter = LOAD_POINTER if what.startswith("load") else FIRE_POINTER
        marks.report((key[1], key[2], counter), f"{what} of {magazine} shard {shard}", magazine, stored)
        load, fire = exp.IntBin(LOAD_POINTER), exp.IntBin(FIRE_POINTER)
        fire_now = exp.Cond(exp.BinExists(FIRE_POINTER), fire, 0)
        raised_fire = arithmetic.Max(fire_now, arithmetic.Min(fire_high, load))  # (load: already raised above)
        self._ctx.call("roll_forward", self._ctx.client.operate, key, [
            expr_ops.expression_write(LOAD_POINTER, arithmetic.Max(load, load_high).compile()),
            expr_ops.expression_write(FIRE_POINTER, raised_fire.compile())], None, self._ctx.never)

    def allocate(self, operation: str, magazine: str, shards: Sequence[int]) -> list[SlotRef]:
        """A new slot for each entry of `shards`, in order: one increment per distinct shard. Also creates
        FIRE_POINTER (claim's guard needs it) and drops a purge tombstone's bins, so a purged-then-reused
        magazine starts clean."""
        counts: dict[int, int] = {}
        for shard in shards:
            counts[shard] = counts.get(shard, 0) + 1
        next_slot = {shard: self._allocate_slots(operation, magazine, shard, n) for shard, n in counts.items()}
        refs = []
        for shard in shards:
            refs.append(SlotRef(magazine, shard, next_slot[shard]))
            next_slot[shard] += 1
        return refs

    def write_new(self, operation: str, refs: Sequence[SlotRef], bins_list: Sequence[Mapping[str, Any]],
                  ttl: int) -> list[bool]:
        """Write records into slots just allocated: create-only, and where a record is there already, over
        it as _write_over allows (a purge leftover, this write's own earlier attempt). Per slot: False =
        refused (a seal, or another message): publish it again elsewhere."""
        create = {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl}
        if len(refs) == 1:
            key = self._ctx.data_key(refs[0])
            try:
                self._ctx.call(operation, self._ctx.client.put, key, dict(bins_list[0]), None, create)
                return [True]
            except ex.RecordExistsError:
                return [self._write_over(operation, key, bins_list[0], ttl)]
        records = self._create_many(operation, refs, bins_list, create)
        return [r.result == 0 or self._write_over(operation, r.key, bins, ttl)
                for r, bins in zip(records, bins_list, strict=True)]

    def _create_many(self, operation: str, refs: Sequence[SlotRef], bins_list: Sequence[Mapping[str, Any]],
                     create: Mapping[str, Any]) -> list[Any]:
        """Create-only writes of new records into their slots, one batch: the per-record answers (result 0:
        written; RECORD_EXISTS: a record is there). Should any record fail otherwise, the others may be written:
        an outage is raised as LoadInterrupted saying which are (result 0). Aerospike errors of the whole
        batch raw."""
        write = aerospike.OPERATOR_WRITE  # the op dicts ops.write builds, without a call per bin
        batch = BatchRecords([Write(self._ctx.data_key(ref),
                                    [{"op": write, "bin": k, "val": v} for k, v in bins.items()],
                                    policy=create) for ref, bins in zip(refs, bins_list, strict=True)])
        done = self._ctx.call(operation, self._ctx.client.batch_write, batch,
                              self._ctx.batch_policy(len(refs))) or batch
        records = self._ctx.answers(operation, done, len(refs), self._ctx.data_set)
        failed = [r for r in records if r.result not in (0, RECORD_EXISTS)]
        if failed:
            error = self._ctx.record_failure(operation, failed[0], self._ctx.data_set)
            if isinstance(error, StoreUnavailable):
                raise LoadInterrupted(str(error), refs, [r.result == 0 for r in records])
            raise error
        return records

    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        if not items:
            return []
        bins_list = [envelope.to_bins() for _, envelope in items]
        for bins in bins_list:
            self._ctx.check_size(magazine, bins)
        ttl = self._ctx.ttl(ttl_seconds)
        try:
            refs = self.allocate("load", magazine, [shard for shard, _ in items])
        except ex.AerospikeError as exc:  # nothing written yet: load them again at will
            raise self._ctx.fail(exc, "load", self._ctx.data_set) from None
        landed = [False] * len(items)
        todo = list(range(len(items)))
        try:
            for round_ in range(REPUBLISH_ROUNDS):
                written = self.write_new("load", [refs[i] for i in todo], [bins_list[i] for i in todo], ttl)
                for i, ok in zip(todo, written, strict=True):
                    landed[i] = ok
                todo = [i for i, ok in zip(todo, written, strict=True) if not ok]
                if not todo:
                    return refs
                if round_ == REPUBLISH_ROUNDS - 1:
                    break
                # These writes came after their deadline: a consumer had given the slots up and sealed
                # them. Publish the messages again, into new slots of the same shards.
                log.warning("%d message(s) for %s reached sealed slots (the write came after its deadline); "
                            "publishing them again", len(todo), magazine)
                STORAGE_RETRIES.labels("load_sealed").inc(len(todo))
                for i, ref in zip(todo, self.allocate("load", magazine, [items[i][0] for i in todo]), strict=True):
                    refs[i] = ref
            raise StoreError(f"aerospike load into {magazine!r}: {len(todo)} message(s) kept reaching sealed slots "
                             f"({REPUBLISH_ROUNDS} tries); nothing more was written for them")
        except LoadInterrupted as exc:  # (from write_new, over the slots of `todo`)
            raise _widened(exc, todo, refs, landed) from None
        except ex.AerospikeError as exc:  # writes were sent: some may have landed
            raise self._interrupted(exc, refs, landed) from None

    def _interrupted(self, exc: ex.AerospikeError, refs: Sequence[SlotRef], landed: Sequence[bool]) -> Exception:
        """The error of a load whose writes were sent: an outage is a LoadInterrupted (which slots, and which
        writes are known to have landed), so that the caller finishes it with `reload` instead of copying the
        landed messages twice (a cluster fault run delivered a delayed message after its ack that way)."""
        error = self._ctx.fail(exc, "load", self._ctx.data_set)
        return LoadInterrupted(str(error), refs, landed) if isinstance(error, StoreUnavailable) else error

    def reload(self, magazine: str, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool],
               ttl_seconds: int) -> list[SlotRef]:
        refs, landed = list(refs), list(landed)
        todo = [i for i, done in enumerate(landed) if not done]
        if not todo:
            return refs
        bins_list = [envelopes[i].to_bins() for i in todo]
        afresh = []
        try:
            records = self._create_many("load", [refs[i] for i in todo], bins_list,
                                        self._plain_policies(ttl_seconds)[0])
            for i, record, bins in zip(todo, records, bins_list, strict=True):
                if record.result == 0 or self._holds(record.key, bins):
                    landed[i] = True
                else:
                    afresh.append(i)
        except LoadInterrupted as exc:
            raise _widened(exc, todo, refs, landed) from None
        except ex.AerospikeError as exc:
            raise self._interrupted(exc, refs, landed) from None
        if afresh:
            try:
                new = self.load(magazine, [(refs[i].shard, envelopes[i]) for i in afresh], ttl_seconds)
            except LoadInterrupted as exc:  # (its slots are new ones)
                raise _widened(exc, afresh, refs, landed, moved=True) from None
            except StoreUnavailable as exc:  # (the allocation failed: nothing of these was written)
                raise LoadInterrupted(str(exc), refs, landed) from None
            for i, ref in zip(afresh, new, strict=True):
                refs[i] = ref
        return refs

    def _holds(self, key: tuple[Any, ...], bins: Mapping[str, Any]) -> bool:
        """A reload's create-only write found a record in its slot: whether that is this message (its earlier
        write landed, acked since or not). No for a seal (a consumer gave the slot up), a purge leftover, or
        another message (a rollback handed the slot out twice): the message goes to a new slot.
        An ack leaves a tombstone without the message id, taken as this message's: another message's ack
        there would take a rollback collision and an outage in the same load. Where deletes leave no trace
        (durable deletes, Enterprise), an ack leaves nothing, and the create-only write copies it again: at
        least once, as before."""
        try:
            _, _, held = self._ctx.call("load", self._ctx.client.get, key)
        except ex.RecordNotFound:  # gone since (expired): a new slot
            return False
        if held.get(SEALED) is not None or held.get(PURGED) is not None:
            return False
        if held.get(MSG_ID) == bins.get(MSG_ID) or (held.get(TOMBSTONE) is not None and held.get(MSG_ID) is None):
            return True
        self._collided(*names.parse_data_key(key[2]))
        return False


def _widened(exc: LoadInterrupted, part: Sequence[int], refs: list[SlotRef], landed: list[bool],
             moved: bool = False) -> LoadInterrupted:
    """The LoadInterrupted of the whole load, from one raised for the items `part` of it: their landed flags
    (and, `moved`, their slots: they were loaded afresh) replace the whole's."""
    for k, i in enumerate(part):
        landed[i] = exc.landed[k]
        if moved:
            refs[i] = exc.refs[k]
    return LoadInterrupted(str(exc), refs, landed)
