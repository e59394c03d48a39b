"""The queue registry of a (farmId, clientId): queue records in `{farm}_{client}_ignis_queues`, their STRING
index on `active` (created here; `list_queues` scans with a filter while the index is not queryable yet), and
the sweep pointers kept on them (`advance_sweep`, forward-only and fenced by the sweeper epoch). Separate
because it is control-plane data (what queues exist and how far they are swept), not the message path."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.expressions import map as exp_map
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import now_ms
from ignis.errors import QueueNotFound, StaleEpoch, StoreError, StoreUnavailable
from ignis.storage.aerospike.context import LIVE, MISSING, NOT_TOMBSTONED, PURGED, TOMBSTONE, AerospikeContext
from ignis.storage.aerospike.errors import map_error
from ignis.storage.aerospike.reads import Reads
from ignis.storage.base import (
    ACTIVE,
    CURSOR_SWEEP,
    SIDELINE_SWEEP,
    SWEEP_EPOCH,
    SWEEP_POINTERS,
    MagazineKind,
    QueueRecord,
    check_queue_config,
    new_queue_bins,
    sweep_bins,
)

log = logging.getLogger(__name__)

_ANY_TOMBSTONE = exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)).compile()


class Registry:
    """Queue records, their secondary index and their sweep pointers."""

    def __init__(self, ctx: AerospikeContext, reads: Reads) -> None:
        self._ctx = ctx
        self._reads = reads

    def ensure_index(self) -> None:
        failure = self.create_index()
        if failure is not None:
            raise failure[1]

    def index_on_every_node(self, name: str | None = None) -> bool:
        """Whether every node already has the index (`name`; default: the queue set's): one cheap info call.
        Creating it again would also succeed, but the client then waits for the index to be ready, about 2 s on
        Aerospike 8.1 even when it exists (measured), which every process start would pay."""
        try:
            answers = self._ctx.call("ensure_index", self._ctx.client.info_all,
                                     f"sindex-exists:namespace={self._ctx.ns};indexname={name or self._ctx.index_name}")
        except ex.AerospikeError:
            return False  # not answerable (an older server, no privilege): let the create decide
        texts = [str(answer[1] if isinstance(answer, tuple) else answer) for answer in (answers or {}).values()]
        return bool(texts) and all(t.strip().rsplit("\t", 1)[-1] == "true" for t in texts)

    def create_index(self) -> tuple[ex.AerospikeError, StoreError] | None:
        """None when the index exists afterwards, else (the Aerospike error, the error to raise)."""
        if self.index_on_every_node():
            return None
        try:
            self._ctx.call("ensure_index", self._ctx.client.index_single_value_create, self._ctx.ns,
                           self._ctx.queue_set, ACTIVE, aerospike.INDEX_STRING, self._ctx.index_name)
        except ex.IndexFoundError:
            pass  # already exists: the normal case after the first start
        except ex.AerospikeError as exc:
            mapped = map_error(exc, "index create", self._ctx.url)
            kind = type(mapped) if isinstance(mapped, StoreUnavailable) else StoreError  # an outage stays one
            return exc, kind(f"cannot create secondary index {self._ctx.index_name!r} on "
                             f"{self._ctx.ns}.{self._ctx.queue_set}.{ACTIVE}: {mapped}")
        return None

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        check_queue_config(config)
        key = self._ctx.key(self._ctx.queue_set, name)
        ttl = self._ctx.ttl(ttl_seconds)
        update = {**config, ACTIVE: "true"}
        try:
            for _ in range(5):  # each step fails only when a concurrent writer changed the record
                created = {**new_queue_bins(config, now_ms()), ACTIVE: "true"}
                try:
                    self._ctx.call("apply_queue", self._ctx.client.put, key, created, None,
                                   {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl})
                    return True
                except ex.RecordExistsError:
                    pass
                try:  # update: config bins only, runtime bins untouched; the TTL re-asserted
                    self._ctx.call("apply_queue", self._ctx.client.put, key, update, None,
                                   {**self._ctx.update_live, "ttl": ttl})
                    return False
                except ex.RecordNotFound:
                    continue  # expired or deleted meanwhile: create it
                except ex.FilteredOut:
                    pass
                try:  # a tombstone of a deleted queue: replace it by a fresh record
                    self._ctx.call("apply_queue", self._ctx.client.put, key, created, None,
                                   {**self._ctx.wp, "exists": aerospike.POLICY_EXISTS_REPLACE, "ttl": ttl,
                                    "expressions": _ANY_TOMBSTONE})
                    return True
                except MISSING:
                    continue
            raise StoreError(f"apply of queue {name!r} kept racing with concurrent writers; try again")
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "apply_queue", self._ctx.queue_set) from None

    def get_queue(self, name: str) -> QueueRecord | None:
        try:
            _, _, bins = self._ctx.call("get_queue", self._ctx.client.get, self._ctx.key(self._ctx.queue_set, name))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "get_queue", self._ctx.queue_set) from None
        if self._ctx.tombstoned(bins):
            return None
        record = QueueRecord(name, dict(bins))
        self._check_sweep_pointers(record)
        return record

    def _check_sweep_pointers(self, record: QueueRecord) -> None:
        """Sweep pointers lower than this process has written or seen are a rollback: reported once (per
        pointer, until it moves past the mark), and taken as stored. The sweep then examines again the slots
        between the stored pointer and the mark, where the rollback may have put back records (acks and claim
        stamps lost): re-sweeping a range is idempotent, and skipping it would strand them (DESIGN §4)."""
        marks = self._ctx.shared.marks
        for kind, bin_name in (("main", SWEEP_POINTERS), ("sideline", SIDELINE_SWEEP), ("cursor", CURSOR_SWEEP)):
            stored = record.bins.get(bin_name)
            if not isinstance(stored, dict):
                continue
            for label, value in stored.items():
                if not isinstance(value, int):
                    continue
                mark = (self._ctx.queue_set, record.name, bin_name, label)
                if value < marks.mark(mark):
                    marks.report(mark, f"{kind} sweep pointer of {record.name} shard {label}", None, value,
                                 queue=record.name, kind=kind)
                else:
                    marks.saw(mark, value)

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        flags = ["true", "false"] if active is None else ["true" if active else "false"]
        try:
            records = self._ctx.call("list_queues", self._query_queues, flags)
            if records is None:
                # The index is not queryable here yet: a new index reaches each node through system
                # metadata and is then built ("index not found" / "not readable" meanwhile), and a sweeper
                # must not miss a new client's queues in that window. The queue set holds one record per
                # queue: scan it with the same condition as a filter expression instead.
                records = self._ctx.call("list_queues", self._scan_queues, flags)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "list_queues", self._ctx.queue_set) from None
        found = []
        for key, _, bins in records:
            if key[2] is None:
                log.warning("queue record without a stored key in %s (written without sendKey); skipped",
                            self._ctx.queue_set)
            elif not self._ctx.tombstoned(bins):
                found.append(QueueRecord(key[2], dict(bins)))
        return sorted(found, key=lambda r: r.name)

    def _query_queues(self, flags: list[str]) -> list[Any] | None:
        """Equality queries on the `active` index; None when the index cannot answer yet."""
        records = []
        try:
            for flag in flags:
                query = self._ctx.client.query(self._ctx.ns, self._ctx.queue_set)
                query.where(aerospike.predicates.equals(ACTIVE, flag))
                records.extend(query.results())
        except (ex.IndexNotFound, ex.IndexNotReadable):
            return None
        return records

    def _scan_queues(self, flags: list[str]) -> list[Any]:
        query = self._ctx.client.query(self._ctx.ns, self._ctx.queue_set)
        wanted = exp.Or(*(exp.Eq(exp.StrBin(ACTIVE), flag) for flag in flags)) if len(flags) > 1 else \
            exp.Eq(exp.StrBin(ACTIVE), flags[0])
        return query.results({"expressions": wanted.compile()})

    def set_queue_active(self, name: str, active: bool) -> bool:
        try:
            self._ctx.call("set_queue_active", self._ctx.client.put, self._ctx.key(self._ctx.queue_set, name),
                           {ACTIVE: "true" if active else "false"}, None, self._ctx.update_live)
            return True
        except MISSING:
            return False
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "set_queue_active", self._ctx.queue_set) from None

    def delete_queue(self, name: str) -> bool:
        try:
            return self._reads.remove_one("delete_queue", self._ctx.key(self._ctx.queue_set, name))
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "delete_queue", self._ctx.queue_set) from None

    @staticmethod
    def _forward_only(pointer_bin: str, pointers: Mapping[int, int], combine: Any = arithmetic.Max) -> Any:
        """The pointer map with each shard's entry raised to max(stored, new), as one expression.

        A `let` binds the stored map to p0, then p_n = p_(n-1) with shard n put: each binding names the
        one before it once, so the expression grows linearly with the shards (a map put nesting the
        previous expression in its arguments would repeat it and grow as 3^shards, which the server
        refuses). Each shard's stored value is read from p0: no other binding changes its entry."""
        stored = exp.Var("p0")
        bindings = [exp.Def("p0", exp.MapBin(pointer_bin))]
        for n, (shard, pointer) in enumerate(sorted(pointers.items()), 1):
            label, value = names.shard_label(shard), int(pointer)
            count = exp_map.MapGetByKey(None, aerospike.MAP_RETURN_COUNT, exp.ResultType.INTEGER, label, stored)
            held = exp_map.MapGetByKey(None, aerospike.MAP_RETURN_VALUE, exp.ResultType.INTEGER, label, stored)
            entry = exp.Cond(exp.Eq(count, 0), value, combine(held, value))
            bindings.append(exp.Def(f"p{n}", exp_map.MapPut(None, None, label, entry, exp.Var(f"p{n - 1}"))))
        return exp.Let(*bindings, exp.Var(f"p{len(pointers)}"))

    def rewind_sweep(self, name: str, kind: MagazineKind, pointers: Mapping[int, int]) -> None:
        if not pointers:
            return
        pointer_bin = sweep_bins(kind)[0]
        update = expr_ops.expression_write(pointer_bin,
                                           self._forward_only(pointer_bin, pointers, arithmetic.Min).compile())
        try:
            self._ctx.call("rewind_sweep", self._ctx.client.operate, self._ctx.key(self._ctx.queue_set, name),
                           [update], None, {**self._ctx.update, "expressions": NOT_TOMBSTONED})
        except (ex.RecordNotFound, ex.FilteredOut):
            raise QueueNotFound(name, self._ctx.client_id) from None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "rewind_sweep", self._ctx.queue_set) from None

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        pointer_bin, counter_bin = sweep_bins(kind)
        operations = [ops.write(SWEEP_EPOCH, epoch)]
        if pointers:
            operations.append(expr_ops.expression_write(pointer_bin,
                                                        self._forward_only(pointer_bin, pointers).compile()))
        if swept:
            operations.append(ops.increment(counter_bin, swept))
        fence = exp.And(LIVE, exp.LE(exp.IntBin(SWEEP_EPOCH), epoch)).compile()
        key = self._ctx.key(self._ctx.queue_set, name)
        try:
            # Not repeated when in doubt: the pointers are idempotent but the counter is not. The sweeper
            # sees the error and re-sweeps next pass; the re-sweep of a swept range changes nothing.
            self._ctx.call("advance_sweep", self._ctx.client.operate, key, operations, None,
                           {**self._ctx.update, "expressions": fence}, idempotent=False)
            for shard, pointer in pointers.items():
                self._ctx.shared.marks.saw((self._ctx.queue_set, name, pointer_bin, names.shard_label(shard)),
                                           int(pointer))
        except ex.RecordNotFound:
            raise QueueNotFound(name, self._ctx.client_id) from None
        except ex.FilteredOut:
            current = self.get_queue(name)
            if current is None:
                raise QueueNotFound(name, self._ctx.client_id) from None
            raise StaleEpoch(name, epoch, int(current.bins.get(SWEEP_EPOCH, 0))) from None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "advance_sweep", self._ctx.queue_set) from None
