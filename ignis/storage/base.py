"""The storage interface: the one contract every backend implements and everything above uses.

A `Storage` is scoped to one (farmId, clientId) pair; `with_client` gives a view on another clientId
over the same connection. Two groups of operations:

* queue registry — the queue-metadata records of set `{farmId}_{clientId}_ignis_queues`;
* magazine primitives — data records `{magazine}_SHARD_{n}_{slot}` and per-shard meta records
  `{magazine}_SHARD_{n}_METADATA` holding the load pointer (slots allocated) and the fire pointer
  (slots claimed). Slots are 1-based: the first load of a shard gets slot 1.

Nothing above this interface knows which backend it runs on.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

from ignis.envelope import Envelope, NewMessages
from ignis.errors import InvalidInputError, StoreUnavailable

if TYPE_CHECKING:
    from ignis.bounds import ShardLimit
    from ignis.subjects import SubjectFilter

MagazineKind = Literal["main", "sideline", "cursor"]  # (cursor: a subscription's claims of its topic's slots)

# Runtime bins of a queue record: written by the store / sweeper, never by a config sync.
CREATED_AT = "createdAt"
ACTIVE = "active"
SWEEP_POINTERS = "sweepPointers"
SIDELINE_SWEEP = "sidelineSweep"
SWEPT_COUNTER = "sweptCounter"
SIDELINE_SWEPT = "sidelineSwept"
SWEEP_EPOCH = "sweepEpoch"
CURSOR_SWEEP = "cursorSweep"  # a subscription's: per topic shard, the sweep position in its cursor's claims
CURSOR_SWEPT = "cursorSwept"
RUNTIME_BINS = frozenset({CREATED_AT, ACTIVE, SWEEP_POINTERS, SIDELINE_SWEEP, SWEPT_COUNTER, SIDELINE_SWEPT,
                          SWEEP_EPOCH, CURSOR_SWEEP, CURSOR_SWEPT})
MAX_BIN_NAME = 15  # an Aerospike limit; the lmdb store keeps the same layout, so the same limit


def check_queue_config(config: Mapping[str, Any]) -> None:
    """What every store refuses in a queue config (InvalidInputError): a runtime bin, which only the store and
    the sweeper write, and a bin name Aerospike cannot store."""
    clobbered = RUNTIME_BINS.intersection(config)
    if clobbered:
        raise InvalidInputError(f"queue config may not set runtime bins: {', '.join(sorted(clobbered))}")
    for bin_name in config:
        if len(bin_name) > MAX_BIN_NAME:
            raise InvalidInputError(f"bin name {bin_name!r} is longer than {MAX_BIN_NAME} characters "
                                    "(an Aerospike limit)")


def new_queue_bins(config: Mapping[str, Any], now: int) -> dict[str, Any]:
    """A new queue record: its config and the runtime bins at their start (no sweep yet, epoch 0); a subscription's
    also has its cursor's sweep pointers (other queues' records keep their layout)."""
    cursor = {CURSOR_SWEEP: {}, CURSOR_SWEPT: 0} if config.get("subTopic") else {}
    return {**config, CREATED_AT: now, SWEEP_POINTERS: {}, SIDELINE_SWEEP: {}, SWEPT_COUNTER: 0,
            SIDELINE_SWEPT: 0, SWEEP_EPOCH: 0, **cursor}


def sweep_bins(kind: MagazineKind) -> tuple[str, str]:
    """(pointer map bin, swept counter bin) of the queue record for a sweep of its `kind` magazine."""
    return {"main": (SWEEP_POINTERS, SWEPT_COUNTER), "sideline": (SIDELINE_SWEEP, SIDELINE_SWEPT),
            "cursor": (CURSOR_SWEEP, CURSOR_SWEPT)}[kind]

# Meta record bins.
LOAD_POINTER = "LOAD_POINTER"
FIRE_POINTER = "FIRE_POINTER"
# Slots a shard gave up without a message (a reservation sealed unused, an awaited write sealed after its
# deadline, a record taken out before any claim, an expired one), counted where that happens; and how many
# of them claims have passed since. The figures count messages from them, not slots (ShardPointers).
HOLES = "HOLES"
HOLES_CLAIMED = "HOLES_CLAIMED"


class SlotRef(NamedTuple):
    """Where one message lives: magazine, shard, slot. (A NamedTuple: built on every hot-path call.)"""

    magazine: str
    shard: int
    slot: int

    def __str__(self) -> str:
        return f"{self.magazine}/{self.shard}/{self.slot}"

    @classmethod
    def parse(cls, text: str) -> SlotRef:
        try:
            magazine, shard, slot = text.rsplit("/", 2)
            return cls(magazine, int(shard), int(slot))
        except ValueError:
            raise ValueError(f"message reference {text!r} is not MAGAZINE/SHARD/SLOT") from None


# Which shard each message of a NewMessages batch goes to: (shard, batch indices in slot order).
Placement = Sequence[tuple[int, Sequence[int]]]


def load_new_as_envelopes(store: Storage, magazine: str, batch: NewMessages, placement: Placement,
                          ttl_seconds: int) -> list[Sequence[int]]:
    """`Storage.load_new` through `Storage.load`, for a backend that writes one record object per
    message anyway."""
    order = [index for _, indices in placement for index in indices]
    if sorted(order) != list(range(len(batch.ids))):
        raise ValueError(f"placement must name each of the {len(batch.ids)} messages exactly once")
    refs = iter(store.load(magazine, [(shard, batch.envelope(i)) for shard, indices in placement
                                      for i in indices], ttl_seconds))
    slots: list[Sequence[int]] = []
    for shard, indices in placement:
        got = [next(refs) for _ in indices]
        if {r.shard for r in got} - {shard}:
            raise RuntimeError(f"load into {magazine!r} shard {shard} placed messages elsewhere: {got}")
        numbers = [ref.slot for ref in got]
        consecutive = not numbers or numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        slots.append(range(numbers[0], numbers[0] + len(numbers)) if numbers and consecutive else numbers)
    return slots


def load_new_bounded_per_shard(store: Storage, magazine: str, batch: NewMessages, placement: Placement,
                               ttl_seconds: int, limits: Sequence[ShardLimit]) -> list[Sequence[int]]:
    """`Storage.load_new_bounded` through `Storage.load_bounded`, one shard at a time, for a backend that writes one
    record object per message anyway."""
    taken: list[Sequence[int]] = []
    for shard, indices in placement:
        refs = store.load_bounded(magazine, shard, [batch.envelope(i) for i in indices], ttl_seconds, limits[shard])
        taken.append([ref.slot for ref in refs if ref is not None])  # (a prefix: load_bounded fits the longest)
    return taken


class MessageRef(NamedTuple):
    """What publish returns: the message id and where it was stored. Flat (not an id and a SlotRef), so
    a publish_many of thousands builds one object per message, not two."""

    id: str
    magazine: str
    shard: int
    slot: int

    @property
    def ref(self) -> SlotRef:
        return SlotRef(self.magazine, self.shard, self.slot)

    def __str__(self) -> str:
        return f"{self.magazine}/{self.shard}/{self.slot}#{self.id}"


class Claimed(NamedTuple):
    """One claimed slot. `envelope` is None for a hole (slot allocated, record absent or expired).
    `awaiting` marks a hole that may still fill: the record is missing, but on a backend whose publish
    is two steps (allocate the slot, then write the record) its write may be in flight. The claimer owns
    the slot: it re-reads it (`Storage.restamp`) until the record lands or the producer's write deadline
    (`Storage.write_grace_ms`) has passed, then seals it (`Storage.seal`). Build it with all three
    fields: hot paths make it with tuple.__new__."""

    ref: SlotRef
    envelope: Envelope | None
    awaiting: bool = False


class ClaimInterrupted(StoreUnavailable):
    """The store stopped answering after a claim took its slots and before it could stamp and read them
    all. The slots are still the caller's: `claimed` lists every one, those not read yet as `awaiting`
    holes, to re-read (`Storage.restamp`) once the store answers; none is left for the sweeper."""

    def __init__(self, message: str, claimed: Sequence[Claimed]) -> None:
        super().__init__(message)
        self.claimed = list(claimed)


class HeldClaim(NamedTuple):
    """What a claim of an ordered queue's shard got (`Storage.claim_held`)."""

    claimed: list[Claimed]  # the shard's head, now held by the caller ([] when drained or held)
    held_until: int = 0  # > 0: another claim holds the shard until then (epoch ms), so nothing was claimed


