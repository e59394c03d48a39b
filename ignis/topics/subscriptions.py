"""Subscriptions: where a new one starts in its topic, and seeking an existing one to a time.

A subscription's position is its cursor (names.cursor_of): per topic shard, the last slot it passed. It is set when
the subscription is created, before its queue record exists (a consumer that finds the record finds the cursor):
`latest` at the topic's load pointers (only what comes after), `earliest` just before the oldest message the topic
retains, a time just before the first message published at or after it (a binary search over each shard's slots:
publish times grow with the slot). Nothing is copied: a start costs about log2(retained) reads per shard.

A seek moves the cursor the same way, backwards or forwards; going back it also lowers the sweep pointers of the
cursor's claims (the slots between are claimed again, and a claim the sweeper would never look at again could
strand its message).
"""

from __future__ import annotations

from typing import Any

from ignis import names
from ignis.errors import InvalidInputError
from ignis.spec import QueueSpec, StartPosition, start_ms
from ignis.storage.base import Storage
from ignis.topics.spec import TopicSpec
from ignis.topics.topic import first_published_at, first_retained


def topic_of(store: Storage, spec: QueueSpec) -> TopicSpec:
    """The topic a subscription reads, or InvalidInputError when it does not exist."""
    assert spec.subscribe is not None
    record = store.get_topic(spec.subscribe.topic)
    if record is None:
        raise InvalidInputError(f"queue {spec.name!r} subscribes to topic {spec.subscribe.topic!r}, which does not "
                                f"exist in client {store.client_id!r}: apply the topic first")
    return TopicSpec.from_bins(record.name, record.bins, store.client_id)


def positions(store: Storage, topic: TopicSpec, start: str | int) -> dict[int, int]:
    """Per topic shard, the last slot a cursor starting at `start` has passed."""
    pointers = store.pointers(topic.name, topic.shards)
    if start == StartPosition.LATEST.value:
        return {shard: p.load for shard, p in pointers.items()}
    at = start_ms(start)
    out = {}
    for shard, p in pointers.items():
        first = first_retained(store, topic.name, shard, 1, p.load) if at is None else \
            first_published_at(store, topic.name, shard, 1, p.load, at)
        out[shard] = first - 1
    return out


def prepare(store: Storage, spec: QueueSpec, current: Any) -> None:
    """Check a subscription's spec against the store (its topic exists; the topic of an existing subscription does
    not change; a queue does not become one) and set a new one's cursor. `current`: its stored queue record, if any.
    Raises InvalidInputError naming the problem, having written nothing."""
    if spec.subscribe is None:
        if current is not None and current.bins.get("subTopic"):
            raise InvalidInputError(f"queue {spec.name!r} subscribes to topic {current.bins['subTopic']!r}: a "
                                    "subscription cannot become a plain queue (delete it and apply the queue anew)")
        return
    topic = topic_of(store, spec)
    if current is not None:
        held = current.bins.get("subTopic")
        if not held:
            raise InvalidInputError(f"queue {spec.name!r} exists and subscribes to no topic: a subscription is "
                                    "created as one (apply it under a new name)")
        if held != topic.name:
            raise InvalidInputError(f"subscription {spec.name!r} reads topic {held!r}: its topic cannot change "
                                    f"(to {topic.name!r}); create another subscription")
        return
    store.set_cursor(names.cursor_of(spec.name, topic.name), positions(store, topic, spec.subscribe.start))


def seek(store: Storage, spec: QueueSpec, to: str | int) -> dict[int, int]:
    """Move a subscription to the first message published at or after `to` (a time: ISO-8601 or epoch ms; or
    earliest / latest), backwards or forwards; the new positions per topic shard."""
    if spec.subscribe is None:
        raise InvalidInputError(f"queue {spec.name!r} is no subscription: only a subscription can seek")
    try:
        start_ms(to)
    except ValueError as exc:
        raise InvalidInputError(str(exc).replace("subscribe.start", "seek to")) from None
    topic = topic_of(store, spec)
    cursor = names.cursor_of(spec.name, topic.name)
    new = positions(store, topic, to)
    before = store.pointers(cursor, topic.shards)
    store.set_cursor(cursor, new)
    back = {shard: position + 1 for shard, position in new.items() if position < before[shard].fire}
    if back:
        store.rewind_sweep(spec.name, "cursor", back)
    return new
