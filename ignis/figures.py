"""A queue's figures (`Queue.stats`): what it holds, has delivered and has lost, read from its pointers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class QueueStats:
    name: str
    shards: int
    published: int  # messages ever published to main (slots allocated, minus the holes: ShardPointers)
    consumed: int  # messages ever claimed from main
    depth: int  # messages in main not claimed yet
    sidelined: int  # messages in the sideline not claimed (shovelled) yet
    dead: int  # messages in the dead-letter magazine not claimed (redriven) yet
    in_flight: int | None = None  # claimed, still present in main (see Magazine.in_flight); None = not asked
    delayed: int = 0  # published (or retried) for later and not due yet: not in depth
    # Seconds the oldest unclaimed, due message of main has waited (since its due time, else its publish),
    # read at the head of each shard (ignis.waiting); None when none waits.
    oldest_age_seconds: float | None = None
    # A subscription's (ignis.topics): its topic, and the messages it lost to the topic's retention (they left the
    # topic before the subscription claimed them). Its depth counts every message past its position in the topic,
    # the ones its filter will pass over included (an upper bound), plus those in its own main. Its published and
    # consumed are positions in the topic (as Kafka offsets): published = consumed + depth + expired.
    topic: str | None = None
    expired: int = 0
    # A bounded queue's (ignis.bounds): how full it is, in percent of its bound (the fuller of maxLength, counted in
    # unclaimed slots, and maxBytes, estimated); None when unbounded.
    full_percent: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The figures by name (a plain queue's without the subscription's: its output stays as it was)."""
        out = {f: getattr(self, f) for f in self.__dataclass_fields__}
        if self.topic is None:
            del out["topic"], out["expired"]
        if self.full_percent is None:
            del out["full_percent"]
        return out