# An ordered queue's shard hold (Storage.claim_held): the bin of the shard's meta record (Aerospike; on lmdb a
# record of its own beside it, `{magazine}_SHARD_{n}_HOLD`) holding when the hold of the shard's head ends, epoch
# ms; 0 or absent = not held. The held slot is always the one after the FIRE_POINTER: the fire pointer passes it only
# when it is settled, so a held shard still has work as every watcher sees it.
HOLD_UNTIL = "holdUntil"


@dataclass(frozen=True, slots=True)
class ClaimTicket:
    """A claim whose answer was lost (the store may or may not have applied it): what its claimer needs to
    find out later (`Storage.resolve_claim`) which slots, if any, it took."""

    magazine: str
    shard: int
    single: bool  # a claim of one slot (its answer is the fire pointer after it; others record the one before)
    token: str
    count_attempt: bool


class ClaimInDoubt(StoreUnavailable):
    """The store did not answer a claim that it may have applied: `ticket` resolves it once it answers, so
    the slots it took stay the claimer's (and are not left for the sweeper)."""

    def __init__(self, message: str, ticket: ClaimTicket) -> None:
        super().__init__(message)
        self.ticket = ticket


class CursorClaim(NamedTuple):
    """What a claim through a subscription's cursor took (`Storage.claim_cursor`)."""

    claimed: list[Claimed]  # the messages the filter selected, claimed (a record awaited where it may be in flight)
    expired: int  # slots passed because their message had left the topic: lost to retention, counted on the cursor
    drained: bool  # the cursor reached the topic's load pointer (or `up_to`)


