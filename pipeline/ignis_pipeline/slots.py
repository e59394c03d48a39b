"""Which slots a batch read must look at: per (queue, magazine, shard), from the lowest slot that can
still hold a record to the load pointer, cut into ranges; and the `since` search.

Everything here goes through the storage interface (queue records, pointers, peek), so it runs the same
on every backend.

Lower bound of a shard: the sweeper's pointer (the next slot it will examine) in main and sideline —
everything below it was acked, swept or moved — and slot 1 in the dead-letter magazine, which is never
swept.

`since`: within a main shard, messages published directly (no failure history) are stored in load-time
order, up to a small skew between producers (a publish takes its time stamp before its slot). Messages
moved back from the sideline (shovel, redrive) keep their first load time and carry a history, so the
search skips them, as it skips holes, acked and expired slots. The search only moves right on evidence
(a direct publish older than `since` minus the skew), so it never skips a message it should read; with
no evidence nearby it keeps the slots. The sideline and dead-letter magazines hold moved messages only,
in no load-time order: there `since` filters rows but cannot skip slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ignis import names
from ignis.envelope import now_ms
from ignis.errors import QueueNotFound, TopicNotFound
from ignis.storage.base import Storage
from ignis.topics.spec import TopicSpec
from ignis.topics.topic import first_published_at, first_retained

SINCE_SKEW_MS = 1_000  # producers' time stamps may trail their slot order by this much (plus write grace)
PROBE_FIRST = 1  # slots a probe reads at first; it grows 4x while it finds nothing to judge by
PROBE_LIMIT = 4_096  # slots one probe may read in all before it gives up (and keeps the slots)


@dataclass(frozen=True)
class SlotRange:
    queue: str
    kind: str  # main | sideline | dead
    magazine: str  # stored magazine name (q, q_SIDELINE, q_DEAD)
    shard: int
    first: int
    last: int

    @property
    def size(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Tail:
    """What one (queue, magazine) gained after planning: per shard, the slots after `planned[shard]` (the
    load pointer when the plan was made; a shard absent = nothing planned) up to the load pointer when the
    tail is read. A DataFrame's plan is kept and reused by every later query on it (see reader.py), so its
    tails are what make a reused DataFrame read what is stored now, not what was stored at its first query."""

    queue: str
    kind: str
    magazine: str
    planned: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    ranges: list[SlotRange]
    tails: list[Tail]


def magazine_name(queue: str, kind: str) -> str:
    return {"main": queue, "sideline": names.sideline_of(queue), "dead": names.dead_of(queue)}[kind]


def _probe(store: Storage, magazine: str, shard: int, start: int, stop: int) -> tuple[int, int] | None:
    """(slot, loaded_at) of the first directly published record in start..stop, read in growing steps."""
    at, step, spent = start, PROBE_FIRST, 0
    while at <= stop and spent < PROBE_LIMIT:
        last = min(stop, at + step - 1)
        for ref, envelope in store.peek(magazine, shard, at, last):
            if not envelope.history:
                return ref.slot, envelope.loaded_at
        spent += last - at + 1
        at, step = last + 1, step * 4
    return None


def first_slot_since(store: Storage, magazine: str, shard: int, first: int, last: int, since_ms: int) -> int:
    """A slot s in first..last+1 such that every directly published record before s was loaded before
    `since_ms`: the binary search of the module docstring. Holes, acked and expired slots and moved
    messages never make it skip a record it should keep."""
    cutoff = since_ms - SINCE_SKEW_MS - store.write_grace_ms
    left, right = first, last + 1  # the answer is in left..right
    while left < right:
        mid = (left + right) // 2
        found = _probe(store, magazine, shard, mid, right - 1)
        if found is not None and found[1] < cutoff:
            left = found[0] + 1  # every direct publish up to found[0] is older than since
        else:
            right = mid  # evidence that mid.. is recent enough, or none: keep mid..
    return left


def queue_shards(store: Storage, queues: Iterable[str] | None) -> list[tuple[str, int, dict[str, dict[str, int]]]]:
    """(queue, shards, sweep pointers by kind) of the named queues (None = every queue of the client).
    A named queue that does not exist is an error."""
    records = []
    if queues is None:
        records = store.list_queues(active=None)
    else:
        for name in queues:
            record = store.get_queue(name)
            if record is None:
                raise QueueNotFound(name, store.client_id)
            records.append(record)
    return [(r.name, int(r.bins.get("shards", 0)),
             {"main": r.sweep_pointers("main"), "sideline": r.sweep_pointers("sideline"), "dead": {}})
            for r in records]


def lowest_slot(sweep: dict[str, int], shard: int) -> int:
    """The lowest slot of a shard that can still hold a record (see the module docstring)."""
    return max(1, int(sweep.get(names.shard_label(shard), 1)))


def plan(store: Storage, queues: Iterable[str] | None, kinds: Iterable[str], *, since_ms: int | None,
         slots_per_partition: int) -> Plan:
    """Exhaustive, disjoint slot ranges covering every record that may match now, and a tail per queue and
    magazine for what is published after."""
    ranges: list[SlotRange] = []
    tails: list[Tail] = []
    kinds = list(kinds)
    for queue, shards, sweep in queue_shards(store, queues):
        for kind in kinds:
            magazine = magazine_name(queue, kind)
            pointers = store.pointers(magazine, shards)
            tails.append(Tail(queue, kind, magazine, {shard: p.load for shard, p in pointers.items() if p.load}))
            for shard in range(shards):
                first = lowest_slot(sweep[kind], shard)
                last = pointers[shard].load
                if first > last:
                    continue
                if since_ms is not None and kind == "main":
                    first = first_slot_since(store, magazine, shard, first, last, since_ms)
                for start in range(first, last + 1, slots_per_partition):
                    ranges.append(SlotRange(queue, kind, magazine, shard, start,
                                            min(last, start + slots_per_partition - 1)))
    return Plan(ranges, tails)


def tail_ranges(store: Storage, tail: Tail) -> Iterator[SlotRange]:
    """The slot ranges of a tail as the store holds them now: after the planned slots (never below the
    lowest slot that can hold a record), up to the load pointer; shards added since included. A queue
    deleted since has no tail."""
    record = store.get_queue(tail.queue)
    if record is None:
        return
    shards = int(record.bins.get("shards", 0))
    sweep = {} if tail.kind == "dead" else record.sweep_pointers(tail.kind)  # type: ignore[arg-type]
    for shard, p in store.pointers(tail.magazine, shards).items():
        first = max(tail.planned.get(shard, 0) + 1, lowest_slot(sweep, shard))
        if first <= p.load:
            yield SlotRange(tail.queue, tail.kind, tail.magazine, shard, first, p.load)


# ---- topics ------------------------------------------------------------------------------------------------
# A topic's shard holds its retained messages from the first slot it still holds (its oldest leave first, by
# age or by the byte bound: ignis.topics.retention) to the load pointer, in publish-time order up to the skew
# between producers. So a read from `startingTimestamp` starts where first_published_at finds it (a binary
# search over the slots, about log2(retained) reads per shard, never a scan from the head), less the skew
# allowance, and one up to `endingTimestamp` stops where the search finds that time, plus the allowance; rows
# outside the window are then left out by the read itself (schema.in_topic_window).
TOPIC_KIND = "topic"


def topic_shards(store: Storage, topics: Iterable[str]) -> list[tuple[str, int]]:
    """(topic, shards) of the named topics; one that does not exist is an error (TopicNotFound)."""
    out = []
    for name in topics:
        record = store.get_topic(name)
        if record is None:
            raise TopicNotFound(name, store.client_id)
        out.append((name, TopicSpec.from_bins(name, record.bins, store.client_id).shards))
    return out


def topic_span(store: Storage, topic: str, shard: int, load: int, starting_ms: int | None,
               ending_ms: int | None) -> tuple[int, int]:
    """The slots first..last of one topic shard that may hold a message of the window (first > last: none)."""
    allowance = SINCE_SKEW_MS + store.write_grace_ms
    if starting_ms is None:
        first = first_retained(store, topic, shard, 1, load)
    else:
        first = first_published_at(store, topic, shard, 1, load, starting_ms - allowance)
    last = load
    if ending_ms is not None and first <= load:
        last = first_published_at(store, topic, shard, first, load, ending_ms + allowance) - 1
    return first, last


def plan_topics(store: Storage, topics: Iterable[str], *, starting_ms: int | None, ending_ms: int | None,
                slots_per_partition: int) -> Plan:
    """Exhaustive, disjoint slot ranges covering every retained message of the window, and a tail per topic for
    what is published after (none when the window ended before planning: nothing published later is in it)."""
    ranges: list[SlotRange] = []
    tails: list[Tail] = []
    closed = ending_ms is not None and ending_ms + SINCE_SKEW_MS + store.write_grace_ms < now_ms()
    for topic, shards in topic_shards(store, topics):
        pointers = store.pointers(topic, shards)
        if not closed:
            tails.append(Tail(topic, TOPIC_KIND, topic, {shard: p.load for shard, p in pointers.items() if p.load}))
        for shard in range(shards):
            load = pointers[shard].load
            if not load:
                continue
            first, last = topic_span(store, topic, shard, load, starting_ms, ending_ms)
            for start in range(first, last + 1, slots_per_partition):
                end = min(last, start + slots_per_partition - 1)
                ranges.append(SlotRange(topic, TOPIC_KIND, topic, shard, start, end))
    return Plan(ranges, tails)


def topic_tail_ranges(store: Storage, tail: Tail) -> Iterator[SlotRange]:
    """The slot ranges of a topic's tail as the store holds them now: after the planned slots, up to the load
    pointer (shards with nothing planned from their first retained slot). A topic deleted since has no tail."""
    topic = tail.queue
    record = store.get_topic(topic)
    if record is None:
        return
    shards = TopicSpec.from_bins(topic, record.bins, store.client_id).shards
    for shard, p in store.pointers(topic, shards).items():
        planned = tail.planned.get(shard, 0)
        first = planned + 1 if planned else first_retained(store, topic, shard, 1, p.load)
        if first <= p.load:
            yield SlotRange(topic, TOPIC_KIND, topic, shard, first, p.load)
