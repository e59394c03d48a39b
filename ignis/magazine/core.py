"""Magazine layer (DESIGN §4): load with random or key-based shard choice, fire with guarded claims,
hole skipping with a budget, awaited slots, and active-shard tracking so that an idle magazine costs
almost no reads.

This module holds `Magazine`, the coordinator of one queue handle's magazine: publishes, claims and the
figures, with the state that outlives a call in the parts it composes, each in its own module of this
package: the active shards (ignis.magazine.shards), the awaited slots (ignis.magazine.awaited), the
reservations for publishes (ignis.magazine.reservations) and the prefetch (ignis.magazine.prefetch).
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Mapping, Sequence

from ignis import names
from ignis.envelope import Envelope, now_ms
from ignis.errors import HoleBudgetExceeded, StoreError
from ignis.magazine import prefetch as _prefetch
from ignis.magazine.awaited import AwaitedSlots
from ignis.magazine.loads import MagazineLoads
from ignis.magazine.prefetch import PREFETCH_MAX, PREFETCH_PER_FIRE, Prefetch
from ignis.magazine.reservations import Reservations
from ignis.magazine.shards import ActiveShards
from ignis.metrics import FIRE_CLAIMS, HOLE_BUDGET_EXHAUSTED, HOLES_SKIPPED
from ignis.outage import store_failed
from ignis.storage.base import (
    Claimed,
    ClaimInDoubt,
    ClaimInterrupted,
    ClaimTicket,
    MessageRef,
    ShardPointers,
    SlotRef,
    Storage,
)
from ignis.subjects import SubjectFilter

_random = random.random
_monotonic = time.monotonic
_thread_id = threading.get_ident
_new_tuple = tuple.__new__  # NamedTuples without their slower generated __init__
_new_message_ref = functools.partial(_new_tuple, MessageRef)  # MessageRef from an (id, magazine, shard, slot)


IN_FLIGHT_SCAN_LIMIT = 10_000  # claimed slots per shard that in_flight() looks at
class Magazine(MagazineLoads):
    """One magazine of a queue: `main`, `sideline` or `dead` (and a subscription's `cursor`: ignis.magazine.cursor).
    Thread-safe. Its loads are in ignis.magazine.loads."""

    def __init__(
        self,
        store: Storage,
        name: str,
        *,
        queue: str,
        kind: str,
        shards: int,
        ttl_seconds: int,
        hole_budget: int = 512,
        refresh_seconds: float = 1.0,
        only: SubjectFilter | None = None,
    ) -> None:
        self._store = store
        self.name = name
        self.kind = kind
        self.shards = shards
        self.ttl_seconds = ttl_seconds
        self.hole_budget = hole_budget
        self._lock = threading.Lock()  # shared with the parts below
        # A claim from the sideline is a shovel move, not a delivery; a subscription's cursor delivers, as main does.
        self._count_attempt = kind in ("main", "cursor")
        # Which shards have work, shared with every handle of this magazine in the process (ignis.activity).
        self._active_shards = ActiveShards(store, name, shards, refresh_seconds=refresh_seconds, lock=self._lock,
                                           is_main=kind == "main")
        # Claimed slots awaiting their record (see Claimed.awaiting) and records that turned up, stamped,
        # not yet handed out. Re-read on later fires of this handle: a worker never blocks on them.
        self._awaited_slots = AwaitedSlots(store, self._lock, ttl_seconds=ttl_seconds,
                                           count_attempt=self._count_attempt, queue=queue, kind=kind, only=only)
        self._in_doubt: list[ClaimTicket] = []  # claims whose answer was lost: resolved before the next claim
        self.queue = queue
        # Rare events (holes, late writes, an exhausted budget) look their counter up when they happen: a
        # handle that only reads figures (the operator builds one per queue and pass) makes no counter child.
        self._won = FIRE_CLAIMS.labels(queue, "won")
        self._drained = FIRE_CLAIMS.labels(queue, "drained")
        # Only consumers of the main magazine prefetch: the shovel fires the sideline with an exact budget.
        self._prefetcher = Prefetch(self._count_attempt)
        # Slots reserved by a publish for the next publishes of this handle (ignis.magazine.reservations).
        self._reservations = Reservations(store, name, ttl_seconds, self._lock)
        self._reserves = store.write_grace_ms > 0  # a two-step publish: the increment can be shared
        # Magazines whose work this one's consumers also wait for (a subscription's main: its cursor): the watcher
        # follows them whenever it is asked to follow this one.
        self.also_watch: tuple[Magazine, ...] = ()

    @property
    def store(self) -> Storage:
        return self._store

    @store.setter
    def store(self, store: Storage) -> None:
        """Stand another store in (tests do): the parts use it too."""
        self._store = self._active_shards.store = self._awaited_slots.store = self._reservations.store = store

    @property
    def refresh_seconds(self) -> float:
        """How often the active shards are read again from the store's pointers."""
        return self._active_shards.refresh_seconds

    @refresh_seconds.setter
    def refresh_seconds(self, seconds: float) -> None:
        self._active_shards.refresh_seconds = seconds

    # ---- active shards ----------------------------------------------------------------------------
    # (ignis.magazine.shards: which shards have work, marked by loads, dropped by claims that find them drained.)
    @property
    def changes(self) -> int:
        """A token that changes whenever shards get work; read it before looking for work, and pass it to
        `wait_for_work`."""
        return self._active_shards.activity.changes

    def wait_for_work(self, seen: int, timeout: float) -> bool:
        """Sleep until shards get work after `seen` (`changes` read before the last fire found nothing), a
        `wake()`, a slot claimed before its record landed is due for a re-read (a landing moves no pointer,
        so nothing else would wake the wait), or `timeout` seconds; meanwhile the process's watcher keeps this
        magazine's activity up to date with what other processes publish. True if woken."""
        due = self.next_check_in()
        for other in self.also_watch:  # a subscription's cursor: its awaited slots are due for re-reads too
            other_due = other.next_check_in()
            if other_due is not None and (due is None or other_due < due):
                due = other_due
        return self._active_shards.wait_for_work(self, seen, timeout if due is None else min(timeout, due))

    def watch(self) -> None:
        """Have the process's watcher follow this magazine (for the next ignis.watch.KEEP_WATCHING_SECONDS), and
        its delay mover move the queue's due messages into it (ignis.delay)."""
        self._active_shards.watch(self)

    def ring(self) -> None:
        """Bump the beacon (at most once a second): watchers of the idle queue elsewhere read it (a delayed
        publish: their movers look)."""
        self._active_shards.ring(())

    def wake(self) -> None:
        """Wake every consumer waiting on this magazine (one stops)."""
        self._active_shards.activity.wake()

    # ---- fire ------------------------------------------------------------------------------------
    def _claim_next(self, max_slots: int) -> list[Claimed] | None:
        """One guarded claim on an active shard: None when no shard has work, [] when the picked shard
        turned out drained (it is dropped from the active set)."""
        if self._in_doubt:
            resolved = self._resolve_in_doubt()
            if resolved:
                return resolved
        active_shards = self._active_shards
        loads_seen = active_shards.activity.last_load
        shard = active_shards.pick()
        if shard is None:
            return None
        try:
            claimed = self._store.claim(self.name, shard, max_slots, now_ms(), self._count_attempt)
        except (ClaimInDoubt, ClaimInterrupted) as exc:
            self._claim_failed(exc)
            raise
        if claimed:
            self._won.tick()
        else:
            self._drained.tick()
            active_shards.suppress(shard, loads_seen)
        return claimed

    def _resolve_in_doubt(self) -> list[Claimed]:
        """Find out what the claims whose answer was lost took (raising StoreUnavailable while the store still
        does not answer, keeping them for the next fire): their slots, stamped, are this handle's."""
        with self._lock:
            tickets, self._in_doubt = self._in_doubt, []
        out: list[Claimed] = []
        try:
            while tickets:
                try:
                    claimed = self._store.resolve_claim(tickets[0], now_ms())
                except ClaimInterrupted as exc:  # it took slots, then their stamp failed
                    tickets.pop(0)
                    self._keep_interrupted(exc)
                    raise
                tickets.pop(0)
                out.extend(claimed or ())
        finally:
            if tickets:
                with self._lock:
                    self._in_doubt[:0] = tickets
        return out

    def _claim_failed(self, exc: ClaimInDoubt | ClaimInterrupted) -> None:
        """After a claim of this handle failed: what it may have taken stays this handle's. In doubt (its answer
        was lost): resolved by this handle's next fire before it claims more. Interrupted: the slots it took, kept."""
        if isinstance(exc, ClaimInDoubt):
            with self._lock:
                self._in_doubt.append(exc.ticket)
        else:
            self._keep_interrupted(exc)

    def _keep_interrupted(self, exc: ClaimInterrupted) -> None:
        """The store failed after a claim took its slots: they are still ours. Keep them, awaited, to re-read
        once the store answers (the caller reports the outage)."""
        holes: list[SlotRef] = []
        for item in exc.claimed:
            self._set_aside(item, holes)
        HOLES_SKIPPED.labels(self.queue, self.kind).inc(len(holes))  # (not counted in the store: it is failing)

    def _give_up(self, skipped: int) -> None:
        HOLE_BUDGET_EXHAUSTED.labels(self.queue).inc()
        raise HoleBudgetExceeded(self.name, skipped)

    # Prefetch for concurrent consumers (ignis.magazine.prefetch): a fire that sees other threads of this handle
    # consuming claims for them too, and keeps the extra messages for the next fires of any thread.
    def fire_one(self) -> Claimed | None:
        """The next present record, or None: fire(1), the per-message consume path."""
        prefetcher, awaited = self._prefetcher, self._awaited_slots
        if awaited.slots or awaited.landed or prefetcher.kept:
            # Busy consumers come here per message: prefetcher.fired() and take_one() inlined (a Python call is a
            # visible share of a handed-out message). begin() notes the thread for a fire that claims.
            now = _monotonic()
            if prefetcher.enabled:
                prefetcher.consumers[_thread_id()] = now
            if awaited.slots or awaited.landed:
                ready = self._take_ready(1)
                if ready:
                    return ready[0]
            else:  # _take_ready(1) without its lists: the common case of busy consumers
                try:
                    at, item = prefetcher.kept.popleft()
                except IndexError:  # another thread took the last one
                    pass
                else:
                    if at >= now - _prefetch.PREFETCH_FRESH_SECONDS:
                        return item
                    restamped = self._awaited_slots.restamp_kept([item])
                    if restamped:
                        return restamped[0]
        others = prefetcher.begin()
        try:
            if not others:
                return self._fire_one()
            got = self._fire_many(1 + min(others * PREFETCH_PER_FIRE, PREFETCH_MAX), need=1)
        finally:
            prefetcher.end()
        if len(got) > 1:
            prefetcher.keep(got[1:])
        return got[0] if got else None

    def fire(self, max_messages: int = 1) -> list[Claimed]:
        """Claim up to `max_messages` present records (stamped with fireTS and attempts + 1).

        Returns [] when no shard has work. Skipped holes are counted; after `hole_budget` holes
        without a message it raises HoleBudgetExceeded (data may remain: fire again). A slot whose
        record is still being written is awaited, not skipped: a later fire delivers it once it lands."""
        prefetcher = self._prefetcher
        got = self.take_kept(max_messages)
        want = max_messages - len(got)
        if want <= 0:
            if prefetcher.enabled:  # (begin does this for a fire that claims)
                prefetcher.fired()
            return got
        others = prefetcher.begin()
        try:
            extra = min(others * max_messages * PREFETCH_PER_FIRE, PREFETCH_MAX) \
                if others and max_messages < PREFETCH_MAX else 0
            claimed = self._fire_many(want + extra, need=want)
        except HoleBudgetExceeded:
            if got:
                return got
            raise
        finally:
            prefetcher.end()
        if len(claimed) > want:
            prefetcher.keep(claimed[want:])
        return got + claimed[:want]

    def take_kept(self, max_messages: int) -> list[Claimed]:
        """Up to `max_messages` records this handle claimed and keeps (prefetched, or late writes that
        landed), without claiming more: what a consumer that stops hands out before it goes."""
        awaited = self._awaited_slots
        return self._take_ready(max_messages) if awaited.slots or awaited.landed or self._prefetcher.kept else []

    def _set_aside(self, item: Claimed, holes: list[SlotRef]) -> None:
        """A claimed slot without a record: awaited (kept to re-read later), or a hole for good (added to
        `holes`, for _passed)."""
        if item.awaiting:
            self._awaited_slots.add(item.ref)
        else:
            holes.append(item.ref)

    def _passed(self, holes: list[SlotRef], unwritten: Sequence[SlotRef] = ()) -> None:
        """Count claimed slots that were holes for good: the metric, and the store's HOLES_CLAIMED (so the
        figures count messages). The store's count is not worth failing a fire for: a failure leaves the
        figures a few messages off, said in the log. (`unwritten`: those a cursor's seal found never written.)"""
        if not holes:
            return
        HOLES_SKIPPED.labels(self.queue, self.kind).inc(len(holes))
        per_shard: dict[int, int] = {}
        for ref in holes:
            per_shard[ref.shard] = per_shard.get(ref.shard, 0) + 1
        try:
            self._store.note_claimed_holes(self.name, per_shard)
        except StoreError as exc:
            store_failed(f"count {len(holes)} hole(s) passed in {self.name} (its figures are off by as many)", exc)

    def _fire_one(self) -> Claimed | None:
        """fire(1) without its lists (measurably faster)."""
        holes: list[SlotRef] = []
        skipped = 0
        try:
            while (claimed := self._claim_next(1)) is not None:
                if claimed:
                    item = claimed[0]
                    if item.envelope is not None:
                        return item
                    self._set_aside(item, holes)
                    skipped += 1
                    if skipped >= self.hole_budget:
                        self._give_up(skipped)
            return None
        finally:
            if holes:
                self._passed(holes)

    def _fire_many(self, max_messages: int, need: int | None = None) -> list[Claimed]:
        """Claims until `need` (default: all) of `max_messages` are in hand; each claim asks for the rest."""
        need = max_messages if need is None else need
        got: list[Claimed] = []
        holes: list[SlotRef] = []
        skipped = 0
        try:
            while len(got) < need and (claimed := self._claim_next(max_messages - len(got))) is not None:
                for item in claimed:
                    if item.envelope is not None:
                        got.append(item)
                        continue
                    self._set_aside(item, holes)
                    skipped += 1
                if skipped >= self.hole_budget:
                    if got:
                        break
                    self._give_up(skipped)
        finally:
            if holes:
                self._passed(holes)
        return got

    # ---- awaited slots ----------------------------------------------------------------------------
    # (ignis.magazine.awaited: claimed slots whose record has not landed, re-read on later fires.)
    def awaiting(self) -> int:
        """Slots this handle claimed and has not delivered yet: awaited, landed or prefetched (and claims
        whose answer was lost, not resolved yet)."""
        awaited = self._awaited_slots
        return len(awaited.slots) + len(awaited.landed) + len(self._prefetcher.kept) + len(self._in_doubt)

    def next_check_in(self) -> float | None:
        """Seconds until an awaited slot is due for a re-read (0 when a claimed record waits to be handed
        out); None when this handle awaits nothing."""
        if self._prefetcher.kept:
            return 0.0
        return self._awaited_slots.next_check_in()

    def _take_ready(self, n: int) -> list[Claimed]:
        """Up to n claimed records waiting here: late writes that landed, then prefetched ones."""
        out = self._awaited_slots.take(n, self._passed)
        stale: list[Claimed] = []
        if len(out) < n:
            fresh, stale = self._prefetcher.take(n - len(out))
            out.extend(fresh)
        if stale:
            out.extend(self._awaited_slots.restamp_kept(stale))
        return out

    def adopt(self, previous: Magazine) -> None:
        """Take over what an earlier handle of this magazine claimed and has not handed out (awaited,
        landed, prefetched) and the slots it reserved, so replacing a handle (a config change) strands
        none of it."""
        if previous is self:
            return
        before, mine = previous._awaited_slots, self._awaited_slots
        with previous._lock:
            awaited, before.slots = before.slots, []
        landed, prefetched = list(before.landed), list(previous._prefetcher.kept)
        before.landed.clear()
        previous._prefetcher.kept.clear()
        reserved = previous._reservations.pop()
        with self._lock:
            mine.slots.extend(awaited)
        mine.landed.extend(landed)
        self._prefetcher.kept.extend(prefetched)
        self._reservations.slots.extend(reserved)

    def invalidate(self) -> None:
        """Forget when the active shards were read: the next fire re-reads the pointers."""
        self._active_shards.activity.invalidate()

    # ---- inspection --------------------------------------------------------------------------------
    def pointers(self) -> dict[int, ShardPointers]:
        return self._store.pointers(self.name, self.shards)

    def pending(self) -> int:
        """Messages not claimed yet (ShardPointers.pending: slots not claimed, minus the holes among them)."""
        return sum(p.pending for p in self.pointers().values())

    def in_flight(self, sweep_pointers: Mapping[str, int], scan_limit: int = IN_FLIGHT_SCAN_LIMIT) -> int:
        """Claimed records still present (delivered, neither settled nor swept yet): per shard, the
        present records from the sweep pointer (the next slot the sweeper will examine) up to the fire
        pointer, looking at no more than the newest `scan_limit` claimed slots of a shard — claims
        older than that are the sweeper's business, and the scan must stay cheap on a big backlog."""
        return self.in_flight_summary(sweep_pointers, scan_limit)[0]

    def in_flight_summary(self, sweep_pointers: Mapping[str, int], scan_limit: int = IN_FLIGHT_SCAN_LIMIT
                          ) -> tuple[int, int | None]:
        """`in_flight`'s count and the oldest fire time (epoch ms) among those records, None when no
        scanned record carries one: the age an alert compares with the queue's sweepDuration."""
        count = 0
        oldest: int | None = None
        for shard, p in self.pointers().items():
            first = max(int(sweep_pointers.get(names.shard_label(shard), 0)), p.fire - scan_limit + 1, 1)
            while first <= p.fire:
                last = min(p.fire, first + 999)
                found = self._store.peek(self.name, shard, first, last)
                count += len(found)
                for _, envelope in found:
                    fired = envelope.fire_ts
                    if fired and (oldest is None or fired < oldest):
                        oldest = fired
                first = last + 1
        return count, oldest

    def browse(self, limit: int = 100) -> list[tuple[SlotRef, Envelope]]:
        """Unclaimed present records, oldest slots first per shard, at most `limit`."""
        found: list[tuple[SlotRef, Envelope]] = []
        for shard, p in sorted(self.pointers().items()):
            first = p.fire + 1
            while first <= p.load and len(found) < limit:
                last = min(p.load, first + 999)
                found.extend(self._store.peek(self.name, shard, first, last)[: limit - len(found)])
                first = last + 1
        return found
