"""The lmdb store's transaction context: what every concern of one store handle shares.

`StoreContext` holds the handle's environment and open databases (queues, index, data, meta, system), opens
transactions (`begin`, `write`, `read`, the group-committed `grouped`), makes commits durable (`flush`), rings
the doorbell after a load (`ring`), maps lmdb errors to IgnisMQ's (`map_error`), counts calls and refuses them
on a closed or forked handle (`opened`), and builds a shard's keys and reads or writes its meta and hole
records. It is separate so that the concern objects (registry, leases, allocation, claims, moves, reads,
delayed) each hold one small shared object, not the whole store, and none of them depends on another.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb

from ignis import names
from ignis.errors import StoreError, StoreFull, StoreUnavailable
from ignis.metrics import STORAGE_CALLS
from ignis.storage.base import SlotRef
from ignis.storage.lmdb.doorbell import EnvironmentBell
from ignis.storage.lmdb.environment import _Environment
from ignis.storage.lmdb.records import (
    _HOLES_SUFFIX,
    _expired,
    _pack_holes,
    _pack_meta,
    _unpack,
    _unpack_header,
    _unpack_holes,
    _unpack_meta,
)

_monotonic = time.monotonic
log = logging.getLogger(__name__)

T = TypeVar("T")


def _delete_keys(txn: Any, keys: Sequence[bytes], db: Any) -> int:
    """Delete records; how many were there (an expired, unpurged record counts too)."""
    delete = txn.delete
    return sum(delete(key, b"", db) for key in keys)


class CursorElsewhere(LookupError):
    """A subscription's cursor's keys asked of the store's own context: its records are in its own environment
    (ignis.storage.lmdb.cursor_environments). Raised on a miss of the key cache, never on a hit, so an ack's hot
    path tells a queue's message from a subscription's at no cost (Reads.delete)."""


class StoreContext:
    """One store handle's environment, databases and transaction helpers, shared by its concern objects."""

    def __init__(self, env: _Environment, *, farm_id: str, client_id: str, durability: str, map_size: int,
                 max_dbs: int, cursor_only: bool = False) -> None:
        self.env = env
        self.client_id = client_id
        self.sync = durability == "fsync"
        self.map_size = map_size
        self.max_dbs = max_dbs
        self.closed = False
        self.cursor_only = cursor_only
        self.calls: dict[str, Any] = {}
        self.call_counters: list[Any] = []
        self.key_cache: dict[tuple[str, int], tuple[bytes, bytes]] = {}
        self.bells: dict[str, EnvironmentBell | None] = {}  # magazine -> the doorbell a load into it rings (bell_of)
        self.ring_hooks: dict[str, tuple[Any, Any]] = {}  # magazine -> its loads' ring hooks (load_rings)
        try:
            self.data = env.db(names.data_set(client_id))
            self.meta = env.db(names.meta_set(client_id))
            if cursor_only:  # a cursor's own environment: claim records and pointers only
                self.queues = self.index = self.system = None
            else:
                self.queues = env.db(names.queue_set(farm_id, client_id))
                self.index = env.db(names.active_index(farm_id, client_id))
                self.system = env.db(f"{farm_id}_ignis_system")
        except lmdb.Error as exc:
            raise self.map_error(exc) from None

    @property
    def location(self) -> str:
        return f"lmdb://{self.env.path}"

    def map_error(self, exc: lmdb.Error) -> StoreError:
        if isinstance(exc, lmdb.MapFullError):
            return StoreFull(f"lmdb store at {self.env.path} is full (map_size={self.map_size} bytes); "
                             "reopen it with a larger ?map_size=")
        if isinstance(exc, lmdb.DbsFullError):
            return StoreFull(f"lmdb store at {self.env.path} has no room for more sets (max_dbs="
                             f"{self.max_dbs}); reopen it with a larger ?max_dbs=")
        return StoreError(f"lmdb store at {self.env.path}: {exc}")

    @contextmanager
    def write(self, operation: str, durable: bool = True) -> Iterator[Any]:
        """A write transaction, committed on exit; `durable`: on disk when this returns (see flush)."""
        try:
            with self.begin(operation, True) as txn:
                yield txn
            if durable:
                self.flush()
        except lmdb.Error as exc:
            raise self.map_error(exc) from None

    def flush(self) -> None:
        """Make every commit so far durable (durability=fsync): the commit flushed its data pages already; this
        flushes the meta page (environment opened with metasync off), outside the write lock, so concurrent
        publishers share flushes; in a cursor's environment that checkpoints instead (ignis.storage.lmdb.checkpoints),
        writes a checkpoint. Raises lmdb.Error (StoreError: a checkpoint's file)."""
        if self.sync:
            self.env.env.sync(True)
        elif self.env.checkpoints is not None:
            try:
                self.env.checkpoints.take(at_once=True)
            except OSError as exc:
                raise StoreError(f"lmdb store at {self.env.path}: cannot write its checkpoint: {exc}") from None

    def read(self, operation: str, fn: Callable[[Any], T]) -> T:
        try:
            with self.begin(operation, False) as txn:
                return fn(txn)
        except lmdb.Error as exc:
            raise self.map_error(exc) from None

    def get_bins(self, txn: Any, db: Any, key: bytes, now: int) -> tuple[dict[str, Any], int] | None:
        raw = txn.get(key, db=db)
        if raw is None or _expired(raw, now):
            return None
        return _unpack(raw), _unpack_header(raw)[0]

    # ---- magazine primitives' transactions -------------------------------------------------------
    # Hot paths: each is one transaction, opened directly (no context-manager helper) and with the
    # msgpack work done outside it where possible, so concurrent writers hold the write lock briefly.
    def begin(self, operation: str, write: bool) -> Any:
        if self.closed or self.env.forked:
            self.opened(operation)  # raises
        tick = self.calls.get(operation)
        if tick is None:
            self.opened(operation)
        else:
            tick()
        return self.env.env.begin(None, None, write)  # positional: py-lmdb parses keywords slowly

    def grouped(self, operation: str, write: Callable[[Any], T], durable: bool = False,
                 after: Callable[[T], None] | None = None, early: bool = False,
                 before: Callable[[T], None] | None = None, lead_when_idle: bool = False) -> T:
        """write(txn), committed with whatever other threads of this process write meanwhile (GroupCommit);
        before(result) before the commit, after(result) after it; `early`: returns once write ran, under the
        write lock, before its commit (claims only: see GroupCommit), unless `lead_when_idle` and no commit runs
        (group_commit.LEAD_WHEN_IDLE)."""
        self.opened(operation)
        try:
            if not self.sync:  # durability=fast: a commit flushes nothing and holds the lock for microseconds
                with self.env.env.begin(None, None, True) as txn:
                    result = write(txn)
                    if before is not None:
                        before(result)
                if after is not None:
                    after(result)
                return result
            return self.env.group.run(write, durable, after, early, before, lead_when_idle)
        except lmdb.Error as exc:
            raise self.map_error(exc) from None

    def bell_of(self, magazine: str) -> EnvironmentBell | None:
        """The doorbell a load into `magazine` rings: the environment's for a main magazine (only those have
        consumers), None for the others."""
        bell = self.bells.get(magazine, False)
        if bell is False:
            if len(self.bells) > 100_000:
                self.bells.clear()
            bell = self.bells[magazine] = \
                self.env.bell(self.location) if names.queue_and_kind(magazine)[1] == "main" else None
        return bell  # type: ignore[return-value]

    def load_rings(self, magazine: str) -> tuple[Callable[[list[int]], None], Callable[[list[int]], None]]:
        """The rings of a grouped load into `magazine`, before and after its commit, as the `fn`s of
        group_commit.Combined hooks (called with the shards): the same two objects for every load into it, so
        the loads one commit carries ring each listener once."""
        rings = self.ring_hooks.get(magazine)
        if rings is None:
            if len(self.ring_hooks) > 100_000:
                self.ring_hooks.clear()
            rings = self.ring_hooks[magazine] = (functools.partial(self.ring_committing, magazine, grouped=True),
                                                 functools.partial(self.ring, magazine, after_committing=True))
        return rings

    def ring(self, magazine: str, shards: Iterable[int], after_committing: bool = False) -> None:
        """A load into a main magazine committed: ring the consumer processes that wait on it (doorbell),
        before the publish's own flush, so they claim it meanwhile. `after_committing`: ring_committing
        rang already, so only the listeners that do not take committing rings."""
        bell = self.bells.get(magazine, False)
        if bell is False:
            bell = self.bell_of(magazine)
        if bell is not None and _monotonic() >= bell.quiet_until:  # (quiet: nobody else listens, no call)
            bell.ring(self.client_id, magazine, shards, after_committing)

    def ring_committing(self, magazine: str, shards: Iterable[int], grouped: bool = False) -> None:
        """A load into a main magazine is about to commit (called inside its write transaction): ring the
        listeners that take committing rings, so their consumers wake while the commit flushes. `grouped`: a
        before hook of the group commit, whose claims of this process's woken consumers ride along in its
        transaction (GroupCommit.expect_claim). A hint: it never fails the write."""
        try:
            bell = self.bell_of(magazine)
            if bell is not None:
                woke = bell.ring_committing(self.client_id, magazine, shards)
                if woke and grouped and self.sync:
                    self.env.group.expect_claim()
        except Exception:
            log.debug("committing ring failed", exc_info=True)

    def committing(self, magazine: str, shard: int) -> bool:
        """Whether a committing ring vouches for a load into this shard that a reader may not see yet."""
        bell = self.env.bell_if_open()
        return bell is not None and bell.take_committing(self.client_id, magazine, shard)

    def opened(self, operation: str) -> None:
        """Count the call; refuse it on a closed handle or one inherited through fork()."""
        if self.closed or self.env.forked:
            raise StoreUnavailable(f"lmdb store at {self.env.path} is closed" if self.closed else
                                   f"lmdb store at {self.env.path} was opened before this process forked; "
                                   "open it again in this process (LMDB handles do not survive fork)")
        tick = self.calls.get(operation)
        if tick is None:
            counter = STORAGE_CALLS.labels(operation)
            self.call_counters.append(counter)  # held: a counter's tick alone does not keep the counter
            tick = self.calls[operation] = counter.tick
        tick()

    def keys(self, magazine: str, shard: int) -> tuple[bytes, bytes]:
        """(meta key, data-key prefix) of a shard, built once: a delivered message needs them twice."""
        keys = self.key_cache.get((magazine, shard))
        if keys is None:
            if len(self.key_cache) > 100_000:
                self.key_cache.clear()
            if not self.cursor_only and names.CURSOR_INFIX in magazine:
                raise CursorElsewhere(magazine)
            keys = self.key_cache[(magazine, shard)] = (
                names.meta_key(magazine, shard).encode(), names.data_key_prefix(magazine, shard).encode())
        return keys

    def data_key(self, ref: SlotRef) -> bytes:
        return self.keys(ref[0], ref[1])[1] + b"%d" % ref[2]

    def data_keys(self, refs: Sequence[SlotRef]) -> list[bytes]:
        """data_key of each ref, with keys' cache read inline (an ack's path: two calls fewer per message)."""
        cache, keys = self.key_cache, self.keys
        return [(cache.get((ref[0], ref[1])) or keys(ref[0], ref[1]))[1] + b"%d" % ref[2] for ref in refs]

    def meta_get(self, txn: Any, magazine: str, shard: int) -> tuple[bytes, int, int, bytes]:
        """(meta key, load pointer, fire pointer, the rest of the record: a bounded shard's LOAD_BYTES, which a
        writer of the pointers keeps: meta_put's `tail`)."""
        key = self.keys(magazine, shard)[0]
        raw = txn.get(key, db=self.meta)
        if raw is None:
            return key, 0, 0, b""
        _, load, fire = _unpack_meta(raw)
        return key, load, fire, raw[24:]

    def meta_put(self, txn: Any, key: bytes, load: int, fire: int, tail: bytes = b"") -> None:
        txn.put(key, _pack_meta(0, load, fire) + tail, db=self.meta)

    def holes_key(self, magazine: str, shard: int) -> bytes:
        return names.data_key_prefix(magazine, shard).encode()[:-1] + _HOLES_SUFFIX

    def add_holes(self, txn: Any, magazine: str, shard: int, made: int = 0, claimed: int = 0) -> None:
        key = self.holes_key(magazine, shard)
        raw = txn.get(key, db=self.meta)
        _, holes, passed = _unpack_holes(raw) if raw is not None else (0, 0, 0)
        txn.put(key, _pack_holes(0, holes + made, passed + claimed), db=self.meta)
