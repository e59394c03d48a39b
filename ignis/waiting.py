"""How long the oldest waiting message of a magazine has waited (issue 28, part 3): the figure an on-call
engineer is paged on (SQS's ApproximateAgeOfOldestMessage), read from the head of each shard.

A shard's slots are claimed in slot order, so its first unclaimed slot (fire + 1) holds the message that
has waited longest there. That is an approximation, as SQS's figure is: a message moved in later (shovelled
back from the sideline, or a delayed message that fell due) may carry an older time in a later slot, and a
claim may land between the pointer read and the record read. The cost stays small whatever the backlog:
nothing for an empty shard, one batch read of one record per shard with work, and further batches only for
the shards whose head held nothing usable (holes, a claim that just landed), `HEAD_ROUNDS` at most.

A shard whose head holds more empty slots than the rounds look at gives no figure: that takes messages that
expired unclaimed (consumers gone for longer than messageExpirySeconds; the backlog alerts say so) or many
failed publishes in a row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ignis.envelope import Envelope
from ignis.magazine import RESERVE_MAX
from ignis.storage.base import ShardPointers, SlotRef, Storage

# How many slots each batch read looks at past the ones before, per shard whose head is still unknown:
# the head; a few holes (a failed publish, a slot awaited and sealed); then a whole run of reserved slots
# sealed unused (a burst of publishes on a two-step store ends with up to RESERVE_MAX of them). Rounds grow,
# so a shard with one hole costs a few records, not a window's worth of payloads.
HEAD_ROUNDS = (1, 3, RESERVE_MAX - 2)


def waiting_since(envelope: Envelope) -> int | None:
    """Since when (epoch ms) a message has been deliverable: its due time when it was published (or retried)
    for later, else its publish time. None when the record carries no usable time (an unreadable record)."""
    # due_at lands with delayed delivery (issue 28, part 1); an Envelope without it was never delayed.
    due = getattr(envelope, "due_at", None)
    since = due if due else envelope.loaded_at
    return since if isinstance(since, int) and since > 0 else None


def oldest_waiting_since(store: Storage, magazine: str, pointers: Mapping[int, ShardPointers],
                         rounds: Sequence[int] = HEAD_ROUNDS) -> int | None:
    """The earliest `waiting_since` among the unclaimed messages at the head of each shard of `magazine`
    (`pointers`: the shards' pointers, read just before), or None when no shard has one. One batch read per
    round that has a slot to look at (`rounds`: how many slots each looks at per shard); no write."""
    # Each round looks at the next slots of the shards the rounds before found nothing usable in.
    todo = {shard: p for shard, p in pointers.items() if p.load > p.fire}
    oldest: int | None = None
    first = 1  # the round's first slot, counted past each shard's fire pointer
    for width in rounds:
        refs = [SlotRef(magazine, shard, p.fire + offset)
                for shard, p in todo.items() for offset in range(first, min(first + width, p.load - p.fire + 1))]
        if not refs:
            break
        found: set[int] = set()
        for ref, envelope in zip(refs, store.read(refs), strict=True):
            # A fire time in an unclaimed slot means a claim took it after the pointers were read: not waiting.
            if envelope is None or envelope.fire_ts or ref.shard in found:
                continue
            since = waiting_since(envelope)
            if since is None:
                continue
            found.add(ref.shard)  # refs are in slot order per shard: the first usable one is the head
            if oldest is None or since < oldest:
                oldest = since
        todo = {shard: p for shard, p in todo.items() if shard not in found}
        first += width
    return oldest


def age_seconds(since_ms: int | None, now_ms: int) -> float | None:
    """Seconds from `since_ms` to `now_ms` (ms precision; never negative, whatever the producers' clocks),
    None for None."""
    if since_ms is None:
        return None
    return max(0, now_ms - since_ms) / 1000
