"""Bounded queues (QueueSpec.maxLength / maxBytes, `overflow`): how a bound is kept without a read before a publish.

RabbitMQ's `x-max-length` / `x-max-length-bytes` with `x-overflow` (reject-publish | drop-head), on a sharded store:

* **The bound is split across the shards.** Shard i holds at most `ShardLimit.length` messages waiting in main:
  maxLength // shards, one more for the first maxLength % shards shards (so the shares add up to maxLength exactly;
  maxLength >= shards, so each share is at least 1). maxBytes is split the same way. Checking the whole queue's depth
  on every publish would cost a read of every shard; a share is checked where the slot is allocated, in the same
  atomic step: on lmdb inside the load's write transaction, on Aerospike as a filter expression on the meta record's
  increment of the load pointer (the increment is applied only while the shard has room; "filtered out" = full). So
  a bounded publish costs no extra round trip, and the total never passes the bound (the sum of the shares).
* **What counts** (as RabbitMQ counts ready messages): messages waiting in main, not yet claimed: a shard's
  unclaimed slots, LOAD_POINTER - FIRE_POINTER. Delivered, unsettled messages do not count, nor do the sideline, the
  dead letters or delayed messages not due yet. A slot allocated and not written yet (a publish in flight, a
  reservation) counts: it is a message to be. A hole among the unclaimed slots (a reservation sealed unused, an
  expired message nobody claimed yet) counts until a claim passes it, so a bound errs on the full side, never over.
* **Bytes** are payload bytes. A shard keeps one more counter, LOAD_BYTES (the payload bytes ever loaded into it,
  maintained in the same atomic step as the load pointer, on bounded queues only), and its waiting bytes are
  estimated as unclaimed slots x mean message size (LOAD_BYTES // LOAD_POINTER): no counter to maintain where
  messages are claimed, settled or expire (which would put a write on the consumers' path, and could drift with an
  expiry the store does its own way). The estimate is exact when message sizes are uniform; otherwise it is off by
  the difference between the waiting messages' mean size and the shard's lifetime mean (e.g. small messages consumed,
  big ones waiting: it counts low). A reservation on Aerospike counts its slots at the size of the message that
  made it. A message bigger than a shard's byte share never fits: it is refused (QueueFull) whatever the overflow.
* **Unkeyed publishes try other shards** before refusing: a publish that finds its shard full tries the next ones
  (up to every shard); a keyed publish goes to its key's shard only (per-key order), and is refused when it is full.
* **Reservations** (Aerospike: a publisher reserves a block of slots with one increment) are taken within the room
  the guard allows (min(block, room)), so they count towards the bound from the moment they are made: they can make a
  shard refuse early (by at most the slots reserved and not yet written, each written or sealed within
  RESERVATION_FRESH_MS), never overshoot it.
* **dropHead**: a publish that finds its shard full claims that shard's oldest unclaimed messages (as many as it
  needs, through the ordinary guarded claim, so two publishers never take the same one), moves them to the dead
  letters with reason `overflow` (copy, then delete, as every move: a crash between duplicates, never loses; a
  claimed message not moved is found by the sweeper), counts them (ignis_overflow_dropped_total), and publishes into
  the room made. Never a silent delete.
* **Moves into main are not bounded**: a shovelled, retried, released or due delayed message is never refused (that
  would strand it); they can take a shard over its share until consumers catch up, and a publish then finds it full.

Why a share per shard and not a count of the whole queue: the whole-queue bound holds within the number of
concurrent publishers only if every publish reads every shard (or a shared counter, one more round trip and a hot
record); per shard, the atomic guard holds the bound exactly, at the price of refusing a keyed publish whose shard is
full while others have room (unkeyed ones look further).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import NamedTuple

from ignis.spec import QueueSpec

LOAD_BYTES = "LOAD_BYTES"  # payload bytes ever loaded, in the meta record (an Aerospike bin; lmdb: after the pointers)
OVERFLOW = "overflow"  # the reason of a message dropHead moved to the dead letters


class ShardLimit(NamedTuple):
    """One shard's share of a queue's bound: messages waiting (None: no length bound), payload bytes (None: none)."""

    length: int | None
    bytes: int | None


def shard_limits(spec: QueueSpec) -> list[ShardLimit] | None:
    """Each shard's share of the queue's bound (None for an unbounded queue). The shares add up to the bound."""
    if not spec.bounded:
        return None
    return [ShardLimit(_share(spec.max_length, spec.shards, i), _share(spec.max_bytes, spec.shards, i))
            for i in range(spec.shards)]


def _share(bound: int | None, shards: int, shard: int) -> int | None:
    if bound is None:
        return None
    return bound // shards + (1 if shard < bound % shards else 0)


def estimated_bytes(load: int, fire: int, load_bytes: int) -> int:
    """A shard's payload bytes waiting in main, estimated: unclaimed slots x mean message size (module doc)."""
    if load <= 0:
        return 0
    return max(load - fire, 0) * (load_bytes // load)


def room(limit: ShardLimit, load: int, fire: int, load_bytes: int, sizes: Sequence[int]) -> int:
    """How many of the messages of `sizes` (payload bytes, in order) fit a shard with these pointers: the longest
    prefix within both shares."""
    fits = len(sizes)
    if limit.length is not None:
        fits = min(fits, max(limit.length - max(load - fire, 0), 0))
    if limit.bytes is not None and fits:
        free = limit.bytes - estimated_bytes(load, fire, load_bytes)
        # The prefix whose running total stays within `free` (sizes are never negative: the totals only grow), in
        # C-level loops: a publish_many of thousands comes here.
        return bisect.bisect_right(list(itertools.accumulate(sizes[:fits])), free)
    return fits


def fill(limit: ShardLimit | None, load: int, fire: int, load_bytes: int) -> float:
    """How full a shard is, as a fraction of its share (the fuller of length and bytes); 0 when unbounded."""
    if limit is None:
        return 0.0
    ratios = [0.0]
    if limit.length:
        ratios.append(max(load - fire, 0) / limit.length)
    if limit.bytes:
        ratios.append(estimated_bytes(load, fire, load_bytes) / limit.bytes)
    return max(ratios)
