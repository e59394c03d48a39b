"""`Ignis`: the entry point of the library — open a store, declare queues, get queue handles."""

from __future__ import annotations

import threading
from typing import Any

from ignis import names
from ignis.delay import stop_mover
from ignis.errors import InvalidInputError, InvalidSpecError, QueueInactive, QueueNotFound, TopicNotFound
from ignis.queue import Queue, QueueStats
from ignis.settings import IgnisSettings, load_settings
from ignis.spec import QueueSpec, ordered_change
from ignis.storage import Storage, open_store_waiting
from ignis.storage.base import QueueRecord, client_view
from ignis.topics.spec import TopicSpec
from ignis.topics.subscriptions import prepare as prepare_subscription
from ignis.topics.subscriptions import seek as seek_subscription
from ignis.topics.topic import Topic, check_names, subscriptions_of
from ignis.watch import stop_watcher


class Ignis:
    """A connection to one store, scoped to one clientId.

    >>> with Ignis() as ignis:                                     # lmdb in ./.ignis-data
    ...     ignis.apply(QueueSpec.build(name="orders", handlerType="orders"))
    ...     ignis.queue("orders").publish({"order": 1})
    """

    def __init__(self, store: Storage | str | None = None, *, client_id: str | None = None,
                 farm_id: str | None = None, settings: IgnisSettings | None = None,
                 purge_interval: float = 60.0, connect_wait_seconds: float | None = None) -> None:
        """`connect_wait_seconds`: how long to keep trying while the store does not answer (default: the
        IGNIS_CONNECT_WAIT_SECONDS setting, else 0: a StoreUnavailable at once)."""
        self.settings = settings or load_settings()
        if store is None or isinstance(store, str):
            wait = connect_wait_seconds if connect_wait_seconds is not None else self.settings.connect_wait_seconds
            self.store: Storage = open_store_waiting(
                store or self.settings.store, wait or 0.0, farm_id=farm_id or self.settings.farm_id,
                client_id=client_id or self.settings.client_id, purge_interval=purge_interval)
            self._owns_store = True
        else:
            self.store = store if client_id in (None, store.client_id) else store.with_client(client_id)
            self._owns_store = False
        self._queues: dict[str, Queue] = {}
        self._topics: dict[str, Topic] = {}
        self._lock = threading.Lock()
        self.store.ensure_index()

    @property
    def client_id(self) -> str:
        return self.store.client_id

    def __enter__(self) -> Ignis:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            queues = list(self._queues.values())
            topics = list(self._topics.values())
        for queue in queues:  # slots reserved for publishes that will not come: consumers pass them at once
            queue.main.release_reserved()
        for topic in topics:  # (a topic's too: its subscriptions would await each for the write deadline)
            topic.log.release_reserved()
        if self._owns_store:  # the background threads first: no store call may run while the handle closes
            stop_mover(self.store)
            stop_watcher(self.store)
            self.store.close()

    def _store_for(self, client_id: str | None) -> Storage:
        return self.store if client_id is None else client_view(self.store, client_id)

    # ---- registry ----------------------------------------------------------------------------------
    def apply(self, spec: QueueSpec | TopicSpec) -> bool:
        """Create or update a queue's metadata record (runtime bins kept), or a topic's (TopicSpec). True when
        created. A new subscription (QueueSpec.subscribe) starts where its `start` says (ignis.topics)."""
        if isinstance(spec, TopicSpec):
            return self._apply_topic(spec)
        store = self._store_for(spec.client_id)
        current = store.get_queue(spec.name)
        stored_shards = int(current.bins.get("shards", 0)) if current else 0
        if spec.shards < stored_shards:  # messages in the dropped shards would never be delivered
            raise InvalidSpecError([f"shards={spec.shards}: shards may grow, never shrink (queue {spec.name!r} "
                                    f"has {stored_shards})"])
        if current is None:
            check_names(store, spec.name, "queue")
        elif (problem := ordered_change(spec.name, spec.ordered, current.bins)) is not None:
            raise InvalidSpecError([problem])
        prepare_subscription(store, spec, current)  # (a subscription's cursor first: consumers find it set)
        store.register_client(store.client_id)  # so a sweeper finds this client's queue set
        created = store.apply_queue(spec.name, spec.config_bins(), spec.record_ttl_seconds)
        with self._lock:
            self._queues.pop(spec.name, None)
        return created

    def _apply_topic(self, spec: TopicSpec) -> bool:
        store = self._store_for(spec.client_id)
        current = store.get_topic(spec.name)
        if current is None:
            check_names(store, spec.name, "topic")
        elif spec.shards < int(current.bins.get("shards", 0)):
            raise InvalidSpecError([f"shards={spec.shards}: shards may grow, never shrink (topic {spec.name!r} "
                                    f"has {current.bins.get('shards')})"])
        store.register_client(store.client_id)
        created = store.apply_topic(spec.name, spec.config_bins())
        with self._lock:
            self._topics.pop(spec.name, None)
        return created

    # ---- topics ------------------------------------------------------------------------------------
    def topic(self, name: str) -> Topic:
        """A handle on a declared topic (cached). Raises TopicNotFound."""
        with self._lock:
            cached = self._topics.get(name)
        if cached is not None:
            return cached
        topic = Topic(self.store, self.topic_spec(name), max_payload_bytes=self.settings.max_payload_bytes,
                      refresh_seconds=self.settings.active_shard_refresh_seconds)
        with self._lock:
            return self._topics.setdefault(name, topic)

    def topic_spec(self, name: str) -> TopicSpec:
        record = self.store.get_topic(name)
        if record is None:
            raise TopicNotFound(name, self.client_id)
        return TopicSpec.from_bins(name, record.bins, self.client_id)

    def list_topics(self) -> list[TopicSpec]:
        return [TopicSpec.from_bins(r.name, r.bins, self.client_id) for r in self.store.list_topics()]

    def delete_topic(self, name: str, force: bool = False) -> int:
        """Remove a topic: its messages and record. Refused while subscriptions read it (they are named), unless
        `force` (they then find no topic: their consumers get nothing from it). Returns the records removed."""
        self.topic_spec(name)
        users = subscriptions_of(self.store, name)
        if users and not force:
            raise InvalidInputError(f"topic {name!r} is read by subscription(s) {', '.join(sorted(users))}: delete "
                                    "them first, or delete the topic with force")
        removed = self.store.purge_magazine(name)
        self.store.delete_topic(name)
        with self._lock:
            self._topics.pop(name, None)
        return removed

    def seek(self, name: str, to: str | int) -> dict[int, int]:
        """Move subscription `name` to the first message published at or after `to` (ISO-8601 time, epoch ms,
        earliest or latest), backwards or forwards: what it acked after that point is delivered again."""
        positions = seek_subscription(self.store, self.spec(name), to)
        with self._lock:
            queue = self._queues.get(name)
        if queue is not None:
            queue.invalidate()
        return positions

    def spec(self, name: str) -> QueueSpec:
        record = self.record(name)
        return QueueSpec.from_bins(name, record.bins, self.client_id)

    def record(self, name: str) -> QueueRecord:
        record = self.store.get_queue(name)
        if record is None:
            raise QueueNotFound(name, self.client_id)
        return record

    def list_queues(self, active: bool | None = True) -> list[QueueRecord]:
        return self.store.list_queues(active)

    def deactivate(self, name: str) -> None:
        if not self.store.set_queue_active(name, False):
            raise QueueNotFound(name, self.client_id)
        with self._lock:
            self._queues.pop(name, None)

    def delete_queue(self, name: str) -> int:
        """Remove a queue: its messages, sideline, dead letters, shard pointers and record.
        Returns the number of message records removed."""
        record = self.record(name)
        removed = 0
        topic = record.bins.get("subTopic")  # a subscription: its claims too (the messages are the topic's)
        cursor = [names.cursor_of(name, topic)] if topic else []
        for magazine in (name, names.sideline_of(name), names.dead_of(name), *cursor):
            removed += self.store.purge_magazine(magazine)
        self.store.delete_queue(name)
        with self._lock:
            self._queues.pop(name, None)
        return removed

    # ---- queues ------------------------------------------------------------------------------------
    def queue(self, name: str, *, allow_inactive: bool = False) -> Queue:
        """A handle on a declared queue (cached). Raises QueueNotFound / QueueInactive."""
        with self._lock:
            cached = self._queues.get(name)
        if cached is not None:
            return cached
        record = self.record(name)
        if not record.active and not allow_inactive:
            raise QueueInactive(name)
        queue = self.queue_for(QueueSpec.from_bins(name, record.bins, self.client_id))
        if not record.active:
            return queue  # only handles on active queues are cached, so a later queue(name) still refuses
        with self._lock:
            return self._queues.setdefault(name, queue)

    def queue_for(self, spec: QueueSpec) -> Queue:
        """A handle built from a spec already read (no registry read, not cached)."""
        s = self.settings
        return Queue(self.store, spec, max_payload_bytes=s.max_payload_bytes, hole_budget=s.hole_budget,
                     refresh_seconds=s.active_shard_refresh_seconds)

    def refresh(self, name: str) -> Queue:
        """Re-read a queue's record and return a fresh handle (config changes take effect)."""
        with self._lock:
            previous = self._queues.pop(name, None)
        queue = self.queue(name)
        if previous is not None:
            queue.adopt(previous)
        return queue

    def stats(self, name: str, in_flight: bool = False) -> QueueStats:
        return self.queue(name, allow_inactive=True).stats(in_flight)
