"""Topics in the `ignis` data source on a real local SparkSession: the retained log read as a table (publish-time
window, subject filter, partitions), a write that publishes rows with their subjects, a stream of a subscription
(commit = ack), `export --topic`, and bad input. On lmdb, and on a real Aerospike server when IGNIS_TEST_AEROSPIKE
is set (see conftest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from ignis_pipeline import reader as reader_module
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.reader import IgnisReader
from ignis_pipeline.slots import SINCE_SKEW_MS

from ignis import Ignis, QueueSpec, TopicSpec
from ignis.envelope import now_ms
from ignis.storage import open_store
from ignis.subjects import subject_filter

IGNIS = Path(sys.executable).parent / "ignis"
SUBJECTS = ["sensors/kitchen/temp", "sensors/hall/temp", "sensors/kitchen/humidity", "alerts", "sensors"]


def make_topic(ignis: Ignis, name: str = "events", **fields: Any) -> Any:
    fields.setdefault("shards", 4)
    ignis.apply(TopicSpec.build(name=name, **fields))
    return ignis.topic(name)


def subscribe(ignis: Ignis, name: str, topic: str = "events", **sub: Any) -> Any:
    ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=2, subscribe={"topic": topic, **sub}))
    return ignis.queue(name)


def publish_mixed(t: Any, per_subject: int = 10, prefix: str = "m") -> dict[str, str]:
    """id -> subject of what was published, a few keyed and with headers."""
    out = {}
    for subject in SUBJECTS:
        for i in range(per_subject):
            key = f"k{i % 3}" if i % 2 else None
            ref = t.publish(f"{prefix}-{subject}-{i}".encode(), subject=subject, key=key,
                            headers={"n": str(i)} if i % 4 == 0 else None)
            out[ref.id] = subject
    return out


def _error(call: Any) -> str:
    with pytest.raises(Exception) as caught:
        call()
    return str(caught.value)


def test_read_returns_the_retained_log_with_its_columns(ignis: Ignis, read: Any) -> None:
    t = make_topic(ignis)
    sub = subscribe(ignis, "audit", start="earliest")
    refs = {}
    refs["raw"] = t.publish(b"\x00raw\xff", subject="sensors/kitchen/temp", key="cust-7", headers={"trace": "t1"},
                            id="raw-1")
    refs["json"] = t.publish({"n": 1}, subject="alerts", id="json-1")
    many = t.publish_many([b"p%d" % i for i in range(40)], subject="sensors/hall/temp")
    df = read(topic="events")
    assert df.columns == ["topic", "shard", "offset", "subject", "id", "payload", "codec", "key", "headers",
                          "published_at"]
    rows = {r.id: r for r in df.collect()}
    assert set(rows) == {"raw-1", "json-1"} | {m.id for m in many}
    raw, js = rows["raw-1"], rows["json-1"]
    assert (raw.topic, raw.subject, raw.payload, raw.codec, raw.key, raw.headers) == (
        "events", "sensors/kitchen/temp", b"\x00raw\xff", "bytes", "cust-7", {"trace": "t1"})
    assert (js.subject, js.payload, js.codec, js.key, js.headers) == ("alerts", b'{"n":1}', "json", None, None)
    for ref in [refs["raw"], refs["json"], *many]:  # shard and offset: where the message is stored
        assert (rows[ref.id].shard, rows[ref.id].offset) == (ref.shard, ref.slot)
    stored = {env.msg_id: env.loaded_at for shard in range(4)
              for _, env in ignis.store.peek("events", shard, 1, ignis.store.pointers("events", 4)[shard].load)}
    assert {i: int(r.published_at.timestamp() * 1000) for i, r in rows.items()} == stored
    # A read is a peek: the subscription still has every message to deliver, nothing was claimed.
    assert sub.stats().depth == 42 and sub.stats(in_flight=True).in_flight == 0


def test_subject_filter_and_publish_time_window_are_applied_in_the_read_tasks(
        ignis: Ignis, store_url: str, read: Any) -> None:
    t = make_topic(ignis)
    old = publish_mixed(t, prefix="old")
    time.sleep(0.05)
    starting = now_ms()
    time.sleep(0.05)
    mid = publish_mixed(t, prefix="mid")
    time.sleep(0.05)
    ending = now_ms()
    time.sleep(0.05)
    late = publish_mixed(t, prefix="late")
    everything = {**old, **mid, **late}

    def ids(**options: Any) -> set[str]:
        return {r.id for r in read(topic="events", **options).select("id").collect()}

    assert ids() == set(everything)
    assert ids(subjectFilter="sensors/+/temp") == {i for i, s in everything.items() if s.endswith("/temp")}
    assert ids(subjectFilter="sensors/#") == {i for i, s in everything.items() if s.startswith("sensors")}
    assert ids(subjectFilter="alerts") == {i for i, s in everything.items() if s == "alerts"}
    assert ids(startingTimestamp=starting) == set(mid) | set(late)
    assert ids(endingTimestamp=ending) == set(old) | set(mid)  # exclusive, as Spark's Kafka source's
    assert ids(startingTimestamp=starting, endingTimestamp=ending) == set(mid)
    iso = datetime.fromtimestamp(starting / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert ids(startingTimestamp=iso, endingTimestamp=ending, subjectFilter="sensors/kitchen/#") == {
        i for i, s in mid.items() if s.startswith("sensors/kitchen")}
    # The filter is the read task's: the batches it hands Spark hold only the rows it selects.
    reader = IgnisReader(SourceOptions.parse({"store": store_url, "topic": "events", "subjectFilter": "+/+/temp",
                                              "startingTimestamp": str(starting)}))
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert {s for b in batches for s in b.column("subject").to_pylist()} == {"sensors/kitchen/temp",
                                                                           "sensors/hall/temp"}
    assert sum(b.num_rows for b in batches) == sum(1 for i, s in everything.items()
                                                   if s.endswith("/temp") and i not in old)


class CountingStore:
    """A real store that counts what its peeks and reads cover."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.peeked = 0
        self.read_slots = 0

    def peek(self, magazine: str, shard: int, first: int, last: int, only: Any = None) -> Any:
        self.peeked += max(0, last - first + 1)
        return self.store.peek(magazine, shard, first, last, only)

    def read(self, refs: Any) -> Any:
        self.read_slots += len(refs)
        return self.store.read(refs)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_starting_timestamp_finds_its_first_slot_without_reading_the_log_from_its_head(
        ignis: Ignis, store_url: str, read: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t = make_topic(ignis, shards=2)
    for _ in range(20):
        t.publish_many([b"o" * 16] * 1_000, subject="bulk/old")
    time.sleep((SINCE_SKEW_MS + ignis.store.write_grace_ms) / 1000 + 0.2)  # past the producers' skew allowance
    starting = now_ms()
    time.sleep(0.01)
    recent = {r.id for r in t.publish_many([b"n" * 16] * 200, subject="bulk/new")}
    store = open_store(store_url, farm_id=ignis.store.farm_id, client_id=ignis.client_id, purge_interval=0)
    counting = CountingStore(store)
    monkeypatch.setattr(reader_module, "open_driver_store", lambda _: counting)
    monkeypatch.setattr(reader_module, "task_store", lambda _: counting)
    reader = IgnisReader(SourceOptions.parse({"store": store_url, "topic": "events", "startingTimestamp": str(starting),
                                              "farmId": ignis.store.farm_id, "clientId": ignis.client_id}))
    got = {i for p in reader.partitions() for b in reader.read(p) for i in b.column("id").to_pylist()}
    store.close()
    assert got == recent
    # 20,200 slots: the search reads a few dozen (about log2 per shard, twice: the first retained, then the
    # time; RESERVE_MAX-slot windows on a two-step store), the read little more than the 200 recent ones.
    assert counting.peeked <= 400, counting.peeked
    assert counting.read_slots <= 400, counting.read_slots
    assert {r.id for r in read(topic="events", startingTimestamp=starting).select("id").collect()} == recent


def test_partitions_cover_each_shard_once_in_slot_ranges_and_a_reused_frame_reads_what_is_new(
        spark: Any, ignis: Ignis, store_url: str) -> None:
    import ignis_pipeline

    ignis_pipeline.register(spark)
    t = make_topic(ignis, shards=3)
    refs = t.publish_many([b"x%d" % i for i in range(500)], subject="a/b")
    reader = IgnisReader(SourceOptions.parse({"store": store_url, "topic": "events", "slotsPerPartition": "37",
                                              "farmId": ignis.store.farm_id, "clientId": ignis.client_id}))
    ranges = reader.plan().ranges
    assert all(r.size <= 37 for r in ranges) and {r.shard for r in ranges} == {0, 1, 2}
    covered = [(r.shard, slot) for r in ranges for slot in range(r.first, r.last + 1)]
    assert len(covered) == len(set(covered)) == 500
    assert set(covered) == {(ref.shard, ref.slot) for ref in refs}
    df = spark.read.format("ignis").option("store", store_url).option("topic", "events").option(
        "slotsPerPartition", 37).load()
    assert df.count() == 500
    assert df.where("shard = 1").count() == sum(1 for ref in refs if ref.shard == 1)
    more = t.publish_many([b"y%d" % i for i in range(60)], subject="a/c")
    assert df.count() == 560  # the plan's tails: a reused DataFrame reads what is stored now
    assert {r.id for r in df.where("subject = 'a/c'").select("id").collect()} == {r.id for r in more}


def test_a_topic_write_publishes_each_row_with_its_subject_key_and_headers(
        spark: Any, ignis: Ignis, store_url: str, read: Any) -> None:
    make_topic(ignis)
    temps = subscribe(ignis, "temps", filter="sensors/+/temp", start="earliest")
    rows = [(f"payload-{i}", SUBJECTS[i % len(SUBJECTS)], f"id-{i}", f"k{i % 3}" if i % 2 else None,
             {"n": str(i)} if i % 4 == 0 else None) for i in range(200)]
    df = spark.createDataFrame(rows, "payload string, subject string, id string, key string, "
                                     "headers map<string,string>")
    df.repartition(3).write.format("ignis").option("store", store_url).option("topic", "events").option(
        "chunkSize", 17).mode("append").save()
    got = {r.id: r for r in read(topic="events").collect()}
    assert set(got) == {f"id-{i}" for i in range(200)}
    for payload, subject, msg_id, key, headers in rows:
        r = got[msg_id]
        assert (r.payload, r.codec, r.subject, r.key, r.headers) == (payload.encode(), "str", subject, key, headers)
    assert len({got[f"id-{i}"].shard for i in range(1, 200, 6)}) == 1  # one key, one shard
    delivered = []
    while (m := temps.fire()) is not None:
        delivered.append(m)
        m.ack()
    assert sorted(m.id for m in delivered) == sorted(f"id-{i}" for i in range(200) if SUBJECTS[i % 5].endswith("temp"))
    assert {m.payload for m in delivered if m.id == "id-0"} == {"payload-0"}  # a string column: str

    # A topic's read written back to another topic: its read-only columns are ignored, the rest is kept.
    make_topic(ignis, "copy", shards=2)
    read(topic="events").write.format("ignis").option("store", store_url).option("topic", "copy").mode(
        "append").save()
    copied = {r.id: (r.subject, r.payload, r.key, r.headers) for r in read(topic="copy").collect()}
    assert copied == {i: (r.subject, r.payload, r.key, r.headers) for i, r in got.items()}


def test_bad_topic_writes_are_one_clear_error_and_write_nothing(spark: Any, ignis: Ignis, store_url: str) -> None:
    t = make_topic(ignis)

    def write(df: Any, mode: str = "append", **options: str) -> Any:
        w = df.write.format("ignis").option("store", store_url).mode(mode)
        for k, v in {"topic": "events", **options}.items():
            w = w.option(k, v)
        return lambda: w.save()

    def frame(subjects: list[Any]) -> Any:
        return spark.createDataFrame([(f"p{i}", s) for i, s in enumerate(subjects)], "payload string, subject string"
                                     ).coalesce(1)

    good = ["a/b"] * 5
    assert "row 5: column subject: subject='a/+/c': '+' is not allowed" in _error(write(frame([*good, "a/+/c"])))
    assert "row 3: column subject is null" in _error(write(frame([*good[:3], None])))
    assert "row 2: column subject: subject of 0 characters" in _error(write(frame(["x", "y", ""])))
    assert "needs a column 'subject'" in _error(write(spark.createDataFrame([("x",)], "payload string")))
    assert "column subject is int" in _error(write(spark.createDataFrame([("x", 1)], "payload string, subject int")))
    assert "column due_at: a topic's messages are not delayed" in _error(write(spark.createDataFrame(
        [("x", "a", None)], "payload string, subject string, due_at timestamp")))
    assert "unknown column(s) magazine" in _error(write(spark.createDataFrame(
        [("x", "a", "main")], "payload string, subject string, magazine string")))
    assert "a topic cannot be overwritten" in _error(write(frame(good), "overwrite"))
    assert "option delay is for queues" in _error(write(frame(good), delay="1"))
    assert "topic 'nosuch' not found" in _error(write(frame(good), topic="nosuch"))
    assert "options queue and topic are both given" in _error(write(frame(good), queue="events"))
    assert t.stats().published == 0  # nothing of any of it was written


def test_bad_topic_reads_fail_at_load_with_the_message_on_the_first_line(spark: Any, ignis: Ignis,
                                                                         store_url: str) -> None:
    from ignis.errors import TopicNotFound

    make_topic(ignis)
    ignis.apply(QueueSpec.build(name="orders", handlerType="orders"))

    def first_line(**options: Any) -> str:
        reader = spark.read.format("ignis").option("store", store_url)
        for key, value in options.items():
            reader = reader.option(key, str(value))
        with pytest.raises(Exception) as caught:
            reader.load()
        return str(caught.value).splitlines()[0]

    assert first_line(topic="events,nosuch").endswith(f"TopicNotFound: {TopicNotFound('nosuch', ignis.client_id)}")
    assert first_line(topic="events", queue="orders").endswith(
        "InvalidInputError: options queue and topic are both given: a read or write names queues (option queue) or "
        "topics (option topic), not both")
    assert first_line().endswith(
        "InvalidInputError: option queue (or topic) is missing: name one queue, a comma list, or * for every queue; "
        "or option topic: a topic, or a comma list of topics")
    assert first_line(topic="events", since=1).endswith(
        "option since is for queues (option queue), not for option topic (a topic read takes startingTimestamp)")
    assert first_line(topic="events", magazine="dead").endswith("option magazine is for queues (option queue), not "
                                                                "for option topic (a topic has one log)")
    assert first_line(queue="orders", subjectFilter="a/#").endswith(
        "option subjectFilter is for topics (option topic), not for option queue")
    assert first_line(queue="orders", startingTimestamp=1).endswith("option startingTimestamp is for topics (option "
                                                                    "topic), not for option queue (a queue read "
                                                                    "takes since)")
    assert "option subjectFilter: filter='a/#/b': '#' must be a whole level and the last one" in first_line(
        topic="events", subjectFilter="a/#/b")
    assert "option endingTimestamp (5) is not after startingTimestamp (5)" in first_line(
        topic="events", startingTimestamp=5, endingTimestamp=5)
    assert "option startingTimestamp='soon': not epoch milliseconds or an ISO-8601 time" in first_line(
        topic="events", startingTimestamp="soon")
    assert "option topic: 'Bad_Name' is not a topic name" in first_line(topic="Bad_Name")
    with pytest.raises(Exception) as caught:
        (spark.readStream.format("ignis").option("store", store_url).option("topic", "events").load()
         .writeStream.foreachBatch(lambda df, _: None).start().awaitTermination(60))
    assert "a streaming read consumes a queue (option queue): to stream a topic, stream a subscription" in str(
        caught.value)


def _claims_left(ignis: Ignis, sub: str, topic: str, shards: int) -> list[Any]:
    """Claim records of a subscription's cursor still stored (claimed, not acked)."""
    from ignis import names

    cursor = names.cursor_of(sub, topic)
    out = []
    for shard, p in ignis.store.pointers(cursor, shards).items():
        if p.fire:
            out += ignis.store.peek(cursor, shard, 1, p.fire)
    return out


def test_a_stream_of_a_subscription_delivers_every_matching_message_and_acks_it(
        spark: Any, ignis: Ignis, store_url: str, tmp_path: Path) -> None:
    t = make_topic(ignis)
    sub = subscribe(ignis, "temps", filter="sensors/+/temp", start="earliest")
    published = publish_mixed(t, per_subject=40)
    matching = {i for i, s in published.items() if s.endswith("/temp")}
    # Three taken by a consumer and handed back: they are redelivered from the subscription's own main.
    taken = sub.fire_many(3)
    assert sub.release(taken) == 3 and {m.id for m in taken} <= matching
    sink: list[tuple[str, str]] = []

    def handle(df: Any, batch_id: int) -> None:
        sink.extend((r.id, r.queue) for r in df.select("id", "queue").collect())

    def run(checkpoint: str) -> None:
        query = (spark.readStream.format("ignis").option("store", store_url).option("queue", "temps")
                 .option("maxMessagesPerTrigger", 25).load()
                 .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / checkpoint))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run("ckpt")
    assert {i for i, _ in sink} == matching and {q for _, q in sink} == {"temps"}
    assert len(sink) >= len(matching)
    stats = sub.stats(in_flight=True)
    assert (stats.depth, stats.in_flight) == (0, 0)  # every message delivered was acked
    assert _claims_left(ignis, "temps", "events", 4) == []
    assert sub.fire() is None

    # Published while no query runs: the next run from the same checkpoint delivers exactly the matching ones.
    later = publish_mixed(t, per_subject=5, prefix="later")
    sink.clear()
    run("ckpt")
    assert sorted(i for i, _ in sink) == sorted(i for i, s in later.items() if s.endswith("/temp"))
    assert sub.stats(in_flight=True).in_flight == 0 and _claims_left(ignis, "temps", "events", 4) == []


