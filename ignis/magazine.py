"""Magazine layer (DESIGN §4): load with random or key-based shard choice, fire with guarded claims,
hole skipping with a budget, awaited slots, and active-shard tracking so that an idle magazine costs
almost no reads.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from threading import get_ident as _thread_id
from typing import Any

from ignis import names
from ignis.activity import ShardActivity, activity_for, with_work
from ignis.delay import mover_for
from ignis.envelope import Envelope, NewMessages, now_ms
from ignis.errors import HoleBudgetExceeded, StoreError
from ignis.metrics import FIRE_CLAIMS, HOLE_BUDGET_EXHAUSTED, HOLES_SKIPPED, LATE_WRITES
from ignis.outage import store_failed
from ignis.storage.base import (
    RESERVATION_FRESH_MS,
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
from ignis.watch import watcher_for

log = logging.getLogger(__name__)
_random = random.random
PREFETCH_MAX = 64  # messages one fire claims for other threads of its handle, at most
PREFETCH_PER_FIRE = 8  # ... and per other consumer thread of the handle: each of them comes back for more
CONSUMER_RECENT_SECONDS = 0.1  # a thread that fired this recently counts as a consumer of the handle
PREFETCH_FRESH_SECONDS = 1.0  # a prefetched message kept longer is stamped again when handed out
RESERVE_MAX = 32  # slots one allocation reserves for the next publishes of its handle, at most
RESERVE_AHEAD_SECONDS = 0.005  # ... as many as the handle's recent publish rate fills in this long
REAP_DELAY_SECONDS = 0.05  # after RESERVATION_FRESH_MS, when the timer seals what nobody wrote
_new_tuple = tuple.__new__  # NamedTuples without their slower generated __init__
_new_message_ref = functools.partial(_new_tuple, MessageRef)  # MessageRef from an (id, magazine, shard, slot)


def shard_for_key(key: str, shards: int) -> int:
    """Stable across processes and restarts (unlike hash()): the same key always lands on one shard."""
    return zlib.crc32(key.encode("utf-8")) % shards


IN_FLIGHT_SCAN_LIMIT = 10_000  # claimed slots per shard that in_flight() looks at
# An awaited slot (claimed, its record still being written) is re-read first this soon, then less and
# less often, until the store's write grace has passed. A publish lands within a round trip or two, but a
# slot a publisher reserved ahead (RESERVE_AHEAD_SECONDS) is written only when its publish comes, a few
# milliseconds later on a busy machine: re-reads spaced 1 ms x 1.15^n (1, 2.2, 3.5, 5, 6.7, 8.8 ms ...) find
# it soon after. Doubling from 2 ms (2, 6, 14, 30 ms) gave an e2e p50 / p99 of 2.6-3.1 / 14-21 ms at 1,000
# msg/s on Aerospike; this gives 1.9 / 7-8 ms (bench_latency, same machine, runs side by side). The re-reads
# are one batch call per handle for all its due slots, and only while slots are awaited (never when idle).
AWAIT_FIRST_CHECK_SECONDS = 0.001
AWAIT_CHECK_GROWTH = 1.15
AWAIT_MAX_CHECK_SECONDS = 0.25
AWAIT_MAX_FAILING_SECONDS = 5.0  # between re-reads while the store does not answer them


class _Awaited:
    """A slot this magazine handle claimed whose record has not landed yet."""

    __slots__ = ("deadline", "due", "ref", "wait")

    def __init__(self, ref: SlotRef, now: float, grace: float) -> None:
        self.ref = ref
        self.deadline = now + grace  # the producer's write deadline: seal it after this
        self.wait = AWAIT_FIRST_CHECK_SECONDS
        self.due = now + self.wait  # next re-read


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
        self.store = store
        self.name = name
        self.kind = kind
        self.shards = shards
        self.ttl_seconds = ttl_seconds
        self.hole_budget = hole_budget
        self.refresh_seconds = refresh_seconds
        # Which shards have work, shared with every handle of this magazine in the process (ignis.activity).
        self._activity: ShardActivity = activity_for(store.location, store.client_id, name)
        self._beacon = store.beacon  # (bound now: tests stand other stores in for `store` later)
        self._lock = threading.Lock()
        # Claimed slots awaiting their record (see Claimed.awaiting) and records that turned up, stamped,
        # not yet handed out. Re-read on later fires of this handle: a worker never blocks on them.
        self._awaited: list[_Awaited] = []
        self._landed: deque[Claimed] = deque()
        self._in_doubt: list[ClaimTicket] = []  # claims whose answer was lost: resolved before the next claim
        self._grace = store.write_grace_ms / 1000
        self.queue = queue
        # Rare events (holes, late writes, an exhausted budget) look their counter up when they happen: a
        # handle that only reads figures (the operator builds one per queue and pass) makes no counter child.
        self._won = FIRE_CLAIMS.labels(queue, "won")
        self._drained = FIRE_CLAIMS.labels(queue, "drained")
        self._count_attempt = kind == "main"  # a claim from the sideline is a shovel move, not a delivery
        self._prefetched: deque[tuple[float, Claimed]] = deque()  # (when claimed, claimed) for later fires
        self._firing = 0  # fires of this handle in progress, for the prefetch
        self._firing_lock = threading.Lock()
        self._consumers: dict[int, float] = {}  # thread -> when it last fired on this handle (monotonic)
        # Only consumers of the main magazine prefetch: the shovel fires the sideline with an exact budget.
        self._prefetch = kind == "main"
        # Slots reserved by a publish for the next publishes of this handle: (when reserved, slot).
        self._reserved: deque[tuple[float, SlotRef]] = deque()
        self._allocated_at = float("-inf")  # when this handle last allocated slots to publish into (monotonic)
        self._allocated = 1  # how many slots that allocation took
        self._reaping = False  # a timer will seal the reservations that go stale
        self._reserves = store.write_grace_ms > 0  # a two-step publish: the increment can be shared

    # ---- load ------------------------------------------------------------------------------------
    # Shard choice (DESIGN §4): a keyed message goes to its key's shard, any other to a uniformly random
    # one. A batch is dealt round-robin from a random shard, which spreads it evenly (a random pick per
    # message would not) and keeps each shard's slots contiguous.
    def publish_one(self, payload: bytes, msg_id: str, loaded_at: int) -> MessageRef:
        """Publish one new keyless message of plain bytes: the commonest call, kept lean."""
        store = self.store
        if not self._reserves:
            shard = int(_random() * self.shards)
            slot = store.load_one(self.name, shard, payload, msg_id, loaded_at, self.ttl_seconds)
        else:
            ref = self._take_reserved() if self._reserved else None
            if ref is not None and store.load_reserved(ref, payload, msg_id, loaded_at, self.ttl_seconds):
                shard, slot = ref.shard, ref.slot
            else:
                shard, slot = self._allocate_and_publish(payload, msg_id, loaded_at)
        self._mark_active_one(shard)
        return _new_message_ref((msg_id, self.name, shard, slot))

    # Reservations (two-step backends): a publish is an increment of a shard's load pointer and then the
    # record's write, two round trips. When a handle publishes fast, an allocation reserves, in the same
    # increment, the slots its next publishes will need (the recent rate times RESERVE_AHEAD_SECONDS,
    # RESERVE_MAX at most), and those publishes, from any thread, write into them with one round trip.
    # The rate is told by how long the previous allocation lasted, so this costs a publish into a reserved
    # slot no bookkeeping at all: in a tight per-message path under the interpreter lock every step shows
    # (counting the publishes in progress cost 8 threads about a tenth of their throughput, measured).
    # Concurrent publishers and a loop publishing one by one both run fast, so both reserve; a trickle
    # (under about one publish per RESERVE_AHEAD_SECONDS) reserves nothing.
    # A reserved slot is written within RESERVATION_FRESH_MS or sealed (by the next publish, a timer, close),
    # so a consumer that claims it first awaits it within the store's write grace like any publish in
    # flight, and nothing but a dead process leaves a reserved slot empty (then the claimer seals it).
    def _reservation_size(self, now: float, needed: int = 1) -> int:
        """Slots the allocation made `now` takes: those `needed`, and the reserve for the publishes expected
        next. (Unlocked: two threads allocating at once may each size from the other's numbers; both are
        recent, which is all the estimate needs.)"""
        elapsed = now - self._allocated_at
        self._allocated_at = now
        ahead = RESERVE_MAX if elapsed <= 0 else int(self._allocated / elapsed * RESERVE_AHEAD_SECONDS)
        self._allocated = needed + min(ahead, RESERVE_MAX)
        return self._allocated

    def publish_plain(self, payloads: Sequence[bytes], ids: Sequence[str], loaded_at: int) -> list[MessageRef]:
        """Publish new keyless messages of plain bytes, each as `publish_one` would, together: an async
        publisher's batch (ignis.aio). Two-step backends write them into reserved slots with one round trip
        (reserving what is missing in one allocation); others in one group commit (load_new)."""
        store, name, ttl = self.store, self.name, self.ttl_seconds
        count = len(payloads)
        if not count:
            return []
        if not self._reserves:
            return self.load_new(_new_tuple(NewMessages, (payloads, ids, None, loaded_at, None, None)))
        refs: list[SlotRef] = []
        while len(refs) < count and self._reserved:
            ref = self._take_reserved()
            if ref is None:
                break
            refs.append(ref)
        if len(refs) < count:
            reserved_at = time.monotonic()
            missing = count - len(refs)
            size = self._reservation_size(reserved_at, missing)
            shard = int(_random() * self.shards)
            first = store.reserve(name, shard, size)
            refs += [_new_tuple(SlotRef, (name, shard, slot)) for slot in range(first, first + missing)]
            self._keep_reserved(shard, range(first + missing, first + size), reserved_at)
        written = store.load_reserved_many(refs, payloads, ids, loaded_at, ttl)
        out: list[MessageRef] = []
        for ref, ok, payload, msg_id in zip(refs, written, payloads, ids, strict=True):
            # (sealed meanwhile, a consumer gave the slot up: published again, as publish_one does)
            shard, slot = (ref.shard, ref.slot) if ok else self._allocate_and_publish(payload, msg_id, loaded_at)
            out.append(_new_message_ref((msg_id, name, shard, slot)))
        self._mark_active({ref.shard for ref in out})
        return out

    def _keep_reserved(self, shard: int, slots: range, reserved_at: float) -> None:
        """Keep slots an allocation reserved ahead for the next publishes (sealed by the reaper if unwritten)."""
        if slots:
            self._reserved.extend([(reserved_at, _new_tuple(SlotRef, (self.name, shard, slot))) for slot in slots])
            if not self._reaping:
                self._arm_reaper()

    def _allocate_and_publish(self, payload: bytes, msg_id: str, loaded_at: int) -> tuple[int, int]:
        """Allocate a slot on a random shard, with the reserve for the next publishes, and write into it."""
        store, ttl = self.store, self.ttl_seconds
        reserved_at = time.monotonic()  # before the call: every slot it allocates is younger than this
        count = self._reservation_size(reserved_at)
        shard = int(_random() * self.shards)
        if count == 1:
            return shard, store.load_one(self.name, shard, payload, msg_id, loaded_at, ttl)
        first = store.reserve(self.name, shard, count)
        self._keep_reserved(shard, range(first + 1, first + count), reserved_at)
        if store.load_reserved(_new_tuple(SlotRef, (self.name, shard, first)), payload, msg_id, loaded_at, ttl):
            return shard, first
        return shard, store.load_one(self.name, shard, payload, msg_id, loaded_at, ttl)  # sealed at once: rare

    def _take_reserved(self) -> SlotRef | None:
        """A reserved slot young enough to write; older ones are sealed on the way."""
        stale = self._pop_reserved(time.monotonic() - RESERVATION_FRESH_MS / 1000)
        if stale:
            self._seal_reserved([ref for _, ref in stale])
        try:
            return self._reserved.popleft()[1]
        except IndexError:  # none left (another thread may have taken the last one)
            return None

    def _pop_reserved(self, older_than: float | None = None) -> list[tuple[float, SlotRef]]:
        """Take reservations off the front: those made before `older_than` (monotonic), or all of them.
        Without a lock (publishers pop the same deque): the front is looked at, then popped, and put back
        if a publish took it in between."""
        out = []
        reserved = self._reserved
        while True:
            try:
                head = reserved[0]
                if older_than is not None and head[0] >= older_than:
                    break
                popped = reserved.popleft()
            except IndexError:
                break
            if popped is head:
                out.append(popped)
            else:  # a publish took the front meanwhile: put back what came out instead, and look again
                reserved.appendleft(popped)
        return out

    # A reservation left when publishing stops (the end of a loop, of a burst) is sealed by a timer a
    # moment after it goes stale, not left to a consumer that would await it for the whole write grace
    # (seconds): one short-lived daemon thread per magazine, only while reservations are held.
    def _arm_reaper(self) -> None:
        with self._lock:
            if self._reaping:
                return
            self._reaping = True
        timer = threading.Timer(RESERVATION_FRESH_MS / 1000 + REAP_DELAY_SECONDS, self._reap)
        timer.daemon = True
        timer.start()

    def _reap(self) -> None:
        """Seal the stale reservations; come back while fresh ones remain."""
        stale = self._pop_reserved(time.monotonic() - RESERVATION_FRESH_MS / 1000)
        if stale:
            self._seal_reserved([ref for _, ref in stale])
        with self._lock:
            self._reaping = False
        if self._reserved:
            self._arm_reaper()

    def reserved(self) -> int:
        """Slots this handle reserved for publishes to come and has not written (they are not messages)."""
        return len(self._reserved)

    def release_reserved(self) -> int:
        """Seal every slot reserved and not written (at close): a consumer then passes them at once
        instead of awaiting each for the write grace. Returns how many."""
        refs = [ref for _, ref in self._pop_reserved()]
        if refs:
            self._seal_reserved(refs)
        return len(refs)

    def _seal_reserved(self, refs: list[SlotRef]) -> None:
        try:
            self.store.seal(refs, self.ttl_seconds)
        except StoreError as exc:  # the claimers of these slots seal them after the write grace instead
            log.warning("could not seal %d unused reserved slot(s) of %s: %s", len(refs), self.name, exc)

    def load_new(self, batch: NewMessages) -> list[MessageRef]:
        """Publish a batch of new messages in one group commit; their references, in batch order."""
        count, shards, name, ids = len(batch.ids), self.shards, self.name, batch.ids
        if batch.key is not None:
            placement: list[tuple[int, range]] = [(shard_for_key(batch.key, shards), range(count))]
        else:
            first = int(_random() * shards)
            placement = [((first + k) % shards, range(k, count, shards)) for k in range(min(shards, count))]
        taken = self.store.load_new(name, batch, placement, self.ttl_seconds)
        self._mark_active([shard for shard, _ in placement])
        refs: list[Any] = [None] * count
        for (shard, indices), slots in zip(placement, taken, strict=True):
            # One slice assignment per shard, its references built by C-level map/zip (the indices
            # of a placement here are always a range).
            where = slice(indices.start, indices.stop, indices.step)
            refs[where] = map(_new_message_ref, zip(ids[where], repeat(name), repeat(shard), slots))
        return refs

    def load(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Append existing messages (a sideline, shovel or sweep move) in one group commit, placed as
        load_new places new ones."""
        first = random.randrange(self.shards)
        shards = self.shards
        items = [(shard_for_key(env.key, shards) if env.key is not None else (first + i) % shards, env)
                 for i, env in enumerate(envelopes)]
        refs = self.store.load(self.name, items, self.ttl_seconds)
        self._mark_active({shard for shard, _ in items})
        return refs

    def move_in(self, epoch: int, moves: Sequence[tuple[SlotRef, int | None, Envelope]],
                fired_before: int | None = None) -> list[bool]:
        """Fenced move of existing records (source slot, the fireTS it was seen with, envelope to write)
        into this magazine, placed as `load` places them; see `Storage.move` (and its `fired_before`). Per
        record: moved here."""
        first = random.randrange(self.shards)
        shards = self.shards
        placed = [Move(source, fired_at, shard_for_key(env.key, shards) if env.key is not None else
                       (first + i) % shards, env) for i, (source, fired_at, env) in enumerate(moves)]
        done = self.store.move(self.name, placed, self.ttl_seconds, epoch, fired_before)
        self._mark_active({m.shard for m, moved in zip(placed, done, strict=True) if moved})
        return done

    # ---- active shards ----------------------------------------------------------------------------
    # The shards with work live in the process's ShardActivity of this magazine (ignis.activity, where the
    # race-free marking and dropping is explained): a load through any handle lists its shard and wakes the
    # consumers waiting on the magazine, whichever handle they hold, and rings the store's doorbell for those
    # of other processes (lmdb); the watcher (ignis.watch) lists what other processes publish.
    def _mark_active(self, shards: Iterable[int]) -> None:
        shards = tuple(shards)
        if not shards:
            return
        self._activity.mark(shards)
        self._ring(shards)

    def _mark_active_one(self, shard: int) -> None:
        self._activity.mark_one(shard)
        self._ring((shard,))

    def _ring(self, shards: Iterable[int]) -> None:
        """Tell consumers in other processes (only main has consumers): the store's beacon (a store with a
        doorbell rang it in the load itself, and its beacon does nothing)."""
        if self._count_attempt:
            self._beacon(self.name)

    def _suppress(self, shard: int, loads_seen: int) -> None:
        self._activity.suppress(shard, loads_seen)

    def _pick_shard(self) -> int | None:
        activity = self._activity
        if activity.refresh_due(self.refresh_seconds):
            with self._lock:
                if activity.refresh_due(self.refresh_seconds):
                    seen = activity.before_read()
                    activity.replace(with_work(self.store.pointers(self.name, self.shards)), seen)
        active = activity.active
        return active[int(_random() * len(active))] if active else None

    @property
    def changes(self) -> int:
        """A token that changes whenever shards get work; read it before looking for work, and pass it to
        `wait_for_work`."""
        return self._activity.changes

    def wait_for_work(self, seen: int, timeout: float) -> bool:
        """Sleep until shards get work after `seen` (`changes` read before the last fire found nothing), a
        `wake()`, or `timeout` seconds; meanwhile the process's watcher keeps this magazine's activity up to
        date with what other processes publish. True if woken."""
        self.watch()
        return self._activity.wait(seen, timeout)

    def watch(self) -> None:
        """Have the process's watcher follow this magazine (for the next ignis.watch.KEEP_WATCHING_SECONDS), and
        its delay mover move the queue's due messages into it (ignis.delay)."""
        watcher = watcher_for(self.store)
        if watcher is not None:  # (None: the handle is closing)
            watcher.watch(self.name, self.shards, self._activity)
        mover = mover_for(self.store) if self._count_attempt else None
        if mover is not None:
            mover.follow(self)

    def ring(self) -> None:
        """Bump the beacon (at most once a second): watchers of the idle queue elsewhere read it (a delayed
        publish: their movers look)."""
        self._ring(())

    def wake(self) -> None:
        """Wake every consumer waiting on this magazine (one stops)."""
        self._activity.wake()

    # ---- fire ------------------------------------------------------------------------------------
    def _claim_next(self, max_slots: int) -> list[Claimed] | None:
        """One guarded claim on an active shard: None when no shard has work, [] when the picked shard
        turned out drained (it is dropped from the active set)."""
        if self._in_doubt:
            resolved = self._resolve_in_doubt()
            if resolved:
                return resolved
        loads_seen = self._activity.last_load
        shard = self._pick_shard()
        if shard is None:
            return None
        try:
            claimed = self.store.claim(self.name, shard, max_slots, now_ms(), self._count_attempt)
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
            self._suppress(shard, loads_seen)
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
                    claimed = self.store.resolve_claim(tickets[0], now_ms())
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

    # Prefetch for concurrent consumers: every claim costs a round trip to the meta record and one to
    # the data, so a fire that sees other threads of this handle consuming claims for them too (eight
    # more slots per other consumer, PREFETCH_MAX at most) and keeps the extra messages here, claimed
    # and stamped, for the next fires of any thread. (57 per claim for eight threads, against 29 with
    # four per consumer and at most 32, gave a few percent more throughput across rounds, measured.)
    # The other consumers are the fires in progress beside it or, if more, the other threads that fired
    # on the handle within CONSUMER_RECENT_SECONDS: those are busy with what they got (handling, acking)
    # and come back for more; counting only the fires that overlap saw one or two of eight consumers and
    # claimed half as much per call (measured). A lone consumer, or one slower than that per message,
    # claims exactly what it asks for.
    # A message kept longer than PREFETCH_FRESH_SECONDS is stamped again before it is handed out, so
    # its sweep clock starts at delivery. A Consumer that stops hands the kept messages out first
    # (take_kept); a process that dies leaves them to the sweeper, as any crashed consumer does.
    def _others_consuming(self) -> int:
        """Under _firing_lock: other consumers of this handle, for the prefetch (see above)."""
        consumers = self._consumers
        recent = time.monotonic() - CONSUMER_RECENT_SECONDS
        if len(consumers) > 1:
            for thread in [t for t, at in consumers.items() if at < recent]:
                del consumers[thread]
        return max(self._firing, len(consumers) - 1)

    def fire_one(self) -> Claimed | None:
        """The next present record, or None: fire(1), the per-message consume path."""
        if self._prefetch:  # (pruned by _others_consuming, which only a prefetching handle calls)
            self._consumers[_thread_id()] = time.monotonic()
        if self._awaited or self._landed:
            ready = self._take_ready(1)
            if ready:
                return ready[0]
        elif self._prefetched:  # _take_ready(1) without its lists: the common case of busy consumers
            try:
                at, item = self._prefetched.popleft()
            except IndexError:  # another thread took the last one
                pass
            else:
                if at >= time.monotonic() - PREFETCH_FRESH_SECONDS:
                    return item
                restamped = self._restamp_kept([item])
                if restamped:
                    return restamped[0]
        with self._firing_lock:
            others = self._others_consuming() if self._prefetch else 0
            self._firing += 1
        try:
            if not others:
                return self._fire_one()
            got = self._fire_many(1 + min(others * PREFETCH_PER_FIRE, PREFETCH_MAX), need=1)
        finally:
            with self._firing_lock:
                self._firing -= 1
        if len(got) > 1:
            self._keep(got[1:])
        return got[0] if got else None

    def fire(self, max_messages: int = 1) -> list[Claimed]:
        """Claim up to `max_messages` present records (stamped with fireTS and attempts + 1).

        Returns [] when no shard has work. Skipped holes are counted; after `hole_budget` holes
        without a message it raises HoleBudgetExceeded (data may remain: fire again). A slot whose
        record is still being written is awaited, not skipped: a later fire delivers it once it lands."""
        if self._prefetch:  # (pruned by _others_consuming, which only a prefetching handle calls)
            self._consumers[_thread_id()] = time.monotonic()
        got = self.take_kept(max_messages)
        want = max_messages - len(got)
        if want <= 0:
            return got
        with self._firing_lock:
            others = self._others_consuming() if self._prefetch else 0
            self._firing += 1
        try:
            extra = min(others * max_messages * PREFETCH_PER_FIRE, PREFETCH_MAX) \
                if others and max_messages < PREFETCH_MAX else 0
            claimed = self._fire_many(want + extra, need=want)
        except HoleBudgetExceeded:
            if got:
                return got
            raise
        finally:
            with self._firing_lock:
                self._firing -= 1
        if len(claimed) > want:
            self._keep(claimed[want:])
        return got + claimed[:want]

    def take_kept(self, max_messages: int) -> list[Claimed]:
        """Up to `max_messages` records this handle claimed and keeps (prefetched, or late writes that
        landed), without claiming more: what a consumer that stops hands out before it goes."""
        return self._take_ready(max_messages) if self._awaited or self._landed or self._prefetched else []

    def _keep(self, claimed: Sequence[Claimed]) -> None:
        at = time.monotonic()
        self._prefetched.extend((at, item) for item in claimed)

    def _set_aside(self, item: Claimed, holes: list[SlotRef]) -> None:
        """A claimed slot without a record: awaited (kept to re-read later), or a hole for good (added to
        `holes`, for _passed)."""
        if item.awaiting:
            self._await(item.ref)
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
            self.store.note_claimed_holes(self.name, per_shard)
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
    # A consumer that is caught up may claim a slot between a producer's increment and its write
    # (Aerospike). The claimer owns the slot, so it keeps it here and re-reads it on later fires until
    # the record lands (delivered then, counted as a late write) or the producer's write deadline has
    # passed (sealed: a hole for good, which refuses the late write, so its producer publishes it again).
    def _await(self, ref: SlotRef) -> None:
        with self._lock:
            self._awaited.append(_Awaited(ref, time.monotonic(), self._grace))

    def awaiting(self) -> int:
        """Slots this handle claimed and has not delivered yet: awaited, landed or prefetched (and claims
        whose answer was lost, not resolved yet)."""
        return len(self._awaited) + len(self._landed) + len(self._prefetched) + len(self._in_doubt)

    def next_check_in(self) -> float | None:
        """Seconds until an awaited slot is due for a re-read (0 when a claimed record waits to be handed
        out); None when this handle awaits nothing."""
        if self._landed or self._prefetched:
            return 0.0
        with self._lock:
            due = min((a.due for a in self._awaited), default=None)
        return None if due is None else max(due - time.monotonic(), 0.0)

    def _take_ready(self, n: int) -> list[Claimed]:
        """Up to n claimed records waiting here: late writes that landed, then prefetched ones."""
        if self._awaited:
            self._recheck()
        out: list[Claimed] = []
        while len(out) < n:
            try:
                out.append(self._landed.popleft())
            except IndexError:
                break
        stale: list[Claimed] = []
        if len(out) < n:
            fresh_after = time.monotonic() - PREFETCH_FRESH_SECONDS
            while len(out) + len(stale) < n:
                try:
                    at, item = self._prefetched.popleft()
                except IndexError:
                    break
                (out if at >= fresh_after else stale).append(item)
        if stale:
            out.extend(self._restamp_kept(stale))
        return out

    def _restamp_kept(self, stale: Sequence[Claimed]) -> list[Claimed]:
        """Prefetched messages kept too long, stamped again (not a new attempt) so their sweep clock starts
        at delivery; one the sweeper took meanwhile is dropped."""
        try:
            restamped = self.store.restamp([c.ref for c in stale], now_ms(), False)
        except StoreError:
            for c in stale:  # still ours: re-read once the store answers
                self._await(c.ref)
            raise
        for c in restamped:
            if c.envelope is None and c.awaiting:  # not answered for: still ours, re-read later
                self._await(c.ref)
        return [c for c in restamped if c.envelope is not None]

    def _recheck(self) -> None:
        """Re-read the awaited slots that are due, in one store call; seal those past their deadline."""
        now = time.monotonic()
        with self._lock:
            due = [a for a in self._awaited if a.due <= now]
            if not due:
                return
            self._awaited = [a for a in self._awaited if a.due > now]
        keep: list[_Awaited] = due  # what goes back to the list if a store call fails
        holes: list[SlotRef] = []
        late = 0
        try:
            found = self.store.restamp([a.ref for a in due], now_ms(), self._count_attempt)
            keep, expired = [], []
            for awaited, item in zip(due, found, strict=True):
                if item.envelope is not None:
                    self._landed.append(item)
                    late += 1
                elif not item.awaiting:
                    holes.append(awaited.ref)  # deleted or sealed meanwhile: a hole for good
                elif now >= awaited.deadline:
                    expired.append(awaited)
                else:
                    awaited.wait = min(awaited.wait * AWAIT_CHECK_GROWTH, AWAIT_MAX_CHECK_SECONDS)
                    awaited.due = now + awaited.wait
                    keep.append(awaited)
            if expired:
                keep.extend(expired)  # until they are sealed
                sealed = self.store.seal([a.ref for a in expired], self.ttl_seconds)
                keep = keep[:-len(expired)]
                for awaited, done in zip(expired, sealed, strict=True):
                    if done:
                        holes.append(awaited.ref)
                    else:  # the record landed at the last moment: re-read it at once
                        awaited.due = now
                        keep.append(awaited)
        except StoreError:
            # The store did not answer: the slots stay ours, and are re-read later and later while it
            # fails (never in a tight loop: a caller that waits for next_check_in() backs off too).
            for awaited in keep:
                awaited.wait = min(max(awaited.wait, AWAIT_MAX_CHECK_SECONDS) * 2, AWAIT_MAX_FAILING_SECONDS)
                awaited.due = now + awaited.wait
            raise
        finally:
            with self._lock:
                self._awaited.extend(keep)
            if holes:
                self._passed(holes)
            if late:
                LATE_WRITES.labels(self.queue, self.kind).inc(late)

    def adopt(self, previous: Magazine) -> None:
        """Take over what an earlier handle of this magazine claimed and has not handed out (awaited,
        landed, prefetched) and the slots it reserved, so replacing a handle (a config change) strands
        none of it."""
        if previous is self:
            return
        with previous._lock:
            awaited, previous._awaited = previous._awaited, []
        landed, prefetched = list(previous._landed), list(previous._prefetched)
        previous._landed.clear()
        previous._prefetched.clear()
        reserved = previous._pop_reserved()
        with self._lock:
            self._awaited.extend(awaited)
        self._landed.extend(landed)
        self._prefetched.extend(prefetched)
        self._reserved.extend(reserved)

    def invalidate(self) -> None:
        """Forget when the active shards were read: the next fire re-reads the pointers."""
        self._activity.invalidate()

    # ---- inspection --------------------------------------------------------------------------------
    def pointers(self) -> dict[int, ShardPointers]:
        return self.store.pointers(self.name, self.shards)

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
                found = self.store.peek(self.name, shard, first, last)
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
                found.extend(self.store.peek(self.name, shard, first, last)[: limit - len(found)])
                first = last + 1
        return found
