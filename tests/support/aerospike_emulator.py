"""An in-memory Aerospike server and client for tests: exactly the subset of the `aerospike` client API
that `ignis.storage.aerospike` uses, following the documented server semantics.

Emulated: records with generation and void time (TTL -1 never, -2 don't update, 0 namespace default,
>0 seconds; a TTL is refused with ForbiddenError when the namespace has nsup-period 0); exists policies
(IGNORE, CREATE, UPDATE, REPLACE, CREATE_OR_REPLACE) and generation policies (EQ, GT) raising the real
`aerospike.exception` classes; filter expressions (policy "expressions", applied to existing records;
false or unknown -> FilteredOut); operate with read / write / increment / map put / expression
read / expression write; batch_read / batch_write / batch_operate / batch_remove; remove with
durable_delete (Enterprise only); secondary STRING indexes and equality queries; scans; info_all
("edition"); bin-name limit 15, set-name limit 63, record size limit, missing namespaces.

Community Edition's cold-restart behaviour: a record removed without a durable delete is remembered as a
"ghost", and `cold_restart()` brings every unexpired ghost back — as a real CE server does when it
rebuilds its index from the device. A later write of the same key supersedes the ghost.

Anything outside this subset raises NotImplementedError naming what is missing, so the emulator never
silently answers something a server would not.
"""

from __future__ import annotations

import copy
import hashlib
import re
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aerospike
import msgpack
from aerospike import exception as ex
from aerospike_helpers.batch.records import BatchRecord, BatchRecords, Read, Remove, Write

MAX_BIN_NAME = 15
MAX_SET_NAME = 63
TTL_NEVER = {-1, aerospike.TTL_NEVER_EXPIRE}
TTL_KEEP = {-2, aerospike.TTL_DONT_UPDATE}
TTL_DEFAULT = {0, None, -3, aerospike.TTL_CLIENT_DEFAULT}
UNKNOWN = object()  # an expression's "unknown" value (a missing bin, a type mismatch)

# Compiled expression op codes (aerospike_helpers.expressions.resources._ExprOp).
EQ, NE, GT, GE, LT, LE, CMP_REGEX = 1, 2, 3, 4, 5, 6, 7
AND, OR, NOT = 16, 17, 18
ADD, SUB, MUL, DIV, MIN, MAX = 20, 21, 22, 23, 50, 51
VAR, LET, DEF = 124, 125, 126
REC_KEY, BIN, BIN_EXISTS = 80, 81, 83
LAST_UPDATE = 66  # META_LAST_UPDATE_TIME: the record's last-update time, ns (the server keeps it to the millisecond)
COND, END, TRUE, FALSE, AS_VAL, VAL, EXP_UNKNOWN = 123, 150, 151, 152, 128, 200, 0
CDT_FLAGS = (139, 144)
RESULT_TYPES = {2: int, 3: str, 4: list, 5: dict, 6: (bytes, bytearray), 7: float}


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _err(cls: type[ex.AerospikeError], message: str, in_doubt: bool = False) -> ex.AerospikeError:
    # As the C client raises them: args (code, msg, file, line, in_doubt) and the same as attributes.
    error = cls(cls.code, message, "aerospike_emulator", 0, in_doubt)
    error.code, error.msg, error.file, error.line, error.in_doubt = cls.code, message, "aerospike_emulator", 0, in_doubt
    return error


