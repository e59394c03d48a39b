"""The topic reconcile functions (ignis_operator.topics) and the subscription side of sync_queue / queue_figures
against a real store (the `store` fixture: lmdb, the Aerospike emulator, and Aerospike when configured)."""

from __future__ import annotations

from typing import Any

import pytest
from ignis_operator.reconcile import (
    CONFLICT,
    DELETED,
    INVALID_SPEC,
    OWNER_BIN,
    SYNCED,
    TOPIC_NOT_FOUND,
    UNTOUCHED,
    Finalized,
    Owner,
    figures_changed,
    finalize_queue,
    queue_figures,
    sync_queue,
)
from ignis_operator.topics import (
    RETAINED,
    InUse,
    finalize_topic,
    in_step,
    subscriptions_by_topic,
    sync_topic,
    topic_figures,
    topic_figures_changed,
    topic_spec_from_object,
)

from ignis.errors import InvalidSpecError
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import Storage
from ignis.topics import Topic, TopicSpec

OLD = Owner("uid-old", "shop/events", 1_000)
NEW = Owner("uid-new", "other/events", 2_000)


def topic(name: str = "events", **fields: Any) -> TopicSpec:
    fields.setdefault("shards", 2)
    fields.setdefault("clientId", "shop")
    return TopicSpec.build(name=name, **fields)


def subscription(name: str, topic_name: str = "events", **fields: Any) -> QueueSpec:
    return QueueSpec.build(name=name, handlerType=f"{name}.v1", shards=2, clientId="shop",
                           subscribe={"topic": topic_name, **fields.pop("subscribe", {})}, **fields)


def bins(store: Storage, name: str = "events") -> dict[str, Any] | None:
    record = store.with_client("shop").get_topic(name)
    return record.bins if record else None


def test_topic_spec_from_object_defaults_client_id_to_namespace() -> None:
    assert topic_spec_from_object("events", "shop", {}).client_id == "shop"
    assert topic_spec_from_object("events", "shop", {"clientId": "billing"}).client_id == "billing"
    with pytest.raises(InvalidSpecError, match="retentionSeconds=0"):
        topic_spec_from_object("events", "shop", {"retentionSeconds": 0})


def test_sync_creates_then_is_idempotent_then_updates(store: Storage) -> None:
    created = sync_topic(store, topic(), OLD)
    assert (created.ready, created.reason, created.created, created.client_id) == (True, SYNCED, True, "shop")
    stored = bins(store)
    assert stored is not None and stored[OWNER_BIN] == OLD.as_bin()
    assert {k: stored[k] for k in topic().config_bins()} == topic().config_bins()
    assert "shop" in store.list_clients()
    again = sync_topic(store, topic(), OLD)
    assert (again.created, again.diff, again.message) == (False, {}, "topic record in sync")
    assert in_step(store.with_client("shop").get_topic("events"), topic().config_bins(), OLD.uid)
    updated = sync_topic(store, topic(shards=4, retentionSeconds=60), OLD)
    assert updated.diff == {"shards": (2, 4), "retention": (604800, 60)}
    assert (bins(store) or {})["retention"] == 60


def test_shards_never_shrink_and_a_queue_name_is_refused(store: Storage) -> None:
    sync_topic(store, topic(shards=4), OLD)
    shrink = sync_topic(store, topic(shards=2), OLD)
    assert (shrink.reason, shrink.ready) == (INVALID_SPEC, False) and "never shrink" in shrink.message
    assert (bins(store) or {})["shards"] == 4
    sync_queue(store, QueueSpec.build(name="orders", handlerType="h", clientId="shop", shards=2), OLD)
    clash = sync_topic(store, topic("orders"), NEW)
    assert clash.reason == INVALID_SPEC and "may not share one" in clash.message
    assert bins(store, "orders") is None


def test_the_older_claim_wins_and_the_loser_leaves_it_alone(store: Storage) -> None:
    sync_topic(store, topic(retentionSeconds=60), OLD)
    loser = sync_topic(store, topic(retentionSeconds=90), NEW)
    assert loser.reason == CONFLICT and "shop/events" in loser.message
    assert finalize_topic(store, topic(deletionPolicy="Delete"), NEW).action == UNTOUCHED
    assert (bins(store) or {})["retention"] == 60


def test_drift_is_seen_and_repaired(store: Storage) -> None:
    sync_topic(store, topic(), OLD)
    view = store.with_client("shop")
    view.apply_topic("events", {"retention": 5})
    assert not in_step(view.get_topic("events"), topic().config_bins(), OLD.uid)
    assert sync_topic(store, topic(), OLD).diff == {"retention": (5, 604800)}
    view.delete_topic("events")
    assert not in_step(view.get_topic("events"), topic().config_bins(), OLD.uid)
    assert sync_topic(store, topic(), OLD).created


