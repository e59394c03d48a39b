"""The delayed-message primitives (ignis.delay): delayed records in the data set, found by a NUMERIC index
on their due time (`load_delayed`, `due_delayed`, `settle_delayed`), the per-queue delay record that counts
them and elects the mover (`lead_delayed`, `delay_states`). Separate because delayed messages live outside
the magazines' slot numbering and have their own index and leader."""

from __future__ import annotations

from collections.abc import Sequence

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import Envelope
from ignis.errors import StoreError, StoreUnavailable
from ignis.storage.aerospike.context import BATCH_CHUNK, ENVELOPE_BINS, LIVE, PURGED, TOMBSTONE, AerospikeContext
from ignis.storage.aerospike.errors import map_error
from ignis.storage.aerospike.reads import Reads
from ignis.storage.aerospike.registry import Registry
from ignis.storage.base import DELAY_LEADER, DELAY_UNTIL, DELAYED_COUNT, DelayState

# A delayed message's data record (names.delayed_key) also holds its due time in an indexed bin (a NUMERIC
# secondary index, `{data set}_due`: the due ones are one range query) and its queue (the query's filter).
# A tombstone drops both, so a moved message leaves the index; a message moved to main keeps only dueAt.
DELAY_INDEX_BIN, DELAY_QUEUE_BIN = "dueWait", "dueQ"
_READ_ALL_COPIES = {"read_mode_ap": aerospike.POLICY_READ_MODE_AP_ALL}


