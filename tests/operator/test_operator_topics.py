"""IgnisTopic through the kopf wiring against the kmock API emulator and lmdb: a topic's record, status and figures;
subscriptions (IgnisQueues with spec.subscribe) before and after their topic, with their topic, lag and oldest age
in their status; deletion waiting for subscriptions; deletion policies; drift repair; conflicts; outages; and no
API write while idle."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from ignis_operator.handlers import FINALIZER, OperatorConfig
from ignis_operator.reconcile import OWNER_BIN
from kopf_harness import Harness, fast_config
from test_operator_scale import passes, writes

from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.topics import Topic, TopicSpec

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


@pytest.fixture
def operator_config(request: pytest.FixtureRequest) -> OperatorConfig:
    return getattr(request, "param", None) or fast_config(finalizer_timeout_seconds=0.5)


def topic_record(h: Harness, name: str, client_id: str = "ns1") -> dict[str, Any] | None:
    found = h.store.with_client(client_id).get_topic(name)
    return found.bins if found else None


def queue_record(h: Harness, name: str, client_id: str = "ns1") -> dict[str, Any] | None:
    found = h.store.with_client(client_id).get_queue(name)
    return found.bins if found else None


def topic_ready(h: Harness, name: str, namespace: str = "ns1") -> bool:
    return h.topic_condition(name, namespace).get("status") == "True"


def ready(h: Harness, name: str, namespace: str = "ns1") -> bool:
    return h.condition(name, namespace).get("status") == "True"


def publisher(h: Harness, name: str, shards: int) -> Topic:
    return Topic(h.store.with_client("ns1"), TopicSpec.build(name=name, shards=shards, clientId="ns1"))


async def subscribe(h: Harness, name: str, topic: str, **spec: Any) -> None:
    await h.create(name, shards=2, subscribe={"topic": topic, **spec.pop("subscribe", {})}, **spec)


async def test_a_topic_is_synced_with_its_finalizer_status_and_first_figures(harness: Harness) -> None:
    await harness.create_topic("events", shards=4, retentionSeconds=3600)
    await harness.until(lambda: topic_ready(harness, "events"), what="the topic Ready")
    obj = harness.topic("events") or {}
    assert FINALIZER in obj["metadata"]["finalizers"]
    status = obj["status"]
    assert status["observedGeneration"] == 1 and status["clientId"] == "ns1"
    assert harness.topic_condition("events", type_="Synced")["reason"] == "Synced"
    # the Ready write carries the first figures: MESSAGES and SUBSCRIPTIONS show at once
    assert (status["published"], status["retained"], status["retainedBytes"], status["subscriptions"]) == (0, 0, 0, 0)
    assert status["subscriptionNames"] == [] and "oldestAgeSeconds" not in status
    bins = topic_record(harness, "events")
    assert bins is not None and (bins["shards"], bins["retention"]) == (4, 3600)
    assert bins[OWNER_BIN]["ref"] == "ns1/events"
    (created,) = await harness.until(lambda: harness.events("Created"), what="a Created event")
    assert created["involvedObject"]["kind"] == "IgnisTopic" and "topic record created" in created["message"]


async def test_an_edit_reaches_the_store_and_a_shrink_is_refused(harness: Harness) -> None:
    await harness.create_topic("events", shards=4)
    await harness.until(lambda: topic_ready(harness, "events"), what="Ready")
    await harness.edit("events", plural="ignistopics", shards=8, retentionSeconds=60)
    await harness.until(lambda: (topic_record(harness, "events") or {}).get("shards") == 8, what="shards 8")
    assert topic_record(harness, "events")["retention"] == 60  # type: ignore[index]
    await harness.edit("events", plural="ignistopics", shards=2)  # the emulator runs no CEL: the operator refuses
    refused = await harness.until(lambda: harness.topic_condition("events").get("reason") == "InvalidSpec"
                                  and harness.topic_condition("events"), what="InvalidSpec")
    assert "shards may grow, never shrink" in refused["message"]
    assert topic_record(harness, "events")["shards"] == 8  # type: ignore[index]


async def test_a_subscription_before_its_topic_waits_then_becomes_ready(harness: Harness) -> None:
    """`kubectl apply -f dir/` may create a subscription before its topic: a clear condition and retries, no
    InvalidSpec to edit away, no crash; once the topic exists the subscription follows without a resync period."""
    await subscribe(harness, "alerts", "events", subscribe={"filter": "sensors/+/temp"})
    waiting = await harness.until(lambda: harness.condition("alerts").get("reason") == "TopicNotFound"
                                  and harness.condition("alerts"), what="TopicNotFound")
    assert waiting["status"] == "False" and "'events' does not exist" in waiting["message"]
    assert queue_record(harness, "alerts") is None
    await asyncio.sleep(1.0)  # retried meanwhile (backoff 0.1-0.5 s): still waiting, one Event only
    assert harness.condition("alerts")["reason"] == "TopicNotFound"
    assert len(harness.events("TopicNotFound")) in (1, 2)  # (kmock may let kopf handle the creation twice)
    await harness.create_topic("events", shards=2)
    await harness.until(lambda: ready(harness, "alerts"), what="the subscription Ready")
    bins = queue_record(harness, "alerts")
    assert bins is not None and (bins["subTopic"], bins["subFilter"]) == ("events", "sensors/+/temp")
    # the write that makes it Ready carries its first figures (no extra write from the figures pass for them)
    status_writes = [r.data["status"] for r in writes(harness) if r.url.path.endswith("/ignisqueues/alerts/status")]
    first_ready = next(s for s in status_writes
                       if any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("conditions", [])))
    assert (first_ready["topic"], first_ready["lag"], first_ready["depth"]) == ("events", 0, 0)
    assert first_ready["figuresTime"].endswith("Z")


async def test_figures_of_a_topic_and_its_subscriptions(harness: Harness) -> None:
    await harness.create_topic("events", shards=2)
    await harness.until(lambda: topic_ready(harness, "events"), what="topic Ready")
    await subscribe(harness, "all", "events")
    await subscribe(harness, "temps", "events", subscribe={"filter": "sensors/+/temp"})
    await harness.until(lambda: ready(harness, "all") and ready(harness, "temps"), what="subscriptions Ready")
    status = (harness.obj("all") or {})["status"]
    assert (status["topic"], status["lag"], status["expired"], status["depth"]) == ("events", 0, 0, 0)
    topic = publisher(harness, "events", 2)
    topic.publish_many([b"t"] * 6, subject="sensors/kitchen/temp")
    topic.publish_many([b"h"] * 4, subject="sensors/kitchen/humidity")
    status = await harness.until(lambda: (harness.topic("events") or {}).get("status", {}).get("retained") == 10
                                 and harness.topic("events")["status"], what="topic figures")
    assert (status["published"], status["subscriptions"], status["subscriptionNames"]) == (10, 2, ["all", "temps"])
    # every record sampled (at most 16 a shard): the estimate is exact, payload + subject + id of each message
    subjects = 6 * len("sensors/kitchen/temp") + 4 * len("sensors/kitchen/humidity")
    assert status["retainedBytes"] == 10 + subjects + sum(len(m) for m in _ids(harness, "events", 2))
    assert 0 <= status["oldestAgeSeconds"] < 30
    sub = await harness.until(lambda: (harness.obj("all") or {}).get("status", {}).get("lag") == 10
                              and harness.obj("all")["status"], what="subscription lag")
    assert sub["topic"] == "events" and sub["depth"] == 10 and 0 <= sub["oldestAgeSeconds"] < 30
    queue = Queue(harness.store.with_client("ns1"), QueueSpec.build(name="all", handlerType="all.v1", shards=2,
                                                                     clientId="ns1", subscribe={"topic": "events"}))
    queue.ack(queue.fire_many(10))
    sub = await harness.until(lambda: (harness.obj("all") or {}).get("status", {}).get("lag") == 0
                              and harness.obj("all")["status"], what="lag back to 0")
    assert sub["depth"] == 0 and "oldestAgeSeconds" not in sub
    assert (harness.obj("temps") or {})["status"]["lag"] == 10  # the other subscription has its own position


def _ids(h: Harness, topic: str, shards: int) -> list[str]:
    """The message ids the topic holds (their lengths are part of its retained bytes)."""
    from ignis.storage.base import SlotRef

    store = h.store.with_client("ns1")
    out = []
    for shard, p in store.pointers(topic, shards).items():
        refs = [SlotRef(topic, shard, slot) for slot in range(1, p.load + 1)]
        out += [e.msg_id for e in store.read(refs) if e is not None]
    return out


async def test_deleting_a_topic_waits_for_its_subscriptions_and_names_them(harness: Harness) -> None:
    await harness.create_topic("events", shards=2, deletionPolicy="Delete")
    await harness.until(lambda: topic_ready(harness, "events"), what="topic Ready")
    await subscribe(harness, "alpha", "events")
    await subscribe(harness, "beta", "events", deletionPolicy="Delete")
    await harness.until(lambda: ready(harness, "alpha") and ready(harness, "beta"), what="subscriptions Ready")
    publisher(harness, "events", 2).publish(b"kept while in use", subject="a")
    await harness.delete("events", plural="ignistopics")
    blocked = await harness.until(lambda: harness.topic_condition("events").get("reason") == "InUse"
                                  and harness.topic_condition("events"), what="InUse")
    assert blocked["status"] == "False" and "2 subscription(s)" in blocked["message"]
    assert "alpha, beta" in blocked["message"]
    (event,) = await harness.until(lambda: harness.events("InUse"), what="an InUse event")
    assert event["type"] == "Warning"
    await asyncio.sleep(1.0)  # re-checked meanwhile: still there, data intact
    assert harness.topic("events") is not None and topic_record(harness, "events") is not None
    await harness.delete("alpha")  # Retain: its record stays, inactive; it holds the topic no longer
    await harness.until(lambda: "1 subscription(s)" in harness.topic_condition("events").get("message", ""),
                        what="the condition names the one left")
    assert "beta" in harness.topic_condition("events")["message"]
    await harness.delete("beta")
    await harness.until(lambda: harness.topic("events") is None, what="the topic released")
    assert topic_record(harness, "events") is None  # deletionPolicy Delete: record and messages gone
    assert publisher(harness, "events", 2).stats([]).retained == 0
    assert (await harness.until(lambda: harness.events("Deleted")))


async def test_retain_keeps_the_topic_and_its_messages_and_releases_the_claim(harness: Harness) -> None:
    await harness.create_topic("events", shards=2)
    await harness.until(lambda: topic_ready(harness, "events"), what="topic Ready")
    publisher(harness, "events", 2).publish_many([b"x"] * 3, subject="a")
    await harness.delete("events", plural="ignistopics")
    await harness.until(lambda: harness.topic("events") is None, what="released")
    bins = topic_record(harness, "events")
    assert bins is not None and bins[OWNER_BIN]["uid"] == ""  # kept, and no object claims it any more
    assert publisher(harness, "events", 2).stats([]).retained == 3
    # a new IgnisTopic of that name takes it over (a released claim is no conflict)
    await harness.create_topic("events", shards=2)
    await harness.until(lambda: topic_ready(harness, "events"), what="the new object Ready")
    assert topic_record(harness, "events")[OWNER_BIN]["uid"] != ""  # type: ignore[index]
    assert (harness.topic("events") or {})["status"]["retained"] == 3


async def test_drift_repair_recreates_a_topic_record_deleted_behind_its_back(harness: Harness) -> None:
    await harness.create_topic("events", shards=2, retentionSeconds=600)
    await harness.until(lambda: topic_ready(harness, "events"), what="Ready")
    # creation fully handled (kopf's handlers are at-least-once: a second sync of the creation would revert an edit
    # with no DriftRepaired): from now on only the drift pass writes the record
    await passes(harness, drift=1, figures=0)
    view = harness.store.with_client("ns1")
    view.apply_topic("events", {"retention": 5})
    await harness.until(lambda: (topic_record(harness, "events") or {}).get("retention") == 600, what="reverted")
    await harness.until(lambda: harness.events("DriftRepaired"), what="a DriftRepaired event")
    view.delete_topic("events")
    await harness.until(lambda: topic_record(harness, "events"), what="the record re-created")
    assert topic_record(harness, "events")["shards"] == 2  # type: ignore[index]


async def test_an_idle_operator_with_topics_and_subscriptions_writes_nothing(harness: Harness) -> None:
    for topic in ("events", "audit"):
        await harness.create_topic(topic, shards=2)
        for n in (1, 2, 3):
            await subscribe(harness, f"{topic}-{n}", topic)
    names = [f"{t}-{n}" for t in ("events", "audit") for n in (1, 2, 3)]
    await harness.until(lambda: topic_ready(harness, "events") and topic_ready(harness, "audit")
                        and all(ready(harness, n) for n in names), what="all Ready")
    publisher(harness, "events", 2).publish_many([b"m"] * 20, subject="a")  # figures to write, once
    await harness.until(lambda: (harness.obj("events-1") or {}).get("status", {}).get("lag") == 20, what="lag 20")
    await passes(harness, drift=1, figures=1)
    since = len(list(harness.emulator))
    await passes(harness, drift=3, figures=3)
    assert [f"{r.method.value} {r.url.path}" for r in writes(harness, since)] == []


async def test_a_store_outage_is_synced_false_then_recovers(harness: Harness) -> None:
    harness.outage.down = True
    await harness.create_topic("events", shards=2)
    synced = await harness.until(lambda: harness.topic_condition("events", type_="Synced").get("reason") ==
                                 "StoreUnavailable" and harness.topic_condition("events", type_="Synced"))
    assert synced["status"] == "False"
    harness.outage.down = False
    await harness.until(lambda: topic_ready(harness, "events"), what="recovery")
    assert topic_record(harness, "events") is not None


async def test_two_objects_claiming_one_topic_the_newer_gets_conflict(harness: Harness) -> None:
    await harness.create_topic("events", "ns1", clientId="shared", created="2026-01-01T00:00:00Z", retentionSeconds=60)
    await harness.until(lambda: topic_ready(harness, "events", "ns1"), what="the first Ready")
    await harness.create_topic("events", "ns2", clientId="shared", created="2026-02-01T00:00:00Z", retentionSeconds=90)
    loser = await harness.until(lambda: harness.topic_condition("events", "ns2").get("reason") == "Conflict"
                                and harness.topic_condition("events", "ns2"), what="Conflict")
    assert "ns1/events" in loser["message"]
    assert topic_record(harness, "events", "shared")["retention"] == 60  # type: ignore[index]
    await harness.delete("events", "ns2", plural="ignistopics")
    await harness.until(lambda: harness.topic("events", "ns2") is None, what="the loser gone")
    assert topic_record(harness, "events", "shared") is not None  # the winner's topic untouched


async def test_a_topic_may_not_take_a_queues_name(harness: Harness) -> None:
    await harness.create("orders", shards=2)
    await harness.until(lambda: ready(harness, "orders"), what="the queue Ready")
    await harness.create_topic("orders", shards=2)
    refused = await harness.until(lambda: harness.topic_condition("orders").get("reason") == "InvalidSpec"
                                  and harness.topic_condition("orders"), what="InvalidSpec")
    assert "may not share one" in refused["message"]
    assert topic_record(harness, "orders") is None


async def test_a_subscription_whose_topic_is_declared_but_not_handled_yet_waits_quietly(tmp_path: Any) -> None:
    """`kubectl apply -f dir/`: the subscription may be handled before the IgnisTopic next to it. Then no
    TopicNotFound status or Warning for a moment's ordering: a retry, and it follows the topic. Without such an
    IgnisTopic (or once the topic was handled and is not Ready), the condition says what is missing."""
    from ignis_operator.catalog import Catalog
    from ignis_operator.handlers import OperatorContext, Outcome, settle
    from ignis_operator.reconcile import TOPIC_NOT_FOUND, SyncResult

    from ignis.storage import open_store

    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    ctx = OperatorContext(store, fast_config())
    posted: list[str] = []
    ctx.event = lambda entry, type_, reason, message: posted.append(reason)  # type: ignore[method-assign]
    meta = {"namespace": "ns1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    sub = Catalog().observe({"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisQueue",
                             "metadata": {**meta, "name": "alerts", "uid": "u-sub"},
                             "spec": {"handlerType": "h", "subscribe": {"topic": "events"}}})
    waiting = Outcome(SyncResult("alerts", "ns1", False, TOPIC_NOT_FOUND, "topic 'events' does not exist"), None)
    log = logging.getLogger("test")
    assert settle(ctx, sub, waiting, drift=False, logger=log, now=0.0)["conditions"][0]["reason"] == TOPIC_NOT_FOUND
    assert posted == [TOPIC_NOT_FOUND] and "u-sub" in ctx.retries
    ctx.retries.clear()
    posted.clear()
    topic = ctx.topics.observe({"apiVersion": "ignismq.io/v1alpha1", "kind": "IgnisTopic",
                                "metadata": {**meta, "name": "events", "uid": "u-topic"}, "spec": {}})
    assert settle(ctx, sub, waiting, drift=False, logger=log, now=0.0) == {}  # its topic is on its way
    assert posted == [] and "u-sub" in ctx.retries
    topic.status = {"conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec"}]}
    assert settle(ctx, sub, waiting, drift=False, logger=log, now=0.0)["conditions"][0]["reason"] == TOPIC_NOT_FOUND
    assert posted == [TOPIC_NOT_FOUND]
    store.close()


@pytest.mark.parametrize("operator_config", [fast_config(status_writes_per_second=0.05)], indirect=True)
async def test_waiting_subscriptions_become_ready_beside_a_slow_figures_write_budget(harness: Harness) -> None:
    """The background passes write figures at most `status_writes_per_second` (here one write per 20 s): the writes
    that make waiting subscriptions Ready are not figures and do not queue behind that budget (five of them would
    need 100 s, four times the wait below)."""
    names = [f"sub-{n}" for n in range(5)]
    for name in names:
        await subscribe(harness, name, "events")
    await harness.until(lambda: all(harness.condition(n).get("reason") == "TopicNotFound" for n in names),
                        what="all waiting")
    await harness.create_topic("events", shards=2)
    await harness.until(lambda: all(ready(harness, n) for n in names), what="all Ready", timeout=25)