class Move(NamedTuple):
    """One record a fenced `Storage.move` takes out of its magazine: where it is, the fireTS it was seen
    with (the move refuses a record that changed since), and the envelope to write at the target."""

    source: SlotRef
    fired_at: int | None
    shard: int  # target shard
    envelope: Envelope


@dataclass(frozen=True, slots=True)
class ShardPointers:
    """A shard's pointers (slots) and hole counters, and the message figures they give."""

    load: int = 0
    fire: int = 0
    holes: int = 0  # slots given up without a message (HOLES)
    claimed_holes: int = 0  # ... that claims have passed (HOLES_CLAIMED)

    @property
    def unclaimed(self) -> int:
        """Slots not claimed yet, holes included: what a claim still has to pass."""
        return max(self.load - self.fire, 0)

    @property
    def published(self) -> int:
        """Messages ever stored in the shard (slots allocated, minus the holes)."""
        return max(self.load - self.holes, 0)

    @property
    def consumed(self) -> int:
        """Messages ever claimed (slots claimed, minus the holes claims passed)."""
        return max(self.fire - self.claimed_holes, 0)

    @property
    def pending(self) -> int:
        """Messages not claimed yet (a publish still being written counts)."""
        return min(max(self.published - self.consumed, 0), self.unclaimed)


@dataclass(slots=True)
class QueueRecord:
    """A queue-metadata record as stored: config bins plus runtime bins."""

    name: str
    bins: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.bins.get(ACTIVE) == "true"

    @property
    def created_at(self) -> int:
        return int(self.bins.get(CREATED_AT, 0))

    def sweep_pointers(self, kind: MagazineKind = "main") -> dict[str, int]:
        return dict(self.bins.get(sweep_bins(kind)[0]) or {})


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A leader-election lease kept in the store (the embedded twin of a coordination.k8s.io Lease).
    `version` is the store's compare-and-set token: bumped by every successful write."""

    holder: str
    acquired_ms: int
    renewed_ms: int
    duration_s: float
    transitions: int = 0
    version: int = 0

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.renewed_ms + self.duration_s * 1000


# Bins of a queue's delay record (names.delayed_meta_key): the delayed messages it holds, and the lease of
# the process moving the due ones (Storage.lead_delayed).
DELAYED_COUNT, DELAY_LEADER, DELAY_UNTIL = "DELAYED", "dueLead", "dueUntil"


@dataclass(frozen=True, slots=True)
class DelayState:
    """What a queue's delay record says: the delayed messages it holds, and when the earliest is due where the
    store can tell that cheaply (lmdb reads it off its key order; None: not known, or none)."""

    count: int = 0
    next_due: int | None = None


# A publisher bumps a magazine's beacon at most this often (Storage.beacon); a watcher treats a queue whose
# pointers stood still for longer than this (plus a margin) as idle, and from then on reads only its beacon.
BEACON_SECONDS = 1.0

# How long a slot from `Storage.reserve` may wait for its record: a publish writes a reserved slot only
# this soon after reserving it (else it seals it), so a two-step backend's write grace includes it.
RESERVATION_FRESH_MS = 250


class Doorbell(Protocol):
    """A store's way to wake the consumer processes of a magazine on a publish (see ignis.watch): a load into
    a main magazine rings the processes subscribed to it, and a ring marks the shards active in their
    ShardActivity (ignis.activity). Rings are hints: a lost one delays a message until the watcher next
    reads the pointers, never strands it."""

    def subscribe(self, magazines: Collection[str]) -> None:
        """This process listens for rings of these magazines (replacing its earlier set)."""
        ...