class Delayed:
    """Delayed messages: their records, their index, their count and their mover's lead."""

    def __init__(self, ctx: AerospikeContext, registry: Registry, reads: Reads) -> None:
        self._ctx = ctx
        self._registry = registry
        self._reads = reads

    def delay_index(self) -> str:
        """The delay index's name, created the first time this process needs it (IndexFoundError: there)."""
        name = f"{self._ctx.data_set}_due"
        if self._ctx.data_set not in self._ctx.shared.delay_indexes and not self._registry.index_on_every_node(name):
            try:
                self._ctx.call("ensure_index", self._ctx.client.index_single_value_create, self._ctx.ns,
                               self._ctx.data_set, DELAY_INDEX_BIN, aerospike.INDEX_NUMERIC, name)
            except ex.IndexFoundError:
                pass
            except ex.AerospikeError as exc:
                mapped = map_error(exc, "index create", self._ctx.url)
                kind = type(mapped) if isinstance(mapped, StoreUnavailable) else StoreError
                raise kind(f"cannot create secondary index {name!r} on {self._ctx.ns}.{self._ctx.data_set}."
                           f"{DELAY_INDEX_BIN} (delayed messages need it): {mapped}") from None
        self._ctx.shared.delay_indexes.add(self._ctx.data_set)
        return name

    def delay_meta(self, queue: str) -> tuple[str, str, str]:
        return self._ctx.key(self._ctx.meta_set, names.delayed_meta_key(queue))

    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        if not envelopes:
            return
        self.delay_index()
        policy = {**self._ctx.wp,
                  "ttl": self._ctx.ttl(ttl_seconds)}  # create or replace: a retry writes the same record
        items = [(self._ctx.key(self._ctx.data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id)),
                  {**env.to_bins(), DELAY_INDEX_BIN: env.due_at or 0, DELAY_QUEUE_BIN: queue}) for env in envelopes]
        try:  # the count first (Storage.load_delayed): not repeated when in doubt, a count too high is harmless
            self._ctx.call("load_delayed", self._ctx.client.operate, self.delay_meta(queue),
                           [ops.increment(DELAYED_COUNT, len(items))], None, self._ctx.never, idempotent=False)
            if len(items) == 1:
                self._ctx.call("load_delayed", self._ctx.client.put, items[0][0], items[0][1], None, policy)
                return
            write = aerospike.OPERATOR_WRITE
            for start in range(0, len(items), BATCH_CHUNK):
                chunk = items[start:start + BATCH_CHUNK]
                batch = BatchRecords([Write(key, [{"op": write, "bin": k, "val": v} for k, v in bins.items()],
                                            policy=policy) for key, bins in chunk])
                done = self._ctx.call("load_delayed", self._ctx.client.batch_write, batch) or batch
                failed = [r for r in self._ctx.answers("load_delayed", done, len(chunk), self._ctx.data_set)
                          if r.result]
                if failed:
                    raise self._ctx.record_failure("load_delayed", failed[0], self._ctx.data_set)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "load_delayed", self._ctx.data_set) from None

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        found: list[Envelope] = []
        wanted = exp.And(exp.Eq(exp.StrBin(DELAY_QUEUE_BIN), queue), LIVE).compile()

        def run() -> None:
            found.clear()
            query = self._ctx.client.query(self._ctx.ns, self._ctx.data_set)
            query.select(*ENVELOPE_BINS)
            query.where(aerospike.predicates.between(DELAY_INDEX_BIN, 0, now_ms_))

            def take(record: tuple) -> bool:
                found.append(self._ctx.envelope(record[2], None, record[0][2]))
                return len(found) < limit  # False stops the query

            query.foreach(take, {"expressions": wanted})

        try:
            self.delay_index()
            with self._ctx.query_running():
                self._ctx.call("due_delayed", run)
            if found:
                found = self._still_delayed(queue, found)
        except (ex.IndexNotFound, ex.IndexNotReadable):
            return []  # the index is still being built: nothing is known to be due yet
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "due_delayed", self._ctx.data_set) from None
        return sorted(found, key=lambda env: env.due_at or 0)

    def _still_delayed(self, queue: str, found: list[Envelope]) -> list[Envelope]:
        """Those of a query's answers that are still delayed records (not settled), by a batch read that consults
        every copy of a record: while partitions migrate, a query can answer from a copy that has not seen the
        settle yet, and the message would be moved twice. ("How duplicates should be consulted in a read
        operation. Only makes a difference during migrations": read_mode_ap ALL, Aerospike client policies.)
        Aerospike errors raw."""
        keys = [self._ctx.key(self._ctx.data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id))
                for env in found]
        live = self._reads.batch_get("due_delayed", keys, [DELAY_QUEUE_BIN, TOMBSTONE, PURGED], _READ_ALL_COPIES)
        return [env for env, bins in zip(found, live, strict=True) if bins is not None]

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        keys = [self._ctx.key(self._ctx.data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id))
                for env in envelopes]
        try:
            gone = self._reads.remove_many("settle_delayed", keys)
            if gone:
                self._ctx.call("settle_delayed", self._ctx.client.operate, self.delay_meta(queue),
                               [ops.increment(DELAYED_COUNT, -gone)], None, self._ctx.never, idempotent=False)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "settle_delayed", self._ctx.data_set) from None
        return gone

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        free = exp.Or(exp.Not(exp.BinExists(DELAY_LEADER)), exp.Eq(exp.StrBin(DELAY_LEADER), holder),
                      exp.LT(exp.IntBin(DELAY_UNTIL), now_ms_)).compile()
        try:
            self._ctx.call("lead_delayed", self._ctx.client.operate, self.delay_meta(queue),
                           [ops.write(DELAY_LEADER, holder), ops.write(DELAY_UNTIL, now_ms_ + hold_ms)], None,
                           {**self._ctx.never, "expressions": free})
            return True
        except ex.FilteredOut:
            return False
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "lead_delayed", self._ctx.meta_set) from None

    def change_mark(self) -> int | None:
        return None  # (a server's writes are not counted where a client could read them for free)

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        if not queues:
            return []
        try:
            found = self._reads.batch_get("delay_states", [self.delay_meta(q) for q in queues])
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "delay_states", self._ctx.meta_set) from None
        return [DelayState(max(int((bins or {}).get(DELAYED_COUNT) or 0), 0), None) for bins in found]