def test_available_now_on_a_subscription_delivers_what_was_there_then_stops(
        spark: Any, ignis: Ignis, store_url: str, tmp_path: Path) -> None:
    t = make_topic(ignis)
    sub = subscribe(ignis, "kitchen", filter="sensors/kitchen/#", start="earliest")
    published = publish_mixed(t, per_subject=30)
    present = {i for i, s in published.items() if s.startswith("sensors/kitchen")}
    sink: list[str] = []
    late: set[str] = set()

    def handle(df: Any, batch_id: int) -> None:
        sink.extend(r.id for r in df.select("id").collect())
        if batch_id == 0:  # published during the run: for the next one
            late.update(r.id for r in t.publish_many([b"late%d" % i for i in range(20)], subject="sensors/kitchen"))

    query = (spark.readStream.format("ignis").option("store", store_url).option("queue", "kitchen")
             .option("maxMessagesPerTrigger", 25).load()
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the query must stop by itself"
    assert query.exception() is None
    assert sorted(sink) == sorted(present) and len(late) == 20
    stats = sub.stats(in_flight=True)
    assert (stats.depth, stats.in_flight) == (20, 0)  # the late ones wait; what was delivered was acked
    for progress in query.recentProgress:
        offset = json.loads(progress.sources[0].endOffset)
        assert set(offset) == {"fire", "claims", "topicFire", "topicClaims"}


def test_export_of_a_topic_writes_its_window_partitioned_by_topic(spark: Any, ignis: Ignis, store_url: str,
                                                                   tmp_path: Path) -> None:
    from ignis_pipeline.jobs.export import export, read_export

    from ignis.errors import InvalidInputError, TopicNotFound

    store = {"store": SourceOptions.parse({"store": store_url, "queue": "*"}).store,
             "farmId": ignis.store.farm_id, "clientId": ignis.client_id}
    t = make_topic(ignis)
    old = publish_mixed(t, per_subject=4, prefix="old")
    time.sleep(0.05)
    since = now_ms()
    time.sleep(0.05)
    new = publish_mixed(t, per_subject=6, prefix="new")
    done = export(spark, store, [], str(tmp_path / "e"), topic="events", since=str(since))
    assert (done["exported"], done["topic"]) == (len(new), "events")
    assert list((tmp_path / "e").iterdir()) and (tmp_path / "e" / "topic=events").is_dir()
    rows = read_export(spark, str(tmp_path / "e"), topic=True).collect()
    assert {r.id: r.subject for r in rows} == new and {r.topic for r in rows} == {"events"}
    until = datetime.fromtimestamp(since / 1000, UTC).isoformat()
    done = export(spark, store, [], str(tmp_path / "j"), fmt="json", topic="events", until=until,
                  subject_filter="sensors/#")
    assert done["exported"] == sum(1 for s in old.values() if s.startswith("sensors"))
    rows = read_export(spark, str(tmp_path / "j"), "json", topic=True).collect()
    assert {r.id for r in rows} == {i for i, s in old.items() if s.startswith("sensors")}
    with pytest.raises(TopicNotFound):
        export(spark, store, [], str(tmp_path / "x"), topic="nosuch")
    with pytest.raises(InvalidInputError, match="export a topic or queues, not both"):
        export(spark, store, ["q"], str(tmp_path / "x"), topic="events")
    assert not (tmp_path / "x").exists()


def test_the_cli_export_of_a_topic_and_its_usage_errors(ignis: Ignis, store_url: str, tmp_path: Path) -> None:
    if not store_url.startswith("lmdb:"):
        pytest.skip("one store is enough for the command's own checks and output")
    t = make_topic(ignis, shards=2)
    t.publish_many([b"c%d" % i for i in range(9)], subject="cli/x")
    env = {**os.environ, "IGNIS_STORE": store_url, "IGNIS_CLIENT_ID": ignis.client_id,
           "IGNIS_FARM_ID": ignis.store.farm_id}

    def ignis_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(IGNIS), "pipeline", *args], capture_output=True, text=True, env=env, timeout=300)

    missing = ignis_cli("export", "--topic", "nosuch", "--to", str(tmp_path / "m"))
    assert missing.returncode == 3, missing.stderr
    assert "topic 'nosuch' not found" in missing.stderr and not (tmp_path / "m").exists()
    for args, words in ((["export", "orders", "--topic", "events", "--to", "x"], "export a topic or queues, not both"),
                        (["export", "--topic", "events", "--magazine", "dead", "--to", "x"],
                         "--magazine is for queues"),
                        (["export", "--topic", "events", "--since", "20", "--until", "10", "--to", "x"],
                         "--until 10 is not after --since 20"),
                        (["export", "--topic", "events", "--subject-filter", "a+", "--to", "x"],
                         "--subject-filter: filter='a+': '+' must be a whole level"),
                        (["export", "--subject-filter", "a/#", "--to", "x"], "give --topic too")):
        bad = ignis_cli(*args)
        assert bad.returncode == 2 and words in bad.stderr, (args, bad.stderr)
    done = ignis_cli("--conf", "spark.ui.enabled=false", "export", "--topic", "events", "--to", str(tmp_path / "out"),
                     "-o", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["exported"] == 9
    assert list((tmp_path / "out" / "topic=events").glob("*.parquet"))


def test_subject_filter_of_the_read_is_the_subscriptions(ignis: Ignis, store_url: str) -> None:
    """The read's filter is the library's (ignis.subjects): what a subscription with that filter would select."""
    t = make_topic(ignis)
    published = publish_mixed(t, per_subject=2)
    for text in ("#", "sensors/+/temp", "sensors/#", "+", "+/+"):
        reader = IgnisReader(SourceOptions.parse({"store": store_url, "topic": "events", "subjectFilter": text,
                                                  "farmId": ignis.store.farm_id, "clientId": ignis.client_id}))
        got = {i for p in reader.partitions() for b in reader.read(p) for i in b.column("id").to_pylist()}
        assert got == {i for i, s in published.items() if subject_filter(text).matches(s)}, text
