"""The main magazine of a bounded queue (QueueSpec.maxLength / maxBytes; design in ignis.bounds): its publishes
allocate within each shard's share of the bound, in the allocation's own atomic step (`Storage.load_bounded`,
`Storage.reserve_bounded`), try other shards when an unkeyed message's shard is full, and then either refuse
(QueueFull, counted in ignis_publish_rejected_total) or, with overflow dropHead, have the queue move the shard's
oldest waiting messages to the dead letters and publish into the room made.

A subclass of `Magazine`, built only for bounded queues, so that an unbounded queue's publish runs exactly the code
it ran before (no check of a bound on its hot path). Moves into main (a shovel, a retry, a release, a due delayed
message) go through `Magazine.load` and are never refused.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from ignis.bounds import ShardLimit, room
from ignis.envelope import Envelope, NewMessages
from ignis.errors import QueueFull
from ignis.magazine.core import Magazine
from ignis.magazine.loads import shard_for_key
from ignis.metrics import PUBLISH_REJECTED
from ignis.storage.base import Claimed, ClaimInDoubt, ClaimInterrupted, MessageRef, SlotRef, Storage

_new_tuple = tuple.__new__
_random = random.random
DROP_ROUNDS = 8  # dropHead: times a publish makes room in one shard and tries again (bytes may need several)

# dropHead: (shard, how many) -> slots of main the queue freed (claimed out of the shard, messages moved to the dead
# letters and holes passed).
DropHead = Callable[[int, int], int]


class BoundedMagazine(Magazine):
    """A bounded queue's main magazine (module doc)."""

    def __init__(self, store: Storage, name: str, *, limits: Sequence[ShardLimit], spec_text: str,
                 drop_head: DropHead | None = None, **kwargs: Any) -> None:
        super().__init__(store, name, **kwargs)
        self.limits = list(limits)
        self.spec_text = spec_text  # the bound, as the errors say it ("maxLength 1000")
        self.drop_head = drop_head
        self._rejected = PUBLISH_REJECTED.labels(self.queue)

    # ---- the publishes (Magazine's, bounded) ---------------------------------------------------------------
    def publish_one(self, payload: bytes, msg_id: str, loaded_at: int) -> MessageRef:
        if self._reserves:
            ref = self._publish_reserved(payload, msg_id, loaded_at)
            if ref is not None:
                return ref
        else:  # one write transaction, with the room checked in it: as lean as an unbounded publish
            shard = int(_random() * self.shards)
            slot = self._store.load_one_bounded(self.name, shard, payload, msg_id, loaded_at, self.ttl_seconds,
                                                self.limits[shard])
            if slot:
                self._active_shards.mark_one(shard)
                return _new_tuple(MessageRef, (msg_id, self.name, shard, slot))
        return self._publish([Envelope(payload, msg_id, loaded_at)], None)[0]

    def publish_envelope(self, envelope: Envelope) -> MessageRef:
        return self._publish([envelope], envelope.key)[0]

    def publish_plain(self, payloads: Sequence[bytes], ids: Sequence[str], loaded_at: int) -> list[MessageRef]:
        return self._publish([Envelope(p, i, loaded_at) for p, i in zip(payloads, ids, strict=True)], None)

    def load_new(self, batch: NewMessages) -> list[MessageRef]:
        """A publish_many: placed as an unbounded queue's (Magazine.load_new) and loaded within each shard's share in
        one store call (one write transaction on lmdb); only what that refuses takes _publish's other shards and
        overflow."""
        placement = self.new_placement(batch)
        taken = self._store.load_new_bounded(self.name, batch, placement, self.ttl_seconds, self.limits)
        filled = [shard for (shard, _), slots in zip(placement, taken, strict=True) if len(slots)]
        if filled:
            self._active_shards.mark(filled)
        out: list[Any] = [None] * len(batch.ids)
        self.fill_refs(out, batch.ids, placement, taken)
        left = [i for (_, indices), slots in zip(placement, taken, strict=True) for i in indices[len(slots):]]
        if not left:
            return out
        envelopes: list[Any] = [None] * len(out)
        for i in left:
            envelopes[i] = batch.envelope(i)
        return self._settle_refused(placement[0][0], sorted(left), envelopes, out, batch.key)

    def load_published(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Publish existing envelopes, each with its own key (publish_each's per-message path), within the bound."""
        out: list[Any] = [None] * len(envelopes)
        refused: list[int] = []
        by_key: dict[str | None, list[int]] = {}
        for i, env in enumerate(envelopes):
            by_key.setdefault(env.key, []).append(i)
        for key, indices in by_key.items():
            try:
                refs = self._publish([envelopes[i] for i in indices], key)
            except QueueFull as exc:
                refs = exc.results
            for i, ref in zip(indices, refs, strict=True):
                if ref is None:
                    refused.append(i)
                else:
                    out[i] = _new_tuple(SlotRef, (ref.magazine, ref.shard, ref.slot))
        if refused:
            raise QueueFull(self.queue, self._why(None), sorted(refused), out)
        return out

    # ---- how -------------------------------------------------------------------------------------------------
    def _publish_reserved(self, payload: bytes, msg_id: str, loaded_at: int) -> MessageRef | None:
        """A plain publish on a two-step store: into a slot this handle reserved (counted in the bound when it was
        reserved), else a guarded reservation of the next slots within a random shard's room. None: no room there
        (or the slot was sealed at once): the general path decides."""
        store, ttl, reservations = self._store, self.ttl_seconds, self._reservations
        taken = reservations.take() if reservations.slots else None
        if taken is not None and store.load_reserved(taken, payload, msg_id, loaded_at, ttl):
            shard, slot = taken.shard, taken.slot
        else:
            reserved_at = time.monotonic()
            shard = int(random.random() * self.shards)
            first, got = store.reserve_bounded(self.name, shard, reservations.size(reserved_at), self.limits[shard],
                                               len(payload))
            if not got:
                return None
            reservations.keep(shard, range(first + 1, first + got), reserved_at)
            if not store.load_reserved(_new_tuple(SlotRef, (self.name, shard, first)), payload, msg_id, loaded_at,
                                       ttl):
                return None
            slot = first
        self._active_shards.mark_one(shard)
        return _new_tuple(MessageRef, (msg_id, self.name, shard, slot))

    def _publish(self, envelopes: Sequence[Envelope], key: str | None) -> list[MessageRef]:
        """Publish `envelopes` within the bound: a keyed batch into its key's shard; an unkeyed one dealt
        round-robin from a random shard (as load_new deals it), what finds no room placed on the shards that have
        some. Then, for what is still refused: dropHead makes room, rejectPublish refuses (QueueFull, which lists
        them; the others are stored)."""
        count = len(envelopes)
        out: list[Any] = [None] * count
        if not count:
            return out
        shards = self.shards
        if key is not None:
            home = shard_for_key(key, shards)
            left = self._place(home, list(range(count)), envelopes, out)
        else:
            home = int(random.random() * shards)
            left = []
            for k in range(min(shards, count)):
                left += self._place((home + k) % shards, list(range(k, count, shards)), envelopes, out)
        return self._settle_refused(home, sorted(left), envelopes, out, key) if left else out

    def _settle_refused(self, home: int, left: list[int], envelopes: Sequence[Envelope], out: list[Any],
                        key: str | None) -> list[MessageRef]:
        """What the home shards refused (`left`, indices into `envelopes` and `out`): an unkeyed message onto the
        shards with room; then dropHead makes room in `home`, rejectPublish refuses (QueueFull, which lists them;
        the others are stored)."""
        if key is None:
            left = self._elsewhere(left, envelopes, out)
        if left and self.drop_head is not None:
            left = self._drop_and_place(home, left, envelopes, out)
        if left:
            self._rejected.inc(len(left))
            raise QueueFull(self.queue, self._why(key), left, out)
        return out

    def _place(self, shard: int, indices: list[int], envelopes: Sequence[Envelope], out: list[Any]) -> list[int]:
        """Load what fits of `indices` into `shard`; the indices refused."""
        slots = self._store.load_bounded(self.name, shard, [envelopes[i] for i in indices], self.ttl_seconds,
                                         self.limits[shard])
        refused = []
        placed = False
        for i, ref in zip(indices, slots, strict=True):
            if ref is None:
                refused.append(i)
            else:
                out[i] = _new_tuple(MessageRef, (envelopes[i].msg_id, self.name, ref.shard, ref.slot))
                placed = True
        if placed:
            self._active_shards.mark_one(shard)
        return refused

    def _elsewhere(self, left: list[int], envelopes: Sequence[Envelope], out: list[Any]) -> list[int]:
        """Unkeyed messages whose shard was full: onto the shards with room, fullest-free first, as one read of
        every shard's pointers finds them (a publish to a full queue costs that read, not a try per shard)."""
        pointers = self._store.pointers(self.name, self.shards)
        with_bytes = any(limit.bytes is not None for limit in self.limits)
        loaded = self._store.loaded_bytes(self.name, self.shards) if with_bytes else [0] * self.shards
        sizes = [len(envelopes[i].payload) for i in left]
        free = []
        for shard in range(self.shards):
            p = pointers.get(shard)
            fits = room(self.limits[shard], p.load if p else 0, p.fire if p else 0, loaded[shard], sizes)
            if fits:
                free.append((fits, shard))
        for _, shard in sorted(free, reverse=True):
            left = self._place(shard, left, envelopes, out)
            if not left:
                break
        return left

    def _drop_and_place(self, home: int, left: list[int], envelopes: Sequence[Envelope], out: list[Any]) -> list[int]:
        """dropHead: make room in the home shard by moving its oldest waiting messages to the dead letters (the
        queue's drop_head), and publish into it; again while room made is taken by others, a few rounds."""
        assert self.drop_head is not None
        limit = self.limits[home]
        for _ in range(DROP_ROUNDS):
            want = len(left) if limit.length is None else min(len(left), limit.length)
            freed = self.drop_head(home, want)
            left = self._place(home, left, envelopes, out)
            if not left or not freed:  # done, or nothing left to drop (a message bigger than the byte share)
                break
        return left

    def _why(self, key: str | None) -> str:
        where = f"the shard of key {key!r} holds its share" if key is not None else "every shard holds its share"
        return f"{self.spec_text}: {where}"

    # ---- dropHead's claim ------------------------------------------------------------------------------------
    def claim_head(self, shard: int, count: int, now: int) -> tuple[list[Claimed], int]:
        """Claim the oldest `count` waiting slots of `shard` (the guarded claim: no other claimer gets them), not
        counted as a delivery: (the records claimed, the slots claimed). A hole passed is counted; a record still
        being written is awaited by this handle's next fires, as any claim's, or found by the sweeper."""
        try:
            claimed = self._store.claim(self.name, shard, count, now, False)
        except (ClaimInDoubt, ClaimInterrupted) as exc:  # the slots are not lost either way
            self._claim_failed(exc)
            raise
        holes: list[SlotRef] = []
        present = []
        for item in claimed:
            if item.envelope is None:
                self._set_aside(item, holes)
            else:
                present.append(item)
        self._passed(holes)
        return present, len(claimed)


__all__ = ["BoundedMagazine", "DropHead"]
