"""The topic side of a queue handle that is a subscription (`QueueSpec.subscribe`): a mixin of `Queue`.

A subscription is a queue whose messages come from a topic. Its own magazines (main, sideline, dead, delayed) work
as every queue's and hold only the rare path: a message nacked, retried, released or shovelled back is copied into
them, as from any queue. Its messages come through its cursor (`CursorMagazine`): a fire looks in its own main
first (cheap when idle: no shard there has work), then claims from the topic. The cursor's changes wake the queue's
waiting consumers (its shard activity wakes main's), and the watcher follows both.

Publishers never write a subscription: its publish methods refuse, naming the topic.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ignis.envelope import now_ms
from ignis.errors import InvalidInputError
from ignis.figures import QueueStats
from ignis.magazine.cursor import CursorMagazine
from ignis.subjects import subject_filter
from ignis.topics.spec import TopicSpec
from ignis.waiting import age_seconds, oldest_waiting_since

if TYPE_CHECKING:
    from ignis.magazine import Magazine
    from ignis.spec import QueueSpec
    from ignis.storage.base import ShardPointers, Storage


class SubscriptionSide:
    """What a subscription's queue handle adds to a queue's (a mixin of Queue)."""

    # Set by Queue.__init__.
    store: Storage
    spec: QueueSpec
    name: str
    main: Magazine
    _hole_budget: int
    _refresh_seconds: float
    _cursor: CursorMagazine | None = None
    _cursor_lock: threading.Lock

    def _subscribe(self) -> None:
        """Make this handle a subscription's (Queue.__init__, when the spec subscribes)."""
        self._cursor_lock = threading.Lock()
        for method in ("publish", "publish_many", "publish_each", "publish_plain"):
            setattr(self, method, self._refuse_publish)

    def _refuse_publish(self, *_: Any, **__: Any) -> Any:
        assert self.spec.subscribe is not None
        raise InvalidInputError(f"queue {self.name!r} is a subscription of topic {self.spec.subscribe.topic!r}: "
                                "publish to the topic")

    @property
    def cursor(self) -> CursorMagazine | None:
        """The subscription's cursor (built on first use: it reads the topic's record); None for a plain queue."""
        if self._cursor is None and self.spec.subscribe is not None:
            # Built once, under a lock: a consumer's threads fire at once on a new handle, and a second cursor would
            # keep what its fire prefetched where no later fire (and no idle check) looks, until the sweeper.
            with self._cursor_lock:
                if self._cursor is None:
                    self._cursor = self._build_cursor()
        return self._cursor

    def _build_cursor(self) -> CursorMagazine:
        """The cursor of this subscription's topic (`cursor`, under its lock)."""
        sub = self.spec.subscribe
        assert sub is not None
        record = self.store.get_topic(sub.topic)
        if record is None:
            raise InvalidInputError(f"subscription {self.name!r} reads topic {sub.topic!r}, which does not exist "
                                    f"(any more) in client {self.store.client_id!r}")
        topic = TopicSpec.from_bins(record.name, record.bins, self.store.client_id)
        cursor = CursorMagazine(self.store, self.name, topic.name, shards=topic.shards,
                                ttl_seconds=topic.retention_seconds, only=subject_filter(sub.filter),
                                hole_budget=self._hole_budget, refresh_seconds=self._refresh_seconds)
        cursor.activity.wake_with(self.main._active_shards.activity)  # its consumers wait on main
        self.main.also_watch = (cursor,)
        return cursor

    def _watch(self) -> None:
        """Have the watcher follow where this queue's messages come from (main, and a subscription's cursor)."""
        self.main.watch()  # (which watches main.also_watch too: a subscription's cursor)

    def idle(self) -> bool:
        """Nothing to deliver and nothing in hand: main's (and the topic's, for a subscription)."""
        cursor = self.cursor
        return self.main.pending() == 0 and self.main.awaiting() == 0 and (
            cursor is None or (cursor.pending() == 0 and cursor.awaiting() == 0))

    def _subscription_stats(self, pointers: dict[int, ShardPointers], oldest: int | None,
                            in_flight: bool) -> QueueStats:
        """Queue.stats of a subscription: main's figures plus its cursor's (the topic's slots past its position)."""
        cursor = self.cursor
        assert cursor is not None and self.spec.subscribe is not None
        topic = cursor.pointers()
        ahead = {shard: p for shard, p in topic.items() if p.load > p.fire}
        topic_oldest = oldest_waiting_since(self.store, cursor.topic, ahead)
        if topic_oldest is not None and (oldest is None or topic_oldest < oldest):
            oldest = topic_oldest
        main, expired = pointers.values(), sum(p.claimed_holes for p in topic.values())
        record = self.store.get_queue(self.name) if in_flight else None
        # Positions in the topic, as a Kafka consumer group's offsets: `published` counts the topic's messages (a
        # subscription that starts at `latest` begins with consumed == published), `consumed` the slots it passed
        # (its filter's rejects too) less what it lost to retention; published = consumed + depth + expired.
        return QueueStats(
            name=self.name,
            shards=self.spec.shards,
            published=sum(p.published for p in main) + sum(p.load for p in topic.values()),
            consumed=sum(p.consumed for p in main) + sum(p.fire for p in topic.values()) - expired,
            depth=sum(p.pending for p in main) + sum(p.load - p.fire for p in topic.values()),
            sidelined=self.sideline.pending(),  # type: ignore[attr-defined]
            dead=self.dead.pending(),  # type: ignore[attr-defined]
            in_flight=(self.main.in_flight(record.sweep_pointers("main") if record else {})
                       + cursor.in_flight(record.sweep_pointers("cursor") if record else {})) if in_flight else None,
            delayed=self.store.delay_states([self.name])[0].count,
            oldest_age_seconds=age_seconds(oldest, now_ms()),
            topic=cursor.topic,
            expired=expired,
        )

    def invalidate(self) -> None:
        """Forget what this handle knows of where work is (after a seek, say): the next fire reads it again."""
        self.main.invalidate()
        if self._cursor is not None:
            self._cursor.invalidate()
