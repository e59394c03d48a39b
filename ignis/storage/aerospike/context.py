"""What every concern of the Aerospike backend shares: the connection and its settings, the names of this
(farmId, clientId) view, the write policies, the key builders, and the plumbing every round trip goes through
(`call`: counted and retried where safe; `fail`, `answers`, `record_failure`: Aerospike errors and batch answers
mapped to `ignis.errors`), with the bins and compiled expressions of more than one concern (tombstones, seals,
purge marks, envelopes). It is separate so that each concern module depends on it alone, never on the facade:
the error mapping, retries and layout constants are written once and imported by every concern."""

from __future__ import annotations

import contextlib
import itertools
import operator
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as ops
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

from ignis import names
from ignis.envelope import (
    ATTEMPTS,
    CODEC,
    CODEC_BYTES,
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
    SUBJECT,
    Envelope,
    envelope_problem,
    unreadable_envelope,
)
from ignis.errors import IgnisError, InvalidInputError, StoreUnavailable
from ignis.metrics import STORAGE_CALLS, STORAGE_ERRORS, STORAGE_RETRIES
from ignis.storage.aerospike.config import AerospikeSettings
from ignis.storage.aerospike.deferred import DeferredClaims
from ignis.storage.aerospike.errors import is_transient, map_error, record_error
from ignis.storage.base import SlotRef
from ignis.storage.rollback import HighMarks

T = TypeVar("T")

TOMBSTONE = "deletedAt"  # the one bin of a tombstoned record (Community Edition acks and deletes)
SEALED = "sealedAt"  # with deletedAt: a slot given up as a hole for good; refuses a late write
# With sealedAt, in a topic's slot: sealed by a subscription that found its message missing (gone, as far as it can
# tell), so every subscription counts it lost; a seal without it is a publisher's reservation given up (no message).
LOST = "lostAt"
PURGED = "purgedAt"  # the one bin a magazine purge leaves; a new message may replace it
ENVELOPE_BINS = (PAYLOAD, MSG_ID, LOADED_AT, CODEC, HEADERS, PARTITION_KEY, REASON, HISTORY, FIRE_TS, ATTEMPTS,
                 DUE_AT, SUBJECT)
# envelope's order of the bins, read in one step from an answer that holds them all
ENVELOPE_ORDER = (PAYLOAD, MSG_ID, LOADED_AT, CODEC, HEADERS, PARTITION_KEY, FIRE_TS, ATTEMPTS, REASON, HISTORY, DUE_AT,
                  SUBJECT)
_ENVELOPE_VALUES = operator.itemgetter(*ENVELOPE_ORDER)
_ENVELOPE_COUNT = len(ENVELOPE_ORDER)
BATCH_CHUNK = 5000  # keys per batch call in peeks and purges
# A batch of at most this many records is processed in the server thread that receives it (allow_inline_ssd): a
# device namespace otherwise hands every batch to separate service threads, which cost a publish batch of 8
# about a quarter of its time (386 -> 281 us, measured on CE 8.1), a read of 32 records 0.72 against 0.14 ms, of
# 100 1.06 against 0.51 ms, of 250 1.89 against 1.03 ms; at 1,000 the service threads win (9.1 against 10.9 ms).
# So batches up to a fire_many's or an ack's usual size go inline, larger ones not: "inline processing can
# introduce the possibility of unfairness because the server can process the entire batch before moving onto
# the next command" (Aerospike client BatchPolicy.allowInlineSSD docs; server 6.0+, older ignore it), and a batch
# of 256 small records holds one service thread about a millisecond.
INLINE_BATCH_MAX = 256
RECORD_OVERHEAD = 128  # record header + key + per-bin overhead estimate, for the size pre-check
SIZE_CHECK_MARGIN = 64 * 1024  # a payload this far below the limit skips the estimate (the server refuses the rest)

_VAL = 200  # a compiled expression's value item (aerospike_helpers.expressions.resources._ExprOp.VAL)


class ExpressionTemplate:
    """An expression of values that change per call (a message id, a time, a slot), compiled once around
    placeholders: `template(*values)` is the compiled list with the values in their places. Compiling per call cost
    the client more than the call it filters (measured); the client still converts the list on every call."""

    def __init__(self, build: Callable[..., Any], *placeholders: Any) -> None:
        compiled = build(*placeholders).compile()
        # (ValueError: no such placeholder in it)
        self._at = [compiled.index((_VAL, None, {"val": p}, 0)) for p in placeholders]
        self._compiled = compiled
        self._head, self._tail = compiled[:self._at[0]], compiled[self._at[0] + 1:]

    def __call__(self, *values: Any) -> list[Any]:
        if len(values) == 1:  # (the usual case, in one step)
            return [*self._head, (_VAL, None, {"val": values[0]}, 0), *self._tail]
        out = list(self._compiled)
        for at, value in zip(self._at, values, strict=True):
            out[at] = (_VAL, None, {"val": value}, 0)
        return out