@runtime_checkable
class Storage(Protocol):
    """A backend. All methods are thread-safe; errors are `ignis.errors` types."""

    farm_id: str
    client_id: str

    @property
    def url(self) -> str:
        """The store URL with any credentials removed (safe to log)."""
        ...

    @property
    def location(self) -> str:
        """Names the data this handle reaches, for state a process shares between handles of the same data
        (ignis.activity): equal for two handles only if each sees the other's writes at once."""
        ...

    def with_client(self, client_id: str) -> Storage:
        """A view of the same store scoped to another clientId."""
        ...

    # ---- queue registry ---------------------------------------------------------------------
    def ensure_index(self) -> None:
        """Create the `{set}_active` index if it does not exist ("already exists" is fine)."""
        ...

    def apply_queue(self, name: str, config: Mapping[str, Any], ttl_seconds: int) -> bool:
        """Create the record (create-only, with createdAt, active=true and empty runtime bins) or
        update its config bins, setting active=true and re-asserting the TTL; runtime bins are never
        touched by an update. Returns True when the record was created."""
        ...

    def get_queue(self, name: str) -> QueueRecord | None: ...

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        """Queues by active flag through the index (None = all), sorted by name."""
        ...

    def set_queue_active(self, name: str, active: bool) -> bool:
        """Flip the active flag without touching the TTL. False if there is no such queue."""
        ...

    def delete_queue(self, name: str) -> bool:
        """Remove the queue record only (purge its magazines first). False if there was none."""
        ...

    def next_epoch(self) -> int:
        """A new sweeper fencing epoch, strictly greater than every epoch handed out before."""
        ...

    def advance_sweep(
        self, name: str, kind: MagazineKind, epoch: int, pointers: Mapping[int, int], swept: int
    ) -> None:
        """Fenced, atomic, forward-only update of sweep pointers (per shard, absolute next slot) and
        add `swept` to the lifetime counter; TTL untouched. Raises StaleEpoch when the record holds a
        newer epoch, QueueNotFound when there is no record."""
        ...

    def rewind_sweep(self, name: str, kind: MagazineKind, pointers: Mapping[int, int]) -> None:
        """Lower sweep pointers (per shard, to min(stored, given); TTL untouched), not fenced: a subscription's
        seek back, whose slots are claimed again and must be swept again. Raises QueueNotFound."""
        ...

    # ---- farm-wide system records ({farmId}_ignis_system) ----------------------------------------
    def register_client(self, client_id: str) -> None:
        """Record that `client_id` has queues in this farm (idempotent), so a sweeper can find every
        client's queue set. Written by every queue apply."""
        ...

    def list_clients(self) -> list[str]:
        """Every registered clientId, sorted."""
        ...

    def get_lease(self, name: str) -> LeaseRecord | None:
        """The lease called `name`, or None if it was never written."""
        ...

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        """Compare-and-set: write `lease` only if the stored version is `expected_version` (0 = there
        must be no lease yet). Returns the stored lease with its new version, or None if another
        writer got there first."""
        ...

    # ---- magazine primitives ----------------------------------------------------------------
    def load(self, magazine: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        """Append each (shard, envelope): advance the shard's load pointer, write the data record with
        TTL. Several items are one group commit where the backend can. Returns the slots in order."""
        ...

    def reload(self, magazine: str, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool],
               ttl_seconds: int) -> list[SlotRef]:
        """Finish a `load` that raised `LoadInterrupted` (its `refs` and `landed`), without copying anything
        twice: each envelope not known to have landed is written into its own slot, create-only. A slot that
        holds it already, or its ack, is left as it is; a slot a consumer sealed meanwhile (or that holds
        another message) gets the envelope in a new slot of the same shard. Returns the slots, in order.
        Raises `LoadInterrupted` again if the store fails again."""
        ...

    def load_one(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                 ttl_seconds: int) -> int:
        """Publish one new message of plain bytes (no headers, no key) into `shard`: `load_new` for the
        commonest call there is, without the batch around it. Expires `ttl_seconds` after loaded_at.
        Returns its slot."""
        ...

    def load_new(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int
                 ) -> list[Sequence[int]]:
        """Publish: append new messages, as `load` does, in one group commit where the backend can.
        `placement` lists (shard, indices into the batch): each index exactly once, in the order the
        shard's slots are taken. Records expire `ttl_seconds` after the batch's loadedAt (publish sets
        it to now). Returns, per placement entry, the slots its messages got, in order: a range, except
        where a write came after its deadline and was published again into a later slot."""
        ...

    def load_bounded(self, magazine: str, shard: int, envelopes: Sequence[Envelope], ttl_seconds: int,
                     limit: ShardLimit) -> list[SlotRef | None]:
        """A publish into one shard of a bounded queue (ignis.bounds): `load` of as many of `envelopes` as the
        shard's share `limit` has room for, the room checked in the same atomic step as the allocation (lmdb: the
        write transaction; Aerospike: a filter expression on the load pointer's increment), and LOAD_BYTES moved
        with the load pointer where the limit has bytes. Per envelope, in order: its slot, or None when it was
        refused (nothing of it written)."""
        ...

    def load_new_bounded(self, magazine: str, batch: NewMessages, placement: Placement, ttl_seconds: int,
                         limits: Sequence[ShardLimit]) -> list[Sequence[int]]:
        """`load_new` into a bounded queue (a publish_many's lean path): per placement entry, the slots of the longest
        prefix of its messages that its shard's share (`limits[shard]`) has room for, as `load_bounded` checks it;
        the rest of each entry is refused (nothing of it written). lmdb: one write transaction."""
        ...

    def load_one_bounded(self, magazine: str, shard: int, payload: bytes, msg_id: str, loaded_at: int,
                         ttl_seconds: int, limit: ShardLimit) -> int:
        """`load_one` into a shard of a bounded queue, within its share (as `load_bounded`): its slot, or 0 when the
        shard is full (nothing written). The lean path of a plain bounded publish."""
        ...

    def reserve_bounded(self, magazine: str, shard: int, count: int, limit: ShardLimit, size: int
                        ) -> tuple[int, int]:
        """`reserve` on a bounded shard: up to `count` slots within the room `limit` leaves (each counted as `size`
        payload bytes in LOAD_BYTES); (first slot, how many were reserved), 0 when the shard is full. Only where a
        publish is two steps."""
        ...

    def loaded_bytes(self, magazine: str, shards: int) -> list[int]:
        """Each shard's LOAD_BYTES (payload bytes loaded by bounded publishes; 0 where none), one store call."""
        ...

    def claim(self, magazine: str, shard: int, max_slots: int, now_ms: int, count_attempt: bool = True,
              up_to: int | None = None) -> list[Claimed]:
        """Guarded claim of up to `max_slots` slots (fire pointer advances only while below the load
        pointer, so distinct callers get distinct slots), and for each present record stamp fireTS =
        now_ms (and attempts + 1 when `count_attempt`: a delivery to a handler, not a shovel move) and
        return it. Empty list = shard drained. A missing record is a hole, `awaiting` when its write may
        still be in flight (see Claimed). `up_to`: claim no slot above this one (the fire pointer never
        passes it; empty list once it is reached), e.g. to take exactly what a shard held at some moment."""
        ...

    def claim_held(self, magazine: str, shard: int, now_ms: int, hold_ms: int, count_attempt: bool = True
                   ) -> HeldClaim:
        """The claim of an ordered queue (QueueSpec.ordered): at most one slot of a shard in flight, enforced in the
        claim's own atomic write. The shard's head is the slot after its fire pointer, which moves past it only when
        it is settled (`release_hold`). Held until a time still to come: nothing (`held_until` says when the hold
        ends). Else (no hold, or one that ended: its holder crashed or outlived its handler timeout, or a failed
        delivery's backoff is over): the head, stamped (attempts + 1), held until now_ms + hold_ms. A head that is a
        hole, or was settled already (a settle whose release did not happen), is returned as a hole and passed (the
        fire pointer moves past it), unless it is awaited: that stays held until `release_hold` gives it up."""
        ...

    def release_hold(self, magazine: str, shard: int, slot: int, until_ms: int = 0) -> bool:
        """After the held `slot` was settled (an ack, a dead letter; or it was a hole): the fire pointer passes it and
        the hold ends, so the shard's next message may be claimed. With `until_ms` (a failed delivery's backoff):
        the slot stays the shard's head, held until then, the next claim's. Only while `slot` is the shard's held
        head; False if it was not (then nothing changed)."""
        ...

    def settle_held(self, refs: Sequence[SlotRef], ids: Sequence[str | None] | None = None) -> int:
        """An ordered queue's settle (an ack, a drop, a move out of main) of held heads: `delete` them, then
        `release_hold` each, in one transaction where the store can (lmdb). Elsewhere (Aerospike: two records) the
        deletes first, then the releases: a crash between leaves a hold that ends by itself, and the claim that
        then finds its head settled passes it; a failed release raises (settle again: the delete is done, the
        release is not). Returns how many records were present."""
        ...

    @property
    def write_grace_ms(self) -> int:
        """How long after its slot was allocated a publish's record may still land: the producer's whole
        write deadline (every attempt and the waits between them). 0 where a publish is one atomic step
        and a claim can never pass a record still being written (lmdb)."""
        ...

    def reserve(self, magazine: str, shard: int, count: int) -> int:
        """Allocate `count` consecutive slots of `shard` for messages to come, writing none; the first.
        Only where a publish is two steps (`write_grace_ms` > 0): the caller writes each slot with
        `load_reserved` within RESERVATION_FRESH_MS of this call, or seals it (`seal`). A consumer that
        claims one before then awaits it, as it awaits any publish in flight (the grace covers it)."""
        ...

    def load_reserved(self, ref: SlotRef, payload: bytes, msg_id: str, loaded_at: int, ttl_seconds: int
                      ) -> bool:
        """`load_one`'s record write, into a slot from `reserve`. False if the slot was sealed meanwhile
        (a consumer gave it up): nothing was written, publish the message again."""
        ...

    def load_reserved_envelope(self, ref: SlotRef, envelope: Envelope, ttl_seconds: int) -> bool:
        """`load_reserved` of a message that is more than plain bytes (a topic's, with its subject)."""
        ...

    def load_reserved_many(self, refs: Sequence[SlotRef], payloads: Sequence[bytes], ids: Sequence[str],
                           loaded_at: int, ttl_seconds: int) -> list[bool]:
        """`load_reserved` of many slots in one round trip (an async publisher's batch); per slot, False when it
        was sealed meanwhile (nothing written there: publish that message again)."""
        ...

    def resolve_claim(self, ticket: ClaimTicket, now_ms: int) -> list[Claimed] | None:
        """What a claim that raised ClaimInDoubt took: its slots, stamped and read as `claim` does (None when
        it was not applied, or can no longer be told: then the sweeper finds whatever it took). Raises
        StoreUnavailable while the store still does not answer. A backend whose claims are never in doubt
        answers None."""
        ...

    def note_claimed_holes(self, magazine: str, holes: Mapping[int, int]) -> None:
        """Count, per shard, claimed slots that turned out empty for good (HOLES_CLAIMED), so the figures
        count messages (see ShardPointers). The claimer calls it; the holes themselves were counted where
        they were made (a seal, a move out of an unclaimed slot, an expiry found by a claim)."""
        ...

    def restamp(self, refs: Sequence[SlotRef], now_ms: int, count_attempt: bool = True) -> list[Claimed]:
        """The second half of `claim` again, for slots this caller claimed whose record was awaited: stamp
        each record that has landed meanwhile and return it, in order; still missing -> awaiting again."""
        ...

    def seal(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool]:
        """Give up claimed awaited slots for good: each becomes a permanent hole (kept `ttl_seconds`)
        that refuses a late write, so that publish fails loudly (and is made again into a new slot)
        instead of leaving its record behind the fire pointer. Per slot: True = sealed, False = the
        record landed first (restamp it)."""
        ...

    def move(self, target: str, moves: Sequence[Move], ttl_seconds: int, epoch: int,
             fired_before: int | None = None) -> list[bool]:
        """Fenced copy-then-delete of records out of their magazine into `target` (a sweep, a shovel or a
        dead-letter move). A record is moved only if it is still there with the fireTS it was seen with (or,
        with `fired_before`, a fireTS older than that: the sweep's cutoff, which a holder that took its claim
        back has passed),
        and only under the newest epoch: the fence is part of the writes themselves, never a check made
        before them (lmdb: the move's own transaction refuses an epoch older than the newest handed out;
        Aerospike: a per-record claim that a newer epoch wins, and target slots a newer epoch seals), so a
        paused ex-leader that resumes copies and deletes nothing. Returns, per move, whether this call
        moved it. Raises StaleEpoch when a newer epoch is found to hold the records."""
        ...

    def read(self, refs: Sequence[SlotRef]) -> list[Envelope | None]:
        """Batch read; None for absent or expired records."""
        ...

    def held(self, refs: Sequence[SlotRef]) -> list[bool]:
        """Per slot (one batch): whether it holds a live message, read without the payloads where a store can."""
        ...

    def peek(self, magazine: str, shard: int, first: int, last: int, only: SubjectFilter | None = None
             ) -> list[tuple[SlotRef, Envelope]]:
        """Present records of slots first..last inclusive, in slot order. Never mutates. `only`: of a topic's
        records, those whose subject it selects, applied by the store (on Aerospike by the server, so the others'
        payloads are never sent)."""
        ...

    def settled(self, refs: Sequence[SlotRef]) -> list[bool]:
        """Per slot (one batch): True if it holds the trace of a record settled for good (an ack's or a
        purge's tombstone, a seal), so no write can still land there; False for a live record or no
        record at all. A backend that keeps no trace of a delete answers False (the caller then waits
        until the slot's write deadline is known to be over)."""
        ...

    def drop_settled(self, magazine: str, shard: int, first: int, last: int) -> int:
        """Delete what is left of settled records in slots first..last, which a sweep pointer has passed (nothing
        reads them again): where acks leave tombstones (Aerospike Community Edition), a subscription's would
        otherwise outlive the ack by the topic's whole retention. How many it deleted; 0 where acks leave none."""
        ...

    # Whether delete() reads its `ids`: False where a slot is never handed out twice (an lmdb environment), so a
    # settle skips building them (a hot path).
    settles_by_id: bool = True

    def delete(self, refs: Sequence[SlotRef], versions: Sequence[Any] | None = None,
               ids: Sequence[str | None] | None = None) -> int:
        """Delete records so they stay deleted (one batch). Returns how many were present (an expired
        record not yet purged may count). `versions` (Envelope.version of each, as claimed) are a hint
        a backend may use to skip a check; the outcome is the same without them, but for the one trade a backend's
        setting may choose (Aerospike's ack_check=generation: acks checked by their versions alone, a store that
        never loses an acknowledged write assumed; docs/aerospike/durability.md). `ids` (the message ids
        as claimed): a slot holding another message is left alone; a store that can roll back (rollback.py)
        can hand a lost message's slot to a newer one while the old claim is still being settled."""
        ...

    def stamp_unfired(self, ref: SlotRef, now_ms: int) -> Envelope | None:
        """Set fireTS = now_ms only if the record exists and has no fireTS; return the record as it
        is afterwards (None if absent). Used by the sweeper for stranded writes."""
        ...

    def pointers(self, magazine: str, shards: int) -> dict[int, ShardPointers]:
        """Load/fire pointers of shards 0..shards-1 in one batch read (absent shard = 0/0)."""
        ...

    def purge_magazine(self, magazine: str) -> int:
        """Remove every data and meta record of a magazine. Returns data records removed."""
        ...

    def watch_pointers(self, magazines: Sequence[tuple[str, int]]) -> list[tuple[list[int], int]]:
        """For each (magazine, shards): (the shards of 0..shards-1 whose load pointer is past the fire pointer, the
        sum of the load pointers). What the watcher (ignis.watch) needs, in one lean read for all of them (one
        store call per few thousand shards). No rollback checks: claims and allocations make those."""
        ...

    # Whether a publish must bump the beacon (beacon below); False where the load itself rings a doorbell, so a
    # publish skips the call (a hot path).
    needs_beacon: bool = True

    def beacon(self, magazine: str) -> None:
        """After a publish: bump the magazine's beacon, at most once per BEACON_SECONDS in this process, so a
        watcher of an idle queue can tell it woke by reading one record, not every shard's (ignis.watch). Never
        raises: the publish itself is done. A store with a doorbell needs none (no-op, and needs_beacon False)."""
        ...

    def read_beacons(self, magazines: Sequence[str]) -> list[int]:
        """The beacon of each magazine (0 when never bumped), in one store call."""
        ...

    # ---- delayed messages (ignis.delay) -----------------------------------------------------------------
    def load_delayed(self, queue: str, envelopes: Sequence[Envelope], ttl_seconds: int) -> None:
        """Store messages that are not due yet (each with `due_at`) under names.delayed_key, and count them in
        the queue's delay record: the count first, so a crash between leaves it high (a wasted look), never
        low (a message nobody looks for). One transaction on lmdb."""
        ...

    def due_delayed(self, queue: str, now_ms: int, limit: int) -> list[Envelope]:
        """Up to `limit` of the queue's delayed messages due at `now_ms` (earliest first where the store keeps
        them in order). An index still being built answers nothing yet."""
        ...

    def settle_delayed(self, queue: str, envelopes: Sequence[Envelope]) -> int:
        """Delete delayed messages once their copy is in main (so they stay deleted), and uncount them; returns
        how many were still there."""
        ...

    @property
    def moves_delayed_in_one_write(self) -> bool:
        """True where `move_delayed` makes due messages deliverable in one transaction (lmdb): a message is
        counted delayed or in main at every moment, never both. False where the copy into main and the settle
        are two writes (Aerospike: `load`, then `settle_delayed`; between them a message is counted in both),
        and `move_delayed` raises NotImplementedError."""
        ...

    def move_delayed(self, queue: str, items: Sequence[tuple[int, Envelope]], ttl_seconds: int) -> list[SlotRef]:
        """Move due delayed messages into the main magazine `queue` in one transaction: for each (shard, copy)
        whose delayed record is still there, append the copy to the shard (as `load`), delete the delayed record
        and uncount it in the queue's delay record. Those no longer delayed (moved or settled already) are left
        out. Returns the new slots of the copies. Only where `moves_delayed_in_one_write`."""
        ...

    def lead_delayed(self, queue: str, holder: str, now_ms: int, hold_ms: int) -> bool:
        """Take, or keep, the right to move the queue's due messages until now_ms + hold_ms: one mover at a
        time, so no message is moved twice (one store call)."""
        ...

    def delay_states(self, queues: Sequence[str]) -> list[DelayState]:
        """Each queue's DelayState, in one store call."""
        ...

    def change_mark(self) -> int | None:
        """A number that changes whenever anything was written to the store (by any process), read without a
        store call; None where there is none (then the delay states are read every time)."""
        ...

    def doorbell(self) -> Doorbell | None:
        """How publishers wake consumers in other processes, or None where consumers poll the pointers
        instead (ignis.watch)."""
        ...

    # ---- topics and subscriptions (ignis.topics) ------------------------------------------------------------
    # A topic's messages are the magazine named after it; a subscription reads them through its cursor magazine
    # (names.cursor_of), which every magazine primitive resolves: its load pointer, beacon and doorbell are the
    # topic's, its fire pointer the subscription's position, and its records the claims of topic slots, read
    # (`peek`, `read`) joined to the topic's records; `move` and `delete` act on the claim records.
    def apply_topic(self, name: str, config: Mapping[str, Any]) -> bool:
        """Create the topic record (with createdAt) or update its config bins. True when created."""
        ...

    def get_topic(self, name: str) -> QueueRecord | None: ...

    def list_topics(self) -> list[QueueRecord]:
        """Every topic of this client, sorted by name."""
        ...

    def delete_topic(self, name: str) -> bool:
        """Remove the topic record only (purge its magazine first). False if there was none."""
        ...

    def set_cursor(self, cursor: str, positions: Mapping[int, int]) -> None:
        """Put a cursor's position (the last slot it passed) per topic shard, backwards or forwards (a start, a
        seek). A claim in flight meanwhile takes the slots after whichever position it finds."""
        ...

    def claim_cursor(self, cursor: str, shard: int, max_slots: int, now_ms: int, only: SubjectFilter | None,
                     up_to: int | None = None, count_attempt: bool = True, recheck: bool = True) -> CursorClaim:
        """Move the cursor over the shard's next slots (never past the topic's load pointer nor `up_to`) until
        `max_slots` messages the filter `only` selects are taken (or a bounded number of slots looked at), and
        write each one's claim record (fireTS = now_ms, attempts 1). Messages the filter does not select are
        passed over, with no record; slots whose message left the topic are counted (`expired`). A message
        that may still be on its way is returned awaiting, as `claim` does. A store that bounds the move by the
        topic's load pointer as last seen reads it again when the cursor caught up with it, unless `recheck` is
        False (the caller's watcher reads it often enough: the claim then says drained at once)."""
        ...

    def restamp_cursor(self, refs: Sequence[SlotRef], now_ms: int, only: SubjectFilter | None,
                       count_attempt: bool = True) -> list[Claimed]:
        """`restamp` for cursor slots: stamp their claim records again, or claim a topic message that was awaited
        and landed (a Claimed with `awaiting` None: it landed but the filter passes it over)."""
        ...

    def write_claims(self, refs: Sequence[SlotRef]) -> None:
        """Write now the claim records of `refs` that this store writes late (Aerospike's subscription claims:
        ignis.storage.aerospike.deferred), since another process reads them next (a Spark query's executors read
        the slots its driver claimed). Nothing to do where a claim writes its records itself."""
        ...

    def cursor_moved_at(self, cursor: str, shard: int) -> int | None:
        """When the cursor's shard last moved (epoch ms, the store's clock; a seek counts), None when it never did or
        the store does not keep it. No claim of a slot it passed was made later: the sweeper stamps a slot a dead
        claimer left without its claim record no later than this (workers: `_claim_stranded`)."""
        ...

    def seal_cursor(self, refs: Sequence[SlotRef], ttl_seconds: int) -> list[bool | None]:
        """`seal` for awaited cursor slots: seals the topic's slots (every subscription then passes them). Per slot:
        True, sealed, its message gone (lost to the topic's retention); None, sealed, never written (a publisher that
        stopped after reserving the slot: a hole, nothing lost); False, its record landed after all."""
        ...

    @property
    def closed(self) -> bool:
        """True once close() was called on this handle."""
        ...

    def close(self) -> None: ...


def client_view(store: Storage, client_id: str) -> Storage:
    """`store` itself when it is already scoped to `client_id`, else its view on that clientId."""
    return store if client_id == store.client_id else store.with_client(client_id)
