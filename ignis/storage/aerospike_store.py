"""The production backend: `Storage` on Aerospike with the exact layout of DESIGN §3.

Layout (names from `ignis.names`): queue records in `{farm}_{client}_ignis_queues` (key = queue name,
sendKey, STRING index `{set}_active` on bin `active`); message records in `{client}_data_set` keyed
`{magazine}_SHARD_{n}_{slot}` with the envelope bins; shard pointers in `{client}_meta_set` keyed
`{magazine}_SHARD_{n}_METADATA` (bins LOAD_POINTER, FIRE_POINTER); the farm-wide `{farm}_ignis_system`
set holds the sweeper epoch counter, the clients registry (one record, map bin `clients`) and leases.

Atomicity from single-record operations, one round trip each:
* load: one `operate` on the meta record (increment LOAD_POINTER by n, read it back) allocates n slots,
  then the data records are written (one `put`, or one `batch_write`). A crash in between leaves a hole.
  If the increment fails *in doubt* it is repeated: the slot numbers come only from an increment's
  answer, so a repeat can at worst leave the first increment's slots as holes (skipped and counted by
  fire), never give one slot to two messages. The write refuses a *sealed* slot (below): such a message
  is written again into a new slot, so a write that came too late is never left behind the fire pointer.
* claim: one `operate` on the meta record guarded by the filter `FIRE_POINTER < LOAD_POINTER`, writing
  FIRE = min(FIRE + k, LOAD) by expression and reading the old and new value: distinct callers always
  get distinct slots. An in-doubt claim is not repeated: slots it may have taken are recovered by the
  sweeper (unstamped records below the fire pointer) — duplication, never loss. Then one update-only
  `operate` (one slot) or `batch_operate` (several) stamps fireTS, bumps attempts and reads the records.
  A missing record is usually a publish in flight (a consumer that is caught up claims between a
  producer's increment and its write, or a slot a concurrent publish reserved for the next one): it is
  *awaited*, and the claimer re-reads it (`restamp`) until it
  lands or the producer's write deadline (`write_grace_ms`) has passed; then it *seals* the slot: a
  tombstone marked `sealedAt` that every later write to the slot is refused by (filter, in the write).
* move (sweep, shovel, dead-letter): a per-record claim that a newer epoch wins — bins `mvEpoch` and
  `mvTo` (the target slot) written on the source under the filter `mvEpoch <= epoch` — then the copy,
  then the delete filtered by `mvEpoch == epoch`. A newer epoch that takes over a claimed record seals
  the older claim's target slot first (or finds the copy already there), so a paused ex-leader that
  resumes can neither copy twice nor delete.
* sweep pointers: one `operate` fenced by the filter `sweepEpoch <= epoch` that writes the pointer map
  through one expression: a `let` binding per shard to max(stored, new) (forward-only; linear in the
  number of shards, so 512 shards are one small expression), adds to the counter and stores the epoch.

Acks that stay acked. Community Edition has no durable deletes: a plainly deleted record comes back
after a cold restart. `ack_mode=auto` asks the server for its edition: Enterprise -> deletes with
`durable_delete`; Community -> a *tombstone*: the record is replaced (update-only) by the single bin
`deletedAt` keeping its original TTL ("don't update"), so it disappears when the message would have
expired anyway and a restart finds the newer tombstone, not the message. Every read path (claim, read,
peek, stamp_unfired, pointers, purge, queue registry) treats a tombstone as absent. Queue deletion uses
the same mechanism; a magazine purge leaves `purgedAt` tombstones instead, which a new message written
to the slot (the queue declared again) simply replaces, and which a claim takes for an awaited slot.

Retries: tenacity repeats transient errors of reads and idempotent writes; a non-idempotent write
(increment) is repeated only when the client says the server surely did not apply it (`in_doubt`
False), except where a repeat is harmless by design: the load pointer (at worst a hole), the sweeper
epoch (at worst a gap) and the fire stamp (at worst one extra attempt counted — better than leaving a
claimed message to the sweeper). Not repeated when in doubt: the claim (its slots are recovered by the
sweeper), the sweep update (its counter is not idempotent), the lease compare-and-set.

Time to live goes in each write's policy (`ttl`; -2 = keep the record's own): the client deprecates it
in the record metadata.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch.records import BatchRecords, Remove, Write
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.expressions import map as exp_map
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import map_operations as map_ops
from aerospike_helpers.operations import operations as ops
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

from ignis import names
from ignis.envelope import (
    ATTEMPTS,
    CODEC,
    CODEC_BYTES,
    CODEC_UNREADABLE,
    DUE_AT,
    FIRE_TS,
    HEADERS,
    HISTORY,
    LOADED_AT,
    MSG_ID,
    PARTITION_KEY,
    PAYLOAD,
    REASON,
    STORED_CODECS,
    Envelope,
    NewMessages,
    envelope_problem,
    now_ms,
    unreadable_envelope,
)
from ignis.errors import IgnisError, InvalidInputError, QueueNotFound, StaleEpoch, StoreError, StoreUnavailable
from ignis.metrics import STORAGE_CALLS, STORAGE_ERRORS, STORAGE_RETRIES
from ignis.outage import store_failed
from ignis.storage.aerospike_config import AerospikeSettings, load_settings
from ignis.storage.aerospike_errors import error_field, is_transient, map_error, record_error
from ignis.storage.base import (
    ACTIVE,
    BEACON_SECONDS,
    CREATED_AT,
    DELAY_LEADER,
    DELAY_UNTIL,
    DELAYED_COUNT,
    FIRE_POINTER,
    HOLES,
    HOLES_CLAIMED,
    LOAD_POINTER,
    RESERVATION_FRESH_MS,
    RUNTIME_BINS,
    SIDELINE_SWEEP,
    SIDELINE_SWEPT,
    SWEEP_EPOCH,
    SWEEP_POINTERS,
    SWEPT_COUNTER,
    Claimed,
    ClaimInDoubt,
    ClaimInterrupted,
    ClaimTicket,
    DelayState,
    LeaseRecord,
    MagazineKind,
    Move,
    Placement,
    QueueRecord,
    ShardPointers,
    SlotRef,
    load_new_as_envelopes,
)
from ignis.storage.rollback import HighMarks, report

log = logging.getLogger(__name__)
T = TypeVar("T")

TOMBSTONE = "deletedAt"  # the one bin of a tombstoned record (Community Edition acks and deletes)
SEALED = "sealedAt"  # with deletedAt: a slot given up as a hole for good; refuses a late write
PURGED = "purgedAt"  # the one bin a magazine purge leaves; a new message may replace it
MOVE_EPOCH, MOVE_TO = "mvEpoch", "mvTo"  # a move's claim on its source record (see the module doc)
# A move's journal, in the system set under its token (the mvTo of its claims): the source keys and the
# target slot keys, in order. Kept as long as the copies.
MOVE_TOKEN_MARK = "mv:"
JOURNAL_SOURCES, JOURNAL_TARGETS = "src", "dst"
MOVE_CHUNK = 4000  # moves per journal (a journal of 4,000 pairs of keys is about 200 KB)
EPOCH_KEY, EPOCH_BIN = "sweeperEpoch", "epoch"
CLIENTS_KEY, CLIENTS_BIN = "clients", "clients"
LEASE_PREFIX = "lease:"
LEASE_BINS = ("holder", "acquired_ms", "renewed_ms", "duration_s", "transitions")
CLAIM_FROM = "claimFrom"  # expression-read result: the fire pointer before the claim
# Every claim leaves its token (and, for a claim of several slots, the fire pointer before it) on the meta
# record, so a claimer whose answer was lost can tell later whether the claim was applied and what it took.
LAST_CLAIM, LAST_FROM = "lastClaim", "lastFrom"
ENVELOPE_BINS = (PAYLOAD, MSG_ID, LOADED_AT, CODEC, HEADERS, PARTITION_KEY, REASON, HISTORY, FIRE_TS, ATTEMPTS,
                 DUE_AT)
BATCH_CHUNK = 5000  # keys per batch call in peeks and purges
BEACON_BIN = "BEACON"  # the counter of a magazine's beacon record (Storage.beacon)
# A delayed message's data record (names.delayed_key) also holds its due time in an indexed bin (a NUMERIC
# secondary index, `{data set}_due`: the due ones are one range query) and its queue (the query's filter).
# A tombstone drops both, so a moved message leaves the index; a message moved to main keeps only dueAt.
DELAY_INDEX_BIN, DELAY_QUEUE_BIN = "dueWait", "dueQ"
MAX_BIN_NAME = 15
RECORD_OVERHEAD = 128  # record header + key + per-bin overhead estimate, for the size pre-check
ROLLBACK_SEAL_TTL = 30 * 86400  # seals of slots left by an allocation that met a rollback (no queue TTL at hand)
SIZE_CHECK_MARGIN = 64 * 1024  # a payload this far below the limit skips the estimate (the server refuses the rest)

_LIVE = exp.Not(exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)))
_READ_ALL_COPIES = {"read_mode_ap": aerospike.POLICY_READ_MODE_AP_ALL}
_NOT_TOMBSTONED = _LIVE.compile()
# A claim stamps every record but a deletedAt tombstone: a purge leftover is stamped (harmlessly) and
# reported awaiting, since the slot's new message may be on its way.
_STAMPABLE = exp.Not(exp.BinExists(TOMBSTONE)).compile()
_NOT_SEALED = exp.Not(exp.BinExists(SEALED)).compile()  # a new record may go anywhere but a sealed slot
_ANY_TOMBSTONE = exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)).compile()
# A seal turns a missing record or a tombstone into a seal, once: a slot sealed already refuses (so each
# hole is counted once, by whoever sealed it).
_SEALABLE = exp.And(exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)), exp.Not(exp.BinExists(SEALED))).compile()
_CLAIM_GUARD = exp.LT(exp.IntBin(FIRE_POINTER), exp.IntBin(LOAD_POINTER)).compile()
# A claim of one slot needs no expression: under the guard FIRE < LOAD an increment by one cannot pass
# the load pointer (a claim of k takes min(FIRE + k, LOAD), an expression write).
_CLAIM_ONE = [ops.increment(FIRE_POINTER, 1), ops.read(FIRE_POINTER)]


def _allocate_ops(n: int) -> list[dict[str, Any]]:
    """Allocate n slots on a meta record: increment the load pointer and read it back; also create the
    fire pointer (the claim guard needs it) and drop a purge tombstone's bins, reading first whether there
    was one (a purge restarts the numbering on purpose: no rollback)."""
    return [ops.read(PURGED), ops.increment(LOAD_POINTER, n), ops.increment(FIRE_POINTER, 0),
            ops.write(TOMBSTONE, None), ops.write(PURGED, None), ops.read(LOAD_POINTER)]


_ALLOCATE_ONE = _allocate_ops(1)  # built once: the per-message publish path
_READ_ENVELOPE = [ops.read(b) for b in ENVELOPE_BINS]
_READ_STAMPED = [*_READ_ENVELOPE, ops.read(PURGED)]
_READ_TOMBSTONE = ops.read(TOMBSTONE)


def _stamp_only(now: int) -> list[dict[str, Any]]:
    """A claim's stamp and read without the attempts increment, for a record whose attempts bin is not a
    number (it is then read back as an unreadable envelope)."""
    return [ops.write(FIRE_TS, now), *_READ_STAMPED]
# What an ack, a delete or a seal leaves in a slot. Not a purge's mark: slot numbering starts afresh
# after a purge, so a new message may still be written over it.
_SETTLED_BINS = [TOMBSTONE]
_MISSING = (ex.RecordNotFound, ex.FilteredOut)
_ANSWER_LOST = (ex.TimeoutError, ex.NoResponse)  # sent, maybe applied, no answer
# A move reads the target of an earlier claim while writing its own. A plain read of mvTo would come
# back overwritten by the write's None (a batch write answers every operation, later ones winning), so
# it is read by an expression under its own name; a missing bin reads as None.
MOVE_TO_BEFORE = "mvToBefore"
_READ_MOVE_TO_BEFORE = expr_ops.expression_read(MOVE_TO_BEFORE, exp.StrBin(MOVE_TO).compile(),
                                                aerospike.EXP_READ_EVAL_NO_FAIL)
NOT_FOUND, RECORD_EXISTS, BIN_INCOMPATIBLE, FILTERED_OUT = 2, 5, 12, 27  # per-record result codes of batch calls
COLLISION_WINDOW = 256  # slots read at a time past a slot found used twice (see _collided)
_ANSWERED = (0, NOT_FOUND, FILTERED_OUT)  # a record's answer; any other code is a failure to answer
REPUBLISH_ROUNDS = 5  # a message refused by a sealed slot is written again, at most this many times


def _connect(config: dict[str, Any]) -> Any:
    """The real client. Tests replace this module attribute to plug in the emulator."""
    client = aerospike.client(config)  # recent clients connect here already
    return client if client.is_connected() else client.connect()


client_factory: Callable[[dict[str, Any]], Any] = _connect


class _Shared:
    """What every clientId view of one store shares: the client, settings, edition and retry policy."""

    def __init__(self, client: Any, settings: AerospikeSettings, owns_client: bool) -> None:
        self.client = client
        self.settings = settings
        self.owns_client = owns_client
        self.closed = False
        self.lock = threading.Lock()
        self.views: dict[str, AerospikeStore] = {}
        self.marks = HighMarks()  # the highest pointers and generations this process has seen (rollback.py)
        self.lease_holds: dict[str, float] = {}  # lease name -> monotonic time until which it is not used
        self.beacons: dict[tuple[str, str], float] = {}  # (meta set, magazine) -> when this process bumped it
        self.delay_indexes: set[str] = set()  # data sets whose delay index this process made sure of
        # Queries running on the client (the delay movers' threads): close() lets them end first, since the C
        # client does not survive a close under a running query (a segfault, seen in tests).
        self.queries = 0
        self.queries_done = threading.Condition(self.lock)
        self.claim_prefix = uuid.uuid4().hex[:10]  # claim tokens: this prefix and a counter
        self.claim_seq = itertools.count(1)
        self.durable_delete = self._detect_durable_delete()

    def _detect_durable_delete(self) -> bool:
        mode = self.settings.ack_mode
        if mode != "auto":
            return mode == "durable-delete"
        STORAGE_CALLS.labels("edition").inc()
        try:
            answers = self.client.info_all("edition")
        except ex.AerospikeError as exc:
            raise map_error(exc, "edition check", self.settings.redacted_url("?", "?")) from None
        texts = [str(answer[1] if isinstance(answer, tuple) else answer) for answer in (answers or {}).values()]
        # Every node must be Enterprise: a Community node would silently drop the durable flag's promise.
        return bool(texts) and all("enterprise" in t.lower() for t in texts)


class AerospikeStore:
    """`Storage` on Aerospike. Thread-safe (the client is); one instance per (farmId, clientId)."""

    def __init__(self, settings: AerospikeSettings, *, farm_id: str = "local", client_id: str = "default",
                 client: Any = None, _shared: _Shared | None = None) -> None:
        self.farm_id = names.check_id("farmId", farm_id)
        self.client_id = names.check_id("clientId", client_id)
        self._ns = settings.namespace
        self._queue_set = names.queue_set(farm_id, client_id)
        self._index_name = names.active_index(farm_id, client_id)
        self._data_set = names.data_set(client_id)
        self._meta_set = names.meta_set(client_id)
        self._system_set = names.system_set(farm_id)
        self._url = settings.redacted_url(farm_id, client_id)
        self._owner = _shared is None  # views made by with_client share the owner's connection
        if _shared is None:
            owns = client is None
            if client is None:
                try:
                    client = client_factory(settings.client_config())
                except ex.AerospikeError as exc:
                    raise map_error(exc, "connect", self._url) from None
            try:
                _shared = _Shared(client, settings, owns)
            except BaseException:
                if owns:
                    client.close()  # do not leak the connection pool of a store that failed to open
                raise
        self._shared = _shared
        self._client = _shared.client
        self._durable = _shared.durable_delete
        s = settings
        self._retrying = Retrying(stop=stop_after_attempt(max(s.retries, 1)), wait=wait_fixed(s.retry_sleep_ms / 1000),
                                  reraise=True)
        self._counters: dict[str, Any] = {}
        self._claim_exprs: dict[int, list] = {}
        # Write policies; each carries its TTL ("ttl": -2 keeps the record's own, -1 never expires).
        wp = {"commit_level": aerospike.POLICY_COMMIT_LEVEL_ALL, "key": aerospike.POLICY_KEY_SEND}
        self._wp = wp
        self._keep = {**wp, "ttl": aerospike.TTL_DONT_UPDATE}
        self._never = {**wp, "ttl": aerospike.TTL_NEVER_EXPIRE}
        self._update = {**self._keep, "exists": aerospike.POLICY_EXISTS_UPDATE}
        self._update_live = {**self._update, "expressions": _NOT_TOMBSTONED}
        self._stamp = {**self._update, "expressions": _STAMPABLE}
        self._claim_policy = {**self._update, "expressions": _CLAIM_GUARD}
        self._replace_same = {**self._keep, "exists": aerospike.POLICY_EXISTS_REPLACE, "gen": aerospike.POLICY_GEN_EQ}
        # write policies of a new record, by TTL: create-only; create-or-replace unless sealed
        self._new_record: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._replace_live = {**self._keep, "exists": aerospike.POLICY_EXISTS_REPLACE, "expressions": _NOT_TOMBSTONED}
        self._durable_remove = {**wp, "durable_delete": True}
        # The producer's write deadline: every attempt of a load's write and the waits between them, the
        # longest a reserved slot waits for its write (Storage.reserve), and a second for the gap between
        # the increment's answer and the write (a scheduling delay).
        self._write_grace_ms = ((s.retries + 1) * s.total_timeout_ms + s.retries * s.retry_sleep_ms
                                + RESERVATION_FRESH_MS + 1000)
        failure = self._create_index()
        if failure is not None:
            # A producer or consumer whose user may read and write but not manage indexes still works;
            # only listing queues needs the index, and the operator (sindex-admin role) creates it.
            if not isinstance(failure[0], ex.RoleViolation):
                if self._owner:
                    self.close()
                raise failure[1]
            log.warning("%s: cannot create index %s (no privilege); list_queues needs it: create it with a "
                        "user holding sindex-admin (the operator does)", self._url, self._index_name)

    # ---- plumbing ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._url

    @property
    def location(self) -> str:
        # The connection's identity too: handles on one connection share it; two connections of a process
        # to one cluster are told apart (harmless: each learns of the other's publishes through its watcher).
        return f"{self._url}@{id(self._shared):x}"

    @property
    def client(self) -> Any:
        """The raw Aerospike client (for tools and tests)."""
        return self._client

    @property
    def durable_deletes(self) -> bool:
        """True: acks are durable deletes (Enterprise); False: tombstones (Community)."""
        return self._durable

    def __repr__(self) -> str:
        return f"AerospikeStore({self._url}, acks={'durable-delete' if self._durable else 'tombstone'})"

    def with_client(self, client_id: str) -> AerospikeStore:
        if client_id == self.client_id:
            return self
        with self._shared.lock:
            view = self._shared.views.get(client_id)
        if view is None:
            view = AerospikeStore(self._shared.settings, farm_id=self.farm_id, client_id=client_id,
                                  _shared=self._shared)
            with self._shared.lock:
                view = self._shared.views.setdefault(client_id, view)
        return view

    def watch_pointers(self, magazine: str, shards: int) -> tuple[list[int], int]:
        keys = [self._meta_key(magazine, shard) for shard in range(shards)]
        try:
            done = self._call("watch", self._client.batch_read, keys, [LOAD_POINTER, FIRE_POINTER])
            records = self._answers("watch", done, len(keys), self._meta_set)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "watch", self._meta_set) from None
        with_work, loaded = [], 0
        for shard, record in enumerate(records):
            if record.result == 0 and record.record is not None:
                bins = record.record[2] or {}
                load = bins.get(LOAD_POINTER) or 0
                loaded += load
                if load > (bins.get(FIRE_POINTER) or 0):
                    with_work.append(shard)
            elif record.result != NOT_FOUND:
                raise self._record_failure("watch", record, self._meta_set)
        return with_work, loaded

    def beacon(self, magazine: str) -> None:
        beacons, key = self._shared.beacons, (self._meta_set, magazine)
        now = time.monotonic()
        if now - beacons.get(key, -BEACON_SECONDS) < BEACON_SECONDS:
            return
        beacons[key] = now
        try:  # an increment is not repeated when in doubt: a lost bump only delays an idle watcher's wake
            self._call("beacon", self._client.operate, self.key(self._meta_set, names.beacon_key(magazine)),
                       [ops.increment(BEACON_BIN, 1)], None, self._never, idempotent=False)
        except ex.AerospikeError as exc:
            beacons.pop(key, None)  # bump again with the next publish
            store_failed(f"bump the beacon of {magazine}", self._fail(exc, "beacon", self._meta_set))

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        if not magazines:
            return []
        keys = [self.key(self._meta_set, names.beacon_key(m)) for m in magazines]
        out: list[int] = []
        try:
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._call("watch", self._client.batch_read, chunk, [BEACON_BIN])
                for record in self._answers("watch", done, len(chunk), self._meta_set):
                    if record.result == 0 and record.record is not None:
                        out.append(int((record.record[2] or {}).get(BEACON_BIN) or 0))
                    elif record.result == NOT_FOUND:
                        out.append(0)
                    else:
                        raise self._record_failure("watch", record, self._meta_set)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "watch", self._meta_set) from None
        return out

    def doorbell(self) -> None:
        """None: consumers in other processes poll the shard pointers (ignis.watch), there being no channel
        between clients but the records themselves."""
        return None

    @property
    def closed(self) -> bool:
        return self._shared.closed

    def close(self) -> None:
        shared = self._shared
        if not self._owner:
            return  # a view: the owner closes the connection
        with shared.lock:
            if shared.closed:
                return
            shared.closed = True
            shared.queries_done.wait_for(lambda: shared.queries == 0, timeout=shared.settings.total_timeout_ms / 1000)
        if shared.owns_client:
            shared.client.close()

    @contextlib.contextmanager
    def _query_running(self) -> Iterator[None]:
        """Around a query of a background thread: refused once closing, and waited for by close()."""
        shared = self._shared
        with shared.lock:
            if shared.closed:
                raise StoreUnavailable(f"{self._url}: the store handle is closed")
            shared.queries += 1
        try:
            yield
        finally:
            with shared.lock:
                shared.queries -= 1
                shared.queries_done.notify_all()

    def key(self, set_name: str, key: str) -> tuple[str, str, str]:
        return (self._ns, set_name, key)

    def _data_key(self, ref: SlotRef) -> tuple[str, str, str]:
        return (self._ns, self._data_set, names.data_key(ref[0], ref[1], ref[2]))

    def _meta_key(self, magazine: str, shard: int) -> tuple[str, str, str]:
        return (self._ns, self._meta_set, names.meta_key(magazine, shard))

    def _call(self, operation: str, fn: Callable[..., T], *args: Any, idempotent: bool = True, **kwargs: Any) -> T:
        """One storage round trip, counted; transient errors repeated where safe (see module doc).
        Aerospike errors propagate raw so callers can branch on expected ones (not found, filtered)."""
        counter = self._counters.get(operation)
        if counter is None:
            counter = self._counters[operation] = STORAGE_CALLS.labels(operation)
        counter.tick()
        try:
            return fn(*args, **kwargs)
        except ex.AerospikeError as exc:
            if self._shared.settings.retries == 0 or not is_transient(exc, idempotent):
                if is_transient(exc, True):  # a failure of the store, not an answer (not found, filtered)
                    STORAGE_ERRORS.labels(operation).inc()
                raise

        def again() -> T:
            STORAGE_RETRIES.labels(operation).inc()
            counter.tick()
            return fn(*args, **kwargs)

        retrying = self._retrying.copy(retry=retry_if_exception(lambda e: is_transient(e, idempotent)))
        try:
            return retrying(again)
        except ex.AerospikeError as exc:
            if is_transient(exc, True):  # the retries ran out (or a retry failed in doubt)
                STORAGE_ERRORS.labels(operation).inc()
            raise

    def _fail(self, exc: ex.AerospikeError, operation: str, set_name: str) -> Exception:
        return map_error(exc, operation, f"{self._url} set {set_name!r}")

    def _answers(self, operation: str, done: Any, count: int, set_name: str) -> list[Any]:
        """The per-record answers of a batch call, one per key asked. A batch does not raise when the
        cluster is down: it answers with an overall result code and failing records, or with no records at
        all (the Python client 19). Missing answers are an outage, never "absent"."""
        records = getattr(done, "batch_records", None) or []
        if len(records) != count:
            STORAGE_ERRORS.labels(operation).inc()
            raise StoreUnavailable(f"aerospike {operation} on {self._url} set {set_name!r}: the batch answered "
                                   f"for {len(records)} of {count} record(s) (result code "
                                   f"{getattr(done, 'result', None)}): cluster unreachable or unstable")
        return records

    def _record_failure(self, operation: str, record: Any, set_name: str) -> IgnisError:
        """The error for one record of a batch whose result code is not an answer (not 0, not found or
        filtered out): an outage (StoreUnavailable) or a failure of that record."""
        STORAGE_ERRORS.labels(operation).inc()
        key = record.key[2] if getattr(record, "key", None) else "?"
        return record_error(record.result, operation, f"{self._url} set {set_name!r}", f"record {key!r}")

    @staticmethod
    def _tombstoned(bins: Mapping[str, Any] | None) -> bool:
        return bins is None or bins.get(TOMBSTONE) is not None or bins.get(PURGED) is not None

    @staticmethod
    def _envelope(bins: Mapping[str, Any], version: int | None = None, where: object = "?") -> Envelope:
        # Envelope.from_bins, for what the client hands back: a batch write answers every operation (a
        # read of a missing bin, a write: None), so an absent bin may be there as None; blobs may come
        # back as bytearray. One pass, no intermediate dict: this runs once per delivered message. A record
        # that is not an envelope (another tool wrote it, or it is damaged) is carried on as an unreadable one
        # (envelope.unreadable_envelope): never as something else.
        get = bins.get
        payload, msg_id, loaded_at, codec = get(PAYLOAD), get(MSG_ID), get(LOADED_AT), get(CODEC) or CODEC_BYTES
        headers, key, fire_ts, attempts = get(HEADERS), get(PARTITION_KEY), get(FIRE_TS), get(ATTEMPTS) or 0
        reason, history, due_at = get(REASON), get(HISTORY), get(DUE_AT)
        if type(payload) is not bytes or type(msg_id) is not str or not msg_id or type(loaded_at) is not int \
                or type(attempts) is not int or codec not in STORED_CODECS \
                or (fire_ts is not None and type(fire_ts) is not int) \
                or (headers is not None and type(headers) is not dict) \
                or (key is not None and type(key) is not str) or (reason is not None and type(reason) is not str) \
                or (history is not None and type(history) is not list) \
                or (due_at is not None and type(due_at) is not int):
            problem = envelope_problem(dict(bins))
            if problem is not None:
                envelope = unreadable_envelope(problem, dict(bins), where)
                envelope.version = version
                return envelope
            payload = bytes(payload)  # a bytearray: the client's blob type in some answers
        elif headers and not all(type(k) is str and type(v) is str for k, v in headers.items()):
            envelope = unreadable_envelope("bin headers is not a map of strings", dict(bins), where)
            envelope.version = version
            return envelope
        envelope = Envelope(payload, msg_id, loaded_at, codec, headers, key, fire_ts, attempts, reason, history,
                            due_at)
        envelope.version = version
        return envelope

    def _check_size(self, magazine: str, bins: Mapping[str, Any]) -> None:
        payload = bins.get(PAYLOAD) or b""
        limit = self._shared.settings.max_record_bytes
        if len(payload) + SIZE_CHECK_MARGIN < limit:  # far from the limit: no estimate (the server still checks)
            return
        size = RECORD_OVERHEAD + len(payload) + sum(len(k) + len(repr(v)) for k, v in bins.items() if k != PAYLOAD)
        if size > limit:
            raise InvalidInputError(
                f"message for magazine {magazine!r} needs a record of about {size} bytes; the Aerospike "
                f"namespace {self._ns!r} accepts at most {limit} bytes per record (max-record-size): publish "
                f"a smaller payload ({len(payload)} bytes now)")

    # ---- queue registry ---------------------------------------------------------------------
    def ensure_index(self) -> None:
        failure = self._create_index()
        if failure is not None:
            raise failure[1]

    def _index_on_every_node(self, name: str | None = None) -> bool:
        """Whether every node already has the index (`name`; default: the queue set's): one cheap info call.
        Creating it again would also succeed, but the client then waits for the index to be ready, about 2 s on
        Aerospike 8.1 even when it exists (measured), which every process start would pay."""
        try:
            answers = self._call("ensure_index", self._client.info_all,
                                 f"sindex-exists:namespace={self._ns};indexname={name or self._index_name}")
        except ex.AerospikeError:
            return False  # not answerable (an older server, no privilege): let the create decide
        texts = [str(answer[1] if isinstance(answer, tuple) else answer) for answer in (answers or {}).values()]
        return bool(texts) and all(t.strip().rsplit("\t", 1)[-1] == "true" for t in texts)

    def _create_index(self) -> tuple[ex.AerospikeError, StoreError] | None:
        """None when the index exists afterwards, else (the Aerospike error, the error to raise)."""
        if self._index_on_every_node():
            return None
        try:
            self._call("ensure_index", self._client.index_single_value_create, self._ns, self._queue_set, ACTIVE,
                       aerospike.INDEX_STRING, self._index_name)
        except ex.IndexFoundError:
            pass  # already exists: the normal case after the first start
        except ex.AerospikeError as exc:
            mapped = map_error(exc, "index create", self._url)
            kind = type(mapped) if isinstance(mapped, StoreUnavailable) else StoreError  # an outage stays one
            return exc, kind(f"cannot create secondary index {self._index_name!r} on "
                             f"{self._ns}.{self._queue_set}.{ACTIVE}: {mapped}")
        return None

    @staticmethod
    def _ttl(seconds: int) -> int:
        return seconds if seconds > 0 else aerospike.TTL_NEVER_EXPIRE

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        clobbered = RUNTIME_BINS.intersection(config)
        if clobbered:
            raise InvalidInputError(f"queue config may not set runtime bins: {', '.join(sorted(clobbered))}")
        for bin_name in config:
            if len(bin_name) > MAX_BIN_NAME:
                raise InvalidInputError(f"bin name {bin_name!r} is longer than {MAX_BIN_NAME} characters "
                                        "(an Aerospike limit)")
        key = self.key(self._queue_set, name)
        ttl = self._ttl(ttl_seconds)
        update = {**config, ACTIVE: "true"}
        try:
            for _ in range(5):  # each step fails only when a concurrent writer changed the record
                created = {**config, CREATED_AT: now_ms(), ACTIVE: "true", SWEEP_POINTERS: {}, SIDELINE_SWEEP: {},
                           SWEPT_COUNTER: 0, SIDELINE_SWEPT: 0, SWEEP_EPOCH: 0}
                try:
                    self._call("apply_queue", self._client.put, key, created, None,
                               {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl})
                    return True
                except ex.RecordExistsError:
                    pass
                try:  # update: config bins only, runtime bins untouched; the TTL re-asserted
                    self._call("apply_queue", self._client.put, key, update, None, {**self._update_live, "ttl": ttl})
                    return False
                except ex.RecordNotFound:
                    continue  # expired or deleted meanwhile: create it
                except ex.FilteredOut:
                    pass
                try:  # a tombstone of a deleted queue: replace it by a fresh record
                    self._call("apply_queue", self._client.put, key, created, None,
                               {**self._wp, "exists": aerospike.POLICY_EXISTS_REPLACE, "ttl": ttl,
                                "expressions": _ANY_TOMBSTONE})
                    return True
                except _MISSING:
                    continue
            raise StoreError(f"apply of queue {name!r} kept racing with concurrent writers; try again")
        except ex.AerospikeError as exc:
            raise self._fail(exc, "apply_queue", self._queue_set) from None

    def get_queue(self, name: str) -> QueueRecord | None:
        try:
            _, _, bins = self._call("get_queue", self._client.get, self.key(self._queue_set, name))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "get_queue", self._queue_set) from None
        if self._tombstoned(bins):
            return None
        record = QueueRecord(name, dict(bins))
        self._check_sweep_pointers(record)
        return record

    def _check_sweep_pointers(self, record: QueueRecord) -> None:
        """Sweep pointers lower than this process has written or seen are a rollback: reported once (per
        pointer, until it moves past the mark), and taken as stored. The sweep then examines again the slots
        between the stored pointer and the mark, where the rollback may have put back records (acks and claim
        stamps lost): re-sweeping a range is idempotent, and skipping it would strand them (DESIGN §4)."""
        marks = self._shared.marks
        for kind, bin_name in (("main", SWEEP_POINTERS), ("sideline", SIDELINE_SWEEP)):
            stored = record.bins.get(bin_name)
            if not isinstance(stored, dict):
                continue
            for label, value in stored.items():
                if not isinstance(value, int):
                    continue
                mark = (self._queue_set, record.name, bin_name, label)
                if value < marks.mark(mark):
                    marks.report(mark, f"{kind} sweep pointer of {record.name} shard {label}", None, value,
                                 queue=record.name, kind=kind)
                else:
                    marks.saw(mark, value)

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        flags = ["true", "false"] if active is None else ["true" if active else "false"]
        try:
            records = self._call("list_queues", self._query_queues, flags)
            if records is None:
                # The index is not queryable here yet: a new index reaches each node through system
                # metadata and is then built ("index not found" / "not readable" meanwhile), and a sweeper
                # must not miss a new client's queues in that window. The queue set holds one record per
                # queue: scan it with the same condition as a filter expression instead.
                records = self._call("list_queues", self._scan_queues, flags)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "list_queues", self._queue_set) from None
        found = []
        for key, _, bins in records:
            if key[2] is None:
                log.warning("queue record without a stored key in %s (written without sendKey); skipped",
                            self._queue_set)
            elif not self._tombstoned(bins):
                found.append(QueueRecord(key[2], dict(bins)))
        return sorted(found, key=lambda r: r.name)

    def _query_queues(self, flags: list[str]) -> list[Any] | None:
        """Equality queries on the `active` index; None when the index cannot answer yet."""
        records = []
        try:
            for flag in flags:
                query = self._client.query(self._ns, self._queue_set)
                query.where(aerospike.predicates.equals(ACTIVE, flag))
                records.extend(query.results())
        except (ex.IndexNotFound, ex.IndexNotReadable):
            return None
        return records

    def _scan_queues(self, flags: list[str]) -> list[Any]:
        query = self._client.query(self._ns, self._queue_set)
        wanted = exp.Or(*(exp.Eq(exp.StrBin(ACTIVE), flag) for flag in flags)) if len(flags) > 1 else \
            exp.Eq(exp.StrBin(ACTIVE), flags[0])
        return query.results({"expressions": wanted.compile()})

    def set_queue_active(self, name: str, active: bool) -> bool:
        try:
            self._call("set_queue_active", self._client.put, self.key(self._queue_set, name),
                       {ACTIVE: "true" if active else "false"}, None, self._update_live)
            return True
        except _MISSING:
            return False
        except ex.AerospikeError as exc:
            raise self._fail(exc, "set_queue_active", self._queue_set) from None

    def delete_queue(self, name: str) -> bool:
        try:
            return self._remove_one("delete_queue", self.key(self._queue_set, name))
        except ex.AerospikeError as exc:
            raise self._fail(exc, "delete_queue", self._queue_set) from None

    def next_epoch(self) -> int:
        # Repeating an in-doubt increment is safe here: it can only skip an epoch, and epochs need to be
        # increasing, not dense. The epoch is at least the current time in ms: a store that loses the last
        # increments (rollback.py) still hands out an epoch above every one handed out before its crash, since
        # epochs come seconds apart (one per leadership) and the restart takes longer than that.
        at_least_now = arithmetic.Max(exp.IntBin(EPOCH_BIN), now_ms()).compile()
        try:
            _, _, bins = self._call("next_epoch", self._client.operate, self.key(self._system_set, EPOCH_KEY),
                                    [ops.increment(EPOCH_BIN, 1), expr_ops.expression_write(EPOCH_BIN, at_least_now),
                                     ops.read(EPOCH_BIN)], None, self._never)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "next_epoch", self._system_set) from None
        return int(bins[EPOCH_BIN])

    @staticmethod
    def _forward_only(pointer_bin: str, pointers: Mapping[int, int]) -> Any:
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
            entry = exp.Cond(exp.Eq(count, 0), value, arithmetic.Max(held, value))
            bindings.append(exp.Def(f"p{n}", exp_map.MapPut(None, None, label, entry, exp.Var(f"p{n - 1}"))))
        return exp.Let(*bindings, exp.Var(f"p{len(pointers)}"))

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        pointer_bin, counter_bin = (SWEEP_POINTERS, SWEPT_COUNTER) if kind == "main" else (SIDELINE_SWEEP,
                                                                                             SIDELINE_SWEPT)
        operations = [ops.write(SWEEP_EPOCH, epoch)]
        if pointers:
            operations.append(expr_ops.expression_write(pointer_bin,
                                                        self._forward_only(pointer_bin, pointers).compile()))
        if swept:
            operations.append(ops.increment(counter_bin, swept))
        fence = exp.And(_LIVE, exp.LE(exp.IntBin(SWEEP_EPOCH), epoch)).compile()
        key = self.key(self._queue_set, name)
        try:
            # Not repeated when in doubt: the pointers are idempotent but the counter is not. The sweeper
            # sees the error and re-sweeps next pass; the re-sweep of a swept range changes nothing.
            self._call("advance_sweep", self._client.operate, key, operations, None,
                       {**self._update, "expressions": fence}, idempotent=False)
            for shard, pointer in pointers.items():
                self._shared.marks.saw((self._queue_set, name, pointer_bin, names.shard_label(shard)), int(pointer))
        except ex.RecordNotFound:
            raise QueueNotFound(name, self.client_id) from None
        except ex.FilteredOut:
            current = self.get_queue(name)
            if current is None:
                raise QueueNotFound(name, self.client_id) from None
            raise StaleEpoch(name, epoch, int(current.bins.get(SWEEP_EPOCH, 0))) from None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "advance_sweep", self._queue_set) from None

    # ---- farm-wide system records -------------------------------------------------------------
    def register_client(self, client_id: str) -> None:
        client_id = names.check_id("clientId", client_id)
        policy = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY | aerospike.MAP_WRITE_FLAGS_NO_FAIL}
        try:  # one map put, create-only: idempotent, so safe to repeat; no read-modify-write
            self._call("register_client", self._client.operate, self.key(self._system_set, CLIENTS_KEY),
                       [map_ops.map_put(CLIENTS_BIN, client_id, now_ms(), policy)], None, self._never)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "register_client", self._system_set) from None

    def list_clients(self) -> list[str]:
        try:
            _, _, bins = self._call("list_clients", self._client.get, self.key(self._system_set, CLIENTS_KEY))
        except ex.RecordNotFound:
            return []
        except ex.AerospikeError as exc:
            raise self._fail(exc, "list_clients", self._system_set) from None
        return sorted((bins or {}).get(CLIENTS_BIN) or {})

    def _lease_held_off(self, name: str) -> None:
        until = self._shared.lease_holds.get(name)
        if until is not None:
            if time.monotonic() < until:
                raise StoreUnavailable(f"lease {name!r}: the store lost writes to it (a rollback); not read or "
                                       f"written for {until - time.monotonic():.0f} s more, until any holder "
                                       "it may have had has expired")
            del self._shared.lease_holds[name]

    def get_lease(self, name: str) -> LeaseRecord | None:
        self._lease_held_off(name)
        try:
            _, meta, bins = self._call("get_lease", self._client.get, self.key(self._system_set, LEASE_PREFIX + name))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "get_lease", self._system_set) from None
        lease = LeaseRecord(*(bins[b] for b in LEASE_BINS), version=meta["gen"])
        mark = (self._system_set, LEASE_PREFIX + name)
        high = self._shared.marks.mark(mark)
        if lease.version < high:
            # Writes to the lease were lost: who holds it is not known. This process neither renews nor takes
            # it for a whole lease duration (a holder it knows nothing of expires meanwhile), so the rollback
            # never makes two leaders. Then it starts afresh from what the store holds.
            report(f"generation of lease {name}", None, lease.version, high, queue="", kind="lease")
            self._shared.lease_holds[name] = time.monotonic() + lease.duration_s
            self._shared.marks.forget(lambda k: k == mark)
            self._lease_held_off(name)
        self._shared.marks.saw(mark, lease.version)
        return lease

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        self._lease_held_off(name)
        writes = [ops.write(b, getattr(lease, b)) for b in LEASE_BINS]
        if expected_version == 0:
            meta, policy = None, {**self._never, "exists": aerospike.POLICY_EXISTS_CREATE}
        else:  # compare-and-set on the record generation
            meta = {"gen": expected_version}
            policy = {**self._never, "exists": aerospike.POLICY_EXISTS_UPDATE, "gen": aerospike.POLICY_GEN_EQ}
        try:
            _, stored_meta, _ = self._call("replace_lease", self._client.operate,
                                           self.key(self._system_set, LEASE_PREFIX + name), writes, meta, policy,
                                           idempotent=False)
        except (ex.RecordExistsError, ex.RecordGenerationError, ex.RecordNotFound):
            return None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "replace_lease", self._system_set) from None
        self._shared.marks.saw((self._system_set, LEASE_PREFIX + name), stored_meta["gen"])
        return LeaseRecord(lease.holder, lease.acquired_ms, lease.renewed_ms, lease.duration_s, lease.transitions,
                           stored_meta["gen"])

    # ---- magazine primitives ----------------------------------------------------------------
    @property
    def write_grace_ms(self) -> int:
        return self._write_grace_ms

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        # load() for one plain message, without its lists: the per-message publish path. Anything out
        # of the ordinary (a record near the size limit, a sealed slot) takes the general path.
        if len(payload) + len(msg_id) + RECORD_OVERHEAD > self._shared.settings.max_record_bytes:
            return self.load(magazine, [(shard, Envelope(payload, msg_id, loaded_at))], ttl_seconds)[0].slot
        try:
            slot = self._allocate_slots("load", magazine, shard, 1)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "load", self._data_set) from None
        if self.load_reserved(tuple.__new__(SlotRef, (magazine, shard, slot)), payload, msg_id, loaded_at,
                              ttl_seconds):
            return slot
        # sealed: a consumer gave the slot up; publish it again into a new one
        return self.load(magazine, [(shard, Envelope(payload, msg_id, loaded_at))], ttl_seconds)[0].slot

    def _plain_policies(self, ttl_seconds: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The create-only and the sealed-refusing create-or-replace policy of a new record (cached)."""
        policies = self._new_record.get(ttl_seconds)
        if policies is None:
            ttl = self._ttl(ttl_seconds)
            policies = self._new_record[ttl_seconds] = (
                {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl},
                {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "expressions": _NOT_SEALED,
                 "ttl": ttl})
        return policies

    def _write_plain(self, data_key: str, bins: dict[str, Any], policies: tuple[dict[str, Any], dict[str, Any]]
                     ) -> bool:
        """Write a new record into its allocated slot; False if the slot is sealed. Aerospike errors raw."""
        key = (self._ns, self._data_set, data_key)
        try:
            # A new slot is almost always empty: create-only needs no filter expression (whose
            # conversion costs the client about a third of the call, measured).
            self._call("load", self._client.put, key, bins, None, policies[0])
        except ex.RecordExistsError:  # a purge leftover, a seal, or this write's own earlier attempt
            return self._write_over("load", key, bins, policies[1]["ttl"])
        return True

    def _write_over(self, operation: str, key: tuple[str, str, str], bins: Mapping[str, Any], ttl: int) -> bool:
        """A new record's write into a slot that holds one already: it replaces a purge leftover, or this same
        message (its own earlier attempt); it is refused by a seal, and by another message, which a rollback
        put there (the store handed the slot out twice: see rollback.py). False: publish it again elsewhere."""
        replaceable = exp.And(exp.Not(exp.BinExists(SEALED)), exp.Or(
            exp.BinExists(PURGED), exp.Eq(exp.StrBin(MSG_ID), str(bins.get(MSG_ID) or ""))))
        policy = {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "ttl": ttl,
                  "expressions": replaceable.compile()}
        try:
            self._call(operation, self._client.put, key, dict(bins), None, policy)
            return True
        except ex.FilteredOut:
            pass
        STORAGE_RETRIES.labels("load_sealed").inc()
        try:
            _, _, held = self._call(operation, self._client.get, key)
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
            live = self._batch_get("rollback_check", [self._data_key(ref) for ref in refs])
            used = [ref.slot for ref, bins, done in zip(refs, live, self.settled(refs), strict=True)
                    if bins is not None or done]
            if not used:
                break
            last = used[-1]
        key = self._meta_key(magazine, shard)
        self._shared.marks.saw((key[1], key[2], LOAD_POINTER), last)
        self._roll_forward(magazine, shard, f"load pointer (slot {slot} already holds a message)", slot - 1)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        if count < 1:
            raise InvalidInputError(f"reserve {count} slots: count must be at least 1")
        try:
            return self._allocate_slots("reserve", magazine, shard, count)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "reserve", self._meta_set) from None

    def _plain_bins(self, magazine: str, payload: bytes, msg_id: str, loaded_at: int) -> dict[str, Any]:
        """The bins of a new plain message, checked against the record size limit."""
        bins = {PAYLOAD: payload, MSG_ID: msg_id, LOADED_AT: loaded_at, CODEC: CODEC_BYTES, ATTEMPTS: 0}
        if len(payload) + len(msg_id) + RECORD_OVERHEAD > self._shared.settings.max_record_bytes:
            self._check_size(magazine, bins)  # near the limit: the exact estimate, and its clear error
        return bins

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        bins = self._plain_bins(ref.magazine, payload, msg_id, loaded_at)
        try:
            return self._write_plain(names.data_key(ref.magazine, ref.shard, ref.slot), bins,
                                     self._plain_policies(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._fail(exc, "load", self._data_set) from None

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        bins_list = [self._plain_bins(ref.magazine, payload, msg_id, loaded_at)
                     for ref, payload, msg_id in zip(refs, payloads, ids, strict=True)]
        try:
            return self._write_new("load", refs, bins_list, self._ttl(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._fail(exc, "load", self._data_set) from None

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[Sequence[int]]:
        # One record object per message either way: the envelope path costs nothing extra here.
        return load_new_as_envelopes(self, magazine, batch, placement, ttl_seconds)

    def _allocate_slots(self, operation: str, magazine: str, shard: int, count: int) -> int:
        """Allocate `count` consecutive slots of a shard; the first. Checked against the highest load pointer
        this process has seen (the mark is taken before the call, see rollback.py): a lower answer is a
        rollback, and the slots are allocated again past the mark after the pointers are moved there.
        Aerospike errors raw."""
        key = self._meta_key(magazine, shard)
        marks, mark = self._shared.marks, (key[1], key[2], LOAD_POINTER)
        before = marks.mark(mark)
        _, _, got = self._call(operation, self._client.operate, key,
                               _ALLOCATE_ONE if count == 1 else _allocate_ops(count), None, self._never)
        load = int(got[LOAD_POINTER])
        if got.get(PURGED) is not None:  # purged since: the numbering starts afresh, on purpose
            marks.forget(lambda k: k[:2] == key[1:])
            before = 0
        elif load - count < before and self._renumbered(magazine, shard, load - count + 1, mark):
            before = 0
        if load - count < before and not self._renumbered(magazine, shard, load - count + 1, mark):
            self._roll_forward(magazine, shard, "load pointer", load - count)
            if load > before:  # the part of this allocation past the mark: ours, and unused from now on
                self._seal_slots(operation, [SlotRef(magazine, shard, slot) for slot in range(before + 1, load + 1)],
                                 ROLLBACK_SEAL_TTL)
            return self._allocate_slots(operation, magazine, shard, count)
        marks.saw(mark, load)
        return load - count + 1

    def _renumbered(self, magazine: str, shard: int, slot: int, mark: tuple[str, str, str]) -> bool:
        """Whether a pointer below this process's mark comes from a purge (another process purged the magazine
        and it is used again: numbering afresh, on purpose) rather than a rollback, told by the first slot
        past the pointer: a purge tombstone there, or a message published after the mark was seen. Then the
        shard's marks are forgotten. (A rollback leaves nothing there, or what was there before the mark.)"""
        try:
            _, _, bins = self._call("rollback_check", self._client.get, self._data_key(SlotRef(magazine, shard, slot)))
        except ex.RecordNotFound:
            return False
        seen_at = self._shared.marks.seen_at(mark)
        if bins.get(PURGED) is None and not (bins.get(TOMBSTONE) is None and (bins.get(LOADED_AT) or 0) > seen_at):
            return False
        self._shared.marks.forget(lambda k: k[:2] == mark[:2])
        return True

    def _roll_forward(self, magazine: str, shard: int, what: str, stored: int) -> None:
        """After a rollback of a shard's pointers: report it, and move its load and fire pointers up to the
        highest this process has seen (never down: max by expression, one call)."""
        key = self._meta_key(magazine, shard)
        marks = self._shared.marks
        load_high = marks.mark((key[1], key[2], LOAD_POINTER))
        fire_high = marks.mark((key[1], key[2], FIRE_POINTER))
        counter = LOAD_POINTER if what.startswith("load") else FIRE_POINTER
        marks.report((key[1], key[2], counter), f"{what} of {magazine} shard {shard}", magazine, stored)
        load, fire = exp.IntBin(LOAD_POINTER), exp.IntBin(FIRE_POINTER)
        fire_now = exp.Cond(exp.BinExists(FIRE_POINTER), fire, 0)
        raised_fire = arithmetic.Max(fire_now, arithmetic.Min(fire_high, load))  # (load: already raised above)
        self._call("roll_forward", self._client.operate, key, [
            expr_ops.expression_write(LOAD_POINTER, arithmetic.Max(load, load_high).compile()),
            expr_ops.expression_write(FIRE_POINTER, raised_fire.compile())], None, self._never)

    def _allocate(self, operation: str, magazine: str, shards: Sequence[int]) -> list[SlotRef]:
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

    def _write_new(self, operation: str, refs: Sequence[SlotRef], bins_list: Sequence[Mapping[str, Any]],
                   ttl: int) -> list[bool]:
        """Write records into slots just allocated: create-only, and where a record is there already, over
        it as _write_over allows (a purge leftover, this write's own earlier attempt). Per slot: False =
        refused (a seal, or another message): publish it again elsewhere."""
        create = {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE, "ttl": ttl}
        if len(refs) == 1:
            key = self._data_key(refs[0])
            try:
                self._call(operation, self._client.put, key, dict(bins_list[0]), None, create)
                return [True]
            except ex.RecordExistsError:
                return [self._write_over(operation, key, bins_list[0], ttl)]
        write = aerospike.OPERATOR_WRITE  # the op dicts ops.write builds, without a call per bin
        batch = BatchRecords([Write(self._data_key(ref), [{"op": write, "bin": k, "val": v} for k, v in bins.items()],
                                    policy=create) for ref, bins in zip(refs, bins_list, strict=True)])
        done = self._call(operation, self._client.batch_write, batch) or batch
        records = self._answers(operation, done, len(refs), self._data_set)
        failed = [r for r in records if r.result not in (0, RECORD_EXISTS)]
        if failed:  # some may be written: publishing them again can duplicate, never lose
            raise self._record_failure(operation, failed[0], self._data_set)
        return [r.result == 0 or self._write_over(operation, r.key, bins, ttl)
                for r, bins in zip(records, bins_list, strict=True)]

    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        if not items:
            return []
        bins_list = [envelope.to_bins() for _, envelope in items]
        for bins in bins_list:
            self._check_size(magazine, bins)
        ttl = self._ttl(ttl_seconds)
        try:
            refs = self._allocate("load", magazine, [shard for shard, _ in items])
            todo = list(range(len(items)))
            for round_ in range(REPUBLISH_ROUNDS):
                written = self._write_new("load", [refs[i] for i in todo], [bins_list[i] for i in todo], ttl)
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
                for i, ref in zip(todo, self._allocate("load", magazine, [items[i][0] for i in todo]), strict=True):
                    refs[i] = ref
            raise StoreError(f"aerospike load into {magazine!r}: {len(todo)} message(s) kept reaching sealed slots "
                             f"({REPUBLISH_ROUNDS} tries); nothing more was written for them")
        except ex.AerospikeError as exc:
            raise self._fail(exc, "load", self._data_set) from None

    def _claim_ops(self, k: int) -> list[dict[str, Any]]:
        cached = self._claim_exprs.get(k)
        if cached is None:
            advanced = arithmetic.Min(arithmetic.Add(exp.IntBin(FIRE_POINTER), k), exp.IntBin(LOAD_POINTER))
            cached = [expr_ops.expression_read(CLAIM_FROM, exp.IntBin(FIRE_POINTER).compile()),
                      expr_ops.expression_write(LAST_FROM, exp.IntBin(FIRE_POINTER).compile()),
                      expr_ops.expression_write(FIRE_POINTER, advanced.compile()),
                      ops.read(FIRE_POINTER)]
            if len(self._claim_exprs) < 1024:
                self._claim_exprs[k] = cached
        return cached

    def _bounded_claim(self, k: int, up_to: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The claim's operations and policy when it may not pass slot `up_to` (not cached: the bound varies)."""
        fire, load = exp.IntBin(FIRE_POINTER), exp.IntBin(LOAD_POINTER)
        guard = exp.And(exp.LT(fire, load), exp.LT(fire, up_to)).compile()
        advanced = arithmetic.Min(arithmetic.Add(fire, k), load, up_to)
        operations = [expr_ops.expression_read(CLAIM_FROM, fire.compile()),
                      expr_ops.expression_write(LAST_FROM, fire.compile()),
                      expr_ops.expression_write(FIRE_POINTER, advanced.compile()), ops.read(FIRE_POINTER)]
        return operations, {**self._update, "expressions": guard}

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        if max_slots <= 0:
            return []
        if up_to is None:
            operations, policy = _CLAIM_ONE if max_slots == 1 else self._claim_ops(max_slots), self._claim_policy
        else:
            operations, policy = self._bounded_claim(max_slots, up_to)
        key = self._meta_key(magazine, shard)
        marks, mark = self._shared.marks, (key[1], key[2], FIRE_POINTER)
        before = marks.mark(mark)  # taken before the call: see rollback.py
        token = f"{self._shared.claim_prefix}{next(self._shared.claim_seq)}"
        try:
            try:
                _, _, got = self._call("claim", self._client.operate, key, [*operations, ops.write(LAST_CLAIM, token)],
                                       None, policy, idempotent=False)
            except _MISSING:  # no meta record, or FIRE == LOAD: drained
                return []
        except ex.AerospikeError as exc:
            error = self._fail(exc, "claim", self._meta_set)
            if is_transient(exc, True) and (error_field(exc, "in_doubt", False) or isinstance(exc, _ANSWER_LOST)):
                ticket = ClaimTicket(magazine, shard, max_slots == 1 and up_to is None, token, count_attempt)
                raise ClaimInDoubt(str(error), ticket) from None
            raise error from None
        return self._claimed(magazine, shard, max_slots == 1 and up_to is None, got, before, now_ms_, count_attempt)

    def resolve_claim(self, ticket: ClaimTicket, now_ms_: int) -> list[Claimed] | None:
        try:
            _, _, got = self._call("claim", self._client.get, self._meta_key(ticket.magazine, ticket.shard))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "claim", self._meta_set) from None
        if got.get(LAST_CLAIM) != ticket.token:  # not applied, or another claim came after it: no telling
            return None
        answer = {FIRE_POINTER: got.get(FIRE_POINTER, 0), CLAIM_FROM: got.get(LAST_FROM, 0)}
        return self._claimed(ticket.magazine, ticket.shard, ticket.single, answer, 0, now_ms_, ticket.count_attempt)

    def _claimed(self, magazine: str, shard: int, single: bool, got: Mapping[str, Any], before: int, now_ms_: int,
                 count_attempt: bool) -> list[Claimed]:
        """The slots a claim answered `got` took (checked against the fire pointer's mark `before`), stamped."""
        key = self._meta_key(magazine, shard)
        marks, mark = self._shared.marks, (key[1], key[2], FIRE_POINTER)
        last = int(got[FIRE_POINTER])
        first = last if single else int(got[CLAIM_FROM]) + 1
        if first <= before:  # the fire pointer was below one seen before this claim: a rollback, or a purge
            try:
                if not self._renumbered(magazine, shard, first, mark):
                    self._roll_forward(magazine, shard, "fire pointer", first - 1)
                    first = before + 1  # slots up to the mark were claimed before the rollback: not this claim's
            except ex.AerospikeError as exc:
                raise self._fail(exc, "claim", self._meta_set) from None
        marks.saw(mark, last)
        if first > last:
            return []
        new = tuple.__new__  # a NamedTuple's own __new__ is a Python call: too slow per claimed slot
        return self._stamp_slots("claim", [new(SlotRef, (magazine, shard, slot)) for slot in range(first, last + 1)],
                                 now_ms_, count_attempt)

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        return self._stamp_slots("restamp", refs, now_ms_, count_attempt)

    @staticmethod
    def _slot(ref: SlotRef, bins: Mapping[str, Any] | None, result: int, generation: int | None = None
              ) -> Claimed:
        """A claimed slot from its stamp's outcome: the record; an awaited hole (not found, or a purge
        leftover a new message may still replace); or a hole for good (deleted or sealed)."""
        if result == 0 and bins is not None and bins.get(PURGED) is None:
            return Claimed(ref, AerospikeStore._envelope(bins, generation, ref), False)
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
        stamp = [ops.write(FIRE_TS, now_ms_), *([ops.increment(ATTEMPTS, 1)] if count_attempt else []),
                 *_READ_STAMPED]
        try:
            if len(refs) == 1:
                # One record: no filter expression (converting one costs the client more than the rest of
                # the call, measured); a deletedAt tombstone is told by reading the bin instead. Stamping
                # one writes two bins into a tombstone, which stays a tombstone: harmless, and rare.
                try:
                    _, meta, bins = self._call(operation, self._client.operate, self._data_key(refs[0]),
                                               [*stamp, _READ_TOMBSTONE], None, self._update)
                except ex.RecordNotFound:
                    return [self._slot(refs[0], None, NOT_FOUND)]
                except ex.BinIncompatibleType:  # attempts is not a number: not an envelope, stamp it only
                    _, meta, bins = self._call(operation, self._client.operate, self._data_key(refs[0]),
                                               [*_stamp_only(now_ms_), _READ_TOMBSTONE], None, self._update)
                if bins.get(TOMBSTONE) is not None:
                    return [self._slot(refs[0], None, FILTERED_OUT)]
                return [self._slot(refs[0], bins, 0, (meta or {}).get("gen"))]
            # batch_operate: one operation list and one policy for every key, which the client converts
            # once (per-record Write objects cost about three times the client CPU, measured).
            done = self._call(operation, self._client.batch_operate, [self._data_key(ref) for ref in refs], stamp,
                              None, self._stamp)
            records = self._answers(operation, done, len(refs), self._data_set)
        except ex.AerospikeError as exc:
            error = self._fail(exc, operation, self._data_set)
            raise self._interrupted(error, refs) from None
        except StoreUnavailable as error:
            raise self._interrupted(error, refs) from None
        incompatible = [i for i, record in enumerate(records) if record.result == BIN_INCOMPATIBLE]
        if incompatible:  # attempts is not a number (another tool wrote the record): stamp it only
            records = list(records)
            try:
                keys = [self._data_key(refs[i]) for i in incompatible]
                again = self._call(operation, self._client.batch_operate, keys, _stamp_only(now_ms_), None, self._stamp)
                for i, record in zip(incompatible, self._answers(operation, again, len(incompatible), self._data_set),
                                     strict=True):
                    records[i] = record
            except (ex.AerospikeError, StoreUnavailable):
                pass  # those records stay failed: re-read later, like any record the store did not answer for
        out = []
        new, envelope = tuple.__new__, self._envelope
        failure: IgnisError | None = None
        for ref, record in zip(refs, records, strict=True):
            result, got = record.result, record.record
            bins = got[2] if got else None
            if result == 0 and bins is not None and bins.get(PURGED) is None:  # _slot, inlined: per message
                out.append(new(Claimed, (ref, envelope(bins, (got[1] or {}).get("gen"), ref), False)))
            elif result in _ANSWERED:
                out.append(self._slot(ref, bins, result))
            else:  # not answered: still this caller's slot, re-read later
                failure = failure or self._record_failure(operation, record, self._data_set)
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

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        if not refs:
            return []
        try:
            return self._seal_slots("seal", refs, self._ttl(ttl_seconds))
        except ex.AerospikeError as exc:
            raise self._fail(exc, "seal", self._data_set) from None

    def _seal_slots(self, operation: str, refs: Sequence[SlotRef], ttl: int) -> list[bool]:
        """Create a seal in each slot, or turn a tombstone there into one; a live record, or a seal already
        there, wins (False). Each slot sealed here is a hole, counted (HOLES) on its shard's meta record."""
        now = now_ms()
        policy = {**self._wp, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE, "expressions": _SEALABLE,
                  "ttl": ttl}
        seal = [ops.write(TOMBSTONE, now), ops.write(SEALED, now)]
        done = self._call(operation, self._client.batch_operate, [self._data_key(ref) for ref in refs], seal, None,
                          policy)
        records = self._answers(operation, done, len(refs), self._data_set)
        failed = [r for r in records if r.result not in (0, FILTERED_OUT)]
        if failed:
            raise self._record_failure(operation, failed[0], self._data_set)
        sealed = [r.result == 0 for r in records]
        self._count_holes(HOLES, [ref for ref, done_ in zip(refs, sealed, strict=True) if done_])
        return sealed

    def _count_holes(self, counter: str, refs: Sequence[SlotRef]) -> None:
        """Add the holes among `refs` to `counter` (HOLES or HOLES_CLAIMED) of their shards: one increment
        per shard. Repeated when in doubt, like the load pointer: the figures may then be one batch off."""
        per_shard: dict[tuple[str, int], int] = {}
        for ref in refs:
            per_shard[(ref[0], ref[1])] = per_shard.get((ref[0], ref[1]), 0) + 1
        for (magazine, shard), n in per_shard.items():
            self._call("count_holes", self._client.operate, self._meta_key(magazine, shard),
                       [ops.increment(counter, n)], None, self._never)

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        try:
            self._count_holes(HOLES_CLAIMED, [SlotRef(magazine, shard, 0) for shard, n in holes.items()
                                              for _ in range(n)])
        except ex.AerospikeError as exc:
            raise self._fail(exc, "count_holes", self._meta_set) from None

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        if not moves:
            return []
        bins_list = [m.envelope.to_bins() for m in moves]
        for bins in bins_list:
            self._check_size(target, bins)
        ttl = self._ttl(ttl_seconds)
        out: list[bool] = []
        try:
            for start in range(0, len(moves), MOVE_CHUNK):
                out += self._move(target, moves[start:start + MOVE_CHUNK], bins_list[start:start + MOVE_CHUNK], ttl,
                                  epoch, fired_before)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "move", self._data_set) from None
        return out

    def _move(self, target: str, moves: Sequence[Move], bins_list: list[dict[str, Any]], ttl: int, epoch: int,
              fired_before: int | None) -> list[bool]:
        dests = self._allocate("move", target, [m.shard for m in moves])
        dest_keys = [names.data_key(*ref) for ref in dests]
        sources = [self._data_key(m.source) for m in moves]
        # 0. The journal of this move: which target slot each source goes to, under a token of its own, so
        #    that a newer epoch taking a claim over finds the claim's target slots (step 2), and the claims of
        #    step 1 are one operation list for every record (a batch the client converts once).
        token = f"{MOVE_TOKEN_MARK}{epoch}:{uuid.uuid4().hex[:16]}"
        self._call("move", self._client.put, self.key(self._system_set, token),
                   {JOURNAL_SOURCES: [key[2] for key in sources], JOURNAL_TARGETS: dest_keys}, None,
                   {**self._wp, "ttl": ttl})
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
            policy = {**self._update, "expressions": exp.And(_LIVE, fired, not_newer).compile()}
            done = self._call("move", self._client.batch_operate, [sources[i] for i in members], claim_ops, None,
                              policy)
            for i, record in zip(members, self._answers("move", done, len(members), self._data_set), strict=True):
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
                raise self._record_failure("move", record, self._data_set)
        refused = sorted(set(range(len(moves))) - set(claimed))
        if refused:
            held = [int((bins or {}).get(MOVE_EPOCH, 0)) for bins in
                    self._batch_get("move", [sources[i] for i in refused])]
            if max(held, default=0) > epoch:  # a newer leader holds records of this batch: write nothing
                self._seal_slots("move", dests, ttl)
                raise StaleEpoch(moves[0].source.magazine, epoch, max(held))
        # 2. Take over earlier claims: seal their target slot so a late copy there is refused, or find
        #    that copy already landed (then this move only deletes the source).
        copied_before: set[int] = set()
        if earlier:
            targets = self._earlier_targets(earlier, sources)
            order = [i for i in earlier if i in targets]
            refs = [SlotRef(*names.parse_data_key(targets[i])) for i in order]
            landed = [i for i, sealed in zip(order, self._seal_slots("move", refs, ttl), strict=True) if not sealed]
            if landed:
                found = self._batch_get("move", [(self._ns, self._data_set, targets[i]) for i in landed])
                copied_before = {i for i, bins in zip(landed, found, strict=True)
                                 if bins is not None and bins.get(MSG_ID) == moves[i].envelope.msg_id}
        # 3. Copy. A slot sealed meanwhile means a newer epoch took the source over: it moves it.
        to_copy = [i for i in claimed if i not in copied_before]
        written = self._write_new("move", [dests[i] for i in to_copy], [bins_list[i] for i in to_copy], ttl)
        copied = [i for i, ok in zip(to_copy, written, strict=True) if ok]
        unused = sorted(set(range(len(moves))) - set(copied))
        if unused:  # target slots this move allocated and will not fill: holes at once, not after a grace
            self._seal_slots("move", [dests[i] for i in unused], ttl)
        # 4. Delete the sources, only where this epoch's claim still holds (one operation list for all). A
        #    source no claim had reached (fire pointer below it, read before the delete: a claim after it finds
        #    the record moved) leaves a hole where a message was counted: counted (HOLES) below.
        moved = sorted([*copied, *copied_before])
        unclaimed = self._unclaimed([moves[i].source for i in moved if moves[i].fired_at is None])
        if moved:
            guard = exp.And(_LIVE, exp.Eq(exp.IntBin(MOVE_EPOCH), epoch)).compile()
            keys = [sources[i] for i in moved]
            if self._durable:
                done = self._call("move", self._client.batch_remove, keys,
                                  policy_batch_remove={"durable_delete": True, "expressions": guard})
            else:
                done = self._call("move", self._client.batch_operate, keys, [ops.write(TOMBSTONE, now_ms())], None,
                                  {**self._keep, "exists": aerospike.POLICY_EXISTS_REPLACE, "expressions": guard})
            records = self._answers("move", done, len(keys), self._data_set)
            failed = [r for r in records if r.result not in _ANSWERED]
            if failed:  # copied, not deleted: the record stays claimed and the next pass finishes it
                raise self._record_failure("move", failed[0], self._data_set)
            gone = {(r[0], r[1], r[2]) for r in unclaimed}
            self._count_holes(HOLES, [moves[i].source for i, record in zip(moved, records, strict=True)
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
            journals = self._batch_get("move", [self.key(self._system_set, t) for t in order])
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
        found = self._batch_get("move", [self._meta_key(magazine, shard) for magazine, shard in shards])
        fire = {key: int((bins or {}).get(FIRE_POINTER, 0)) for key, bins in zip(shards, found, strict=True)}
        return [ref for ref in refs if ref[2] > fire[(ref[0], ref[1])]]

    def _batch_get(self, operation: str, keys: list[tuple[str, str, str]], bins: list[str] | None = None,
                   policy: dict[str, Any] | None = None) -> list[dict[str, Any] | None]:
        """The bins of each key (only `bins`, when given; None: the server said not found, or a tombstone).
        Any other answer, or none, raises: an outage never reads as an empty slot."""
        out: list[dict[str, Any] | None] = []
        set_name = keys[0][1] if keys else ""
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            done = (self._call(operation, self._client.batch_read, chunk) if bins is None and policy is None
                    else self._call(operation, self._client.batch_read, chunk, bins, policy))
            for record in self._answers(operation, done, len(chunk), set_name):
                if record.result == 0:
                    found = record.record[2] if record.record is not None else None
                    out.append(None if self._tombstoned(found) else found)
                elif record.result == NOT_FOUND:
                    out.append(None)
                else:
                    raise self._record_failure(operation, record, set_name)
        return out

    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        if not refs:
            return []
        try:
            found = self._batch_get("read", [self._data_key(ref) for ref in refs])
        except ex.AerospikeError as exc:
            raise self._fail(exc, "read", self._data_set) from None
        return [None if bins is None else self._envelope(bins, None, ref)
                for ref, bins in zip(refs, found, strict=True)]

    def peek(self, magazine: str, shard: int, first: int, last: int) -> list[tuple[SlotRef, Envelope]]:
        refs = [SlotRef(magazine, shard, slot) for slot in range(max(first, 1), last + 1)]
        if not refs:
            return []
        try:
            found = self._batch_get("peek", [self._data_key(ref) for ref in refs])
        except ex.AerospikeError as exc:
            raise self._fail(exc, "peek", self._data_set) from None
        return [(ref, self._envelope(bins, None, ref)) for ref, bins in zip(refs, found, strict=True)
                if bins is not None]

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        if not refs:
            return []
        out = []
        try:
            keys = [self._data_key(ref) for ref in refs]
            for start in range(0, len(keys), BATCH_CHUNK):
                chunk = keys[start:start + BATCH_CHUNK]
                done = self._call("settled", self._client.batch_read, chunk, _SETTLED_BINS)
                for record in self._answers("settled", done, len(chunk), self._data_set):
                    if record.result not in (0, NOT_FOUND):
                        raise self._record_failure("settled", record, self._data_set)
                    bins = record.record[2] if record.result == 0 and record.record is not None else None
                    out.append(bool(bins) and bins.get(TOMBSTONE) is not None)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "settled", self._data_set) from None
        return out

    def _remove_one(self, operation: str, key: tuple[str, str, str], only: Any = None) -> bool:
        """Delete so it stays deleted: a durable delete, or a tombstone. True if it was present. `only`: a
        compiled filter the record must also pass (see _this_message)."""
        try:
            if self._durable:
                policy = self._durable_remove if only is None else {**self._durable_remove, "expressions": only}
                self._call(operation, self._client.remove, key, policy=policy)
            else:
                policy = self._replace_live if only is None else {**self._replace_live, "expressions": only}
                self._call(operation, self._client.put, key, {TOMBSTONE: now_ms()}, None, policy)
            return True
        except _MISSING:
            return False

    def _remove_many(self, operation: str, keys: list[tuple[str, str, str]], only: Sequence[Any] | None = None) -> int:
        present = 0
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            if only is not None:  # a filter per record: one batch_write of per-record policies
                filters = only[start:start + BATCH_CHUNK]
                base = {"durable_delete": True} if self._durable else self._replace_live
                action = [] if self._durable else [{"op": aerospike.OPERATOR_WRITE, "bin": TOMBSTONE, "val": now_ms()}]
                batch = BatchRecords([Remove(key, policy={"durable_delete": True, "expressions": f}) if self._durable
                                      else Write(key, action, policy={**base, "expressions": f})
                                      for key, f in zip(chunk, filters, strict=True)])
                done = self._call(operation, self._client.batch_write, batch) or batch
            elif self._durable:
                done = self._call(operation, self._client.batch_remove, chunk,
                                  policy_batch_remove={"durable_delete": True})
            else:
                done = self._call(operation, self._client.batch_operate, chunk, [ops.write(TOMBSTONE, now_ms())],
                                  None, self._replace_live)
            for record in self._answers(operation, done, len(chunk), self._data_set):
                if record.result == 0:
                    present += 1
                elif record.result not in (NOT_FOUND, FILTERED_OUT):
                    raise self._record_failure(operation, record, self._data_set)
        return present

    @staticmethod
    def _this_message(msg_id: str | None) -> Any:
        """A settle's filter: the live record of this message (None: any live record). After a store rollback
        lost a claimed record, its slot can hold a newer message (rollback.py): the claimer's late ack must
        not delete that one."""
        if msg_id is None:
            return _NOT_TOMBSTONED
        return exp.And(_LIVE, exp.Eq(exp.StrBin(MSG_ID), msg_id)).compile()

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[int | None] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        if not refs:
            return 0
        try:
            if ids is not None:  # (versions: a generation can repeat in a reused slot, so the id decides)
                filters = [self._this_message(i) for i in ids]
                if len(refs) == 1:
                    return int(self._remove_one("delete", self._data_key(refs[0]), filters[0]))
                return self._remove_many("delete", [self._data_key(ref) for ref in refs], filters)
            if len(refs) == 1:
                version = versions[0] if versions else None
                if version is not None and not self._durable:
                    # The record as claimed (same generation): a tombstone without the filter expression,
                    # which costs the client more than the rest of the call (measured). Written since
                    # (a sweeper's move claim, a purge): the filtered path decides.
                    try:
                        self._call("delete", self._client.put, self._data_key(refs[0]), {TOMBSTONE: now_ms()},
                                   {"gen": version}, self._replace_same)
                        return 1
                    except (ex.RecordGenerationError, ex.RecordNotFound):
                        pass
                return int(self._remove_one("delete", self._data_key(refs[0])))
            return self._remove_many("delete", [self._data_key(ref) for ref in refs])
        except ex.AerospikeError as exc:
            raise self._fail(exc, "delete", self._data_set) from None

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        # Create-only expression write with "no fail": stamps only a record that has no fireTS yet.
        stamp = expr_ops.expression_write(FIRE_TS, exp.Val(now_ms_).compile(),
                                          aerospike.EXP_WRITE_CREATE_ONLY | aerospike.EXP_WRITE_POLICY_NO_FAIL)
        try:
            _, _, bins = self._call("stamp_unfired", self._client.operate, self._data_key(ref),
                                    [stamp, *_READ_ENVELOPE], None, self._update_live)
        except _MISSING:
            return None
        except ex.AerospikeError as exc:
            raise self._fail(exc, "stamp_unfired", self._data_set) from None
        return self._envelope(bins, None, ref)

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        if shards <= 0:
            return {}
        keys = [self._meta_key(magazine, shard) for shard in range(shards)]
        marks = self._shared.marks
        before = [(marks.mark((k[1], k[2], LOAD_POINTER)), marks.mark((k[1], k[2], FIRE_POINTER))) for k in keys]
        try:
            found = self._batch_get("pointers", keys)
            out = {}
            for shard, (key, bins, (load_high, fire_high)) in enumerate(zip(keys, found, before, strict=True)):
                load, fire = int((bins or {}).get(LOAD_POINTER, 0)), int((bins or {}).get(FIRE_POINTER, 0))
                if bins is not None and (load < load_high or fire < fire_high):  # (absent: a purge, no telling)
                    which, stored = ("load", load) if load < load_high else ("fire", fire)
                    if not self._renumbered(magazine, shard, stored + 1, (key[1], key[2], f"{which.upper()}_POINTER")):
                        self._roll_forward(magazine, shard, f"{which} pointer", stored)
                        load, fire = max(load, load_high), max(fire, min(fire_high, max(load, load_high)))
                marks.saw((key[1], key[2], LOAD_POINTER), load)
                marks.saw((key[1], key[2], FIRE_POINTER), fire)
                out[shard] = ShardPointers(load, fire, int((bins or {}).get(HOLES, 0)),
                                           int((bins or {}).get(HOLES_CLAIMED, 0)))
        except ex.AerospikeError as exc:
            raise self._fail(exc, "pointers", self._meta_set) from None
        return out

    # ---- delayed messages (ignis.delay) -------------------------------------------------------
    def _delay_index(self) -> str:
        """The delay index's name, created the first time this process needs it (IndexFoundError: there)."""
        name = f"{self._data_set}_due"
        if self._data_set not in self._shared.delay_indexes and not self._index_on_every_node(name):
            try:
                self._call("ensure_index", self._client.index_single_value_create, self._ns, self._data_set,
                           DELAY_INDEX_BIN, aerospike.INDEX_NUMERIC, name)
            except ex.IndexFoundError:
                pass
            except ex.AerospikeError as exc:
                mapped = map_error(exc, "index create", self._url)
                kind = type(mapped) if isinstance(mapped, StoreUnavailable) else StoreError
                raise kind(f"cannot create secondary index {name!r} on {self._ns}.{self._data_set}."
                           f"{DELAY_INDEX_BIN} (delayed messages need it): {mapped}") from None
        self._shared.delay_indexes.add(self._data_set)
        return name

    def _delay_meta(self, queue: str) -> tuple[str, str, str]:
        return self.key(self._meta_set, names.delayed_meta_key(queue))

    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        if not envelopes:
            return
        self._delay_index()
        policy = {**self._wp, "ttl": self._ttl(ttl_seconds)}  # create or replace: a retry writes the same record
        items = [(self.key(self._data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id)),
                  {**env.to_bins(), DELAY_INDEX_BIN: env.due_at or 0, DELAY_QUEUE_BIN: queue}) for env in envelopes]
        try:  # the count first (Storage.load_delayed): not repeated when in doubt, a count too high is harmless
            self._call("load_delayed", self._client.operate, self._delay_meta(queue),
                       [ops.increment(DELAYED_COUNT, len(items))], None, self._never, idempotent=False)
            if len(items) == 1:
                self._call("load_delayed", self._client.put, items[0][0], items[0][1], None, policy)
                return
            write = aerospike.OPERATOR_WRITE
            for start in range(0, len(items), BATCH_CHUNK):
                chunk = items[start:start + BATCH_CHUNK]
                batch = BatchRecords([Write(key, [{"op": write, "bin": k, "val": v} for k, v in bins.items()],
                                            policy=policy) for key, bins in chunk])
                done = self._call("load_delayed", self._client.batch_write, batch) or batch
                failed = [r for r in self._answers("load_delayed", done, len(chunk), self._data_set) if r.result]
                if failed:
                    raise self._record_failure("load_delayed", failed[0], self._data_set)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "load_delayed", self._data_set) from None

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        found: list[Envelope] = []
        wanted = exp.And(exp.Eq(exp.StrBin(DELAY_QUEUE_BIN), queue), _LIVE).compile()

        def run() -> None:
            found.clear()
            query = self._client.query(self._ns, self._data_set)
            query.select(*ENVELOPE_BINS)
            query.where(aerospike.predicates.between(DELAY_INDEX_BIN, 0, now_ms_))

            def take(record: tuple) -> bool:
                found.append(self._envelope(record[2], None, record[0][2]))
                return len(found) < limit  # False stops the query

            query.foreach(take, {"expressions": wanted})

        try:
            self._delay_index()
            with self._query_running():
                self._call("due_delayed", run)
            if found:
                found = self._still_delayed(queue, found)
        except (ex.IndexNotFound, ex.IndexNotReadable):
            return []  # the index is still being built: nothing is known to be due yet
        except ex.AerospikeError as exc:
            raise self._fail(exc, "due_delayed", self._data_set) from None
        return sorted(found, key=lambda env: env.due_at or 0)

    def _still_delayed(self, queue: str, found: list[Envelope]) -> list[Envelope]:
        """Those of a query's answers that are still delayed records (not settled), by a batch read that consults
        every copy of a record: while partitions migrate, a query can answer from a copy that has not seen the
        settle yet, and the message would be moved twice. ("How duplicates should be consulted in a read
        operation. Only makes a difference during migrations": read_mode_ap ALL, Aerospike client policies.)
        Aerospike errors raw."""
        keys = [self.key(self._data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id)) for env in found]
        live = self._batch_get("due_delayed", keys, [DELAY_QUEUE_BIN, TOMBSTONE, PURGED], _READ_ALL_COPIES)
        return [env for env, bins in zip(found, live, strict=True) if bins is not None]

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        keys = [self.key(self._data_set, names.delayed_key(queue, env.due_at or 0, env.msg_id)) for env in envelopes]
        try:
            gone = self._remove_many("settle_delayed", keys)
            if gone:
                self._call("settle_delayed", self._client.operate, self._delay_meta(queue),
                           [ops.increment(DELAYED_COUNT, -gone)], None, self._never, idempotent=False)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "settle_delayed", self._data_set) from None
        return gone

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        free = exp.Or(exp.Not(exp.BinExists(DELAY_LEADER)), exp.Eq(exp.StrBin(DELAY_LEADER), holder),
                      exp.LT(exp.IntBin(DELAY_UNTIL), now_ms_)).compile()
        try:
            self._call("lead_delayed", self._client.operate, self._delay_meta(queue),
                       [ops.write(DELAY_LEADER, holder), ops.write(DELAY_UNTIL, now_ms_ + hold_ms)], None,
                       {**self._never, "expressions": free})
            return True
        except ex.FilteredOut:
            return False
        except ex.AerospikeError as exc:
            raise self._fail(exc, "lead_delayed", self._meta_set) from None

    def change_mark(self) -> int | None:
        return None  # (a server's writes are not counted where a client could read them for free)

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        if not queues:
            return []
        try:
            found = self._batch_get("delay_states", [self._delay_meta(q) for q in queues])
        except ex.AerospikeError as exc:
            raise self._fail(exc, "delay_states", self._meta_set) from None
        return [DelayState(max(int((bins or {}).get(DELAYED_COUNT) or 0), 0), None) for bins in found]

    def _purge_delayed(self, queue: str) -> int:
        """A queue's delayed messages (by the index) and its delay record."""
        keys: list[Any] = []

        def run() -> None:
            keys.clear()
            query = self._client.query(self._ns, self._data_set)
            query.select(DELAY_QUEUE_BIN)
            query.where(aerospike.predicates.between(DELAY_INDEX_BIN, 0, 2**62))
            query.foreach(lambda record: keys.append(record[0][:3]),
                          {"expressions": exp.Eq(exp.StrBin(DELAY_QUEUE_BIN), queue).compile()})

        try:
            self._delay_index()
            self._call("purge_magazine", run)
        except (ex.IndexNotFound, ex.IndexNotReadable):
            pass
        removed = self._purge_keys([(k[0], k[1], k[2]) for k in keys]) if keys else 0
        with contextlib.suppress(ex.RecordNotFound):
            self._call("purge_magazine", self._client.remove, self._delay_meta(queue))
        return removed

    def purge_magazine(self, magazine: str) -> int:
        """Find the magazine's shards by a scan of the meta set (small: one record per shard), then turn
        every record of data slots 1..LOAD_POINTER and the meta records into purge tombstones (durable
        deletes on Enterprise): deletes that stay deleted, and a slot numbering that starts afresh."""
        prefix, suffix = names.magazine_prefix(magazine), "_METADATA"
        # The numbering starts afresh on purpose: forget the pointers this process saw (no rollback).
        self._shared.marks.forget(lambda k: k[0] == self._meta_set and str(k[1]).startswith(prefix))

        def scan() -> list[Any]:
            query = self._client.query(self._ns, self._meta_set)
            query.select(LOAD_POINTER, TOMBSTONE, PURGED)
            return query.results()

        try:
            shards: dict[int, int] = {}
            for key, _, bins in self._call("purge_magazine", scan):
                user_key = key[2]
                if not isinstance(user_key, str) or not user_key.startswith(prefix) or not user_key.endswith(suffix):
                    continue
                shard_text = user_key[len(prefix):-len(suffix)]
                if shard_text.isdigit() and not self._tombstoned(bins):
                    shards[int(shard_text)] = int(bins.get(LOAD_POINTER, 0))
            removed = 0
            for shard, load in sorted(shards.items()):
                keys = [self._data_key(SlotRef(magazine, shard, slot)) for slot in range(1, load + 1)]
                removed += self._purge_keys(keys)
            self._purge_keys([self._meta_key(magazine, shard) for shard in sorted(shards)])
            with contextlib.suppress(ex.RecordNotFound):
                self._call("purge_magazine", self._client.remove, self.key(self._meta_set, names.beacon_key(magazine)))
            if names.queue_and_kind(magazine)[1] == "main":
                removed += self._purge_delayed(magazine)
        except ex.AerospikeError as exc:
            raise self._fail(exc, "purge_magazine", self._data_set) from None
        return removed

    def _purge_keys(self, keys: list[tuple[str, str, str]]) -> int:
        """Purge tombstones (or durable deletes) over every record at `keys`, in two passes: the live
        records, counted; then ack tombstones and seals, which a new message at the slot must not meet.
        Returns the live records removed."""
        live = 0
        passes = ((_NOT_TOMBSTONED, True), (exp.BinExists(TOMBSTONE).compile(), False))
        for start in range(0, len(keys), BATCH_CHUNK):
            chunk = keys[start:start + BATCH_CHUNK]
            for guard, count in passes:
                if self._durable:
                    records: list[Any] = [Remove(key, policy={**self._durable_remove, "expressions": guard})
                                          for key in chunk]
                else:
                    purge = [ops.write(PURGED, now_ms())]
                    policy = {**self._keep, "exists": aerospike.POLICY_EXISTS_REPLACE, "expressions": guard}
                    records = [Write(key, purge, policy=policy) for key in chunk]
                batch = BatchRecords(records)
                done = self._call("purge_magazine", self._client.batch_write, batch) or batch
                for record in self._answers("purge_magazine", done, len(records), self._data_set):
                    if record.result == 0:
                        live += count
                    elif record.result not in (NOT_FOUND, FILTERED_OUT):
                        raise self._record_failure("purge_magazine", record, self._data_set)
        return live


def open_aerospike(location: str, params: dict[str, str], *, farm_id: str, client_id: str) -> AerospikeStore:
    """An AerospikeStore from the parts of an `aerospike://` URL (see `ignis.storage.open_store`)."""
    userinfo, at, hostpart = location.rpartition("@")
    hosts, _, namespace = (hostpart if at else location).partition("/")
    overrides: dict[str, Any] = dict(params)
    config_file = overrides.pop("config", None)
    unknown = sorted(set(overrides) - set(AerospikeSettings.model_fields))
    if unknown:
        raise InvalidInputError(f"aerospike store URL: unknown option(s) {', '.join(unknown)}")
    if hosts:
        overrides["hosts"] = hosts
    if namespace.strip("/"):
        overrides["namespace"] = namespace.strip("/")
    if at:
        user, _, password = userinfo.partition(":")
        overrides["user"] = unquote(user)
        if password:
            overrides["password"] = unquote(password)
    return AerospikeStore(load_settings(overrides, config_file), farm_id=farm_id, client_id=client_id)
