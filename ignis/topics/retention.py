"""A topic's byte bound (`retentionBytes`): drop its oldest messages once it holds more.

Age is the store's job (each record's TTL); bytes are the sweeper leader's, once a pass (ignis_workers.service):
`trim_to_bytes` estimates the retained bytes from a sample (Topic.survey) and, over the bound, deletes the oldest
messages of every shard in proportion to what each holds, so the topic keeps about `retentionBytes` and its shards
stay even. Oldest first within a shard means presence stays monotonic in the slot, which the subscriptions' claims
and the figures' binary searches rely on; a subscription behind the trimmed head counts what it lost as expired, as
for age.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ignis.storage.base import SlotRef
from ignis.topics.topic import Topic, retained_bytes

log = logging.getLogger(__name__)
DELETE_BATCH = 1000  # records per delete call


@dataclass(frozen=True)
class Trim:
    topic: str
    retained_bytes: int  # the estimate before the trim
    dropped: int  # slots deleted (a reserved or sealed one among them held no message)


def trim_to_bytes(topic: Topic) -> Trim:
    """Delete the oldest messages of `topic` until its estimated bytes are within its `retentionBytes` (nothing
    when it has no byte bound or is within it)."""
    bound = topic.spec.retention_bytes
    survey = topic.survey()
    estimate = retained_bytes(survey)
    if not bound or estimate <= bound:
        return Trim(topic.name, estimate, 0)
    slots = sum(s.retained for s in survey)
    per_slot = estimate / slots
    excess = math.ceil((estimate - bound) / per_slot)  # slots to drop, over all shards
    dropped = 0
    for s in survey:
        # In proportion to what each shard holds; never a shard's newest slot (on a two-step store it may be
        # reserved by a publisher and not written yet).
        count = min(math.ceil(excess * s.retained / slots), max(s.retained - 1, 0))
        for start in range(s.first, s.first + count, DELETE_BATCH):
            refs = [SlotRef(topic.name, s.shard, slot) for slot in range(start, min(start + DELETE_BATCH,
                                                                                    s.first + count))]
            topic.store.delete(refs)
            dropped += len(refs)
    if dropped:
        log.info("topic %s: %d oldest message(s) dropped to its retentionBytes (%d bytes held, bound %d)",
                 topic.name, dropped, estimate, bound,
                 extra={"event": "topic_trimmed", "topic": topic.name, "dropped": dropped})
    return Trim(topic.name, estimate, dropped)


__all__ = ["Trim", "trim_to_bytes"]
