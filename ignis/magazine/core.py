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
import zlib
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from ignis import names
from ignis.envelope import Envelope, NewMessages, now_ms
from ignis.errors import HoleBudgetExceeded, StoreError
from ignis.magazine.awaited import AwaitedSlots
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
    Move,
    ShardPointers,
    SlotRef,
    Storage,
)

_random = random.random
_new_tuple = tuple.__new__  # NamedTuples without their slower generated __init__
_new_message_ref = functools.partial(_new_tuple, MessageRef)  # MessageRef from an (id, magazine, shard, slot)


def shard_for_key(key: str, shards: int) -> int:
    """Stable across processes and restarts (unlike hash()): the same key always lands on one shard."""
    return zlib.crc32(key.encode("utf-8")) % shards


def placement(envelopes: Sequence[Envelope], shards: int) -> list[int]:
    """The shard of each existing message a load appends (a sideline, shovel, sweep or delayed move), placed as
    load_new places new ones: its key's shard, else dealt round-robin from a random shard."""
    first = random.randrange(shards)
    return [shard_for_key(env.key, shards) if env.key is not None else (first + i) % shards
            for i, env in enumerate(envelopes)]


IN_FLIGHT_SCAN_LIMIT = 10_000  # claimed slots per shard that in_flight() looks at
class Magazine:
    """One magazine of a queue: `main`, `sideline` or `dead`. Thread-safe."""

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
    ) -> None:
        self._store = store
        self.name = name
        self.kind = kind
        self.shards = shards
        self.ttl_seconds = ttl_seconds
        self.hole_budget = hole_budget
        self._lock = threading.Lock()  # shared with the parts below
        self._count_attempt = kind == "main"  # a claim from the sideline is a shovel move, not a delivery
        # Which shards have work, shared with every handle of this magazine in the process (ignis.activity).
        self._active_shards = ActiveShards(store, name, shards, refresh_seconds=refresh_seconds, lock=self._lock,
                                           is_main=self._count_attempt)
        # Claimed slots awaiting their record (see Claimed.awaiting) and records that turned up, stamped,
        # not yet handed out. Re-read on later fires of this handle: a worker never blocks on them.
        self._awaited_slots = AwaitedSlots(store, self._lock, ttl_seconds=ttl_seconds,
                                           count_attempt=self._count_attempt, queue=queue, kind=kind)
        self._in_doubt: list[ClaimTicket] = []  # claims whose answer was lost: resolved before the next claim
        self.queue = queue
        # Rare events (holes, late writes, an exhausted budget) look their counter up when they happen: a
        # handle that only reads figures (the operator builds one per queue and pass) makes no counter child.
        self._won = FIRE_CLAIMS.labels(queue, "won")
        self._drained = FIRE_CLAIMS.labels(queue, "drained")
        # Only consumers of the main magazine prefetch: the shovel fires the sideline with an exact budget.
        self._prefetcher = Prefetch(kind == "main")
        # Slots reserved by a publish for the next publishes of this handle (ignis.magazine.reservations).
        self._reservations = Reservations(store, name, ttl_seconds, self._lock)
        self._reserves = store.write_grace_ms > 0  # a two-step publish: the increment can be shared

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

    # ---- load ------------------------------------------------------------------------------------
    # Shard choice (DESIGN §4): a keyed message goes to its key's shard, any other to a uniformly random
    # one. A batch is dealt round-robin from a random shard, which spreads it evenly (a random pick per
    # message would not) and keeps each shard's slots contiguous.
    def publish_one(self, payload: bytes, msg_id: str, loaded_at: int) -> MessageRef:
        """Publish one new keyless message of plain bytes: the commonest call, kept lean."""
        store = self._store
        if not self._reserves:
            shard = int(_random() * self.shards)
            slot = store.load_one(self.name, shard, payload, msg_id, loaded_at, self.ttl_seconds)
        else:
            reservations = self._reservations
            ref = reservations.take() if reservations.slots else None
            if ref is not None and store.load_reserved(ref, payload, msg_id, loaded_at, self.ttl_seconds):
                shard, slot = ref.shard, ref.slot
            else:
                shard, slot = self._allocate_and_publish(payload, msg_id, loaded_at)
        self._active_shards.mark_one(shard)
        return _new_message_ref((msg_id, self.name, shard, slot))

    def publish_plain(self, payloads: Sequence[bytes], ids: Sequence[str], loaded_at: int) -> list[MessageRef]:
        """Publish new keyless messages of plain bytes, each as `publish_one` would, together: an async
        publisher's batch (ignis.aio). Two-step backends write them into reserved slots with one round trip
        (reserving what is missing in one allocation); others in one group commit (load_new)."""
        store, name, ttl = self._store, self.name, self.ttl_seconds
        count = len(payloads)
        if count < 2:  # one (a lone async publisher's): publish_one's leaner path, as a blocking publish takes
            return [self.publish_one(payloads[0], ids[0], loaded_at)] if count else []
        if not self._reserves:
            return self.load_new(_new_tuple(NewMessages, (payloads, ids, None, loaded_at, None, None)))
        reservations = self._reservations  # (ignis.magazine.reservations)
        refs: list[SlotRef] = []
        while len(refs) < count and reservations.slots:
            ref = reservations.take()
            if ref is None:
                break
            refs.append(ref)
        if len(refs) < count:
            reserved_at = time.monotonic()
            missing = count - len(refs)
            size = reservations.size(reserved_at, missing)
            shard = int(_random() * self.shards)
            first = store.reserve(name, shard, size)
            refs += [_new_tuple(SlotRef, (name, shard, slot)) for slot in range(first, first + missing)]
            reservations.keep(shard, range(first + missing, first + size), reserved_at)
        written = store.load_reserved_many(refs, payloads, ids, loaded_at, ttl)
        out: list[MessageRef] = []
        for ref, ok, payload, msg_id in zip(refs, written, payloads, ids, strict=True):
            # (sealed meanwhile, a consumer gave the slot up: published again, as publish_one does)
            shard, slot = (ref.shard, ref.slot) if ok else self._allocate_and_publish(payload, msg_id, loaded_at)
            out.append(_new_message_ref((msg_id, name, shard, slot)))
        self._active_shards.mark({ref.shard for ref in out})
        return out

    def _allocate_and_publish(self, payload: bytes, msg_id: str, loaded_at: int) -> tuple[int, int]:
        """Allocate a slot on a random shard, with the reserve for the next publishes, and write into it."""
        store, ttl = self._store, self.ttl_seconds
        reserved_at = time.monotonic()  # before the call: every slot it allocates is younger than this
        count = self._reservations.size(reserved_at)
        shard = int(_random() * self.shards)
        if count == 1:
            return shard, store.load_one(self.name, shard, payload, msg_id, loaded_at, ttl)
        first = store.reserve(self.name, shard, count)
        self._reservations.keep(shard, range(first + 1, first + count), reserved_at)
        if store.load_reserved(_new_tuple(SlotRef, (self.name, shard, first)), payload, msg_id, loaded_at, ttl):
            return shard, first
        return shard, store.load_one(self.name, shard, payload, msg_id, loaded_at, ttl)  # sealed at once: rare

    def reserved(self) -> int:
        """Slots this handle reserved for publishes to come and has not written (they are not messages)."""
        return len(self._reservations.slots)

    def release_reserved(self) -> int:
        """Seal every slot reserved and not written (at close): a consumer then passes them at once
        instead of awaiting each for the write grace. Returns how many."""
        return self._reservations.release()

    def load_new(self, batch: NewMessages) -> list[MessageRef]:
        """Publish a batch of new messages in one group commit; their references, in batch order."""
        count, shards, name, ids = len(batch.ids), self.shards, self.name, batch.ids
        if batch.key is not None:
            placement: list[tuple[int, range]] = [(shard_for_key(batch.key, shards), range(count))]
        else:
            first = int(_random() * shards)
            placement = [((first + k) % shards, range(k, count, shards)) for k in range(min(shards, count))]
        taken = self._store.load_new(name, batch, placement, self.ttl_seconds)
        self._active_shards.mark([shard for shard, _ in placement])
        refs: list[Any] = [None] * count
        for (shard, indices), slots in zip(placement, taken, strict=True):
            # One slice assignment per shard, its references built by C-level map/zip (the indices
            # of a placement here are always a range).
            where = slice(indices.start, indices.stop, indices.step)
            refs[where] = map(_new_message_ref, zip(ids[where], repeat(name), repeat(shard), slots))
        return refs

    def load(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Append existing messages (a sideline, shovel or sweep move) in one group commit (`placement`)."""
        items = list(zip(placement(envelopes, self.shards), envelopes, strict=True))
        return self._active_shards.loaded(lambda: self._store.load(self.name, items, self.ttl_seconds))

    def load_due(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Move the queue's due delayed messages in (`placement`), in one transaction with their delete and
        uncount (`Storage.move_delayed`); those no longer delayed are left out."""
        items = list(zip(placement(envelopes, self.shards), envelopes, strict=True))
        return self._active_shards.loaded(lambda: self._store.move_delayed(self.name, items, self.ttl_seconds))

    def reload(self, refs: Sequence[SlotRef], envelopes: Sequence[Envelope], landed: Sequence[bool]
               ) -> list[SlotRef]:
        """Finish a `load` that raised LoadInterrupted, copying nothing twice (see `Storage.reload`)."""
        return self._active_shards.loaded(
            lambda: self._store.reload(self.name, refs, envelopes, landed, self.ttl_seconds))

    def move_in(self, epoch: int, moves: Sequence[tuple[SlotRef, int | None, Envelope]],
                fired_before: int | None = None) -> list[bool]:
        """Fenced move of existing records (source slot, the fireTS it was seen with, envelope to write)
        into this magazine, placed as `load` places them; see `Storage.move` (and its `fired_before`). Per
        record: moved here."""
        placed = [Move(source, fired_at, shard, env) for shard, (source, fired_at, env)
                  in zip(placement([m[2] for m in moves], self.shards), moves, strict=True)]
        done = self._store.move(self.name, placed, self.ttl_seconds, epoch, fired_before)
        self._active_shards.mark({m.shard for m, moved in zip(placed, done, strict=True) if moved})
        return done

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
        except ClaimInDoubt as exc:  # the claim's answer was lost: find out what it took before claiming more
            with self._lock:
                self._in_doubt.append(exc.ticket)
            raise
        except ClaimInterrupted as exc:
            self._keep_interrupted(exc)
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
        if prefetcher.enabled:  # (pruned by Prefetch._others_consuming: only a prefetching handle calls it)
            prefetcher.fired()
        if awaited.slots or awaited.landed:
            ready = self._take_ready(1)
            if ready:
                return ready[0]
        elif prefetcher.kept:  # _take_ready(1) without its lists: the common case of busy consumers
            kept = prefetcher.take_one()
            if kept is not None:  # (None: another thread took the last one)
                item, fresh = kept
                if fresh:
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
        if prefetcher.enabled:  # (pruned by Prefetch._others_consuming: only a prefetching handle calls it)
            prefetcher.fired()
        got = self.take_kept(max_messages)
        want = max_messages - len(got)
        if want <= 0:
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

    def _passed(self, holes: list[SlotRef]) -> None:
        """Count claimed slots that were holes for good: the metric, and the store's HOLES_CLAIMED (so the
        figures count messages). The store's count is not worth failing a fire for: a failure leaves the
        figures a few messages off, said in the log."""
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