def test_a_subscription_to_a_missing_topic_waits_with_nothing_written(store: Storage) -> None:
    waiting = sync_queue(store, subscription("alerts"), OLD)
    assert (waiting.ready, waiting.reason) == (False, TOPIC_NOT_FOUND)
    assert "'events' does not exist" in waiting.message and "retried" in waiting.message
    assert store.with_client("shop").get_queue("alerts") is None
    sync_topic(store, topic(), OLD)
    assert sync_queue(store, subscription("alerts"), OLD).reason == SYNCED


def test_deletion_waits_for_active_subscriptions_then_applies_the_policy(store: Storage) -> None:
    sync_topic(store, topic(deletionPolicy="Delete"), OLD)
    for name in ("alpha", "beta"):
        assert sync_queue(store, subscription(name), Owner(f"uid-{name}", f"shop/{name}", 5)).reason == SYNCED
    Topic(store.with_client("shop"), topic()).publish_many([b"x"] * 3, subject="a")
    assert subscriptions_by_topic(store, "shop") == {"events": ["alpha", "beta"]}
    waits = finalize_topic(store, topic(deletionPolicy="Delete"), OLD)
    assert isinstance(waits, InUse) and waits.subscriptions == ["alpha", "beta"]
    assert "2 subscription(s)" in waits.message and "alpha, beta" in waits.message
    assert bins(store) is not None  # nothing done
    finalize_queue(store, subscription("alpha"), Owner("uid-alpha", "shop/alpha", 5))  # Retain: inactive, no reader
    assert subscriptions_by_topic(store, "shop") == {"events": ["beta"]}
    finalize_queue(store, subscription("beta", deletionPolicy="Delete"), Owner("uid-beta", "shop/beta", 5))
    done = finalize_topic(store, topic(deletionPolicy="Delete"), OLD)
    assert isinstance(done, Finalized) and done.action == DELETED and "3 messages" in done.message
    assert bins(store) is None


def test_retain_keeps_record_and_messages_and_releases_the_claim(store: Storage) -> None:
    sync_topic(store, topic(), OLD)
    Topic(store.with_client("shop"), topic()).publish_many([b"x"] * 3, subject="a")
    done = finalize_topic(store, topic(), OLD)
    assert isinstance(done, Finalized) and done.action == RETAINED
    stored = bins(store)
    assert stored is not None and Owner.from_bin(stored[OWNER_BIN]) is None  # released
    assert Topic(store.with_client("shop"), topic()).stats([]).retained == 3
    assert sync_topic(store, topic(), NEW).reason == SYNCED  # a released claim is taken over, not a conflict


def test_figures_of_a_topic_and_of_its_subscription(store: Storage) -> None:
    sync_topic(store, topic(), OLD)
    sync_queue(store, subscription("alerts", subscribe={"filter": "a/#"}), OLD)
    handle = Topic(store.with_client("shop"), topic())
    empty = topic_figures(store, topic(), ["alerts"])
    assert empty == {"published": 0, "retained": 0, "retainedBytes": 0, "subscriptions": 1,
                     "subscriptionNames": ["alerts"], "oldestAgeSeconds": None}
    handle.publish_many([b"abcd"] * 4, subject="a/b")
    handle.publish_many([b"zz"] * 2, subject="z")
    figures = topic_figures(store, topic(), ["alerts"])
    assert (figures["published"], figures["retained"]) == (6, 6)
    assert figures["retainedBytes"] >= 4 * (4 + 3) + 2 * (2 + 1)  # payloads and subjects, plus the ids
    assert topic_figures_changed(empty, figures, 10.0)
    assert not topic_figures_changed(figures, figures, 10.0)  # measured again, unchanged: no write
    sub = queue_figures(store, subscription("alerts", subscribe={"filter": "a/#"}))
    assert (sub["topic"], sub["lag"], sub["expired"], sub["depth"]) == ("events", 6, 0, 6)
    queue = Queue(store.with_client("shop"), subscription("alerts", subscribe={"filter": "a/#"}))
    queue.ack(queue.fire_many(10))  # the four a/b; the filter passes over the two z
    after = queue_figures(store, subscription("alerts", subscribe={"filter": "a/#"}))
    assert (after["lag"], after["depth"], after["expired"]) == (0, 0, 0)
    assert figures_changed(sub, after, 10.0) and not figures_changed(after, after, 10.0)