LIVE = exp.Not(exp.Or(exp.BinExists(TOMBSTONE), exp.BinExists(PURGED)))
NOT_TOMBSTONED = LIVE.compile()
READ_ENVELOPE = [ops.read(b) for b in ENVELOPE_BINS]
MISSING = (ex.RecordNotFound, ex.FilteredOut)
NOT_FOUND, RECORD_EXISTS, BIN_INCOMPATIBLE, FILTERED_OUT = 2, 5, 12, 27  # per-record result codes of batch calls
ANSWERED = (0, NOT_FOUND, FILTERED_OUT)  # a record's answer; any other code is a failure to answer


def _connect(config: dict[str, Any]) -> Any:
    """The real client. Tests replace this module attribute to plug in the emulator."""
    client = aerospike.client(config)  # recent clients connect here already
    return client if client.is_connected() else client.connect()


client_factory: Callable[[dict[str, Any]], Any] = _connect


class Shared:
    """What every clientId view of one store shares: the client, settings, edition and retry policy."""

    def __init__(self, client: Any, settings: AerospikeSettings, owns_client: bool) -> None:
        self.client = client
        self.settings = settings
        self.owns_client = owns_client
        self.closed = False
        self.lock = threading.Lock()
        self.views: dict[str, Any] = {}  # clientId -> its AerospikeStore
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
        self.deferred: DeferredClaims | None = None  # subscriptions' late claim records (the owner store sets it)
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


