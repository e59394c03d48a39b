"""The embedded default backend: one LMDB environment holding the DESIGN §3 layout.

Each Aerospike set is an LMDB named database with the same name, keyed by the same record keys, so a
layout read with `ignis` tools compares 1:1 with Aerospike. Every record value starts with an
8-byte big-endian expire-at (epoch ms, 0 = never); then a msgpack map of bins, except for data
records, which have a fixed binary layout (see _DATA). Expired records read as absent everywhere and
are purged in the background. The `{set}_active` database plays the secondary index.

LMDB gives what the Aerospike backend has to build from single-record operations: every primitive
here is one transaction, so load never leaves a hole on a crash, and claim/stamp is one atomic step.
Several processes on one host share the environment safely (LMDB's lock file, robust mutex).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb
import msgpack

from ignis import names
from ignis.envelope import (
    ATTEMPTS,
    CODEC_BYTES,
    CODEC_JSON,
    CODEC_STR,
    CODEC_UNREADABLE,
    DUE_AT,
    FIRE_TS,
    HEADERS,
    HISTORY,
    LOADED_AT,
    PARTITION_KEY,
    REASON,
    Envelope,
    NewMessages,
    envelope_problem,
    now_ms,
    unreadable_envelope,
)
from ignis.errors import InvalidInputError, QueueNotFound, StaleEpoch, StoreError, StoreFull, StoreUnavailable
from ignis.metrics import STORAGE_CALLS
from ignis.storage.base import (
    ACTIVE,
    CREATED_AT,
    DELAY_LEADER,
    DELAY_UNTIL,
    DELAYED_COUNT,
    FIRE_POINTER,
    HOLES,
    HOLES_CLAIMED,
    LOAD_POINTER,
    RUNTIME_BINS,
    SIDELINE_SWEEP,
    SIDELINE_SWEPT,
    SWEEP_EPOCH,
    SWEEP_POINTERS,
    SWEPT_COUNTER,
    Claimed,
    ClaimTicket,
    DelayState,
    LeaseRecord,
    MagazineKind,
    Move,
    Placement,
    QueueRecord,
    ShardPointers,
    SlotRef,
)
from ignis.storage.lmdb_doorbell import EnvironmentBell, LmdbDoorbell

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")  # every record starts with its expire-at, epoch ms (0 = never)
_DATA_HEADER = struct.Struct(">QQI")  # data records: expire-at, fireTS, attempts
_META = struct.Struct(">QQQ")  # shard meta records: expire-at, LOAD_POINTER, FIRE_POINTER
# A shard's hole counters (HOLES, HOLES_CLAIMED), in a record of their own beside the meta record
# (`{magazine}_SHARD_{n}_HOLES`, same shape, expire-at 0), so the hot paths keep reading 24 bytes.
_HOLES = _META
_HOLES_SUFFIX = b"_HOLES"
_new_ref = tuple.__new__  # builds SlotRef / Claimed NamedTuples without their slower generated __init__
_PACK = msgpack.Packer(use_bin_type=True).pack
DURABILITY_MODES = ("fsync", "fast")
EPOCH_KEY = b"sweeperEpoch"
CLIENTS_KEY = b"clients"
LEASE_PREFIX = b"lease:"
T = TypeVar("T")


def _unpack(raw: bytes) -> dict[str, Any]:
    return msgpack.unpackb(memoryview(raw)[8:], raw=False)


def _expired(raw: bytes, now: int) -> bool:
    if len(raw) < _HEADER.size:  # damaged: not an IgnisMQ record (read as unreadable), never "expired"
        return False
    expire_at = _HEADER.unpack_from(raw)[0]
    return expire_at != 0 and expire_at <= now


def _record(bins: Mapping[str, Any], expire_at: int = 0) -> bytes:
    return _HEADER.pack(expire_at) + _PACK(bins)


# Data record, format 1. Fixed part: expire-at, fireTS (0 = not fired), attempts — the fields a claim
# rewrites in place, first, at fixed offsets — then format, loadedAt, codec, flags and the id's length;
# then the id, the payload's length and the payload; then, only when the message has any, a msgpack map
# of the optional bins (headers, pkey, reason, history). No bin names are stored per record: the layout
# stays the logical envelope of DESIGN §3 (`raw_record` shows it with its bin names), at about half the
# encoding cost and 60 fewer bytes per message than one msgpack map.
_DATA = struct.Struct(">QQIBQBBH")
_PAYLOAD_LEN = struct.Struct(">I")
_FORMAT = 1
_HAS_EXTRAS = 1
_CODEC_IDS = {CODEC_BYTES: 0, CODEC_STR: 1, CODEC_JSON: 2, CODEC_UNREADABLE: 3}
_CODEC_NAMES = {v: k for k, v in _CODEC_IDS.items()}


def _pack_data(envelope: Envelope, expire_at: int) -> bytes:
    msg_id = envelope.msg_id.encode()
    payload = envelope.payload
    if not (envelope.headers or envelope.key is not None or envelope.reason is not None or envelope.history
            or envelope.due_at is not None):
        # The common record: header, id and payload length in one pack call (publish's hot path).
        return _plain_head(len(msg_id)).pack(
            expire_at, envelope.fire_ts or 0, envelope.attempts, _FORMAT, envelope.loaded_at,
            _CODEC_IDS[envelope.codec], 0, len(msg_id), msg_id, len(payload)) + payload
    extras = {name: value for name, value in ((HEADERS, envelope.headers), (PARTITION_KEY, envelope.key),
                                              (REASON, envelope.reason), (HISTORY, envelope.history),
                                              (DUE_AT, envelope.due_at)) if value}
    return b"".join((
        _DATA.pack(expire_at, envelope.fire_ts or 0, envelope.attempts, _FORMAT, envelope.loaded_at,
                   _CODEC_IDS[envelope.codec], _HAS_EXTRAS, len(msg_id)),
        msg_id, _PAYLOAD_LEN.pack(len(payload)), payload, _PACK(extras),
    ))


def _pack_new(batch: NewMessages, expire_at: int) -> list[bytes]:
    """The data records of newly published messages (fireTS 0, attempts 0): the batch's shared
    headers and key are packed once, not per message."""
    ids, payloads, at = batch.ids, batch.payloads, batch.loaded_at
    extras = {name: value for name, value in ((HEADERS, batch.headers), (PARTITION_KEY, batch.key))
              if value is not None and value != {}}
    if batch.codecs is None and not extras and len(set(map(len, ids))) == 1 and "".join(ids).isascii():
        # Generated ids: one length, ASCII, so one struct packs header, id and payload length, and when
        # the payloads have one length too, the payload as well (one allocation per record, not two).
        id_length = len(ids[0])
        if len(set(map(len, payloads))) == 1:
            size = len(payloads[0])
            record = _plain_record(id_length, size).pack
            return [record(expire_at, 0, 0, _FORMAT, at, 0, 0, id_length, msg_id.encode(), size, payload)
                    for msg_id, payload in zip(ids, payloads, strict=True)]
        head = _plain_head(id_length).pack
        return [head(expire_at, 0, 0, _FORMAT, at, 0, 0, id_length, msg_id.encode(), len(payload)) + payload
                for msg_id, payload in zip(ids, payloads, strict=True)]
    tail = _PACK(extras) if extras else b""
    flags = _HAS_EXTRAS if extras else 0
    codecs = batch.codecs or [CODEC_BYTES] * len(ids)
    values = []
    for msg_id, payload, codec in zip(ids, payloads, codecs, strict=True):
        raw_id = msg_id.encode()
        values.append(b"".join((_DATA.pack(expire_at, 0, 0, _FORMAT, at, _CODEC_IDS[codec], flags, len(raw_id)),
                                raw_id, _PAYLOAD_LEN.pack(len(payload)), payload, tail)))
    return values


@functools.lru_cache(maxsize=64)
def _plain_record(id_length: int, payload_length: int) -> struct.Struct:
    """A whole plain record (_plain_head, then the payload) as one struct."""
    return struct.Struct(f"{_plain_head(id_length).format}{payload_length}s")


@functools.cache
def _plain_head(id_length: int) -> struct.Struct:
    """_DATA + the id + _PAYLOAD_LEN as one struct (ids mostly share one length, so this stays tiny)."""
    return struct.Struct(f"{_DATA.format}{id_length}s{_PAYLOAD_LEN.format[1:]}")


def _unpack_data(raw: bytes, where: object = "?") -> Envelope:
    try:
        _, fire_ts, attempts, fmt, loaded_at, codec, flags, id_len = _DATA.unpack_from(raw)
        if fmt != _FORMAT:
            raise StoreError(f"data record format {fmt} is not one this version reads ({_FORMAT})")
        at = _DATA.size + id_len
        msg_id = raw[_DATA.size:at].decode()
        end = at + 4 + _PAYLOAD_LEN.unpack_from(raw, at)[0]
        payload = raw[at + 4:end]
        if len(payload) != end - at - 4 or not msg_id:
            raise ValueError("the record is shorter than its lengths say" if msg_id else "its id is empty")
        if flags & _HAS_EXTRAS:
            extras = msgpack.unpackb(raw[end:], raw=False)
            envelope = Envelope(payload, msg_id, loaded_at, _CODEC_NAMES[codec], extras.get(HEADERS),
                                extras.get(PARTITION_KEY), fire_ts or None, attempts, extras.get(REASON),
                                extras.get(HISTORY), extras.get(DUE_AT))
            problem = envelope_problem(envelope.to_bins())
            if problem is not None:
                raise ValueError(problem)
            return envelope
        return Envelope(payload, msg_id, loaded_at, _CODEC_NAMES[codec], None, None, fire_ts or None, attempts)
    except StoreError:
        raise
    except Exception as exc:  # damaged, or not written by IgnisMQ: carried on as unreadable, never as something else
        problem = f"the record does not decode: {type(exc).__name__}: {exc}"
        bins: dict[str, Any] = {"raw": bytes(raw)}
        if len(raw) >= _DATA.size:
            _, fire_ts, attempts, _, loaded_at, *_ = _DATA.unpack_from(raw)
            bins.update({FIRE_TS: fire_ts or None, ATTEMPTS: attempts, LOADED_AT: loaded_at})
        return unreadable_envelope(problem, bins, where)


def _expire_at(ttl_seconds: int, now: int) -> int:
    return now + ttl_seconds * 1000 if ttl_seconds > 0 else 0


def _delete_keys(txn: Any, keys: Sequence[bytes], db: Any) -> int:
    """Delete records; how many were there (an expired, unpurged record counts too)."""
    delete = txn.delete
    return sum(delete(key, b"", db) for key in keys)


class _Write:
    """One write waiting for a group commit."""

    __slots__ = ("after", "done", "durable", "error", "fn", "result", "taken")

    def __init__(self, fn: Callable[[Any], Any], durable: bool, after: Callable[[Any], None] | None) -> None:
        self.fn = fn
        self.durable = durable
        self.after = after  # called with the result once committed, before the flush
        self.taken = False  # in a leader's batch
        self.done = False  # committed (and flushed, when durable), or failed
        self.result: Any = None
        self.error: BaseException | None = None


class _GroupCommit:
    """Concurrent writes of this process's threads to one environment, committed together (group commit).

    Every LMDB commit holds the environment's write lock, shared with every other process, while it flushes
    its pages; with several threads publishing, claiming or acking, one commit per call would have them
    queue for that lock one flush at a time. Here a thread that finds no commit running takes every write
    queued meanwhile and runs them in one transaction and one flush; the others wait for it, and a thread
    that finds one running queues its write for the next. A lone caller commits at once, as before. The
    flush of the meta page that makes a durable write durable (LmdbStore._flush) is made after the write lock
    and the next leader's turn are given up, so the next batch commits meanwhile.

    The writes are the store's own transaction functions, which raise nothing but lmdb.Error (then the
    whole transaction is aborted and every write of it gets the error, as a failed commit would give each
    of them)."""

    def __init__(self, environment: _Environment) -> None:
        self._environment = environment  # (its LMDB handle looked up per commit: tests stand in for it)
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[_Write] = []
        self._busy = False

    def run(self, fn: Callable[[Any], T], durable: bool, after: Callable[[T], None] | None = None) -> T:
        """fn(txn) in a write transaction, committed (and flushed when `durable`) before this returns;
        after(result) once it is committed (visible to every reader), before the flush."""
        item = _Write(fn, durable, after)
        batch: list[_Write] = []
        with self._cond:
            self._queue.append(item)
            while not item.done and (self._busy or item.taken):
                self._cond.wait()
            if not item.done:  # not taken by a leader: lead the next commit
                self._busy = True
                batch, self._queue = self._queue, []
                for entry in batch:
                    entry.taken = True
        if batch:
            self._commit(batch)
        with self._cond:
            while not item.done:
                self._cond.wait()
        if item.error is not None:
            raise item.error
        return item.result

    def _commit(self, batch: list[_Write]) -> None:
        env = self._environment.env
        error: BaseException | None = None
        try:
            with env.begin(None, None, True) as txn:
                for entry in batch:
                    entry.result = entry.fn(txn)
        except BaseException as exc:  # the transaction was aborted: none of its writes happened
            error = exc
        durable = [entry for entry in batch if entry.durable] if error is None else []
        if error is None:
            for entry in batch:
                if entry.after is not None:
                    try:
                        entry.after(entry.result)
                    except Exception:  # a hint (a ring) that failed: never the write's failure
                        log.debug("after-commit hook failed", exc_info=True)
        with self._cond:
            for entry in batch:
                entry.error = error
                entry.done = entry not in durable
            self._busy = False  # the next batch may commit while this one's meta page is flushed
            self._cond.notify_all()
        if durable:
            try:
                env.sync(True)
            except BaseException as exc:
                for entry in durable:
                    entry.error = exc
            with self._cond:
                for entry in durable:
                    entry.done = True
                self._cond.notify_all()


class _Environment:
    """One open LMDB environment per path per process (LMDB forbids opening it twice)."""

    _open: dict[str, _Environment] = {}
    _inherited: set[str] = set()  # paths this process inherited open through fork()
    _registry_lock = threading.Lock()

    def __init__(self, path: str, durability: str, map_size: int, max_dbs: int) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        self.durability = durability
        self.pid = os.getpid()
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=max_dbs,
            max_readers=1024,
            # durability=fsync: each commit flushes its data pages before it writes the meta page that makes
            # them current, but does not flush that meta page (MDB_NOMETASYNC: "maintains database integrity,
            # but a system crash may undo the last committed transaction", LMDB docs). That halves the time a
            # commit holds the write lock, which every publisher, claimer and acker of every process shares.
            # What a caller is told is stored (a publish, a queue apply, a lease) is made durable by
            # LmdbStore._flush after the commit, outside the lock; claims and acks are not waited for: a crash
            # of the machine that undoes one only delivers a message again (at least once).
            sync=durability == "fsync",
            metasync=False,
            # durability=fast: dirty pages are written in place in the shared map, about twice the write rate
            # (bench_lmdb.py). Not with fsync: a commit then msyncs the whole map, so each durable commit costs
            # time in proportion to the store's size (1,000,000 messages stored: 12 ms a publish instead of
            # 1.2 ms, bench_delayed.py); written pages go out with pwrite and one fdatasync instead. Every
            # process of a store must use the same durability: LMDB's docs warn that "processes with and
            # without MDB_WRITEMAP on the same environment do not cooperate well" (mdb_env_open).
            writemap=durability != "fsync",
            lock=True,
        )
        self.dbs: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.users = 0
        self.forked = False  # set in a forked child: this handle belongs to the parent
        self._purger: threading.Thread | None = None
        self._stop = threading.Event()
        self._bell: EnvironmentBell | None = None
        self.group = _GroupCommit(self)

    @classmethod
    def acquire(cls, path: str, durability: str, map_size: int, max_dbs: int) -> _Environment:
        real = os.path.realpath(path)
        with cls._registry_lock:
            env = cls._open.get(real)
            if env is None and real in cls._inherited:
                raise StoreUnavailable(
                    f"lmdb store at {real} was open when this process was forked from its parent, and LMDB "
                    "cannot open it again here: open stores only after forking, or start worker processes "
                    "with the 'spawn' method")
            if env is None:
                try:
                    env = cls(real, durability, map_size, max_dbs)
                except lmdb.Error as exc:
                    raise StoreUnavailable(f"cannot open lmdb store at {real}: {exc}") from None
                except OSError as exc:
                    raise StoreUnavailable(f"cannot open lmdb store at {real}: {exc.strerror}") from None
                cls._open[real] = env
            elif env.durability != durability:
                raise InvalidInputError(
                    f"lmdb store at {real} is already open in this process with durability="
                    f"{env.durability!r}; cannot reopen it with durability={durability!r}"
                )
            env.users += 1
            return env

    @classmethod
    def _after_fork_in_child(cls) -> None:
        # The child must not touch the parent's handle (not even to close it: that would abort the
        # parent's transactions in shared memory), and LMDB refuses a second open of the same files.
        for env in cls._open.values():
            env.forked = True
        cls._inherited = set(cls._open) | cls._inherited
        cls._open = {}
        cls._registry_lock = threading.Lock()

    def bell(self, location: str) -> EnvironmentBell:
        """The environment's doorbell in this process (lmdb_doorbell), made on first use."""
        if self._bell is None:
            with self.lock:
                if self._bell is None:
                    self._bell = EnvironmentBell(self.path, location)
        return self._bell

    def release(self) -> None:
        with self._registry_lock:
            self.users -= 1
            if self.users > 0 or self.forked:
                return
            self._open.pop(self.path, None)
            self._stop.set()
            if self._purger is not None:
                self._purger.join(timeout=5)
            if self._bell is not None:
                self._bell.close()
            self.env.close()

    def db(self, name: str) -> Any:
        handle = self.dbs.get(name)
        if handle is None:
            with self.lock:
                handle = self.dbs.get(name)
                if handle is None:
                    # In our own write transaction: open_db without one begins it while holding the GIL,
                    # which deadlocks the process when another thread holds the write lock.
                    with self.env.begin(write=True) as txn:
                        handle = self.env.open_db(name.encode(), txn=txn, create=True)
                    self.dbs[name] = handle
        return handle

    def start_purger(self, interval: float) -> None:
        with self.lock:
            if interval <= 0 or self._purger is not None:
                return
            self._purger = threading.Thread(target=self._purge_loop, args=(interval,), name="ignis-lmdb-purge",
                                            daemon=True)
            self._purger.start()

    def _purge_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.purge_expired()
            except lmdb.Error:
                log.exception("background purge of expired records failed in %s", self.path)

    def purge_expired(self, chunk: int = 2000) -> int:
        """Delete expired records of every open database. Only one process per host does the work at a
        time (a non-blocking file lock); the others skip the pass."""
        with open(os.path.join(self.path, "purge.lock"), "a+") as lock_file:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            removed = 0
            for handle in list(self.dbs.values()):
                cursor_key: bytes | None = b""
                while cursor_key is not None:
                    now = now_ms()
                    with self.env.begin(write=True, db=handle) as txn:
                        cursor = txn.cursor()
                        cursor_key, n = _purge_chunk(cursor, cursor_key, now, chunk)
                    removed += n
            return removed


