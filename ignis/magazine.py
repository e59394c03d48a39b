"""Magazine layer (DESIGN §4): load with random or key-based shard choice, fire with guarded claims,
hole skipping with a budget, and active-shard tracking so that an idle magazine costs almost no reads.
"""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

from ignis import names
from ignis.envelope import Envelope, NewMessages, now_ms
from ignis.errors import HoleBudgetExceeded
from ignis.metrics import FIRE_CLAIMS, HOLE_BUDGET_EXHAUSTED, HOLES_SKIPPED
from ignis.storage.base import Claimed, MessageRef, ShardPointers, SlotRef, Storage

_random = random.random
_new_tuple = tuple.__new__  # NamedTuples without their slower generated __init__
_new_message_ref = functools.partial(_new_tuple, MessageRef)  # MessageRef from an (id, magazine, shard, slot)


def shard_for_key(key: str, shards: int) -> int:
    """Stable across processes and restarts (unlike hash()): the same key always lands on one shard."""
    return zlib.crc32(key.encode("utf-8")) % shards


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
        self.store = store
        self.name = name
        self.kind = kind
        self.shards = shards
        self.ttl_seconds = ttl_seconds
        self.hole_budget = hole_budget
        self.refresh_seconds = refresh_seconds
        self._active: tuple[int, ...] = ()
        self._load_tokens = itertools.count(1)  # a fresh value per local load, atomic under the GIL
        self._last_load = 0
        self._refreshed_at = float("-inf")
        self._lock = threading.Lock()
        self._holes = HOLES_SKIPPED.labels(queue, kind)
        self._won = FIRE_CLAIMS.labels(queue, "won")
        self._drained = FIRE_CLAIMS.labels(queue, "drained")
        self._exhausted = HOLE_BUDGET_EXHAUSTED.labels(queue)
        self._count_attempt = kind == "main"  # a claim from the sideline is a shovel move, not a delivery

    # ---- load ------------------------------------------------------------------------------------
    # Shard choice (DESIGN §4): a keyed message goes to its key's shard, any other to a uniformly random
    # one. A batch is dealt round-robin from a random shard, which spreads it evenly (a random pick per
    # message would not) and keeps each shard's slots contiguous.
    def publish_one(self, payload: bytes, msg_id: str, loaded_at: int) -> MessageRef:
        """Publish one new keyless message of plain bytes: the commonest call, kept lean."""
        shard = int(_random() * self.shards)
        slot = self.store.load_one(self.name, shard, payload, msg_id, loaded_at, self.ttl_seconds)
        self._mark_active_one(shard)
        return _new_tuple(MessageRef, (msg_id, self.name, shard, slot))

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

    # ---- active shards ----------------------------------------------------------------------------
    # `_active` is an immutable tuple, replaced only under the lock, so fires and loads read it without
    # locking. After each commit a load stores a fresh token in `_last_load` and then, unlocked, checks
    # that its shard is listed (taking the lock only to add it): publishing takes no lock. A consumer
    # that found a shard drained drops it only if no load stored a token since its claim began, and
    # checks again after dropping it: a load that stored its token meanwhile may have seen the shard
    # still listed and skipped adding it, so the drop is undone. A refresh from the store does the
    # same. Either way a message published by this process never stays hidden from its consumers.
    def _mark_active(self, shards: Iterable[int]) -> None:
        self._last_load = next(self._load_tokens)  # before reading _active: see above
        active = self._active
        if any(shard not in active for shard in shards):
            with self._lock:
                self._active += tuple(shard for shard in set(shards) if shard not in self._active)

    def _mark_active_one(self, shard: int) -> None:
        self._last_load = next(self._load_tokens)  # before reading _active: see above
        if shard not in self._active:
            with self._lock:
                if shard not in self._active:
                    self._active += (shard,)

    def _suppress(self, shard: int, loads_seen: int) -> None:
        with self._lock:
            before = self._active
            if self._last_load == loads_seen and shard in before:
                self._active = tuple(s for s in before if s != shard)
                if self._last_load != loads_seen:  # a load raced the drop: undo it
                    self._active = before

    def _pick_shard(self) -> int | None:
        if time.monotonic() - self._refreshed_at >= self.refresh_seconds:
            with self._lock:
                if time.monotonic() - self._refreshed_at >= self.refresh_seconds:
                    loads_seen, before = self._last_load, self._active
                    pointers = self.store.pointers(self.name, self.shards)
                    self._active = tuple(shard for shard, p in pointers.items() if p.load > p.fire)
                    if self._last_load != loads_seen:  # a load committed after the read: keep what it saw
                        self._active += tuple(shard for shard in before if shard not in self._active)
                    self._refreshed_at = time.monotonic()
        active = self._active
        return active[int(_random() * len(active))] if active else None

    # ---- fire ------------------------------------------------------------------------------------
    def _claim_next(self, max_slots: int) -> list[Claimed] | None:
        """One guarded claim on an active shard: None when no shard has work, [] when the picked shard
        turned out drained (it is dropped from the active set)."""
        loads_seen = self._last_load
        shard = self._pick_shard()
        if shard is None:
            return None
        claimed = self.store.claim(self.name, shard, max_slots, now_ms(), self._count_attempt)
        if claimed:
            self._won.tick()
        else:
            self._drained.tick()
            self._suppress(shard, loads_seen)
        return claimed

    def _give_up(self, holes: int) -> None:
        self._exhausted.inc()
        raise HoleBudgetExceeded(self.name, holes)

    def fire_one(self) -> Claimed | None:
        """The next present record, or None: `fire(1)` without its lists (the per-message consume path,
        measurably faster)."""
        holes = 0
        try:
            while (claimed := self._claim_next(1)) is not None:
                if claimed:
                    if claimed[0].envelope is not None:
                        return claimed[0]
                    holes += 1
                    if holes >= self.hole_budget:
                        self._give_up(holes)
            return None
        finally:
            if holes:
                self._holes.inc(holes)

    def fire(self, max_messages: int = 1) -> list[Claimed]:
        """Claim up to `max_messages` present records (stamped with fireTS and attempts + 1).

        Returns [] when no shard has work. Skipped holes are counted; after `hole_budget` holes
        without a message it raises HoleBudgetExceeded (data may remain: fire again)."""
        got: list[Claimed] = []
        holes = 0
        try:
            while len(got) < max_messages and (claimed := self._claim_next(max_messages - len(got))) is not None:
                for item in claimed:
                    if item.envelope is None:
                        holes += 1
                    else:
                        got.append(item)
                if holes >= self.hole_budget:
                    if got:
                        break
                    self._give_up(holes)
        finally:
            if holes:
                self._holes.inc(holes)
        return got

    def invalidate(self) -> None:
        """Forget the cached active shards: the next fire re-reads the pointers."""
        with self._lock:
            self._refreshed_at = float("-inf")

    # ---- inspection --------------------------------------------------------------------------------
    def pointers(self) -> dict[int, ShardPointers]:
        return self.store.pointers(self.name, self.shards)

    def pending(self) -> int:
        """Unclaimed slots (includes holes): Σ (load - fire)."""
        return sum(p.pending for p in self.pointers().values())

    def in_flight(self, sweep_pointers: Mapping[str, int], scan_limit: int = IN_FLIGHT_SCAN_LIMIT) -> int:
        """Claimed records still present (delivered, neither settled nor swept yet): per shard, the
        present records from the sweep pointer (the next slot the sweeper will examine) up to the fire
        pointer, looking at no more than the newest `scan_limit` claimed slots of a shard — claims
        older than that are the sweeper's business, and the scan must stay cheap on a big backlog."""
        count = 0
        for shard, p in self.pointers().items():
            first = max(int(sweep_pointers.get(names.shard_label(shard), 0)), p.fire - scan_limit + 1, 1)
            while first <= p.fire:
                last = min(p.fire, first + 999)
                count += len(self.store.peek(self.name, shard, first, last))
                first = last + 1
        return count

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
