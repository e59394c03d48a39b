"""The lmdb store's facade: `LmdbStore`, the `Storage` implementation callers open, composed of its concerns.

`LmdbStore` checks its options, acquires the process's environment for its path (`_Environment`), builds the
`StoreContext` its concern objects share, and holds one object per concern: the queue registry, the farm-wide
clients and leases, allocation (loads), claims, fenced moves, reads and deletes, and the delayed-message
primitives. Each `Storage` method delegates to its concern in one line; what is left here is the handle itself
(its URL, client, doorbell, closing and the explicit purge). It is separate so that the one class callers see
stays a readable index of the interface while each concern's code lives beside the layout it relies on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ignis import names
from ignis.bounds import ShardLimit
from ignis.envelope import Envelope, NewMessages
from ignis.errors import InvalidInputError
from ignis.storage.base import (
    Claimed,
    ClaimTicket,
    CursorClaim,
    DelayState,
    HeldClaim,
    LeaseRecord,
    MagazineKind,
    Move,
    Placement,
    QueueRecord,
    ShardPointers,
    SlotRef,
)
from ignis.storage.lmdb.allocation import Allocation
from ignis.storage.lmdb.claims import Claims
from ignis.storage.lmdb.context import StoreContext
from ignis.storage.lmdb.cursor_environments import CURSOR_CHECKPOINT, CURSOR_DURABILITY_MODES, CursorEnvironments
from ignis.storage.lmdb.delayed import DelayedMessages
from ignis.storage.lmdb.doorbell import LmdbDoorbell
from ignis.storage.lmdb.environment import _Environment
from ignis.storage.lmdb.leases import Leases
from ignis.storage.lmdb.moves import Moves
from ignis.storage.lmdb.reads import Reads
from ignis.storage.lmdb.registry import QueueRegistry
from ignis.storage.lmdb.topics import Topics

if TYPE_CHECKING:
    from ignis.subjects import SubjectFilter

DURABILITY_MODES = ("fsync", "fast")


class LmdbStore:
    """`Storage` on LMDB. Thread-safe; safe with several processes on one host."""

    def __init__(
        self,
        path: str = ".ignis-data",
        *,
        farm_id: str = "local",
        client_id: str = "default",
        durability: str = "fsync",
        cursor_durability: str = CURSOR_CHECKPOINT,
        map_size: int = 8 << 30,
        max_dbs: int = 256,
        purge_interval: float = 60.0,
        _env: _Environment | None = None,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise InvalidInputError(f"durability={durability!r}: must be one of {', '.join(DURABILITY_MODES)}")
        if cursor_durability not in CURSOR_DURABILITY_MODES:
            raise InvalidInputError(f"cursor_durability={cursor_durability!r}: must be one of "
                                    f"{', '.join(CURSOR_DURABILITY_MODES)}")
        self.farm_id = names.check_id("farmId", farm_id)
        self.client_id = names.check_id("clientId", client_id)
        self._path = path
        self._durability = durability
        self._cursor_durability = cursor_durability
        self._map_size = map_size
        self._max_dbs = max_dbs
        self._purge_interval = purge_interval
        self._owns_env = _env is None
        env = _env or _Environment.acquire(path, durability, map_size, max_dbs)
        self._ctx = StoreContext(env, farm_id=farm_id, client_id=self.client_id, durability=durability,
                                 map_size=map_size, max_dbs=max_dbs)
        self._cursors = CursorEnvironments(self._ctx, farm_id=self.farm_id, durability=durability, map_size=map_size,
                                           purge_interval=purge_interval, cursor_durability=cursor_durability)
        self._registry = QueueRegistry(self._ctx)
        self._leases = Leases(self._ctx)
        self._allocation = Allocation(self._ctx)
        self._reads = Reads(self._ctx, self._cursors)
        self._claims = Claims(self._ctx, self._reads, self._cursors)
        self._moves = Moves(self._ctx, self._cursors)
        self._delayed = DelayedMessages(self._ctx)
        self._topics = Topics(self._ctx, self._cursors, self.farm_id)
        # The hot paths skip this facade's delegating frame (one Python call per publish, claim or ack): the
        # methods below stay for the interface's sake and are shadowed here by the concern's own.
        self.load_one = self._allocation.load_one  # type: ignore[method-assign]
        self.load_one_bounded = self._allocation.load_one_bounded  # type: ignore[method-assign]
        self.claim = self._claims.claim  # type: ignore[method-assign]
        self.delete = self._reads.delete  # type: ignore[method-assign]
        env.start_purger(purge_interval)

    # ---- plumbing ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        url = f"lmdb://{self._ctx.env.path}?durability={self._durability}"
        return url if self._cursor_durability == CURSOR_CHECKPOINT else \
            f"{url}&cursor_durability={self._cursor_durability}"

    @property
    def path(self) -> str:
        return self._ctx.env.path

    @property
    def location(self) -> str:
        return self._ctx.location

    def with_client(self, client_id: str) -> LmdbStore:
        return LmdbStore(self._path, farm_id=self.farm_id, client_id=client_id, durability=self._durability,
                         cursor_durability=self._cursor_durability,
                         map_size=self._map_size, max_dbs=self._max_dbs, purge_interval=self._purge_interval,
                         _env=self._ctx.env)

    def doorbell(self) -> LmdbDoorbell:
        return LmdbDoorbell(self._ctx.env.bell(self.location), self.client_id)

    @property
    def closed(self) -> bool:
        return self._ctx.closed

    def close(self) -> None:
        if not self._ctx.closed:
            self._ctx.closed = True
            self._cursors.close()
            if self._owns_env:
                self._ctx.env.release()

    def purge_expired(self) -> int:
        """Run one purge pass now (the background threads do this every purge_interval seconds), subscriptions'
        cursors included."""
        return self._ctx.env.purge_expired() + self._cursors.purge_expired()

    # ---- queue registry (registry.py) ----------------------------------------------------------
    def ensure_index(self) -> None:
        return self._registry.ensure_index()

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        return self._registry.apply_queue(name, config, ttl_seconds)

    def get_queue(self, name: str) -> QueueRecord | None:
        return self._registry.get_queue(name)

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        return self._registry.list_queues(active)

    def set_queue_active(self, name: str, active: bool) -> bool:
        return self._registry.set_queue_active(name, active)

    def delete_queue(self, name: str) -> bool:
        return self._registry.delete_queue(name)

    def next_epoch(self) -> int:
        return self._registry.next_epoch()

    def rewind_sweep(self, name: str, kind: MagazineKind, pointers: Mapping[int, int]) -> None:
        self._registry.rewind_sweep(name, kind, pointers)

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        return self._registry.advance_sweep(name, kind, epoch, pointers, swept)

    # ---- farm-wide system records (leases.py) --------------------------------------------------
    def register_client(self, client_id: str) -> None:
        return self._leases.register_client(client_id)

    def list_clients(self) -> list[str]:
        return self._leases.list_clients()

    def get_lease(self, name: str) -> LeaseRecord | None:
        return self._leases.get_lease(name)

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        return self._leases.replace_lease(name, lease, expected_version)

    # ---- magazine primitives: allocation (allocation.py) ---------------------------------------
    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        return self._allocation.load(magazine, items, ttl_seconds)

    def reload(self, magazine: str, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool],
               ttl_seconds: int) -> list[SlotRef]:
        # An lmdb load is one transaction, all or nothing: it never raises LoadInterrupted. For the interface's
        # sake: what is not in its slot is loaded afresh (a slot an lmdb load allocated holds its message).
        refs = list(refs)
        todo = [i for i, (env, done) in enumerate(zip(self.read(refs), landed, strict=True))
                if not done and (env is None or env.msg_id != envelopes[i].msg_id)]
        for i, ref in zip(todo, self.load(magazine, [(refs[i].shard, envelopes[i]) for i in todo], ttl_seconds),
                          strict=True):
            refs[i] = ref
        return refs

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        return self._allocation.load_one(magazine, shard, payload, msg_id, loaded_at, ttl_seconds)

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[range]:
        return self._allocation.load_new(magazine, batch, placement, ttl_seconds)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        return self._allocation.reserve(magazine, shard, count)

    def load_bounded(self, magazine: str, shard: int, envelopes: Sequence[Envelope], ttl_seconds: int,
                     limit: ShardLimit) -> list[SlotRef | None]:
        return self._allocation.load_bounded(magazine, shard, envelopes, ttl_seconds, limit)

    def load_new_bounded(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int,
                         limits: Sequence[ShardLimit]) -> list[Sequence[int]]:
        return self._allocation.load_new_bounded(magazine, batch, placement, ttl_seconds, limits)

    def load_one_bounded(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                         ttl_seconds: int, limit: ShardLimit) -> int:
        return self._allocation.load_one_bounded(magazine, shard, payload, msg_id, loaded_at, ttl_seconds, limit)

    def reserve_bounded(self, magazine: str, shard: int, count: int, limit: ShardLimit, size: int
                        ) -> tuple[int, int]:
        return self._allocation.reserve(magazine, shard, count), 0  # (raises: lmdb reserves nothing)

    def loaded_bytes(self, magazine: str, shards: int) -> list[int]:
        return self._allocation.loaded_bytes(magazine, shards)

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        return self._allocation.load_reserved(ref, payload, msg_id, loaded_at, ttl_seconds)

    def load_reserved_envelope(self, ref: SlotRef, envelope: Envelope, ttl_seconds: int) -> bool:
        raise NotImplementedError("lmdb has no reserved slots (see Allocation.reserve)")

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        return self._allocation.load_reserved_many(refs, payloads, ids, loaded_at, ttl_seconds)

    # ---- magazine primitives: claims, stamps, seals, holes (claims.py) -------------------------
    # A publish here is one transaction, and so is a claim: a claim never passes a record still being
    # written, so no claimed slot is ever pending and restamp / seal are never needed (they still work).
    write_grace_ms = 0
    needs_beacon = False  # a load rings the doorbell itself (StoreContext.ring)
    settles_by_id = False  # an environment never hands a slot out twice (Reads.delete)

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        return self._claims.claim(magazine, shard, max_slots, now_ms_, count_attempt, up_to)

    def claim_held(self, magazine: str, shard: int, now_ms_: int, hold_ms: int, count_attempt: bool = True
                   ) -> HeldClaim:
        return self._claims.claim_held(magazine, shard, now_ms_, hold_ms, count_attempt)

    def release_hold(self, magazine: str, shard: int, slot: int, until_ms: int = 0) -> bool:
        return self._claims.release_hold(magazine, shard, slot, until_ms)

    def settle_held(self, refs: Sequence[SlotRef], ids: Sequence[str | None] | None = None) -> int:
        return self._claims.settle_held(refs, ids)

    def resolve_claim(self, ticket: ClaimTicket, now_ms: int) -> list[Claimed] | None:
        return self._claims.resolve_claim(ticket, now_ms)

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        return self._claims.note_claimed_holes(magazine, holes)

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        return self._claims.restamp(refs, now_ms_, count_attempt)

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        return self._claims.seal(refs, ttl_seconds)

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        return self._claims.stamp_unfired(ref, now_ms_)

    # ---- magazine primitives: fenced moves (moves.py) ------------------------------------------
    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        return self._moves.move(target, moves, ttl_seconds, epoch, fired_before)

    # ---- magazine primitives: reads, pointers, deletes (reads.py) ------------------------------
    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        return self._reads.read(refs)

    def peek(self, magazine: str, shard: int, first: int, last: int, only: SubjectFilter | None = None
             ) -> list[tuple[SlotRef, Envelope]]:
        return self._reads.peek(magazine, shard, first, last, only)

    def held(self, refs: Sequence[SlotRef]) -> list[bool]:
        return [envelope is not None for envelope in self.read(refs)]  # (local, mapped: a read is as cheap)

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        return self._reads.settled(refs)

    def drop_settled(self, magazine: str, shard: int, first: int, last: int) -> int:
        return 0  # an ack deletes its record here: nothing is left behind

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[Any] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        return self._reads.delete(refs, versions, ids)

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        return self._reads.pointers(magazine, shards)

    def purge_magazine(self, magazine: str) -> int:
        return self._reads.purge_magazine(magazine)

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        return self._reads.watch_pointers(magazines)

    def beacon(self, magazine: str) -> None:
        return self._reads.beacon(magazine)

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        return self._reads.read_beacons(magazines)

    # ---- delayed messages (delayed.py) ---------------------------------------------------------
    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        return self._delayed.load_delayed(queue, envelopes, ttl_seconds)

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        return self._delayed.due_delayed(queue, now_ms_, limit)

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        return self._delayed.settle_delayed(queue, envelopes)

    # A due message's move into main is one transaction (delayed.py): its copy, its delete and its uncount.
    moves_delayed_in_one_write = True

    def move_delayed(self, queue: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        return self._delayed.move_delayed(queue, items, ttl_seconds)

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        return self._delayed.lead_delayed(queue, holder, now_ms_, hold_ms)

    def change_mark(self) -> int | None:
        return self._delayed.change_mark()

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        return self._delayed.delay_states(queues)

    # ---- topics and subscriptions' cursors (topics.py) ----------------------------------------
    def apply_topic(self, name: str, config: Mapping[str, Any]) -> bool:
        return self._topics.apply_topic(name, config)

    def get_topic(self, name: str) -> QueueRecord | None:
        return self._topics.get_topic(name)

    def list_topics(self) -> list[QueueRecord]:
        return self._topics.list_topics()

    def delete_topic(self, name: str) -> bool:
        return self._topics.delete_topic(name)

    def set_cursor(self, cursor: str, positions: Mapping[int, int]) -> None:
        self._topics.set_cursor(cursor, positions)

    def claim_cursor(self, cursor: str, shard: int, max_slots: int, now_ms_: int, only: SubjectFilter | None,
                     up_to: int | None = None, count_attempt: bool = True, recheck: bool = True) -> CursorClaim:
        return self._topics.claim_cursor(cursor, shard, max_slots, now_ms_, only, up_to, count_attempt)  # (exact)

    def restamp_cursor(self, refs: Sequence[SlotRef], now_ms_: int, only: SubjectFilter | None,
                       count_attempt: bool = True) -> list[Claimed]:
        return self._topics.restamp_cursor(refs, now_ms_, only, count_attempt)

    def write_claims(self, refs: Sequence[SlotRef]) -> None:
        pass  # (a claim commits its claim records)

    def cursor_moved_at(self, cursor: str, shard: int) -> int | None:
        return None  # (not kept: a cursor here never passes a slot without its claim record)

    def seal_cursor(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        return self._topics.seal_cursor(refs, ttl_seconds)

    # ---- introspection for tools and tests (reads.py) ------------------------------------------
    def raw_record(self, set_name: str, key: str) -> tuple[int, dict[str, Any]] | None:
        """(expire-at ms, bins) of any record, expired or not — what `aql` would show."""
        return self._reads.raw_record(set_name, key)