@dataclass
class Record:
    bins: dict[str, Any]
    gen: int = 1
    void_ms: int = 0  # 0 = never expires; else a whole second (epoch ms), as the server keeps it
    user_key: Any = None  # stored only when written with POLICY_KEY_SEND
    updated_ms: int = 0  # its last-update time (epoch ms)

    def meta(self) -> _Meta:
        return _Meta(self.user_key, self.updated_ms)

    def expired(self, now: int) -> bool:
        # As the server: void time and clock in whole seconds, expired only once the clock has passed the
        # void time (as_record_is_expired: void_time < now), so a TTL of n s lives between n and n + 1 s.
        return self.void_ms != 0 and self.void_ms // 1000 < now // 1000

    def ttl(self, now: int) -> int:
        return -1 if self.void_ms == 0 else max((self.void_ms - now) // 1000, 0)


@dataclass
class _Fault:
    method: str
    error: type[ex.AerospikeError]
    apply_first: bool  # True: the call takes effect, then fails in doubt (a lost reply)
    times: int
    after: int = 0  # calls of the method that pass first


# How the Python client 19 answers while the cluster is down (seen on a real 8.1 server, stopped): at first,
# while its node list still has the node, single calls raise ConnectionError (-10) and batch calls return an
# overall -10 with every record -15 (no response); once the tend thread dropped the node (about a second),
# single calls raise InvalidNodeError (-8, "Node not found for partition") and batch calls return an overall
# result 1 with no records at all. info_all then answers an empty dict. Batch calls never raise for it.
OUTAGE_REFUSED = "refused"
OUTAGE_NO_NODE = "no-node"
NO_RESPONSE = -15


@dataclass
class _RecordFault:
    method: str
    code: int
    times: int


@dataclass
class EmulatedServer:
    """One cluster's state, shared by every client connected to it."""

    namespaces: tuple[str, ...] = ("test",)
    edition: str = "community"
    nsup_period: int = 120
    default_ttl: int = 0
    max_record_bytes: int = 1 << 20
    records: dict[tuple[str, str, Any], Record] = field(default_factory=dict)
    ghosts: dict[tuple[str, str, Any], Record] = field(default_factory=dict)
    indexes: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    configs: list[dict[str, Any]] = field(default_factory=list)
    clients: list[EmulatedClient] = field(default_factory=list)
    reachable: bool = True
    building: set[str] = field(default_factory=set)  # index names still being built: queries refused
    lock: threading.RLock = field(default_factory=threading.RLock)
    faults: list[_Fault] = field(default_factory=list)
    record_faults: list[_RecordFault] = field(default_factory=list)
    # While `reachable` is False: how the client answers (OUTAGE_*); None = every call raises TimeoutError.
    outage: str | None = None

    def client(self, config: dict[str, Any]) -> EmulatedClient:
        """What `aerospike.client(config).connect()` returns."""
        if not self.reachable:
            raise _err(ex.ConnectionError, "Failed to connect")
        self.configs.append(config)
        self.clients.append(EmulatedClient(self, config))
        return self.clients[-1]

    def fail_next(self, method: str, error: type[ex.AerospikeError], *, apply_first: bool = False,
                  times: int = 1, after: int = 0) -> None:
        """Make the next `times` calls of `method` fail with `error` (in doubt if `apply_first`), once `after`
        calls of it have passed."""
        self.faults.append(_Fault(method, error, apply_first, times, after))

    def fail_records(self, method: str, code: int = NO_RESPONSE, times: int = 1) -> None:
        """Make the next `times` batch calls of `method` answer every record with result `code`, applying
        nothing (as the client does when the nodes do not answer)."""
        self.record_faults.append(_RecordFault(method, code, times))

    def go_down(self, style: str = OUTAGE_NO_NODE) -> None:
        """The cluster stops answering, the way the real client reports it (OUTAGE_REFUSED or OUTAGE_NO_NODE)."""
        self.reachable, self.outage = False, style

    def come_back(self) -> None:
        self.reachable, self.outage = True, None

    def cold_restart(self) -> None:
        """A cold restart: the index is rebuilt from the device. On Community Edition a plainly deleted
        record is still there and comes back; durable deletes and newer writes stay."""
        with self.lock:
            now = _now_ms()
            for key, record in self.ghosts.items():
                if key not in self.records and not record.expired(now):
                    self.records[key] = record
            self.ghosts.clear()

    def raw(self, namespace: str, set_name: str, key: Any) -> Record | None:
        """The live record of a key (None when absent or expired) — for assertions."""
        with self.lock:
            record = self.records.get((namespace, set_name, key))
            return None if record is None or record.expired(_now_ms()) else record

    def set_names(self, namespace: str) -> set[str]:
        with self.lock:
            return {s for ns, s, _ in self.records if ns == namespace}


def _digest(set_name: str, key: Any) -> bytes:
    return hashlib.sha1(f"{set_name}\x00{key!r}".encode()).digest()  # 20 bytes, like the RIPEMD-160 digest


def _check_bins(bins: dict[str, Any]) -> None:
    for name in bins:
        if len(name) > MAX_BIN_NAME:
            raise _err(ex.BinNameError, f"bin name {name!r} longer than {MAX_BIN_NAME} characters")


class _Meta(NamedTuple):
    """What an expression reads of a record besides its bins."""

    user_key: Any
    updated_ms: int | None


class _Expr:
    """A compiled expression (list of (op, result type, fixed, child count)) as a tree, evaluated."""

    __slots__ = ("children", "fixed", "op", "rt")

    def __init__(self, op: int, rt: Any, fixed: dict | None, children: list[_Expr]) -> None:
        self.op, self.rt, self.fixed, self.children = op, rt, fixed or {}, children

    @classmethod
    def parse(cls, compiled: list[tuple]) -> _Expr:
        def node(i: int) -> tuple[_Expr, int]:
            op, rt, fixed, count = compiled[i]
            children, j = [], i + 1
            for _ in range(count):
                child, j = node(j)
                if child.op != END:
                    children.append(child)
            return cls(op, rt, fixed, children), j

        tree, end = node(0)
        if end != len(compiled):
            raise NotImplementedError("aerospike emulator: trailing items in a compiled expression")
        return tree

    def eval(self, bins: dict[str, Any], meta: _Meta, scope: dict[str, Any] | None = None) -> Any:
        op, kids = self.op, self.children
        if op == LET:  # definitions in order, each seeing the ones before it; then the body
            inner = dict(scope or {})
            for definition in kids[:-1]:
                if definition.op != DEF:
                    raise NotImplementedError("aerospike emulator: a let expects definitions, then a body")
                inner[definition.fixed["val"]] = definition.children[0].eval(bins, meta, inner)
            return kids[-1].eval(bins, meta, inner)
        if op == VAR:
            name = self.fixed["val"]
            if scope is None or name not in scope:
                raise NotImplementedError(f"aerospike emulator: variable {name!r} used outside its let")
            return scope[name]
        if op in (VAL, AS_VAL):
            return self.fixed["val"]
        if op == TRUE:
            return True
        if op == FALSE:
            return False
        if op == EXP_UNKNOWN:
            return UNKNOWN
        if CDT_FLAGS[0] <= op <= CDT_FLAGS[1]:
            return None  # the list/map call's policy marker (create/modify flags), not a value
        if op == BIN:
            value = bins.get(self.fixed["bin"], UNKNOWN)
            wanted = RESULT_TYPES.get(self.rt)
            if value is UNKNOWN or (wanted and (not isinstance(value, wanted) or isinstance(value, bool))):
                return UNKNOWN
            return value
        if op == BIN_EXISTS:
            return self.fixed["bin"] in bins
        if op == REC_KEY:
            return UNKNOWN if meta.user_key is None else meta.user_key
        if op == LAST_UPDATE:
            return UNKNOWN if meta.updated_ms is None else meta.updated_ms * 1_000_000
        values = [k.eval(bins, meta, scope) for k in kids] if op != COND else None
        if values is not None and UNKNOWN in values and op not in (AND, OR):
            return UNKNOWN
        if op in (EQ, NE, GT, GE, LT, LE):
            a, b = values
            try:
                return {EQ: a == b, NE: a != b, GT: a > b, GE: a >= b, LT: a < b, LE: a <= b}[op]
            except TypeError:
                return UNKNOWN
        if op == NOT:
            return not values[0]
        if op == AND:
            if False in values:
                return False
            return UNKNOWN if UNKNOWN in values else True
        if op == OR:
            if True in values:
                return True
            return UNKNOWN if UNKNOWN in values else False
        if op == ADD:
            return sum(values)
        if op == SUB:
            return values[0] - sum(values[1:])
        if op == MUL:
            product = 1
            for value in values:
                product *= value
            return product
        if op == DIV:  # integer division truncates toward zero (C); a zero divisor fails the expression
            quotient = values[0]
            for value in values[1:]:
                if value == 0:
                    return UNKNOWN
                quotient = int(quotient / value) if isinstance(quotient, int) else quotient / value
            return quotient
        if op == MIN:
            return min(values)
        if op == MAX:
            return max(values)
        if op == COND:
            for i in range(0, len(kids) - 1, 2):
                test = kids[i].eval(bins, meta, scope)
                if test is UNKNOWN:
                    return UNKNOWN
                if test:
                    return kids[i + 1].eval(bins, meta, scope)
            return kids[-1].eval(bins, meta, scope)
        if op == aerospike.OP_MAP_GET_BY_KEY:
            map_key, the_map = values[0], values[-1]
            return_type = self.fixed.get("return_type")
            if not isinstance(the_map, dict):
                return UNKNOWN
            if return_type == aerospike.MAP_RETURN_VALUE:
                return the_map.get(map_key, UNKNOWN)
            if return_type == aerospike.MAP_RETURN_COUNT:
                return int(map_key in the_map)
            if return_type == aerospike.MAP_RETURN_EXISTS:
                return map_key in the_map
            raise NotImplementedError(f"aerospike emulator: MapGetByKey return type {return_type}")
        if op == CMP_REGEX:  # POSIX regcomp/regexec on the server; Python's re reads the expressions IgnisMQ writes
            subject = values[-1]
            if not isinstance(subject, str):
                return UNKNOWN
            options = self.fixed.get("regex_options", 0)
            if not options & aerospike.REGEX_EXTENDED:
                raise NotImplementedError("aerospike emulator: only REGEX_EXTENDED regular expressions")
            flags = (re.IGNORECASE if options & aerospike.REGEX_ICASE else 0) | \
                (re.MULTILINE if options & aerospike.REGEX_NEWLINE else re.DOTALL)
            return re.search(self.fixed["val"], subject, flags) is not None
        if op == aerospike.OP_LIST_GET_BY_VALUE:
            value, the_list = values[0], values[-1]
            return_type = self.fixed.get("return_type")
            if not isinstance(the_list, list):
                return UNKNOWN
            if return_type == aerospike.LIST_RETURN_COUNT:
                return sum(1 for item in the_list if item == value)
            raise NotImplementedError(f"aerospike emulator: ListGetByValue return type {return_type}")
        if op == aerospike.OP_MAP_PUT:
            map_key, value, the_map = values[0], values[1], values[-1]
            if not isinstance(the_map, dict):
                return UNKNOWN
            return {**the_map, map_key: value}
        raise NotImplementedError(f"aerospike emulator: expression op {op} is not emulated")


def _eval(compiled: list[tuple], bins: dict[str, Any], meta: _Meta) -> Any:
    return _Expr.parse(compiled).eval(bins, meta)


def _with_parent_filter(policy: dict | None, parent: dict | None) -> dict | None:
    """A batch record's policy as the server applies it: the batch policy's filter ("expressions") applies to every
    key, unless the record's own policy has one ("filterExp", BatchPolicy and BatchWritePolicy: a record's own
    filter overrides the batch parent's)."""
    if not parent or parent.get("expressions") is None or (policy or {}).get("expressions") is not None:
        return policy
    return {**(policy or {}), "expressions": parent["expressions"]}


class EmulatedQuery:
    def __init__(self, client: EmulatedClient, namespace: str, set_name: str | None) -> None:
        self._client, self._ns, self._set = client, namespace, set_name
        self._bins: tuple[str, ...] | None = None
        self._where: tuple | None = None

    def select(self, *bins: str) -> None:
        self._bins = bins

    def where(self, predicate: tuple, *_: Any) -> None:
        kind, _index_type, bin_name, value = predicate[:4]
        if kind == 0:  # AS_PREDICATE_EQUAL
            self._where = (bin_name, lambda v: v == value)
        elif kind == 1:  # AS_PREDICATE_RANGE (integers, both ends included)
            low, high = value, predicate[4]
            self._where = (bin_name, lambda v: type(v) is int and low <= v <= high)
        else:
            raise NotImplementedError("aerospike emulator: only equality and range predicates are emulated")

    def results(self, policy: dict | None = None, options: dict | None = None) -> list[tuple]:
        return self._client._query(self._ns, self._set, self._bins, self._where, policy)

    def foreach(self, callback: Callable[[tuple], Any], policy: dict | None = None, options: dict | None = None
                ) -> None:
        for record in self.results(policy):
            if callback(record) is False:
                break


class EmulatedClient:
    """The client object (`aerospike.Client`'s methods that the store uses)."""

    def __init__(self, server: EmulatedServer, config: dict[str, Any]) -> None:
        self.server = server
        self.config = config
        self._connected = True

    # ---- plumbing ---------------------------------------------------------------------------
    def connect(self, *_: Any) -> EmulatedClient:
        self._connected = True
        return self

    def is_connected(self) -> bool:
        return self._connected

    def close(self) -> None:
        self._connected = False

    def _enter(self, method: str) -> _Fault | None:
        if not self._connected:
            raise _err(ex.ClusterError, "client is closed")
        if not self.server.reachable:
            if self.server.outage == OUTAGE_REFUSED:
                raise _err(ex.ConnectionError, "Socket write error: 111, 127.0.0.1:3000")
            if self.server.outage == OUTAGE_NO_NODE:
                raise _err(ex.InvalidNodeError, "Node not found for partition test:2914")
            raise _err(ex.TimeoutError, "timeout", in_doubt=False)
        self.server.calls[method] += 1
        for fault in self.server.faults:
            if fault.method == method and fault.times > 0:
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                if not fault.apply_first:
                    raise _err(fault.error, f"injected {fault.error.__name__}")
                return fault
        return None

    def _check_key(self, key: tuple) -> tuple[str, str, Any]:
        if not isinstance(key, tuple) or len(key) < 3:
            raise _err(ex.ParamError, f"key {key!r} is not (namespace, set, key)")
        ns, set_name, user_key = key[:3]
        if ns not in self.server.namespaces:
            raise _err(ex.NamespaceNotFound, f"namespace {ns!r} not found")
        if set_name is not None and len(set_name) > MAX_SET_NAME:
            raise _err(ex.ParamError, f"set name {set_name!r} longer than {MAX_SET_NAME} characters")
        return ns, set_name, user_key

    def _live(self, k: tuple[str, str, Any], now: int) -> Record | None:
        record = self.server.records.get(k)
        if record is not None and record.expired(now):
            del self.server.records[k]  # expired records are gone (and never come back)
            return None
        return record

    def _void(self, ttl: Any, existing: Record | None, now: int) -> int:
        if ttl in TTL_KEEP:
            if existing is not None:
                return existing.void_ms
            ttl = self.server.default_ttl
        elif ttl in TTL_DEFAULT:
            ttl = self.server.default_ttl
        if ttl in TTL_NEVER or ttl == 0:
            return 0
        if not isinstance(ttl, int) or ttl < 0:
            raise _err(ex.ParamError, f"invalid ttl {ttl!r}")
        if self.server.nsup_period == 0:
            raise _err(ex.ForbiddenError, "TTL forbidden: namespace has nsup-period 0")
        return (now // 1000 + ttl) * 1000  # the server: void_time = now in seconds + ttl

    @staticmethod
    def _out_key(key: tuple) -> tuple:
        return (key[0], key[1], key[2], _digest(key[1], key[2]))

    def _store(self, k: tuple, bins: dict[str, Any], gen: int, void_ms: int, policy: dict, now: int | None = None
               ) -> Record:
        _check_bins(bins)
        size = len(msgpack.packb(bins, use_bin_type=True)) + 64 + len(repr(k[2]))
        if size > self.server.max_record_bytes:
            raise _err(ex.RecordTooBig, f"record of {size} bytes exceeds {self.server.max_record_bytes}")
        send = (policy or {}).get("key", self.config.get("policies", {}).get("write", {}).get("key"))
        existing = self.server.records.get(k)
        user_key = k[2] if send == aerospike.POLICY_KEY_SEND else (existing.user_key if existing else None)
        record = Record(bins, gen, void_ms, user_key, _now_ms() if now is None else now)
        self.server.records[k] = record
        self.server.ghosts.pop(k, None)  # a newer version supersedes a deleted one
        return record

    def _write(self, key: tuple, meta: dict | None, policy: dict | None,
               apply: Callable[[dict[str, Any], Record | None], tuple[dict[str, Any], dict[str, Any]]],
               has_write: bool = True) -> tuple[tuple, dict, dict]:
        """Common path of put/operate: existence, generation and filter checks, then `apply` on a copy
        (all or nothing), TTL and generation."""
        policy, meta = policy or {}, meta or {}
        if "ttl" in meta:  # as the real client (19.x) warns: the TTL belongs in the write policy
            warnings.warn('meta["ttl"] is deprecated and will be removed in the next client major release.',
                          DeprecationWarning, stacklevel=4)
        k = self._check_key(key)
        now = _now_ms()
        existing = self._live(k, now)
        exists = policy.get("exists", aerospike.POLICY_EXISTS_IGNORE)
        if existing is None:
            if exists in (aerospike.POLICY_EXISTS_UPDATE, aerospike.POLICY_EXISTS_REPLACE) or not has_write:
                raise _err(ex.RecordNotFound, "record not found")
        else:
            if exists == aerospike.POLICY_EXISTS_CREATE:
                raise _err(ex.RecordExistsError, "record exists")
            gen_policy = policy.get("gen", aerospike.POLICY_GEN_IGNORE)
            if gen_policy == aerospike.POLICY_GEN_EQ and meta.get("gen") != existing.gen:
                raise _err(ex.RecordGenerationError, "generation mismatch")
            if gen_policy == aerospike.POLICY_GEN_GT and meta.get("gen", 0) <= existing.gen:
                raise _err(ex.RecordGenerationError, "generation not greater")
            if policy.get("expressions") is not None and \
                    _eval(policy["expressions"], existing.bins, existing.meta()) is not True:
                raise _err(ex.FilteredOut, "filtered out")
        replace = exists in (aerospike.POLICY_EXISTS_REPLACE, aerospike.POLICY_EXISTS_CREATE_OR_REPLACE)
        start = {} if existing is None or replace else copy.deepcopy(existing.bins)
        bins, result = apply(start, existing, now)
        if not has_write:
            return self._out_key(k), {"gen": existing.gen, "ttl": existing.ttl(now)}, result
        bins = {name: value for name, value in bins.items() if value is not None}
        if not bins:  # a record left without bins is deleted
            self.server.records.pop(k, None)
            return self._out_key(k), {"gen": 0, "ttl": 0}, result
        void = self._void(meta.get("ttl", policy.get("ttl", 0)), existing, now)
        record = self._store(k, bins, (existing.gen + 1) if existing else 1, void, policy, now)
        return self._out_key(k), {"gen": record.gen, "ttl": record.ttl(now)}, result

    # ---- single-record calls ----------------------------------------------------------------
    def put(self, key: tuple, bins: dict[str, Any], meta: dict | None = None, policy: dict | None = None,
            serializer: Any = None) -> int:
        with self.server.lock:
            fault = self._enter("put")
            _check_bins(bins)
            self._write(key, meta, policy, lambda start, _, __: ({**start, **bins}, {}))
            if fault:
                raise _err(fault.error, "injected after apply", in_doubt=True)
            return 0

    def get(self, key: tuple, policy: dict | None = None) -> tuple[tuple, dict, dict]:
        with self.server.lock:
            self._enter("get")
            k = self._check_key(key)
            now = _now_ms()
            record = self._live(k, now)
            if record is None:
                raise _err(ex.RecordNotFound, "record not found")
            if (policy or {}).get("expressions") is not None and \
                    _eval(policy["expressions"], record.bins, record.meta()) is not True:
                raise _err(ex.FilteredOut, "filtered out")
            return self._out_key(k), {"gen": record.gen, "ttl": record.ttl(now)}, copy.deepcopy(record.bins)

    def remove(self, key: tuple, meta: dict | None = None, policy: dict | None = None) -> int:
        with self.server.lock:
            self._enter("remove")
            self._remove(key, policy)
            return 0

    def _remove(self, key: tuple, policy: dict | None) -> None:
        k = self._check_key(key)
        record = self._live(k, _now_ms())
        durable = bool((policy or {}).get("durable_delete"))
        if durable and self.server.edition != "enterprise":
            raise _err(ex.UnsupportedFeature, "durable delete is an Enterprise feature")
        if record is None:
            raise _err(ex.RecordNotFound, "record not found")
        if (policy or {}).get("expressions") is not None and \
                _eval(policy["expressions"], record.bins, record.meta()) is not True:
            raise _err(ex.FilteredOut, "filtered out")
        del self.server.records[k]
        if durable:
            self.server.ghosts.pop(k, None)
        else:
            self.server.ghosts[k] = record  # still on the device: a cold restart brings it back

    def operate(self, key: tuple, list_: list[dict], meta: dict | None = None, policy: dict | None = None
                ) -> tuple[tuple, dict, dict]:
        with self.server.lock:
            fault = self._enter("operate")
            out = self._operate(key, list_, meta, policy)
            if fault:
                raise _err(fault.error, "injected after apply", in_doubt=True)
            return out

    def _operate(self, key: tuple, list_: list[dict], meta: dict | None, policy: dict | None,
                 all_ops: bool = False) -> tuple[tuple, dict, dict]:
        """`all_ops`: answer like a batch write, where the server responds to every operation (measured
        on Aerospike 8.1): a write or increment gives its bin None, a read of a missing bin gives None,
        and a later operation on the same bin overwrites an earlier one's result. A single-record
        operate returns only the reads of bins that exist."""
        writes = {aerospike.OPERATOR_WRITE, aerospike.OPERATOR_INCR, aerospike.OP_MAP_PUT, aerospike.OP_EXPR_WRITE}
        has_write = any(op["op"] in writes for op in list_)

        def apply(bins: dict[str, Any], existing: Record | None, now: int) -> tuple[dict[str, Any], dict[str, Any]]:
            result: dict[str, Any] = {}
            # As the server: an expression sees the last-update time of the write it is part of (measured, 8.1.2)
            record_meta = _Meta(existing.user_key if existing else None,
                                now if has_write else (existing.updated_ms if existing else None))
            for op in list_:
                code, name = op["op"], op.get("bin")
                if all_ops and code in writes and code != aerospike.OP_MAP_PUT:
                    result[name] = None
                if code == aerospike.OPERATOR_READ:
                    if name in bins:
                        result[name] = copy.deepcopy(bins[name])
                    elif all_ops:
                        result[name] = None
                elif code == aerospike.OPERATOR_WRITE:
                    _check_bins({name: None})
                    bins[name] = copy.deepcopy(op["val"])
                elif code == aerospike.OPERATOR_INCR:
                    current = bins.get(name, 0)
                    if not isinstance(current, int) or not isinstance(op["val"], int):
                        raise _err(ex.BinIncompatibleType, f"bin {name!r} is not an integer")
                    bins[name] = current + op["val"]
                elif code == aerospike.OP_MAP_PUT:
                    flags = (op.get("map_policy") or {}).get("map_write_flags", 0)
                    the_map = bins.setdefault(name, {})
                    if not isinstance(the_map, dict):
                        raise _err(ex.BinIncompatibleType, f"bin {name!r} is not a map")
                    present = op["key"] in the_map
                    denied = (present and flags & aerospike.MAP_WRITE_FLAGS_CREATE_ONLY) or \
                        (not present and flags & aerospike.MAP_WRITE_FLAGS_UPDATE_ONLY)
                    if denied and not flags & aerospike.MAP_WRITE_FLAGS_NO_FAIL:
                        raise _err(ex.ElementExistsError if present else ex.ElementNotFoundError, "map put denied")
                    if not denied:
                        the_map[op["key"]] = copy.deepcopy(op["val"])
                    result[name] = len(the_map)
                elif code == aerospike.OP_EXPR_READ:
                    value = _eval(op["expr"], bins, record_meta)
                    if value is UNKNOWN:
                        if not op.get("expr_flags", 0) & aerospike.EXP_READ_EVAL_NO_FAIL:
                            raise _err(ex.OpNotApplicable, "expression read failed")
                        if all_ops:
                            result[name] = None
                    else:
                        result[name] = value
                elif code == aerospike.OP_EXPR_WRITE:
                    _check_bins({name: None})
                    flags = op.get("expr_flags", 0)
                    no_fail = flags & aerospike.EXP_WRITE_POLICY_NO_FAIL
                    if flags & aerospike.EXP_WRITE_CREATE_ONLY and name in bins:
                        if no_fail:
                            continue
                        raise _err(ex.BinExistsError, f"bin {name!r} exists")
                    if flags & aerospike.EXP_WRITE_UPDATE_ONLY and name not in bins:
                        if no_fail:
                            continue
                        raise _err(ex.BinNotFound, f"bin {name!r} not found")
                    value = _eval(op["expr"], bins, record_meta)
                    if value is UNKNOWN:
                        if flags & aerospike.EXP_WRITE_EVAL_NO_FAIL:
                            continue
                        raise _err(ex.OpNotApplicable, "expression write failed")
                    bins[name] = value
                else:
                    raise NotImplementedError(f"aerospike emulator: operation {code} is not emulated")
            return bins, result

        return self._write(key, meta, policy, apply, has_write)

    # ---- batches ------------------------------------------------------------------------------
    def _batch_outage(self, method: str, keys: list[tuple]) -> BatchRecords | None:
        """What a batch call returns when the nodes do not answer (see OUTAGE_*), or None to go on."""
        failing = None
        if not self.server.reachable and self.server.outage is not None:
            failing = -10 if self.server.outage == OUTAGE_REFUSED else None
            if failing is None:  # the node is gone from the client's map: no records at all
                out = BatchRecords([])
                out.result = 1
                return out
            code = NO_RESPONSE
        else:
            fault = next((f for f in self.server.record_faults if f.method == method and f.times > 0), None)
            if fault is None:
                return None
            fault.times -= 1
            failing, code = -16, fault.code
        out = BatchRecords([BatchRecord(key) for key in keys])
        for record in out.batch_records:
            record.result = code
        out.result = failing
        return out

    def batch_read(self, keys: list[tuple], bins: list[str] | None = None, policy: dict | None = None
                   ) -> BatchRecords:
        if bins is not None and not isinstance(bins, list):  # the real client refuses anything else
            raise _err(ex.ParamError, "Bins argument should be a list.")
        with self.server.lock:
            failed = self._batch_outage("batch_read", keys)
            if failed is not None:
                return failed
            self._enter("batch_read")
            out = BatchRecords([BatchRecord(key) for key in keys])
            only = (policy or {}).get("expressions")
            for record in out.batch_records:
                try:
                    got = self.get_unlocked(record.key)
                    if only is not None and _eval(only, got[2], self._live(self._check_key(record.key),
                                                                         _now_ms()).meta()) is not True:
                        record.result = ex.FilteredOut.code
                        continue
                    if bins is not None:
                        got = (got[0], got[1], {b: v for b, v in got[2].items() if b in bins})
                    record.record = got
                except ex.AerospikeError as exc:
                    record.result = exc.code
            return out

    def get_unlocked(self, key: tuple) -> tuple[tuple, dict, dict]:
        k = self._check_key(key)
        now = _now_ms()
        record = self._live(k, now)
        if record is None:
            raise _err(ex.RecordNotFound, "record not found")
        return self._out_key(k), {"gen": record.gen, "ttl": record.ttl(now)}, copy.deepcopy(record.bins)

    def batch_write(self, batch_records: BatchRecords, policy_batch: dict | None = None,
                    _method: str = "batch_write") -> BatchRecords:
        with self.server.lock:
            failed = self._batch_outage(_method, [r.key for r in batch_records.batch_records])
            if failed is not None:
                if failed.batch_records:  # the client fills in the caller's records
                    for record in batch_records.batch_records:
                        record.result = failed.batch_records[0].result
                    batch_records.result = failed.result
                    return batch_records
                return failed
            fault = self._enter("batch_write")
            for record in batch_records.batch_records:
                policy = _with_parent_filter(record.policy, policy_batch)
                try:
                    if isinstance(record, Write):
                        record.record = self._operate(record.key, record.ops, record.meta, policy, all_ops=True)
                    elif isinstance(record, Read):
                        record.record = self._operate(record.key, record.ops or [], None, policy)
                    elif isinstance(record, Remove):
                        self._remove(record.key, policy)
                    else:
                        raise NotImplementedError(f"aerospike emulator: batch record {type(record).__name__}")
                    record.result = 0
                except ex.AerospikeError as exc:
                    record.result = exc.code
            batch_records.result = 0
            if fault:
                raise _err(fault.error, "injected after apply", in_doubt=True)
            return batch_records

    def batch_operate(self, keys: list[tuple], ops: list[dict], policy_batch: dict | None = None,
                      policy_batch_write: dict | None = None, ttl: int | None = None) -> BatchRecords:
        meta = None if ttl is None else {"ttl": ttl}
        return self.batch_write(BatchRecords([Write(key, ops, meta, policy_batch_write) for key in keys]),
                                policy_batch, _method="batch_operate")

    def batch_remove(self, keys: list[tuple], policy_batch: dict | None = None,
                     policy_batch_remove: dict | None = None) -> BatchRecords:
        with self.server.lock:
            failed = self._batch_outage("batch_remove", keys)
            if failed is not None:
                return failed
            self._enter("batch_remove")
            out = BatchRecords([BatchRecord(key) for key in keys])
            policy = _with_parent_filter(policy_batch_remove, policy_batch)
            for record in out.batch_records:
                try:
                    self._remove(record.key, policy)
                except ex.AerospikeError as exc:
                    record.result = exc.code
            return out

    # ---- indexes, queries, info -------------------------------------------------------------
    def index_string_create(self, ns: str, set_name: str, bin_name: str, index_name: str,
                            policy: dict | None = None) -> int:
        warnings.warn("index_string_create() is deprecated. Please use index_single_value_create() instead",
                      DeprecationWarning, stacklevel=2)
        return self.index_single_value_create(ns, set_name, bin_name, aerospike.INDEX_STRING, index_name, policy)

    def index_single_value_create(self, ns: str, set_name: str, bin_name: str, index_datatype: int,
                                  index_name: str, policy: dict | None = None) -> int:
        if index_datatype not in (aerospike.INDEX_STRING, aerospike.INDEX_NUMERIC):
            raise NotImplementedError("aerospike emulator: only STRING and NUMERIC secondary indexes are emulated")
        with self.server.lock:
            self._enter("index_single_value_create")
            self._check_key((ns, set_name, None))
            if (ns, index_name) in self.server.indexes:
                raise _err(ex.IndexFoundError, "index already exists")
            if len(index_name) > 255:
                raise _err(ex.IndexNameMaxLen, "index name too long")
            self.server.indexes[(ns, index_name)] = (set_name, bin_name)
            return 0

    def index_remove(self, ns: str, index_name: str, policy: dict | None = None) -> int:
        with self.server.lock:
            self._enter("index_remove")
            if self.server.indexes.pop((ns, index_name), None) is None:
                raise _err(ex.IndexNotFound, "index not found")
            return 0

    def query(self, namespace: str, set_name: str | None = None) -> EmulatedQuery:
        return EmulatedQuery(self, namespace, set_name)

    def _query(self, ns: str, set_name: str | None, bins: tuple[str, ...] | None, where: tuple | None,
               policy: dict | None) -> list[tuple]:
        with self.server.lock:
            self._enter("query")
            self._check_key((ns, set_name, None))
            if where is not None:
                names = [name for (n, name), (s, b) in self.server.indexes.items()
                         if n == ns and (s, b) == (set_name, where[0])]
                if not names:
                    raise _err(ex.IndexNotFound, f"no secondary index on {ns}.{set_name}.{where[0]}")
                if names[0] in self.server.building:  # as a server while it populates a new index
                    raise _err(ex.IndexNotReadable, f"secondary index {names[0]} is not readable yet")
            now = _now_ms()
            out = []
            for k in list(self.server.records):
                if k[0] != ns or (set_name is not None and k[1] != set_name):
                    continue
                record = self._live(k, now)
                if record is None or (where is not None and (where[0] not in record.bins
                                                             or not where[1](record.bins[where[0]]))):
                    continue
                if (policy or {}).get("expressions") is not None and \
                        _eval(policy["expressions"], record.bins, record.meta()) is not True:
                    continue
                shown = {b: v for b, v in record.bins.items() if bins is None or b in bins}
                out.append(((k[0], k[1], record.user_key, _digest(k[1], k[2])),
                            {"gen": record.gen, "ttl": record.ttl(now)}, copy.deepcopy(shown)))
            return out

    def truncate(self, namespace: str, set_name: str | None, nanos: int, policy: dict | None = None) -> int:
        with self.server.lock:
            self._enter("truncate")
            for k in [k for k in self.server.records if k[0] == namespace and set_name in (None, k[1])]:
                del self.server.records[k]
            return 0

    def info_all(self, command: str, policy: dict | None = None) -> dict[str, tuple[Any, str]]:
        with self.server.lock:
            if not self.server.reachable and self.server.outage == OUTAGE_NO_NODE:
                return {}  # no node to ask: the client answers nothing rather than raise
            self._enter("info_all")
            if command == "edition":
                name = "Enterprise" if self.server.edition == "enterprise" else "Community"
                return {"BB9000000000001": (None, f"edition\tAerospike {name} Edition\n")}
            if command == "namespaces":
                return {"BB9000000000001": (None, f"namespaces\t{';'.join(self.server.namespaces)}\n")}
            if command.startswith("sindex-list:ns="):
                ns = command.split("=", 1)[1]
                entries = [f"ns={n}:indexname={name}:set={set_name}:bin={bin_name}:type=string:state=RW"
                           for (n, name), (set_name, bin_name) in sorted(self.server.indexes.items()) if n == ns]
                return {"BB9000000000001": (None, f"{command}\t{';'.join(entries)}\n")}
            if command.startswith("sindex-exists:"):
                fields = dict(part.split("=", 1) for part in command.split(":", 1)[1].split(";"))
                found = (fields["namespace"], fields["indexname"]) in self.server.indexes
                return {"BB9000000000001": (None, f"{command}\t{str(found).lower()}\n")}
            raise NotImplementedError(f"aerospike emulator: info command {command!r} is not emulated")