class AerospikeContext:
    """One (farmId, clientId) view of a store, shared by its concern objects: the client (tests may swap it here),
names, policies and the round-trip plumbing. Built by `AerospikeStore`; connects when no `Shared` is given."""

    def __init__(self, settings: AerospikeSettings, farm_id: str, client_id: str, client: Any,
                 shared: Shared | None) -> None:
        self.farm_id = names.check_id("farmId", farm_id)
        self.client_id = names.check_id("clientId", client_id)
        self.ns = settings.namespace
        self.queue_set = names.queue_set(farm_id, client_id)
        self.index_name = names.active_index(farm_id, client_id)
        self.data_set = names.data_set(client_id)
        self.meta_set = names.meta_set(client_id)
        self.system_set = names.system_set(farm_id)
        self.url = settings.redacted_url(farm_id, client_id)
        self.owner = shared is None  # views made by with_client share the owner's connection
        if shared is None:
            owns = client is None
            if client is None:
                try:
                    client = client_factory(settings.client_config())
                except ex.AerospikeError as exc:
                    raise map_error(exc, "connect", self.url) from None
            try:
                shared = Shared(client, settings, owns)
            except BaseException:
                if owns:
                    client.close()  # do not leak the connection pool of a store that failed to open
                raise
        self.shared = shared
        self.client = shared.client
        self.durable = shared.durable_delete
        s = settings
        self.retrying = Retrying(stop=stop_after_attempt(max(s.retries, 1)), wait=wait_fixed(s.retry_sleep_ms / 1000),
                                 reraise=True)
        self._counters: dict[str, Any] = {}
        # Write policies; each carries its TTL ("ttl": -2 keeps the record's own, -1 never expires).
        wp = {"commit_level": aerospike.POLICY_COMMIT_LEVEL_ALL, "key": aerospike.POLICY_KEY_SEND}
        self.wp = wp
        self.keep = {**wp, "ttl": aerospike.TTL_DONT_UPDATE}
        self.never = {**wp, "ttl": aerospike.TTL_NEVER_EXPIRE}
        self.update = {**self.keep, "exists": aerospike.POLICY_EXISTS_UPDATE}
        self.update_live = {**self.update, "expressions": NOT_TOMBSTONED}
        self.replace = {**self.keep, "exists": aerospike.POLICY_EXISTS_REPLACE}
        self.replace_same = {**self.replace, "gen": aerospike.POLICY_GEN_EQ}
        self.replace_live = {**self.replace, "expressions": NOT_TOMBSTONED}
        policies = settings.client_config()["policies"]
        self.batch = policies["batch"]  # (a policy given to a call replaces it)
        # A read that decides a topic slot is gone (a claim passes over it, a start or a seek lands past it) consults
        # every copy of the record: while a partition migrates (a node back in the cluster) its new master may not
        # hold it yet, and a read of one node says "not found" for a message that is there. "How duplicates should
        # be consulted in a read operation. Only makes a difference during migrations and only applicable in AP
        # mode" (the clients' ReadModeAP). Found losing a subscription's message in the 3-node fault run.
        self.batch_all = {**self.batch, "read_mode_ap": aerospike.POLICY_READ_MODE_AP_ALL}
        self.read_all = {**policies["read"], "read_mode_ap": aerospike.POLICY_READ_MODE_AP_ALL}  # (one record's)
        self.durable_remove = {**wp, "durable_delete": True}
        self.small_batch = {**self.batch, "allow_inline": True, "allow_inline_ssd": True}
        self.small_batch_all = {**self.batch_all, "allow_inline": True, "allow_inline_ssd": True}
        self.write_grace_ms = s.write_grace_ms  # (the producer's write deadline)

    def batch_policy(self, count: int, policy: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The parent policy of a batch of `count` records: `policy` (None: the client's default), processed inline
        when small (INLINE_BATCH_MAX)."""
        if count > INLINE_BATCH_MAX:
            return policy
        if policy is None:
            return self.small_batch
        if policy is self.batch_all:
            return self.small_batch_all
        return {**policy, "allow_inline": True, "allow_inline_ssd": True}

    @contextlib.contextmanager
    def query_running(self) -> Iterator[None]:
        """Around a query of a background thread: refused once closing, and waited for by close()."""
        shared = self.shared
        with shared.lock:
            if shared.closed:
                raise StoreUnavailable(f"{self.url}: the store handle is closed")
            shared.queries += 1
        try:
            yield
        finally:
            with shared.lock:
                shared.queries -= 1
                shared.queries_done.notify_all()

    def key(self, set_name: str, key: str) -> tuple[str, str, str]:
        return (self.ns, set_name, key)

    def data_key(self, ref: SlotRef) -> tuple[str, str, str]:
        return (self.ns, self.data_set, names.data_key(ref[0], ref[1], ref[2]))

    def data_keys(self, refs: Iterable[SlotRef], magazine: str | None = None) -> list[tuple[str, str, str]]:
        """data_key of each ref (of `magazine`'s slot of the same shard and number, when given), built in one
        comprehension: this runs per message of every batch. The key is names.data_key's (test_aerospike_store
        checks it)."""
        ns, data_set = self.ns, self.data_set
        if magazine is None:
            return [(ns, data_set, f"{m}_SHARD_{shard}_{slot}") for m, shard, slot in refs]
        return [(ns, data_set, f"{magazine}_SHARD_{shard}_{slot}") for _, shard, slot in refs]

    def meta_key(self, magazine: str, shard: int) -> tuple[str, str, str]:
        return (self.ns, self.meta_set, names.meta_key(magazine, shard))

    def call(self, operation: str, fn: Callable[..., T], *args: Any, idempotent: bool = True, **kwargs: Any) -> T:
        """One storage round trip, counted; transient errors repeated where safe (see the package doc).
        Aerospike errors propagate raw so callers can branch on expected ones (not found, filtered)."""
        counter = self._counters.get(operation)
        if counter is None:
            counter = self._counters[operation] = STORAGE_CALLS.labels(operation)
        counter.tick()
        try:
            return fn(*args, **kwargs)
        except ex.AerospikeError as exc:
            if self.shared.settings.retries == 0 or not is_transient(exc, idempotent):
                if is_transient(exc, True):  # a failure of the store, not an answer (not found, filtered)
                    STORAGE_ERRORS.labels(operation).inc()
                raise
        return self._retry(operation, counter, fn, args, kwargs, idempotent)

    def _retry(self, operation: str, counter: Any, fn: Callable[..., T], args: tuple[Any, ...],
               kwargs: dict[str, Any], idempotent: bool) -> T:
        """call's retries, after its first try failed with a transient error. Apart from call because its closures
        would make call's variables cells, built on every store call."""

        def again() -> T:
            STORAGE_RETRIES.labels(operation).inc()
            counter.tick()
            return fn(*args, **kwargs)

        retrying = self.retrying.copy(retry=retry_if_exception(lambda e: is_transient(e, idempotent)))
        try:
            return retrying(again)
        except ex.AerospikeError as exc:
            if is_transient(exc, True):  # the retries ran out (or a retry failed in doubt)
                STORAGE_ERRORS.labels(operation).inc()
            raise

    def fail(self, exc: ex.AerospikeError, operation: str, set_name: str) -> Exception:
        return map_error(exc, operation, f"{self.url} set {set_name!r}")

    def answers(self, operation: str, done: Any, count: int, set_name: str) -> list[Any]:
        """The per-record answers of a batch call, one per key asked. A batch does not raise when the
        cluster is down: it answers with an overall result code and failing records, or with no records at
        all (the Python client 19). Missing answers are an outage, never "absent"."""
        records = getattr(done, "batch_records", None) or []
        if len(records) != count:
            STORAGE_ERRORS.labels(operation).inc()
            raise StoreUnavailable(f"aerospike {operation} on {self.url} set {set_name!r}: the batch answered "
                                   f"for {len(records)} of {count} record(s) (result code "
                                   f"{getattr(done, 'result', None)}): cluster unreachable or unstable")
        return records

    def record_failure(self, operation: str, record: Any, set_name: str) -> IgnisError:
        """The error for one record of a batch whose result code is not an answer (not 0, not found or
        filtered out): an outage (StoreUnavailable) or a failure of that record."""
        STORAGE_ERRORS.labels(operation).inc()
        key = record.key[2] if getattr(record, "key", None) else "?"
        return record_error(record.result, operation, f"{self.url} set {set_name!r}", f"record {key!r}")

    @staticmethod
    def tombstoned(bins: Mapping[str, Any] | None) -> bool:
        return bins is None or bins.get(TOMBSTONE) is not None or bins.get(PURGED) is not None

    @staticmethod
    def envelope(bins: Mapping[str, Any], version: Any = None, where: object = "?") -> Envelope:
        # Envelope.from_bins, for what the client hands back: a batch write answers every operation (a
        # read of a missing bin, a write: None), so an absent bin may be there as None; blobs may come
        # back as bytearray. One pass, no intermediate dict: this runs once per delivered message. A record
        # that is not an envelope (another tool wrote it, or it is damaged) is carried on as an unreadable one
        # (envelope.unreadable_envelope): never as something else.
        # A batch's answer holds every bin asked (a missing one as None): read in one step, tried on a count of its
        # bins rather than checked key by key (a set comparison cost twice the item lookups it guarded, counted).
        get = bins.get
        if len(bins) >= _ENVELOPE_COUNT:
            try:
                payload, msg_id, loaded_at, codec, headers, key, fire_ts, attempts, reason, history, due_at, \
                    subject = _ENVELOPE_VALUES(bins)
                codec, attempts, get = codec or CODEC_BYTES, attempts or 0, None
            except KeyError:  # as many bins, not all of these
                pass
        if get is not None:  # (one record's answer leaves missing bins out)
            payload, msg_id, loaded_at, codec = get(PAYLOAD), get(MSG_ID), get(LOADED_AT), get(CODEC) or CODEC_BYTES
            headers, key, fire_ts, attempts = get(HEADERS), get(PARTITION_KEY), get(FIRE_TS), get(ATTEMPTS) or 0
            reason, history, due_at, subject = get(REASON), get(HISTORY), get(DUE_AT), get(SUBJECT)
        if type(payload) is not bytes or type(msg_id) is not str or not msg_id or type(loaded_at) is not int \
                or type(attempts) is not int or codec not in STORED_CODECS \
                or (fire_ts is not None and type(fire_ts) is not int) \
                or (headers is not None and type(headers) is not dict) \
                or (key is not None and type(key) is not str) or (reason is not None and type(reason) is not str) \
                or (history is not None and type(history) is not list) \
                or (due_at is not None and type(due_at) is not int) \
                or (subject is not None and type(subject) is not str):
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
                            due_at, subject)
        envelope.version = version
        return envelope

    def check_size(self, magazine: str, bins: Mapping[str, Any]) -> None:
        payload = bins.get(PAYLOAD) or b""
        limit = self.shared.settings.max_record_bytes
        if len(payload) + SIZE_CHECK_MARGIN < limit:  # far from the limit: no estimate (the server still checks)
            return
        size = RECORD_OVERHEAD + len(payload) + sum(len(k) + len(repr(v)) for k, v in bins.items() if k != PAYLOAD)
        if size > limit:
            raise InvalidInputError(
                f"message for magazine {magazine!r} needs a record of about {size} bytes; the Aerospike "
                f"namespace {self.ns!r} accepts at most {limit} bytes per record (max-record-size): publish "
                f"a smaller payload ({len(payload)} bytes now)")

    @staticmethod
    def ttl(seconds: int) -> int:
        return seconds if seconds > 0 else aerospike.TTL_NEVER_EXPIRE
