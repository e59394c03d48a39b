"""What the sweeper tells an SRE: a start-up line, one line per lease change, the leader's queue gauges
(cleared when it stops leading), sweep pass metrics, and redeliveries counted."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from pathlib import Path

import pytest
from ignis_workers.election import LeaderElector, StoreLease
from ignis_workers.service import SweeperService, load_sweeper_settings, scaled_clock
from ignis_workers.shovel import Shovel
from prometheus_client import REGISTRY
from support.polling import wait_for

from ignis import Ignis, QueueSpec
from ignis.storage import open_store
from ignis.version import package_version


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_leader_reports_gauges_and_passes_and_clears_them_when_it_stops(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(QueueSpec.build(name="gauged", handlerType="gauged", shards=2, sweepDurationSeconds=300))
    client.apply(QueueSpec.build(name="idle", handlerType="idle", shards=2))
    queue = client.queue("gauged")
    queue.publish_many([b"m%d" % i for i in range(5)])
    published = time.time()
    assert len(queue.fire_many(2)) == 2  # in flight, never settled
    settings = load_sweeper_settings(sweep_interval_seconds=0.2, threads=2, lease_duration_seconds=3,
                                     renew_deadline_seconds=2, retry_period_seconds=0.2, probe_port=-1)
    # The service's clock runs 100 s ahead: the claims look 100 s old, younger than sweepDuration.
    service = SweeperService(store, settings, clock=scaled_clock(offset_seconds=100))
    passes_before = sample("ignis_sweep_passes_total", outcome="ok") or 0
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        # A pass sets a queue's gauges one after the other, the oldest waiting age last: wait for a pass that
        # has set them all (the leader thread may be between two of them when the first one shows).
        wait_for(lambda: (sample("ignis_queue_oldest_in_flight_seconds", queue="gauged") or 0) >= 99
                 and sample("ignis_queue_oldest_age_seconds", queue="gauged") is not None)
        assert sample("ignis_queue_depth", queue="gauged") == 3
        assert sample("ignis_queue_in_flight", queue="gauged") == 2
        assert sample("ignis_queue_sweep_duration_seconds", queue="gauged") == 300
        assert sample("ignis_queue_oldest_in_flight_seconds", queue="gauged") < 110
        # The waiting age is on the wall clock (producers stamp by theirs), not on the sweeper's 100 s ahead.
        assert 0 <= sample("ignis_queue_oldest_age_seconds", queue="gauged") <= time.time() - published + 1
        assert sample("ignis_queue_delayed", queue="gauged") == 0
        wait_for(lambda: sample("ignis_queue_oldest_age_seconds", queue="idle") is not None)  # (set last)
        assert sample("ignis_queue_depth", queue="idle") == 0
        assert math.isnan(sample("ignis_queue_oldest_age_seconds", queue="idle"))  # nothing waits: NaN, not 0
        assert sample("ignis_sweep_interval_seconds") == 0.2
        assert abs(time.time() - sample("ignis_sweep_last_pass_timestamp_seconds")) < 5
        wait_for(lambda: (sample("ignis_sweep_passes_total", outcome="ok") or 0) > passes_before)
        info = {"identity": service.identity, "lease": "store", "version": package_version()}
        assert sample("ignis_sweeper_info", **info) == 1
    finally:
        stop.set()
        runner.join(20)
    assert not runner.is_alive()
    # Only a leader reports queue figures: a stopped (or standby) process exports none.
    for gauge in ("ignis_queue_depth", "ignis_queue_in_flight", "ignis_queue_oldest_in_flight_seconds",
                  "ignis_queue_sweep_duration_seconds", "ignis_queue_delayed", "ignis_queue_oldest_age_seconds"):
        assert sample(gauge, queue="gauged") is None, gauge
        assert sample(gauge, queue="idle") is None, gauge
    assert math.isnan(sample("ignis_sweep_last_pass_timestamp_seconds"))
    (start,) = [r for r in caplog.records if getattr(r, "event", None) == "start"]
    assert start.levelno == logging.INFO
    assert start.getMessage().startswith(f"ignis sweeper {package_version()} starting: store lmdb://")
    assert f"store lease ignis-sweeper, identity {service.identity}" in start.getMessage()
    events = [getattr(r, "event", None) for r in caplog.records]
    assert "leading" in events and "stopped" in events
    store.close()


def test_a_standby_logs_who_holds_the_lease(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")

    async def main() -> None:
        first = LeaderElector(StoreLease(store), "sweeper-a")
        second = LeaderElector(StoreLease(store), "sweeper-b")
        assert await first.try_acquire_or_renew()
        assert not await second.try_acquire_or_renew()
        assert not await second.try_acquire_or_renew()  # no change: no new line
        await first.release()
        assert await second.try_acquire_or_renew()

    asyncio.run(main())
    store.close()
    changes = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "lease_holder"]
    assert changes == ["lease holder is now sweeper-a", "lease holder is now nobody (released)"]


def test_redeliveries_are_counted(tmp_path: Path) -> None:
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(QueueSpec.build(name="again", handlerType="again", shards=1))
    queue = client.queue("again")
    queue.publish(b"x")
    before = sample("ignis_redelivered_total", queue="again") or 0
    (message,) = queue.fire_many(1)
    message.nack("try again")
    assert (sample("ignis_redelivered_total", queue="again") or 0) == before  # a first delivery
    epoch = store.next_epoch()
    assert Shovel(store, epoch_source=lambda: epoch).shovel_queue(store.client_id, "again").moved == 1
    queue.main.invalidate()
    (again,) = queue.fire_many(1)
    assert again.attempts == 2
    assert sample("ignis_redelivered_total", queue="again") == before + 1
    store.close()


def test_the_leader_trims_topics_to_their_byte_bound_and_reports_their_figures(tmp_path: Path) -> None:
    from ignis import TopicSpec

    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(TopicSpec.build(name="bounded", shards=2, retentionBytes=5000))
    client.apply(TopicSpec.build(name="kept", shards=1))
    client.apply(QueueSpec.build(name="reader", handlerType="reader", subscribe={"topic": "bounded",
                                                                                  "start": "earliest"}))
    client.topic("bounded").publish_many([b"x" * 200] * 100, subject="a")  # about 23 kB
    client.topic("kept").publish_many([b"y" * 200] * 10, subject="a")
    settings = load_sweeper_settings(sweep_interval_seconds=0.2, threads=2, lease_duration_seconds=3,
                                     renew_deadline_seconds=2, retry_period_seconds=0.2, probe_port=-1)
    service = SweeperService(store, settings)
    trimmed_before = sample("ignis_topic_trimmed_total", topic="bounded") or 0
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        wait_for(lambda: sample("ignis_topic_retained_bytes", topic="bounded") is not None)
        assert sample("ignis_topic_retained_bytes", topic="bounded") <= 5000 + 2 * 230
        held = sample("ignis_topic_retained_messages", topic="bounded")
        assert 15 <= held < 25
        assert sample("ignis_topic_trimmed_total", topic="bounded") - trimmed_before == 100 - held
        assert sample("ignis_topic_published_messages", topic="bounded") == 100
        assert sample("ignis_topic_subscriptions", topic="bounded") == 1
        assert sample("ignis_topic_oldest_age_seconds", topic="bounded") >= 0
        # A topic without a byte bound keeps everything; one with no subscription says 0.
        assert sample("ignis_topic_retained_messages", topic="kept") == 10
        assert sample("ignis_topic_subscriptions", topic="kept") == 0
        assert client.topic("bounded").stats().retained == held
        # The subscription is named as one, and reported as a queue: its lag and its oldest message's age.
        assert sample("ignis_subscription_info", queue="reader", topic="bounded") == 1
        wait_for(lambda: sample("ignis_queue_oldest_age_seconds", queue="reader") is not None)
        assert sample("ignis_queue_depth", queue="reader") >= held
    finally:
        stop.set()
        runner.join(20)
    assert not runner.is_alive()
    for gauge in ("ignis_topic_retained_bytes", "ignis_topic_retained_messages", "ignis_topic_published_messages",
                  "ignis_topic_subscriptions", "ignis_topic_oldest_age_seconds"):
        assert sample(gauge, topic="bounded") is None, gauge  # a stopped leader reports none
    assert sample("ignis_subscription_info", queue="reader", topic="bounded") is None
    store.close()


def test_keep_topics_says_which_queues_subscribe_to_which_topic_and_forgets_deleted_ones(tmp_path: Path) -> None:
    """ignis_subscription_info{queue, topic} is 1 for each subscription (not for a plain queue); once a subscription
    or a topic is deleted its series end, and a queue declared again under a deleted subscription's name is not
    marked as one."""
    from ignis_workers.topics import keep_topics

    from ignis import TopicSpec

    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(TopicSpec.build(name="info-a", shards=1))
    client.apply(TopicSpec.build(name="info-b", shards=1))
    for name, topic in (("info-s1", "info-a"), ("info-s2", "info-a"), ("info-s3", "info-b")):
        client.apply(QueueSpec.build(name=name, handlerType=name, subscribe={"topic": topic}))
    client.apply(QueueSpec.build(name="info-plain", handlerType="plain"))

    def info() -> set[tuple[str, str]]:
        return {(s.labels["queue"], s.labels["topic"]) for family in REGISTRY.collect()
                if family.name == "ignis_subscription_info" for s in family.samples
                if s.labels["queue"].startswith("info-") and s.value == 1}

    assert keep_topics(store, gauges=True, leading=lambda: False) == 0
    assert info() == set()  # a process that does not lead reports nothing
    keep_topics(store, gauges=True, leading=lambda: True)
    assert info() == {("info-s1", "info-a"), ("info-s2", "info-a"), ("info-s3", "info-b")}
    assert sample("ignis_topic_subscriptions", topic="info-a") == 2

    client.delete_queue("info-s3")
    client.delete_topic("info-b")
    client.delete_queue("info-s2")
    client.apply(QueueSpec.build(name="info-s2", handlerType="info-s2"))  # the name again, as a plain queue
    keep_topics(store, gauges=True, leading=lambda: True)
    assert info() == {("info-s1", "info-a")}
    assert sample("ignis_topic_subscriptions", topic="info-a") == 1
    for gauge in ("ignis_topic_retained_messages", "ignis_topic_subscriptions", "ignis_topic_oldest_age_seconds"):
        assert sample(gauge, topic="info-b") is None, gauge  # the deleted topic's series ended
    store.close()
