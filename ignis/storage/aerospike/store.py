"""The `AerospikeStore` facade and `open_aerospike`. The facade holds one object per concern (registry,
system records, reads, seals, allocation, claims, moves, pointers, delayed messages, purges), all sharing one
`AerospikeContext`, and each `Storage` method delegates to its concern in one line; it also owns the
connection's life (`with_client` views share it, `close`). Separate so that the `Storage` surface is read in
one place and the concerns know nothing of each other beyond what they are given."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aerospike import exception as ex

from ignis import names
from ignis.bounds import ShardLimit
from ignis.envelope import Envelope, NewMessages
from ignis.errors import InvalidInputError
from ignis.storage.aerospike.allocation import Allocation
from ignis.storage.aerospike.claims import Claims
from ignis.storage.aerospike.config import AerospikeSettings, load_settings
from ignis.storage.aerospike.context import AerospikeContext, Shared
from ignis.storage.aerospike.deferred import DeferredClaims
from ignis.storage.aerospike.delayed import Delayed
from ignis.storage.aerospike.moves import Moves
from ignis.storage.aerospike.pointers import Pointers
from ignis.storage.aerospike.purge import Purge
from ignis.storage.aerospike.reads import Reads
from ignis.storage.aerospike.registry import Registry
from ignis.storage.aerospike.seals import Seals
from ignis.storage.aerospike.system import SystemRecords
from ignis.storage.aerospike.topics import Topics
from ignis.storage.base import (
    FIRE_POINTER,
    HOLES,
    HOLES_CLAIMED,
    LOAD_POINTER,
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
    load_new_as_envelopes,
    load_new_bounded_per_shard,
)

if TYPE_CHECKING:
    from ignis.subjects import SubjectFilter

log = logging.getLogger(__name__)


class AerospikeStore:
    """`Storage` on Aerospike. Thread-safe (the client is); one instance per (farmId, clientId)."""

    def __init__(self, settings: AerospikeSettings, *, farm_id: str = "local", client_id: str = "default",
                 client: Any = None, _shared: Shared | None = None) -> None:
        ctx = self._ctx = AerospikeContext(settings, farm_id, client_id, client, _shared)
        self.farm_id, self.client_id = ctx.farm_id, ctx.client_id
        self._shared, self._owner = ctx.shared, ctx.owner  # the connection, for with_client and close
        self._ns = ctx.ns  # (read by tools and tests)
        self._reads = Reads(ctx)
        self._seals = Seals(ctx)
        self._allocation = Allocation(ctx, self._reads, self._seals)
        self._claims = Claims(ctx, self._allocation)
        self._moves = Moves(ctx, self._allocation, self._seals, self._reads)
        self._registry = Registry(ctx, self._reads)
        self._system = SystemRecords(ctx)
        self._pointers = Pointers(ctx, self._allocation, self._reads)
        self._delayed = Delayed(ctx, self._registry, self._reads)
        self._purge = Purge(ctx, self._delayed)
        self._topics = Topics(ctx, self._reads, self._seals)
        if self._owner and settings.claim_write_delay_ms > 0 and not ctx.durable:
            # (durable deletes leave no tombstone that says a slot was acked: claim records are written at once)
            self._shared.deferred = DeferredClaims(settings.claim_write_delay_ms, self._topics.write_late,
                                                   self._topics.settle_late)
        # The hot paths skip this facade's delegating frame (one Python call per publish, claim or ack): the
        # methods below stay for the interface's sake and are shadowed here by the concern's own.
        self.load_reserved = self._allocation.load_reserved  # type: ignore[method-assign]
        self.claim = self._claims.claim  # type: ignore[method-assign]
        self.delete = self._reads.delete  # type: ignore[method-assign]
        self.beacon = self._pointers.beacon  # type: ignore[method-assign]
        failure = self._registry.create_index()
        if failure is not None:
            # A producer or consumer whose user may read and write but not manage indexes still works;
            # only listing queues needs the index, and the operator (sindex-admin role) creates it.
            if not isinstance(failure[0], ex.RoleViolation):
                if self._owner:
                    self.close()
                raise failure[1]
            log.warning("%s: cannot create index %s (no privilege); list_queues needs it: create it with a "
                        "user holding sindex-admin (the operator does)", ctx.url, ctx.index_name)

    # ---- plumbing ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self._ctx.url

    @property
    def location(self) -> str:
        # The connection's identity too: handles on one connection share it; two connections of a process
        # to one cluster are told apart (harmless: each learns of the other's publishes through its watcher).
        return f"{self._ctx.url}@{id(self._shared):x}"

    @property
    def client(self) -> Any:
        """The raw Aerospike client (for tools and tests)."""
        return self._ctx.client

    @property
    def durable_deletes(self) -> bool:
        """True: acks are durable deletes (Enterprise); False: tombstones (Community)."""
        return self._ctx.durable

    def __repr__(self) -> str:
        return f"AerospikeStore({self._ctx.url}, acks={'durable-delete' if self._ctx.durable else 'tombstone'})"

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

    @property
    def closed(self) -> bool:
        return self._shared.closed

    def close(self) -> None:
        shared = self._shared
        if not self._owner:
            return  # a view: the owner closes the connection
        if shared.deferred is not None and not shared.closed:
            shared.deferred.close(shared.settings.total_timeout_ms / 1000)  # (before the client goes)
        with shared.lock:
            if shared.closed:
                return
            shared.closed = True
            shared.queries_done.wait_for(lambda: shared.queries == 0, timeout=shared.settings.total_timeout_ms / 1000)
        if shared.owns_client:
            shared.client.close()

    def key(self, set_name: str, key: str) -> tuple[str, str, str]:
        return self._ctx.key(set_name, key)

    def _claims_written(self, refs: Iterable[SlotRef]) -> None:
        """The claim records owed for `refs` written first (deferred.py): the operation that follows reads or
        changes them (a nack's move, a read of a held message)."""
        deferred = self._shared.deferred
        if deferred is not None and deferred.pending:
            deferred.write_now(self._ctx.data_keys(refs))

    @property
    def write_grace_ms(self) -> int:
        return self._ctx.write_grace_ms

    needs_beacon = True  # no doorbell: watchers of idle queues elsewhere read the beacon (Pointers.beacon)
    settles_by_id = True  # a rollback can hand a lost message's slot to a newer one (rollback.py)

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[Sequence[int]]:
        # One record object per message either way: the envelope path costs nothing extra here.
        return load_new_as_envelopes(self, magazine, batch, placement, ttl_seconds)

    # ---- registry ----------------------------------------------------------------------------------
    def ensure_index(self) -> None:
        self._registry.ensure_index()

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

    def rewind_sweep(self, name: str, kind: MagazineKind, pointers: Mapping[int, int]) -> None:
        self._registry.rewind_sweep(name, kind, pointers)

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        self._registry.advance_sweep(name, kind, epoch, pointers, swept)

    # ---- system ------------------------------------------------------------------------------------
    def next_epoch(self) -> int:
        return self._system.next_epoch()

    def register_client(self, client_id: str) -> None:
        self._system.register_client(client_id)

    def list_clients(self) -> list[str]:
        return self._system.list_clients()

    def get_lease(self, name: str) -> LeaseRecord | None:
        return self._system.get_lease(name)

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        return self._system.replace_lease(name, lease, expected_version)

    # ---- allocation --------------------------------------------------------------------------------
    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        return self._allocation.load_one(magazine, shard, payload, msg_id, loaded_at, ttl_seconds)

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        return self._allocation.reserve(magazine, shard, count)

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        return self._allocation.load_reserved(ref, payload, msg_id, loaded_at, ttl_seconds)

    def load_new_bounded(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int,
                         limits: Sequence[ShardLimit]) -> list[Sequence[int]]:
        return load_new_bounded_per_shard(self, magazine, batch, placement, ttl_seconds, limits)

    def load_bounded(self, magazine: str, shard: int, envelopes: Sequence[Envelope], ttl_seconds: int,
                     limit: ShardLimit) -> list[SlotRef | None]:
        return self._allocation.load_bounded(magazine, shard, envelopes, ttl_seconds, limit)

    def load_one_bounded(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                         ttl_seconds: int, limit: ShardLimit) -> int:
        ref = self._allocation.load_bounded(magazine, shard, [Envelope(payload, msg_id, loaded_at)], ttl_seconds,
                                            limit)[0]
        return 0 if ref is None else ref.slot

    def reserve_bounded(self, magazine: str, shard: int, count: int, limit: ShardLimit, size: int
                        ) -> tuple[int, int]:
        return self._allocation.reserve_bounded(magazine, shard, count, limit, size)

    def loaded_bytes(self, magazine: str, shards: int) -> list[int]:
        return self._pointers.loaded_bytes(magazine, shards)

    def load_reserved_envelope(self, ref: SlotRef, envelope: Envelope, ttl_seconds: int) -> bool:
        return self._allocation.load_reserved_envelope(ref, envelope, ttl_seconds)

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        return self._allocation.load_reserved_many(refs, payloads, ids, loaded_at, ttl_seconds)

    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        return self._allocation.load(magazine, items, ttl_seconds)

    def reload(self, magazine: str, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool],
               ttl_seconds: int) -> list[SlotRef]:
        return self._allocation.reload(magazine, refs, envelopes, landed, ttl_seconds)

    # ---- claims ------------------------------------------------------------------------------------
    def claim(self, magazine: str, shard: int, max_slots: int, now_ms_: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        return self._claims.claim(magazine, shard, max_slots, now_ms_, count_attempt, up_to)

    def claim_held(self, magazine: str, shard: int, now_ms_: int, hold_ms: int, count_attempt: bool = True
                   ) -> HeldClaim:
        return self._claims.claim_held(magazine, shard, now_ms_, hold_ms, count_attempt)

    def settle_held(self, refs: Sequence[SlotRef], ids: Sequence[str | None] | None = None) -> int:
        present = self._reads.delete(refs, None, ids)  # the records first (two records: see Storage.settle_held)
        for ref in refs:
            self._claims.release_hold(ref.magazine, ref.shard, ref.slot)
        return present

    def release_hold(self, magazine: str, shard: int, slot: int, until_ms: int = 0) -> bool:
        return self._claims.release_hold(magazine, shard, slot, until_ms)

    def resolve_claim(self, ticket: ClaimTicket, now_ms_: int) -> list[Claimed] | None:
        if names.cursor_topic(ticket.magazine) is not None:  # a subscription's claim through its cursor
            return self._topics.resolve_cursor_claim(ticket)
        return self._claims.resolve_claim(ticket, now_ms_)

    def restamp(self, refs: Sequence[SlotRef], now_ms_: int, count_attempt: bool = True) -> list[Claimed]:
        return self._claims.restamp(refs, now_ms_, count_attempt)

    # ---- seals -------------------------------------------------------------------------------------
    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        return self._seals.seal(refs, ttl_seconds)

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        self._seals.note_claimed_holes(magazine, holes)

    # ---- moves -------------------------------------------------------------------------------------
    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        self._claims_written(move.source for move in moves)
        return self._moves.move(target, moves, ttl_seconds, epoch, fired_before)

    # ---- reads -------------------------------------------------------------------------------------
    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        if refs and names.cursor_topic(refs[0][0]) is not None:  # a subscription's claims, joined to the messages
            self._claims_written(refs)
            return self._topics.joined("read", refs)
        return self._reads.read(refs)

    def held(self, refs: Sequence[SlotRef]) -> list[bool]:
        return self._reads.held(refs)

    def peek(self, magazine: str, shard: int, first: int, last: int, only: SubjectFilter | None = None
             ) -> list[tuple[SlotRef, Envelope]]:
        if names.cursor_topic(magazine) is not None:
            refs = [SlotRef(magazine, shard, slot) for slot in range(max(first, 1), last + 1)]
            self._claims_written(refs)
            try:
                found = self._topics.joined("peek", refs)
            except ex.AerospikeError as exc:
                raise self._ctx.fail(exc, "peek", self._ctx.data_set) from None
            return [(ref, env) for ref, env in zip(refs, found, strict=True) if env is not None]
        return self._reads.peek(magazine, shard, first, last, self._topics.filter_expression(only))

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        self._claims_written(refs)
        return self._reads.settled(refs)

    def drop_settled(self, magazine: str, shard: int, first: int, last: int) -> int:
        return self._reads.drop_settled(magazine, shard, first, last)

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[Any] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        return self._reads.delete(refs, versions, ids)

    def stamp_unfired(self, ref: SlotRef, now_ms_: int) -> Envelope | None:
        return self._reads.stamp_unfired(ref, now_ms_)

    # ---- pointers ----------------------------------------------------------------------------------
    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        if names.cursor_topic(magazine) is not None:
            return self._cursor_pointers(magazine, shards)
        return self._pointers.pointers(magazine, shards)

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        return self._pointers.watch_pointers(magazines)

    def _cursor_pointers(self, cursor: str, shards: int) -> dict[int, ShardPointers]:
        """A subscription's cursor: the topic's load pointers, the cursor's position (fire) and hole counters."""
        topic = names.cursor_topic(cursor)
        assert topic is not None
        try:  # (one batch call for both: the watcher reads this every few milliseconds while messages flow)
            both = self._reads.batch_get("pointers", [self._ctx.meta_key(topic, s) for s in range(shards)]
                                         + [self._ctx.meta_key(cursor, s) for s in range(shards)])
            loads, own = both[:shards], both[shards:]
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "pointers", self._ctx.meta_set) from None
        out = {}
        for shard, (load_bins, bins) in enumerate(zip(loads, own, strict=True)):
            load = self._topics.saw_load(topic, shard, int((load_bins or {}).get(LOAD_POINTER) or 0))
            bins = bins or {}
            out[shard] = ShardPointers(load, int(bins.get(FIRE_POINTER) or 0), int(bins.get(HOLES) or 0),
                                       int(bins.get(HOLES_CLAIMED) or 0))
        return out

    def beacon(self, magazine: str) -> None:
        self._pointers.beacon(magazine)

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        return self._pointers.read_beacons([names.cursor_topic(m) or m for m in magazines])  # (a cursor: its topic's)

    # ---- topics and subscriptions' cursors (topics.py) ---------------------------------------------
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
        return self._topics.claim_cursor(cursor, shard, max_slots, now_ms_, only, up_to, count_attempt, recheck)

    def restamp_cursor(self, refs: Sequence[SlotRef], now_ms_: int, only: SubjectFilter | None,
                       count_attempt: bool = True) -> list[Claimed]:
        self._claims_written(refs)
        return self._topics.restamp_cursor(refs, now_ms_, only, count_attempt)

    def write_claims(self, refs: Sequence[SlotRef]) -> None:
        self._claims_written(refs)

    def cursor_moved_at(self, cursor: str, shard: int) -> int | None:
        return self._pointers.moved_at(cursor, shard)

    def seal_cursor(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool | None]:
        return self._topics.seal_cursor(refs, ttl_seconds)

    def doorbell(self) -> None:
        self._pointers.doorbell()

    # ---- delayed -----------------------------------------------------------------------------------
    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        self._delayed.load_delayed(queue, envelopes, ttl_seconds)

    def due_delayed(self, queue: str, now_ms_: int, limit: int) -> list[Envelope]:
        return self._delayed.due_delayed(queue, now_ms_, limit)

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        return self._delayed.settle_delayed(queue, envelopes)

    # No write spans the data records of main and of the delayed messages and the delay record: ignis.delay
    # copies a due message into main (load), then settles it (settle_delayed). Between the two it is counted in
    # both figures (docs/python/delayed.md: how long that lasts).
    moves_delayed_in_one_write = False

    def move_delayed(self, queue: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        raise NotImplementedError("Aerospike moves a due delayed message in two writes: load, then settle_delayed")

    def lead_delayed(self, queue: str, holder: str, now_ms_: int, hold_ms: int) -> bool:
        return self._delayed.lead_delayed(queue, holder, now_ms_, hold_ms)

    def change_mark(self) -> int | None:
        return self._delayed.change_mark()

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        return self._delayed.delay_states(queues)

    # ---- purge -------------------------------------------------------------------------------------
    def purge_magazine(self, magazine: str) -> int:
        if self._shared.deferred is not None:
            self._shared.deferred.discard(f"{magazine}_SHARD_")  # (its data keys: names.data_key)
        return self._purge.purge_magazine(magazine)


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
