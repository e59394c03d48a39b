"""The sweeper leader's pass over topics: each topic's byte bound (ignis.topics.retention) and its gauges.

Age needs no one (the records' TTLs); a byte bound needs someone to drop the oldest messages, once a pass, and only
the leader, as for sweeps (two trimmers would only delete the same slots twice, but the gauges must have one
source). Subscriptions need nothing here: they are queues, swept and reported as queues; only which topic each one
reads is reported here (ignis_subscription_info), for panels and alerts to pick them among the queues.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from prometheus_client import Gauge

from ignis.errors import StoreError
from ignis.logs import one_line
from ignis.storage.base import Storage, client_view
from ignis.topics import Topic, TopicSpec
from ignis.topics.retention import trim_to_bytes
from ignis_workers.metrics import (
    SUBSCRIPTION_INFO,
    TOPIC_GAUGES,
    TOPIC_OLDEST_AGE,
    TOPIC_PUBLISHED_MESSAGES,
    TOPIC_RETAINED,
    TOPIC_RETAINED_BYTES,
    TOPIC_SUBSCRIPTIONS,
    TOPIC_TRIMMED,
)

log = logging.getLogger(__name__)


def keep_topics(store: Storage, *, gauges: bool, leading: Callable[[], bool]) -> int:
    """Trim every topic of the farm with a byte bound, and (`gauges`) report every topic's figures and which queues
    subscribe to it. Returns the messages dropped. A store failure propagates (said once by the caller); another
    failure of one topic is logged and the others go on. Stops as soon as `leading()` turns false. After a whole
    pass the series of topics and subscriptions no longer listed end."""
    dropped = 0
    listed: set[str] = set()
    subscribed: set[tuple[str, str]] = set()  # (queue, topic)
    for client_id in store.list_clients():
        view = client_view(store, client_id)
        topics = view.list_topics()
        readers: dict[str, list[str]] = {}
        for queue in view.list_queues(None) if topics and gauges else []:
            if queue.bins.get("subTopic"):
                readers.setdefault(str(queue.bins["subTopic"]), []).append(queue.name)
        for record in topics:
            if not leading():
                return dropped
            listed.add(record.name)
            # Listed, so kept even if this topic fails below: its last figures stay until it is gone.
            subscribed.update((queue, record.name) for queue in readers.get(record.name, []))
            try:
                topic = Topic(view, TopicSpec.from_bins(record.name, record.bins, client_id))
                trim = trim_to_bytes(topic)
                if trim.dropped:
                    TOPIC_TRIMMED.labels(topic.name).inc(trim.dropped)
                    dropped += trim.dropped
                if not gauges:
                    continue
                stats = topic.stats(readers.get(topic.name, []))
                if not leading():
                    return dropped  # lost the lease meanwhile: the gauges were cleared and must stay so
                TOPIC_PUBLISHED_MESSAGES.labels(topic.name).set(stats.published)
                TOPIC_RETAINED.labels(topic.name).set(stats.retained)
                TOPIC_RETAINED_BYTES.labels(topic.name).set(stats.retained_bytes)
                TOPIC_SUBSCRIPTIONS.labels(topic.name).set(len(stats.subscriptions))
                age = stats.oldest_age_seconds
                TOPIC_OLDEST_AGE.labels(topic.name).set(math.nan if age is None else age)
                for queue in readers.get(topic.name, []):
                    SUBSCRIPTION_INFO.labels(queue, topic.name).set(1)
            except StoreError:
                raise
            except Exception as exc:
                log.warning("topic %s/%s: %s: %s", client_id, record.name, type(exc).__name__, one_line(exc))
    if gauges and leading():
        _forget_unlisted(listed, subscribed)
    return dropped


def _forget_unlisted(topics: set[str], subscriptions: set[tuple[str, str]]) -> None:
    """End the series of deleted topics and subscriptions. A stale ignis_subscription_info would go on marking a
    queue as a subscription (one deleted and declared again as a plain queue, or reading another topic)."""
    for queue, topic in _reported(SUBSCRIPTION_INFO, "queue", "topic") - subscriptions:
        SUBSCRIPTION_INFO.remove(queue, topic)
    for gauge in TOPIC_GAUGES:
        if gauge is not SUBSCRIPTION_INFO:
            for (topic,) in _reported(gauge, "topic") - {(t,) for t in topics}:
                gauge.remove(topic)


def _reported(gauge: Gauge, *labels: str) -> set[tuple[str, ...]]:
    """The label values of the series a gauge exports now."""
    return {tuple(sample.labels[name] for name in labels) for family in gauge.collect() for sample in family.samples}


__all__ = ["keep_topics"]
