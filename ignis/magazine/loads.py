"""The load half of a magazine handle (`Magazine`'s publishes and moves in): shard choice (a keyed message goes
to its key's shard, any other to a uniformly random one; a batch is dealt round-robin from a random shard, which
spreads it evenly and keeps each shard's slots contiguous), the reservations of a two-step publish, and the marks
that wake this process's consumers. A mixin of `Magazine` (ignis.magazine.core), which holds the state it uses."""

from __future__ import annotations

import functools
import random
import threading
import time
import zlib
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ignis.envelope import Envelope, NewMessages
from ignis.storage.base import MessageRef, Move, SlotRef, Storage

if TYPE_CHECKING:
    from ignis.magazine.reservations import Reservations
    from ignis.magazine.shards import ActiveShards

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


class MagazineLoads:
    """Publishes into a magazine and moves into it (a mixin of Magazine)."""

    # Set by Magazine.__init__.
    _store: Storage
    name: str
    shards: int
    ttl_seconds: int
    _lock: threading.Lock
    _active_shards: ActiveShards
    _reservations: Reservations
    _reserves: bool

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

    def publish_envelope(self, envelope: Envelope) -> MessageRef:
        """Publish one new message that is more than plain bytes (a topic's, with its subject) as publish_one does:
        into a reserved slot with one write on a two-step store; a keyed one into its key's shard."""
        store, ttl = self._store, self.ttl_seconds
        if envelope.key is not None or not self._reserves:
            shard = shard_for_key(envelope.key, self.shards) if envelope.key is not None else \
                int(_random() * self.shards)
            ref = self._active_shards.loaded(lambda: store.load(self.name, [(shard, envelope)], ttl))[0]
            return _new_message_ref((envelope.msg_id, self.name, ref.shard, ref.slot))
        reservations = self._reservations
        taken = reservations.take() if reservations.slots else None
        if taken is not None and store.load_reserved_envelope(taken, envelope, ttl):
            shard, slot = taken.shard, taken.slot
        else:
            reserved_at = time.monotonic()
            count = reservations.size(reserved_at)
            shard = int(_random() * self.shards)
            first = store.reserve(self.name, shard, count) if count > 1 else None
            if first is not None:
                reservations.keep(shard, range(first + 1, first + count), reserved_at)
            if first is not None and store.load_reserved_envelope(_new_tuple(SlotRef, (self.name, shard, first)),
                                                                  envelope, ttl):
                slot = first
            else:  # no reserve wanted, or the slot was sealed at once (rare): a load of its own
                slot = store.load(self.name, [(shard, envelope)], ttl)[0].slot
        self._active_shards.mark_one(shard)
        return _new_message_ref((envelope.msg_id, self.name, shard, slot))

    def publish_plain(self, payloads: Sequence[bytes], ids: Sequence[str], loaded_at: int) -> list[MessageRef]:
        """Publish new keyless messages of plain bytes, each as `publish_one` would, together: an async
        publisher's batch (ignis.aio). Two-step backends write them into reserved slots with one round trip
        (reserving what is missing in one allocation); others in one group commit (load_new)."""
        store, name, ttl = self._store, self.name, self.ttl_seconds
        count = len(payloads)
        if count < 2:  # one (a lone async publisher's): publish_one's leaner path, as a blocking publish takes
            return [self.publish_one(payloads[0], ids[0], loaded_at)] if count else []
        if not self._reserves:
            return self.load_new(_new_tuple(NewMessages, (payloads, ids, None, loaded_at, None, None, None)))
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

    def new_placement(self, batch: NewMessages) -> list[tuple[int, range]]:
        """Where a batch of new messages goes: a keyed batch into its key's shard, else dealt round-robin from a
        random shard; (shard, batch indices), the indices always a range."""
        count, shards = len(batch.ids), self.shards
        if batch.key is not None:
            return [(shard_for_key(batch.key, shards), range(count))]
        first = int(_random() * shards)
        return [((first + k) % shards, range(k, count, shards)) for k in range(min(shards, count))]

    def load_new(self, batch: NewMessages) -> list[MessageRef]:
        """Publish a batch of new messages in one group commit; their references, in batch order."""
        placement = self.new_placement(batch)
        taken = self._store.load_new(self.name, batch, placement, self.ttl_seconds)
        self._active_shards.mark([shard for shard, _ in placement])
        refs: list[Any] = [None] * len(batch.ids)
        self.fill_refs(refs, batch.ids, placement, taken)
        return refs

    def fill_refs(self, refs: list[Any], ids: Sequence[str], placement: Sequence[tuple[int, range]],
                  taken: Sequence[Sequence[int]]) -> None:
        """Set the references of the messages a load placed (each entry's first len(slots) indices got `slots`)."""
        name = self.name
        for (shard, indices), slots in zip(placement, taken, strict=True):
            # One slice assignment per shard, its references built by C-level map/zip (the indices
            # of a placement here are always a range).
            where = slice(indices.start, indices.start + len(slots) * indices.step, indices.step)
            refs[where] = map(_new_message_ref, zip(ids[where], repeat(name), repeat(shard), slots))

    def load(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Append existing messages (a sideline, shovel or sweep move) in one group commit (`placement`)."""
        items = list(zip(placement(envelopes, self.shards), envelopes, strict=True))
        return self._active_shards.loaded(lambda: self._store.load(self.name, items, self.ttl_seconds))

    def load_published(self, envelopes: Sequence[Envelope]) -> list[SlotRef]:
        """Publish existing envelopes, each placed by its own key (publish_each's per-message path): `load`, bounded
        on a bounded queue (ignis.magazine.bounded)."""
        return self.load(envelopes)

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