os.register_at_fork(after_in_child=_Environment._after_fork_in_child)


def _purge_chunk(cursor: Any, start: bytes, now: int, chunk: int) -> tuple[bytes | None, int]:
    removed = 0
    if not cursor.set_range(start):
        return None, 0
    for _ in range(chunk):
        value = cursor.value()
        if len(value) >= 8 and _expired(value, now):
            cursor.delete()  # moves to the next record
            removed += 1
            if not cursor.key():
                return None, removed
        elif not cursor.next():
            return None, removed
    return bytes(cursor.key()), removed


class LmdbStore:
    """`Storage` on LMDB. Thread-safe; safe with several processes on one host."""

    def __init__(
        self,
        path: str = ".ignis-data",
        *,
        farm_id: str = "local",
        client_id: str = "default",
        durability: str = "fsync",
        map_size: int = 8 << 30,
        max_dbs: int = 256,
        purge_interval: float = 60.0,
        _env: _Environment | None = None,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise InvalidInputError(f"durability={durability!r}: must be one of {', '.join(DURABILITY_MODES)}")
        self.farm_id = names.check_id("farmId", farm_id)
        self.client_id = names.check_id("clientId", client_id)
        self._path = path
        self._durability = durability
        self._sync = durability == "fsync"
        self._map_size = map_size
        self._max_dbs = max_dbs
        self._purge_interval = purge_interval
        self._queue_set = names.queue_set(farm_id, client_id)
        self._index_set = names.active_index(farm_id, client_id)
        self._data_set = names.data_set(client_id)
        self._meta_set = names.meta_set(client_id)
        self._system_set = f"{farm_id}_ignis_system"
        self._owns_env = _env is None
        self._env = _env or _Environment.acquire(path, durability, map_size, max_dbs)
        self._closed = False
        self._calls: dict[str, Any] = {}
        self._call_counters: list[Any] = []
        self._key_cache: dict[tuple[str, int], tuple[bytes, bytes]] = {}
        try:
            self._queues = self._env.db(self._queue_set)
            self._index = self._env.db(self._index_set)
            self._data = self._env.db(self._data_set)
            self._meta = self._env.db(self._meta_set)
            self._system = self._env.db(self._system_set)
        except lmdb.Error as exc:
            raise self._map_error(exc) from None
        self._env.start_purger(purge_interval)

    # ---- plumbing ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"lmdb://{self._env.path}?durability={self._durability}"

    @property
    def path(self) -> str:
        return self._env.path

    @property
    def location(self) -> str:
        return f"lmdb://{self._env.path}"

    def with_client(self, client_id: str) -> LmdbStore:
        return LmdbStore(self._path, farm_id=self.farm_id, client_id=client_id, durability=self._durability,
                         map_size=self._map_size, max_dbs=self._max_dbs, purge_interval=self._purge_interval,
                         _env=self._env)

    def watch_pointers(self, magazine: str, shards: int) -> tuple[list[int], int]:
        def read(txn: Any) -> tuple[list[int], int]:
            get, meta_db, unpack = txn.get, self._meta, _META.unpack
            with_work, loaded = [], 0
            for shard in range(shards):
                raw = get(self._keys(magazine, shard)[0], None, meta_db)
                if raw is not None:
                    _, load, fire = unpack(raw)
                    loaded += load
                    if load > fire:
                        with_work.append(shard)
            return with_work, loaded

        return self._read("watch", read)

    def beacon(self, magazine: str) -> None:
        """Nothing: a load into a main magazine rang the doorbell already (_ring)."""

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        return [0] * len(magazines)

    def doorbell(self) -> LmdbDoorbell:
        return LmdbDoorbell(self._env.bell(self.location), self.client_id)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._owns_env:
                self._env.release()

    def purge_expired(self) -> int:
        """Run one purge pass now (the background thread does this every purge_interval seconds)."""
        return self._env.purge_expired()

    def _map_error(self, exc: lmdb.Error) -> StoreError:
        if isinstance(exc, lmdb.MapFullError):
            return StoreFull(f"lmdb store at {self._env.path} is full (map_size={self._map_size} bytes); "
                             "reopen it with a larger ?map_size=")
        if isinstance(exc, lmdb.DbsFullError):
            return StoreFull(f"lmdb store at {self._env.path} has no room for more sets (max_dbs="
                             f"{self._max_dbs}); reopen it with a larger ?max_dbs=")
        return StoreError(f"lmdb store at {self._env.path}: {exc}")

    @contextmanager
    def _write(self, operation: str, durable: bool = True) -> Iterator[Any]:
        """A write transaction, committed on exit; `durable`: on disk when this returns (see _flush)."""
        try:
            with self._begin(operation, True) as txn:
                yield txn
            if durable:
                self._flush()
        except lmdb.Error as exc:
            raise self._map_error(exc) from None

    def _flush(self) -> None:
        """Make every commit so far durable (durability=fsync): the commit flushed its data pages already; this
        flushes the meta page (environment opened with metasync off), outside the write lock, so concurrent
        publishers share flushes. Raises lmdb.Error."""
        if self._sync:
            self._env.env.sync(True)

    def _read(self, operation: str, fn: Callable[[Any], T]) -> T:
        try:
            with self._begin(operation, False) as txn:
                return fn(txn)
        except lmdb.Error as exc:
            raise self._map_error(exc) from None

    # ---- queue registry ---------------------------------------------------------------------
    def ensure_index(self) -> None:
        """The index database is opened with the store; nothing else to create."""

    def _get_bins(self, txn: Any, db: Any, key: bytes, now: int) -> tuple[dict[str, Any], int] | None:
        raw = txn.get(key, db=db)
        if raw is None or _expired(raw, now):
            return None
        return _unpack(raw), _HEADER.unpack_from(raw)[0]

    def _index_key(self, active: bool, name: str) -> bytes:
        return (b"true\x00" if active else b"false\x00") + name.encode()

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        clobbered = RUNTIME_BINS.intersection(config)
        if clobbered:
            raise InvalidInputError(f"queue config may not set runtime bins: {', '.join(sorted(clobbered))}")
        for bin_name in config:
            if len(bin_name) > 15:
                raise InvalidInputError(f"bin name {bin_name!r} is longer than 15 characters")
        key = name.encode()
        now = now_ms()
        with self._write("apply_queue") as txn:
            current = self._get_bins(txn, self._queues, key, now)
            created = current is None
            if current is None:
                bins: dict[str, Any] = {
                    **config, CREATED_AT: now, SWEEP_POINTERS: {}, SIDELINE_SWEEP: {}, SWEPT_COUNTER: 0,
                    SIDELINE_SWEPT: 0, SWEEP_EPOCH: 0,
                }
            else:
                bins = current[0]
                bins.update(config)
                txn.delete(self._index_key(bins.get(ACTIVE) == "true", name), db=self._index)
            bins[ACTIVE] = "true"
            txn.put(key, _record(bins, _expire_at(ttl_seconds, now)), db=self._queues)
            txn.put(self._index_key(True, name), b"", db=self._index)
        return created

    def get_queue(self, name: str) -> QueueRecord | None:
        found = self._read("get_queue", lambda txn: self._get_bins(txn, self._queues, name.encode(), now_ms()))
        return QueueRecord(name, found[0]) if found else None

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        def scan(txn: Any) -> list[QueueRecord]:
            now = now_ms()
            flags = [True, False] if active is None else [active]
            found = []
            for flag in flags:
                prefix = self._index_key(flag, "")
                cursor = txn.cursor(db=self._index)
                if not cursor.set_range(prefix):
                    continue
                for index_key in cursor.iternext(values=False):
                    index_key = bytes(index_key)
                    if not index_key.startswith(prefix):
                        break
                    name = index_key[len(prefix):].decode()
                    hit = self._get_bins(txn, self._queues, name.encode(), now)
                    if hit is not None and (hit[0].get(ACTIVE) == "true") == flag:
                        found.append(QueueRecord(name, hit[0]))
            return sorted(found, key=lambda r: r.name)

        return self._read("list_queues", scan)

    def set_queue_active(self, name: str, active: bool) -> bool:
        key = name.encode()
        with self._write("set_queue_active") as txn:
            current = self._get_bins(txn, self._queues, key, now_ms())
            if current is None:
                return False
            bins, expire_at = current
            txn.delete(self._index_key(bins.get(ACTIVE) == "true", name), db=self._index)
            bins[ACTIVE] = "true" if active else "false"
            txn.put(key, _record(bins, expire_at), db=self._queues)
            txn.put(self._index_key(active, name), b"", db=self._index)
        return True

    def delete_queue(self, name: str) -> bool:
        key = name.encode()
        with self._write("delete_queue") as txn:
            txn.delete(self._index_key(True, name), db=self._index)
            txn.delete(self._index_key(False, name), db=self._index)
            raw = txn.pop(key, db=self._queues)
        return raw is not None and not _expired(raw, now_ms())

    def next_epoch(self) -> int:
        with self._write("next_epoch") as txn:
            raw = txn.get(EPOCH_KEY, db=self._system)
            epoch = (_unpack(raw)["epoch"] if raw else 0) + 1
            txn.put(EPOCH_KEY, _record({"epoch": epoch}), db=self._system)
        return epoch

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        pointer_bin, counter_bin = (SWEEP_POINTERS, SWEPT_COUNTER) if kind == "main" else (SIDELINE_SWEEP,
                                                                                             SIDELINE_SWEPT)
        key = name.encode()
        with self._write("advance_sweep", durable=False) as txn:
            current = self._get_bins(txn, self._queues, key, now_ms())
            if current is None:
                raise QueueNotFound(name, self.client_id)
            bins, expire_at = current
            held = int(bins.get(SWEEP_EPOCH, 0))
            if epoch < held:
                raise StaleEpoch(name, epoch, held)
            merged = dict(bins.get(pointer_bin) or {})
            for shard, pointer in pointers.items():
                label = names.shard_label(shard)
                merged[label] = max(int(merged.get(label, 0)), int(pointer))  # forward-only
            bins[pointer_bin] = merged
            bins[counter_bin] = int(bins.get(counter_bin, 0)) + swept
            bins[SWEEP_EPOCH] = epoch
            txn.put(key, _record(bins, expire_at), db=self._queues)  # TTL untouched

    # ---- farm-wide system records -------------------------------------------------------------
    def register_client(self, client_id: str) -> None:
        client_id = names.check_id("clientId", client_id)
        if client_id in self.list_clients():  # the common case: no write transaction at all
            return
        with self._write("register_client") as txn:
            raw = txn.get(CLIENTS_KEY, db=self._system)
            clients = dict(_unpack(raw)["clients"]) if raw else {}
            clients.setdefault(client_id, now_ms())
            txn.put(CLIENTS_KEY, _record({"clients": clients}), db=self._system)

    def list_clients(self) -> list[str]:
        raw = self._read("list_clients", lambda txn: txn.get(CLIENTS_KEY, db=self._system))
        return sorted(_unpack(raw)["clients"]) if raw else []

    def get_lease(self, name: str) -> LeaseRecord | None:
        raw = self._read("get_lease", lambda txn: txn.get(LEASE_PREFIX + name.encode(), db=self._system))
        return LeaseRecord(**_unpack(raw)) if raw else None

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        key = LEASE_PREFIX + name.encode()
        with self._write("replace_lease") as txn:
            raw = txn.get(key, db=self._system)
            if (_unpack(raw)["version"] if raw else 0) != expected_version:
                return None
            stored = LeaseRecord(lease.holder, lease.acquired_ms, lease.renewed_ms, lease.duration_s,
                                 lease.transitions, expected_version + 1)
            txn.put(key, _record({f: getattr(stored, f) for f in LeaseRecord.__slots__}), db=self._system)
        return stored

    # ---- magazine primitives ----------------------------------------------------------------
    # Hot paths: each is one transaction, opened directly (no context-manager helper) and with the
    # msgpack work done outside it where possible, so concurrent writers hold the write lock briefly.
    def _begin(self, operation: str, write: bool) -> Any:
        if self._closed or self._env.forked:
            self._opened(operation)  # raises
        tick = self._calls.get(operation)
        if tick is None:
            self._opened(operation)
        else:
            tick()
        return self._env.env.begin(None, None, write)  # positional: py-lmdb parses keywords slowly

    def _grouped(self, operation: str, write: Callable[[Any], T], durable: bool = False,
                 after: Callable[[T], None] | None = None) -> T:
        """write(txn), committed with whatever other threads of this process write meanwhile (_GroupCommit)."""
        self._opened(operation)
        try:
            if not self._sync:  # durability=fast: a commit flushes nothing and holds the lock for microseconds
                with self._env.env.begin(None, None, True) as txn:
                    result = write(txn)
                if after is not None:
                    after(result)
                return result
            return self._env.group.run(write, durable, after)
        except lmdb.Error as exc:
            raise self._map_error(exc) from None

    def _ring(self, magazine: str, shards: Iterable[int]) -> None:
        """A load into a main magazine committed: ring the consumer processes that wait on it (lmdb_doorbell),
        before the publish's own flush, so they claim it meanwhile."""
        if names.queue_and_kind(magazine)[1] == "main":
            self._env.bell(self.location).ring(self.client_id, magazine, shards)

    def _opened(self, operation: str) -> None:
        """Count the call; refuse it on a closed handle or one inherited through fork()."""
        if self._closed or self._env.forked:
            raise StoreUnavailable(f"lmdb store at {self._env.path} is closed" if self._closed else
                                   f"lmdb store at {self._env.path} was opened before this process forked; "
                                   "open it again in this process (LMDB handles do not survive fork)")
        tick = self._calls.get(operation)
        if tick is None:
            counter = STORAGE_CALLS.labels(operation)
            self._call_counters.append(counter)  # held: a counter's tick alone does not keep the counter
            tick = self._calls[operation] = counter.tick
        tick()

    def _keys(self, magazine: str, shard: int) -> tuple[bytes, bytes]:
        """(meta key, data-key prefix) of a shard, built once: a delivered message needs them twice."""
        keys = self._key_cache.get((magazine, shard))
        if keys is None:
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            keys = self._key_cache[(magazine, shard)] = (
                names.meta_key(magazine, shard).encode(), names.data_key_prefix(magazine, shard).encode())
        return keys

    def _data_key(self, ref: SlotRef) -> bytes:
        return self._keys(ref[0], ref[1])[1] + b"%d" % ref[2]

    def _meta_get(self, txn: Any, magazine: str, shard: int) -> tuple[bytes, int, int]:
        key = self._keys(magazine, shard)[0]
        raw = txn.get(key, db=self._meta)
        _, load, fire = _META.unpack(raw) if raw is not None else (0, 0, 0)
        return key, load, fire

    def _meta_put(self, txn: Any, key: bytes, load: int, fire: int) -> None:
        txn.put(key, _META.pack(0, load, fire), db=self._meta)

    def _holes_key(self, magazine: str, shard: int) -> bytes:
        return names.data_key_prefix(magazine, shard).encode()[:-1] + _HOLES_SUFFIX

    def _add_holes(self, txn: Any, magazine: str, shard: int, made: int = 0, claimed: int = 0) -> None:
        key = self._holes_key(magazine, shard)
        raw = txn.get(key, db=self._meta)
        _, holes, passed = _HOLES.unpack(raw) if raw is not None else (0, 0, 0)
        txn.put(key, _HOLES.pack(0, holes + made, passed + claimed), db=self._meta)

    def resolve_claim(self, ticket: ClaimTicket, now_ms: int) -> list[Claimed] | None:
        return None  # a claim here is one local transaction: never in doubt

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        if not holes:
            return
        with self._write("count_holes", durable=False) as txn:
            for shard, n in holes.items():
                self._add_holes(txn, magazine, shard, claimed=n)

    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        expire_at = _expire_at(ttl_seconds, now_ms())
        if len(items) == 1:  # publish of one message: no per-shard bookkeeping
            shard, envelope = items[0]
            value = _pack_data(envelope, expire_at)
            try:
                with self._begin("load", True) as txn:
                    meta_key, load, fire = self._meta_get(txn, magazine, shard)
                    txn.put(self._keys(magazine, shard)[1] + b"%d" % (load + 1), value, db=self._data)
                    txn.put(meta_key, _META.pack(0, load + 1, fire), db=self._meta)
                self._ring(magazine, (shard,))
                self._flush()
            except lmdb.Error as exc:
                raise self._map_error(exc) from None
            return [_new_ref(SlotRef, (magazine, shard, load + 1))]
        packed = [(shard, _pack_data(envelope, expire_at)) for shard, envelope in items]
        refs: list[SlotRef] = []
        try:
            with self._begin("load", True) as txn:
                put, data_db = txn.put, self._data
                shards: dict[int, list[Any]] = {}
                for shard, value in packed:
                    state = shards.get(shard)
                    if state is None:
                        state = shards[shard] = [*self._meta_get(txn, magazine, shard),
                                                 self._keys(magazine, shard)[1]]
                    slot = state[1] = state[1] + 1
                    put(state[3] + b"%d" % slot, value, db=data_db)
                    refs.append(_new_ref(SlotRef, (magazine, shard, slot)))
                for key, load, fire, _ in shards.values():
                    self._meta_put(txn, key, load, fire)
            self._ring(magazine, shards)
            self._flush()
        except lmdb.Error as exc:
            raise self._map_error(exc) from None
        return refs

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        raw_id = msg_id.encode()
        value = _plain_head(len(raw_id)).pack(loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0, 0, 0,
                                              _FORMAT, loaded_at, 0, 0, len(raw_id), raw_id, len(payload)) + payload
        meta_key, prefix = self._keys(magazine, shard)
        meta_db, data_db = self._meta, self._data

        def write(txn: Any) -> int:
            # Positional arguments (get: key, default, db; put: key, value, dupdata, overwrite, append,
            # db): py-lmdb's keyword parsing costs about 0.1 µs a call.
            raw = txn.get(meta_key, None, meta_db)
            _, load, fire = _META.unpack(raw) if raw is not None else (0, 0, 0)
            load += 1
            txn.put(prefix + b"%d" % load, value, True, True, False, data_db)
            txn.put(meta_key, _META.pack(0, load, fire), True, True, False, meta_db)
            return load

        return self._grouped("load", write, durable=True, after=lambda _slot: self._ring(magazine, (shard,)))

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[range]:
        # Records expire ttl_seconds after loadedAt, which publish sets to now.
        expire_at = batch.loaded_at + ttl_seconds * 1000 if ttl_seconds > 0 else 0
        data_db, meta_db, pack_meta = self._data, self._meta, _META.pack
        values = _pack_new(batch, expire_at)
        try:
            with self._begin("load", True) as txn:
                # A shard's records go in together, in slot order: neighbouring keys, so each insert
                # finds its B-tree page already at hand. Per message only C-level calls (map, zip,
                # putmulti): zip hands putmulti one reused tuple, so no pair is allocated either.
                putmulti = txn.cursor(db=data_db).putmulti
                taken = []
                for shard, indices in placement:
                    meta_key, prefix = self._keys(magazine, shard)
                    raw = txn.get(meta_key, None, meta_db)
                    _, load, fire = _META.unpack(raw) if raw is not None else (0, 0, 0)
                    slots = range(load + 1, load + 1 + len(indices))
                    key_format = prefix.replace(b"%", b"%%") + b"%d"  # prefix + slot, as one C call
                    putmulti(zip(map(key_format.__mod__, slots), map(values.__getitem__, indices), strict=True))
                    txn.put(meta_key, pack_meta(0, slots.stop - 1, fire), True, True, False, meta_db)
                    taken.append(slots)
            self._ring(magazine, [shard for shard, _ in placement])
            self._flush()
            return taken
        except lmdb.Error as exc:
            raise self._map_error(exc) from None

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        bump = 1 if count_attempt else 0
        header, header_size = _DATA_HEADER, _DATA_HEADER.size
        meta_key, prefix = self._keys(magazine, shard)
        meta_db, data_db = self._meta, self._data

        def available(meta: bytes | None) -> tuple[int, int, int]:
            if meta is None:
                return 0, 0, 0
            _, load, fire = _META.unpack(meta)
            return load, fire, min(max_slots, (load if up_to is None else min(load, up_to)) - fire)

        if self._sync:  # a look first, without the write lock every process shares: a drained shard waits for
            try:      # no other process's flush (with durability=fast the lock is held for microseconds)
                with self._env.env.begin(None, None, False) as txn:
                    if available(txn.get(meta_key, None, meta_db))[2] <= 0:
                        return []
            except lmdb.Error as exc:
                raise self._map_error(exc) from None

        def write(txn: Any) -> list[tuple[int, bytes | None]]:
            load, fire, count = available(txn.get(meta_key, None, meta_db))  # positional: see load_one
            if count <= 0:  # another claimer took them meanwhile
                return []
            raws: list[tuple[int, bytes | None]] = []
            get, put = txn.get, txn.put
            expired = 0
            for slot in range(fire + 1, fire + count + 1):
                key = prefix + b"%d" % slot
                raw = get(key, None, data_db)
                if raw is not None and len(raw) >= header_size:  # (a shorter one: damaged, unreadable)
                    expire_at, _, attempts = header.unpack_from(raw)
                    if expire_at and expire_at <= now_ms_:
                        txn.delete(key, b"", data_db)
                        raw = None
                        expired += 1
                    else:  # stamp fireTS and attempts in the fixed header: no msgpack in the txn
                        raw = header.pack(expire_at, now_ms_, attempts + bump) + raw[header_size:]
                        put(key, raw, True, True, False, data_db)
                raws.append((slot, raw))
            put(meta_key, _META.pack(0, load, fire + count), True, True, False, meta_db)
            if expired:  # a message that expired unclaimed: a hole made now (the claimer counts it passed)
                self._add_holes(txn, magazine, shard, made=expired)
            return raws

        if self._sync:
            raws = self._grouped("claim", write)
        else:  # durability=fast: its own transaction (see _grouped), without the indirection: a hot path
            try:
                with self._begin("claim", True) as txn:
                    raws = write(txn)
            except lmdb.Error as exc:
                raise self._map_error(exc) from None
        return [_new_ref(Claimed, (_new_ref(SlotRef, (magazine, shard, slot)),
                                   None if raw is None else _unpack_data(raw), False))
                for slot, raw in raws]

    # A publish here is one transaction, and so is a claim: a claim never passes a record still being
    # written, so no claimed slot is ever pending and restamp / seal are never needed (they still work).
    write_grace_ms = 0

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        bump = 1 if count_attempt else 0
        out = []
        with self._write("restamp", durable=False) as txn:
            for ref in refs:
                key = self._data_key(ref)
                raw = txn.get(key, db=self._data)
                if raw is None or _expired(raw, now_ms_):
                    out.append(Claimed(ref, None, False))
                    continue
                if len(raw) >= _DATA_HEADER.size:
                    expire_at, _, attempts = _DATA_HEADER.unpack_from(raw)
                    raw = _DATA_HEADER.pack(expire_at, now_ms_, attempts + bump) + raw[_DATA_HEADER.size:]
                    txn.put(key, raw, db=self._data)
                out.append(Claimed(ref, _unpack_data(raw, ref), False))
        return out

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        # No write can be late here: a missing record is a hole already, and a present one is no hole.
        return [envelope is None for envelope in self.read(refs)]

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        if not moves:
            return []
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        values = [_pack_data(m.envelope, expire_at) for m in moves]
        done: list[bool] = []
        with self._write("move") as txn:
            # The fence, in the move's own transaction: only the newest epoch handed out may move.
            raw = txn.get(EPOCH_KEY, db=self._system)
            newest = _unpack(raw)["epoch"] if raw else 0
            if epoch < newest:
                raise StaleEpoch(moves[0].source.magazine, epoch, newest)
            shards: dict[int, list[Any]] = {}
            for m, value in zip(moves, values, strict=True):
                key = self._data_key(m.source)
                raw = txn.get(key, db=self._data)
                fire_ts = None if raw is None or len(raw) < _DATA_HEADER.size else \
                    (_DATA_HEADER.unpack_from(raw)[1] or None)
                seen = fire_ts == m.fired_at if fired_before is None else \
                    fire_ts is not None and fire_ts < fired_before
                if m.envelope.codec == CODEC_UNREADABLE:  # moved on as it is: nobody holds an unreadable record
                    seen = True
                if raw is None or _expired(raw, now) or not seen:
                    done.append(False)  # settled, moved by someone else, or not the record that was seen
                    continue
                if self._meta_get(txn, m.source.magazine, m.source.shard)[2] < m.source.slot:
                    # taken out before any claim reached it: its slot is a hole now
                    self._add_holes(txn, m.source.magazine, m.source.shard, made=1)
                state = shards.get(m.shard)
                if state is None:
                    state = shards[m.shard] = [*self._meta_get(txn, target, m.shard), self._keys(target, m.shard)[1]]
                state[1] += 1
                txn.put(state[3] + b"%d" % state[1], value, db=self._data)
                txn.delete(key, db=self._data)
                done.append(True)
            for meta_key, load, fire, _ in shards.values():
                self._meta_put(txn, meta_key, load, fire)
        if shards:
            self._ring(target, shards)
        return done

    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        def get_all(txn: Any) -> list[Envelope | None]:
            now = now_ms()
            out: list[Envelope | None] = []
            for ref in refs:
                raw = txn.get(self._data_key(ref), db=self._data)
                out.append(None if raw is None or _expired(raw, now) else _unpack_data(raw, ref))
            return out

        return self._read("read", get_all)

    def peek(self, magazine: str, shard: int, first: int, last: int) -> list[tuple[SlotRef, Envelope]]:
        def scan(txn: Any) -> list[tuple[SlotRef, Envelope]]:
            now = now_ms()
            out = []
            prefix = self._keys(magazine, shard)[1]
            for slot in range(max(first, 1), last + 1):
                raw = txn.get(prefix + b"%d" % slot, db=self._data)
                if raw is not None and not _expired(raw, now):
                    out.append((SlotRef(magazine, shard, slot), _unpack_data(raw, f"{magazine}/{shard}/{slot}")))
            return out

        return self._read("peek", scan)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        raise NotImplementedError("lmdb allocates and writes a slot in one transaction: an empty reserved slot "
                                  "would be a hole for good to its consumers (write_grace_ms is 0)")

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        raise NotImplementedError("lmdb has no reserved slots (see reserve)")

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        raise NotImplementedError("lmdb has no reserved slots (see reserve)")

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        # A delete leaves no trace here; nor is one needed: a publish writes its slot in the transaction
        # that allocates it, so no slot below a fire pointer waits for its write (write_grace_ms = 0).
        return [False] * len(refs)

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[int | None] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        # (ids: an lmdb environment never hands a slot out twice: a commit that a crash undid took every
        # process that saw it down with it, claims included.)
        data_key = self._data_key
        if self._sync:
            keys = [data_key(ref) for ref in refs]
            return self._grouped("delete", functools.partial(_delete_keys, keys=keys, db=self._data))
        present = 0
        try:  # durability=fast: its own transaction (see _grouped), without the indirection: a hot path
            with self._begin("delete", True) as txn:
                delete, data_db = txn.delete, self._data
                for ref in refs:
                    present += delete(data_key(ref), b"", data_db)  # an expired, unpurged record counts too
        except lmdb.Error as exc:
            raise self._map_error(exc) from None
        return present

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        key = self._data_key(ref)
        with self._write("stamp_unfired", durable=False) as txn:
            raw = txn.get(key, db=self._data)
            if raw is None or _expired(raw, now_ms_):
                return None
            if len(raw) < _DATA_HEADER.size:
                return _unpack_data(raw, ref)  # damaged: unreadable, not stamped
            expire_at, fire_ts, attempts = _DATA_HEADER.unpack_from(raw)
            if not fire_ts:
                raw = _DATA_HEADER.pack(expire_at, now_ms_, attempts) + raw[_DATA_HEADER.size:]
                txn.put(key, raw, db=self._data)
        return _unpack_data(raw, ref)

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        def get_all(txn: Any) -> dict[int, ShardPointers]:
            out = {}
            for shard in range(shards):
                _, load, fire = self._meta_get(txn, magazine, shard)
                raw = txn.get(self._holes_key(magazine, shard), db=self._meta)
                _, holes, passed = _HOLES.unpack(raw) if raw is not None else (0, 0, 0)
                out[shard] = ShardPointers(load, fire, holes, passed)
            return out

        return self._read("pointers", get_all)

    def purge_magazine(self, magazine: str) -> int:
        removed = 0
        prefixes = [names.magazine_prefix(magazine).encode()]
        if names.queue_and_kind(magazine)[1] == "main":  # and the queue's delayed messages, and their record
            prefixes.append(names.delayed_prefix(magazine).encode())
        for prefix in prefixes:
            more = True
            while more:  # in chunks, so producers on other queues are not blocked for long
                with self._write("purge_magazine") as txn:
                    more = False
                    for db in (self._data, self._meta):
                        n, more_here = _delete_prefix(txn.cursor(db=db), prefix, 5000)
                        removed += n if db is self._data else 0
                        more = more or more_here
        return removed

    # ---- delayed messages (ignis.delay) -------------------------------------------------------
    # Data records under `{queue}_DELAYED_{due:013d}_{msgId}` (key order is due order, so the due ones are a
    # prefix read); the count and the mover's lease in the meta record `{queue}_DELAYED_METADATA`.
    def _delay_bins(self, txn: Any, queue: str, now: int) -> tuple[bytes, dict[str, Any]]:
        key = names.delayed_meta_key(queue).encode()
        found = self._get_bins(txn, self._meta, key, now)
        return key, (found[0] if found is not None else {})

    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        if not envelopes:
            return
        now = now_ms()
        expire_at = _expire_at(ttl_seconds, now)
        packed = [(names.delayed_key(queue, env.due_at or 0, env.msg_id).encode(), _pack_data(env, expire_at))
                  for env in envelopes]

        def write(txn: Any) -> None:
            key, bins = self._delay_bins(txn, queue, now)
            bins[DELAYED_COUNT] = int(bins.get(DELAYED_COUNT, 0)) + len(packed)
            txn.put(key, _record(bins), db=self._meta)
            for data_key, value in packed:
                txn.put(data_key, value, db=self._data)

        self._grouped("load_delayed", write, durable=True)

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        prefix = names.delayed_prefix(queue).encode()
        last = names.delayed_key(queue, now_ms_, "~").encode()  # every key due at or before now_ms_

        def scan(txn: Any) -> list[Envelope]:
            out: list[Envelope] = []
            cursor = txn.cursor(db=self._data)
            if not cursor.set_range(prefix):
                return out
            for key, raw in cursor:
                if not key.startswith(prefix) or key > last or len(out) >= limit:
                    break
                if _expired(raw, now_ms_):
                    continue
                out.append(_unpack_data(raw, key.decode(errors="replace")))
            return out

        return self._read("due_delayed", scan)

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        keys = [names.delayed_key(queue, env.due_at or 0, env.msg_id).encode() for env in envelopes]

        def write(txn: Any) -> int:
            gone = _delete_keys(txn, keys, self._data)
            key, bins = self._delay_bins(txn, queue, now_ms())
            bins[DELAYED_COUNT] = max(int(bins.get(DELAYED_COUNT, 0)) - gone, 0)
            txn.put(key, _record(bins), db=self._meta)
            return gone

        return self._grouped("settle_delayed", write, durable=True)

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        def write(txn: Any) -> bool:
            key, bins = self._delay_bins(txn, queue, now_ms_)
            if bins.get(DELAY_LEADER) not in (None, holder) and int(bins.get(DELAY_UNTIL, 0)) > now_ms_:
                return False
            bins[DELAY_LEADER], bins[DELAY_UNTIL] = holder, now_ms_ + hold_ms
            txn.put(key, _record(bins), db=self._meta)
            return True

        return self._grouped("lead_delayed", write)

    def change_mark(self) -> int | None:
        # The last committed transaction's id, from the environment's meta pages (mdb_env_info): every commit of
        # every process moves it.
        return int(self._env.env.info()["last_txnid"])

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        now = now_ms()

        def read(txn: Any) -> list[DelayState]:
            out = []
            cursor = txn.cursor(db=self._data)
            for queue in queues:
                bins = self._delay_bins(txn, queue, now)[1]
                count = int(bins.get(DELAYED_COUNT, 0))
                next_due = None
                prefix = names.delayed_prefix(queue).encode()
                if count and cursor.set_range(prefix) and cursor.key().startswith(prefix):
                    due = cursor.key()[len(prefix):len(prefix) + 13]
                    next_due = int(due) if due.isdigit() else None
                out.append(DelayState(count, next_due))
            return out

        return self._read("delay_states", read)

    # ---- introspection for tools and tests ----------------------------------------------------
    def raw_record(self, set_name: str, key: str) -> tuple[int, dict[str, Any]] | None:
        """(expire-at ms, bins) of any record, expired or not — what `aql` would show."""
        db = self._env.db(set_name)

        def get(txn: Any) -> tuple[int, dict[str, Any]] | None:
            raw = txn.get(key.encode(), db=db)
            if raw is None:
                return None
            if db is self._data:
                return _HEADER.unpack_from(raw)[0], _unpack_data(bytes(raw)).to_bins()
            if db is self._meta and len(raw) == _META.size:  # (a queue's delay record is a bin map)
                expire_at, first, second = _META.unpack(raw)
                if key.encode().endswith(_HOLES_SUFFIX):
                    return expire_at, {HOLES: first, HOLES_CLAIMED: second}
                return expire_at, {LOAD_POINTER: first, FIRE_POINTER: second}
            return _HEADER.unpack_from(raw)[0], _unpack(bytes(raw))

        return self._read("raw_record", get)


def _delete_prefix(cursor: Any, prefix: bytes, limit: int) -> tuple[int, bool]:
    removed = 0
    if not cursor.set_range(prefix):
        return 0, False
    while bytes(cursor.key()).startswith(prefix):
        if removed >= limit:
            return removed, True
        removed += 1
        if not cursor.delete():
            break
    return removed, False
