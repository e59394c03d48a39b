"""Looking at messages without claiming them: `Queue.read(ref)` and `Queue.browse(limit, shard)`.

A queue browser for on-call work, as JMS's `QueueBrowser` or RabbitMQ's "get messages" with requeue, except that
nothing is claimed or requeued at all: these are reads, so a consumer still gets each message exactly as before
(same attempts, same order). What is returned is a `BrowsedMessage`, which cannot be acked.

- `read` finds one message by its reference (`MAGAZINE/SHARD/SLOT`, as `Message.ref` and the CLI print it) in any
  magazine of the queue: main (waiting, or delivered and not settled yet: in flight), the sideline, the dead letters,
  and for a subscription its cursor (a slot it claimed, or one of its topic's messages it has not reached yet that its
  filter selects). A reference to nothing, or to a message acked since, raises MessageNotFound.
- `browse` returns the next messages waiting in main, oldest publish first, `limit` at most (one shard's with
  `shard`); a subscription's are those of its topic past its position that its filter selects, and what was handed
  back to its own main (nacked, retried, shovelled). A shard's scan looks at no more than SCAN_SLOTS slots, so a shard
  of holes cannot make a browse read without end.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ignis import names
from ignis.envelope import EnvelopeFields
from ignis.errors import InvalidInputError, MessageNotFound
from ignis.storage.base import MessageRef, SlotRef

if TYPE_CHECKING:
    from ignis.envelope import Envelope
    from ignis.magazine import Magazine
    from ignis.magazine.cursor import CursorMagazine
    from ignis.spec import QueueSpec
    from ignis.storage.base import Storage

MAX_BROWSE = 1000  # messages one browse returns at most
SCAN_SLOTS = 10_000  # slots one browse looks at per shard, at most
WINDOW = 256  # slots read per store call

WAITING, IN_FLIGHT, SIDELINED, DEAD = "waiting", "in flight", "sidelined", "dead"


class Queue(Protocol):
    """What a browse reads of a queue handle (ignis.queue.Queue, which calls this module)."""

    name: str
    spec: QueueSpec
    store: Storage
    main: Magazine
    sideline: Magazine
    dead: Magazine

    @property
    def cursor(self) -> CursorMagazine | None: ...


@dataclass(frozen=True)
class BrowsedMessage(EnvelopeFields):
    """A message read without claiming it (its fields: EnvelopeFields; `attempts`: a waiting one's is 0 unless it
    was handed back). `state`: waiting, in flight (delivered, not settled yet), sidelined or dead."""

    ref: SlotRef
    envelope: Envelope
    state: str

    @property
    def payload(self) -> Any:
        """The payload decoded as published: bytes, str or a JSON value."""
        return self.envelope.decoded()

    @property
    def published_at(self) -> int:
        """When it was published (epoch ms)."""
        return self.envelope.loaded_at


def parse_ref(ref: SlotRef | MessageRef | str) -> tuple[SlotRef, str | None]:
    """A message reference and the message id it names, if any: a SlotRef (`Message.ref`), a MessageRef (what
    publish returns) or the text of either (`MAGAZINE/SHARD/SLOT`, `...#ID`). InvalidInputError when malformed."""
    if isinstance(ref, MessageRef):
        return ref.ref, ref.id
    if isinstance(ref, SlotRef):
        return ref, None
    where, _, msg_id = str(ref).strip().partition("#")
    try:
        parsed = SlotRef.parse(where)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    if parsed.shard < 0 or parsed.slot < 1:
        raise InvalidInputError(f"message reference {ref!r}: the shard must be >= 0 and the slot >= 1")
    return parsed, msg_id or None


def queue_of_ref(ref: SlotRef | MessageRef | str) -> str:
    """The queue a message reference belongs to (its main, sideline, dead letters or subscription cursor)."""
    return names.queue_and_kind(parse_ref(ref)[0].magazine)[0]


def read(queue: Queue, reference: SlotRef | MessageRef | str) -> BrowsedMessage:
    """`Queue.read`: one message by its reference, without claiming it (see the module's docstring)."""
    ref, msg_id = parse_ref(reference)
    found = _read(queue, ref)
    if msg_id is not None and found.id != msg_id:  # (slots are not reused: a message whose record left for good)
        raise MessageNotFound(f"{ref}#{msg_id}", f"the slot holds message {found.id!r}")
    return found


def _read(queue: Queue, ref: SlotRef) -> BrowsedMessage:
    owner, kind = names.queue_and_kind(ref.magazine)
    cursor = queue.cursor if kind == "cursor" else None
    magazines = {queue.name: queue.main, queue.sideline.name: queue.sideline, queue.dead.name: queue.dead}
    if cursor is not None:
        magazines[cursor.name] = cursor
    magazine = magazines.get(ref.magazine)
    if owner != queue.name or magazine is None:
        raise InvalidInputError(f"message reference {str(ref)!r} is not one of queue {queue.name!r}'s")
    if ref.shard >= magazine.shards:
        raise MessageNotFound(str(ref), f"queue {queue.name!r} has {magazine.shards} shard(s)")
    envelope = queue.store.read([ref])[0]
    if kind in ("sideline", "dead"):
        if envelope is None:
            raise MessageNotFound(str(ref))
        return BrowsedMessage(ref, envelope, SIDELINED if kind == "sideline" else DEAD)
    fire = queue.store.pointers(ref.magazine, magazine.shards).get(ref.shard)
    claimed = fire is not None and ref.slot <= fire.fire
    if envelope is not None:
        return BrowsedMessage(ref, envelope, IN_FLIGHT if claimed else WAITING)
    if cursor is not None and not claimed:  # a topic message the subscription has not reached yet
        message = queue.store.read([SlotRef(cursor.topic, ref.shard, ref.slot)])[0]
        if message is not None and cursor.only.matches(message.subject):
            return BrowsedMessage(ref, message, WAITING)
    raise MessageNotFound(str(ref), "acked, expired, or never written" if claimed else "no message there")


def browse(queue: Queue, limit: int = 10, shard: int | None = None) -> list[BrowsedMessage]:
    """`Queue.browse`: the next messages waiting in main, oldest publish first (see the module's docstring)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BROWSE:
        raise InvalidInputError(f"limit={limit!r}: must be an integer from 1 to {MAX_BROWSE}")
    if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int)
                              or not 0 <= shard < queue.spec.shards):
        raise InvalidInputError(f"shard={shard!r}: queue {queue.name!r} has shards 0 to {queue.spec.shards - 1}")
    found = _waiting(queue, queue.main.name, queue.spec.shards, shard, limit)
    cursor = queue.cursor
    if cursor is not None:  # a subscription: its topic's messages past its position, as the filter selects them
        found += _waiting(queue, cursor.name, cursor.shards, shard, limit, topic=cursor.topic,
                          selects=cursor.only.matches)
    return heapq.nsmallest(limit, found, key=lambda m: (m.published_at, m.ref.shard, m.ref.slot))


def _waiting(queue: Queue, magazine: str, shards: int, only_shard: int | None, limit: int,
             topic: str | None = None, selects: Any = None) -> list[BrowsedMessage]:
    """Up to `limit` unclaimed messages per shard of `magazine`, oldest slots first (a cursor's: read in its topic,
    under the cursor's references)."""
    out: list[BrowsedMessage] = []
    pointers = queue.store.pointers(magazine, shards)
    for shard in sorted(pointers) if only_shard is None else [only_shard]:
        p = pointers.get(shard)
        if p is None:
            continue
        first, end, taken = p.fire + 1, min(p.load, p.fire + SCAN_SLOTS), 0
        while first <= end and taken < limit:
            last = min(end, first + WINDOW - 1)
            for ref, envelope in queue.store.peek(topic or magazine, shard, first, last):
                if selects is not None and not selects(envelope.subject):
                    continue
                out.append(BrowsedMessage(SlotRef(magazine, shard, ref.slot), envelope, WAITING))
                taken += 1
                if taken == limit:
                    break
            first = last + 1
    return out


__all__ = ["MAX_BROWSE", "BrowsedMessage", "browse", "parse_ref", "queue_of_ref", "read"]
