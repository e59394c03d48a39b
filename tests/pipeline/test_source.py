"""The `ignis` data source on a real local SparkSession: batch read, pushed filters, `since`, write,
errors. The Aerospike run happens when IGNIS_TEST_AEROSPIKE is set (see conftest)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from ignis_pipeline import reader as reader_module
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.reader import IgnisReader
from ignis_pipeline.slots import SINCE_SKEW_MS
from ignis_pipeline.source import IgnisDataSource
from pyspark.sql.datasource import EqualTo, GreaterThan, In

from ignis import Ignis
from ignis.storage import open_store

ROOT = Path(__file__).resolve().parents[2]


def ignis_stats(store_url: str, queue: str) -> int:
    with Ignis(store_url, purge_interval=0) as client:
        return client.queue(queue).stats().published


def _by_id(rows: list[Any]) -> dict[str, Any]:
    return {r.id: r for r in rows}


def test_read_returns_what_was_published_in_every_magazine(ignis: Ignis, make_queue: Any, read: Any) -> None:
    q = make_queue("orders", maxDeliveries=2)
    q.publish(b"\x00raw\xff", id="raw-1", key="cust-7", headers={"trace": "t1"})
    q.publish("text", id="text-1")
    q.publish({"n": 1}, id="json-1", headers={"a": "b", "c": "d"})
    refs = q.publish_many([b"m%d" % i for i in range(20)])
    failed = q.fire_many(30)
    victims = [m for m in failed if m.id in (refs[0].id, refs[1].id)]
    q.nack(victims[:1], "timeout")  # attempts 1 < 2: sideline
    keep = {"raw-1", "text-1", "json-1", victims[0].id, victims[1].id}  # left delivered, unsettled (or nacked)
    q.ack([m for m in failed if m.id not in keep])
    rows = _by_id(read(queue="orders", magazine="all").collect())

    raw, text, js = rows["raw-1"], rows["text-1"], rows["json-1"]
    assert (raw.payload, raw.codec, raw.key, raw.headers, raw.magazine) == (b"\x00raw\xff", "bytes", "cust-7",
                                                                           {"trace": "t1"}, "main")
    assert (text.payload, text.codec, text.key, text.headers) == (b"text", "str", None, None)
    assert (js.payload, js.codec, js.headers) == (b'{"n":1}', "json", {"a": "b", "c": "d"})
    assert raw.attempts == 1 and raw.fired_at is not None  # delivered once (fire_many above), unsettled
    sidelined = rows[victims[0].id]
    assert (sidelined.magazine, sidelined.reason, sidelined.attempts) == ("sideline", "timeout", 1)
    assert [(h.reason, h.attempt) for h in sidelined.history] == [("timeout", 1)]
    in_flight = rows[victims[1].id]
    assert (in_flight.magazine, in_flight.attempts) == ("main", 1)
    acked = {m.id for m in failed} - {"raw-1", "text-1", "json-1"} - {v.id for v in victims[:2]}
    assert not acked & set(rows)  # acked messages are gone
    assert set(rows) == {"raw-1", "text-1", "json-1", victims[0].id, victims[1].id}
    # The read is a peek: nothing was claimed, stamped or acked by it.
    assert ignis.stats("orders").depth == q.stats().depth
    assert _by_id(read(queue="orders", magazine="all").collect())["raw-1"].attempts == 1


def test_dead_letters_read_after_real_failures(make_queue: Any, read: Any) -> None:
    q = make_queue("jobs", maxDeliveries=1)
    q.publish_many([b"a", b"b", b"c"])
    q.nack(q.fire_many(3), "rejected")  # attempts 1 >= maxDeliveries 1: dead letters
    dead = read(queue="jobs", magazine="dead").collect()
    assert sorted(r.payload for r in dead) == [b"a", b"b", b"c"]
    assert {(r.magazine, r.reason, r.attempts) for r in dead} == {("dead", "rejected", 1)}
    assert read(queue="jobs").count() == 0


def test_a_queue_never_published_to_reads_as_no_rows(make_queue: Any, read: Any) -> None:
    # Nothing to plan: Spark then runs a single InputPartition(None) of its own, which reads nothing.
    make_queue("untouched", shards=3)
    frame = read(queue="untouched", magazine="all")
    assert frame.count() == 0
    assert frame.columns[:3] == ["queue", "magazine", "shard"]


def test_filters_give_the_right_rows_and_none_is_pushed(store_url: str, make_queue: Any, read: Any) -> None:
    for name in ("alpha", "beta"):
        make_queue(name, shards=4).publish_many([f"{name}-{i}".encode() for i in range(40)])
    everything = read(queue="*", magazine="all").collect()
    got = read(queue="*", magazine="all").where("queue = 'beta' and shard in (1, 2) and magazine = 'main'").collect()
    expected = {r.id for r in everything if r.queue == "beta" and r.shard in (1, 2) and r.magazine == "main"}
    assert {r.id for r in got} == expected and expected

    # Spark keeps a DataFrame's read plan for its later queries (see reader.py): the reader takes no filter,
    # so that plan never depends on one query's filters.
    reader = IgnisReader(SourceOptions.parse({"store": store_url, "queue": "*", "magazine": "all"}))
    filters = [In(("shard",), (1, 2)), EqualTo(("queue",), "beta"), GreaterThan(("loaded_at",), 0)]
    assert list(reader.pushFilters(filters)) == filters
    assert {(r.queue, r.kind) for r in reader.plan().ranges} == {(q, "main") for q in ("alpha", "beta")}


def _counts(df: Any) -> dict[str, int]:
    return {kind: n for kind, n in df.groupBy("magazine").count().collect()}


def test_a_reused_dataframe_answers_every_query_right(spark: Any, store_url: str, make_queue: Any) -> None:
    import ignis_pipeline

    ignis_pipeline.register(spark)
    q = make_queue("reuse", shards=4, maxDeliveries=1)
    q.publish_many([b"m%d" % i for i in range(200)])
    q.nack(q.fire_many(30), "rejected")  # dead letters (attempts 1 = maxDeliveries)
    q.fire_many(10)  # in flight, left unsettled
    df = spark.read.format("ignis").option("store", store_url).option("queue", "reuse").option(
        "magazine", "all").load()
    truth = _counts(df)
    assert truth == {"main": 170, "dead": 30}
    everything = {r.id: r for r in df.collect()}
    # The sequence, then every filterable column, in different orders, each followed by an unfiltered
    # query on the same DataFrame.
    long_ago = "timestamp'2000-01-01 00:00:00'"
    queries: list[tuple[str, Any]] = [
        ("magazine = 'dead'", lambda r: r.magazine == "dead"),
        ("shard = 2", lambda r: r.shard == 2),
        ("queue = 'reuse' and magazine = 'main'", lambda r: r.magazine == "main"),
        ("shard in (0, 3)", lambda r: r.shard in (0, 3)),
        ("magazine in ('sideline', 'dead') and shard < 2", lambda r: r.magazine == "dead" and r.shard < 2),
        ("shard >= 1 and magazine = 'main'", lambda r: r.shard >= 1 and r.magazine == "main"),
        (f"loaded_at > {long_ago}", lambda r: True),
        (f"loaded_at < {long_ago}", lambda r: False),
        ("queue = 'other'", lambda r: False),
    ]
    for where, keep in queries + list(reversed(queries)):
        expected = {i for i, r in everything.items() if keep(r)}
        assert {r.id for r in df.where(where).select("id").collect()} == expected, where
        assert df.count() == 200, f"after {where}"
        assert len(df.collect()) == 200
    assert _counts(df) == truth


def test_a_reused_dataframe_reads_what_is_stored_now(spark: Any, store_url: str, make_queue: Any) -> None:
    import ignis_pipeline

    ignis_pipeline.register(spark)
    q = make_queue("grows", shards=8)
    q.publish_many([b"a%d" % i for i in range(5)])  # five of eight shards get one
    df = spark.read.format("ignis").option("store", store_url).option("queue", "grows").load()
    assert df.count() == 5
    assert df.where("shard = 1").count() == len([r for r in df.collect() if r.shard == 1])
    added = q.publish_many([b"b%d" % i for i in range(100)])  # every shard, empty ones included
    assert df.count() == 105
    q.ack(q.fire_many(40))
    assert df.count() == 65
    fresh = spark.read.format("ignis").option("store", store_url).option("queue", "grows").load()
    assert sorted(r.id for r in df.collect()) == sorted(r.id for r in fresh.collect())
    assert len(added) == 100


def test_a_reused_dataframe_with_since_stays_right(spark: Any, store_url: str, make_queue: Any) -> None:
    import ignis_pipeline

    ignis_pipeline.register(spark)
    q = make_queue("windowed", shards=2)
    q.publish_many([b"old%d" % i for i in range(50)])
    time.sleep((SINCE_SKEW_MS + q.store.write_grace_ms) / 1000 + 0.2)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    recent = {r.id for r in q.publish_many([b"new%d" % i for i in range(30)])}
    df = spark.read.format("ignis").option("store", store_url).option("queue", "windowed").option(
        "since", str(since)).load()
    assert {r.id for r in df.collect()} == recent
    assert df.where("shard = 0").count() == len([1 for r in df.collect() if r.shard == 0])
    assert df.where("loaded_at > timestamp'2000-01-01 00:00:00'").count() == 30
    assert df.count() == 30
    later = {r.id for r in q.publish_many([b"later%d" % i for i in range(7)])}
    assert {r.id for r in df.collect()} == recent | later


def test_partitions_are_exhaustive_and_disjoint(store_url: str, make_queue: Any, read: Any) -> None:
    q = make_queue("wide", shards=3)
    refs = q.publish_many([b"x%d" % i for i in range(500)])
    reader = IgnisReader(SourceOptions.parse({"store": store_url, "queue": "wide", "slotsPerPartition": "37"}))
    ranges = reader.plan().ranges
    assert all(r.size <= 37 for r in ranges)
    covered = [(r.shard, slot) for r in ranges for slot in range(r.first, r.last + 1)]
    assert len(covered) == len(set(covered)) == 500
    assert set(covered) == {(ref.shard, ref.slot) for ref in refs}
    rows = read(queue="wide", slotsPerPartition=37).select("id").collect()
    assert sorted(r.id for r in rows) == sorted(ref.id for ref in refs)


class CountingStore:
    """A real store that counts the slots its peeks cover (to see how much a read touches)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.slots = 0
        self.calls = 0

    def peek(self, magazine: str, shard: int, first: int, last: int, only: Any = None) -> Any:
        self.calls += 1
        self.slots += max(0, last - first + 1)
        return self.store.peek(magazine, shard, first, last, only)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_since_reads_about_one_percent_of_a_big_queue(store_url: str, make_queue: Any, read: Any,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    q = make_queue("big", shards=4)
    payloads = [b"p" * 16] * 1_000
    for _ in range(99):
        q.publish_many(payloads)
    # Beyond the search's allowance for producers' clock order (1 s, plus the store's write grace: 0 on lmdb).
    time.sleep((SINCE_SKEW_MS + q.store.write_grace_ms) / 1000 + 0.2)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    recent = {ref.id for ref in q.publish_many(payloads)}

    store = open_store(store_url, purge_interval=0)
    counting = CountingStore(store)
    monkeypatch.setattr(reader_module, "open_driver_store", lambda _: counting)
    monkeypatch.setattr(reader_module, "task_store", lambda _: counting)
    source = IgnisDataSource({"store": store_url, "queue": "big", "since": str(since)})
    r = source.reader(None)
    ids = {i for p in r.partitions() for batch in r.read(p) for i in batch.column("id").to_pylist()}
    store.close()
    assert ids == recent
    # 100,000 slots in all: the search plus the read touch about 1% of them, in a few dozen calls.
    assert counting.slots <= 1_300, counting.slots
    assert counting.calls <= 100, counting.calls
    assert {r.id for r in read(queue="big", since=since).select("id").collect()} == recent


def test_since_skips_nothing_over_holes_acks_and_moved_messages(store_url: str, make_queue: Any) -> None:
    q = make_queue("holey", shards=1, maxDeliveries=5)
    old = q.publish_many([b"old%d" % i for i in range(300)])
    q.ack(q.fire_many(150))  # acked prefix: holes for the search
    time.sleep((SINCE_SKEW_MS + q.store.write_grace_ms) / 1000 + 0.2)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    new = q.publish_many([b"new%d" % i for i in range(50)])
    # A message moved back into main after `since` keeps its old load time: not in the window.
    q.nack(q.fire_many(1), "rejected")
    with Ignis(store_url, purge_interval=0) as other:
        epoch = other.store.next_epoch()
        from ignis_workers.shovel import Shovel

        Shovel(other.store, epoch_source=lambda: epoch).shovel_queue(other.client_id, "holey")
    tail = q.publish_many([b"tail%d" % i for i in range(5)])
    reader = IgnisDataSource({"store": store_url, "queue": "holey", "since": str(since)}).reader(None)
    got = {i for p in reader.partitions() for b in reader.read(p) for i in b.column("id").to_pylist()}
    assert got == {r.id for r in new + tail}
    assert len(old) == 300


def test_write_publishes_rows_with_ids_keys_headers(spark: Any, store_url: str, make_queue: Any, read: Any) -> None:
    q = make_queue("sink", shards=4)
    rows = [(f"payload-{i}", f"id-{i}", f"k{i % 3}" if i % 2 else None, {"n": str(i)} if i % 4 == 0 else None)
            for i in range(200)]
    df = spark.createDataFrame(rows, "payload string, id string, key string, headers map<string,string>")
    df.repartition(3).write.format("ignis").option("store", store_url).option("queue", "sink").option(
        "chunkSize", 17).mode("append").save()
    got = {m.id: m for m in q.fire_many(500)}
    assert set(got) == {f"id-{i}" for i in range(200)}
    for payload, msg_id, key, headers in rows:
        m = got[msg_id]
        assert (m.payload, m.key, m.headers or None) == (payload, key, headers)
    # Keyed messages keep per-key shards.
    assert len({got[f"id-{i}"].ref.shard for i in range(1, 200, 6)}) == 1


def test_write_generates_ids_when_there_are_none(spark: Any, store_url: str, make_queue: Any) -> None:
    q = make_queue("gen", shards=2)
    spark.createDataFrame([(bytes([i]),) for i in range(50)], "payload binary").write.format("ignis").option(
        "store", store_url).option("queue", "gen").mode("append").save()
    got = q.fire_many(100)
    assert sorted(m.data for m in got) == [bytes([i]) for i in range(50)]
    assert len({m.id for m in got}) == 50 and all(len(m.id) == 32 for m in got)


def _error(call: Any) -> str:
    with pytest.raises(Exception) as caught:
        call()
    return str(caught.value)


def test_bad_input_is_one_clear_error_and_writes_nothing(spark: Any, store_url: str, make_queue: Any,
                                                         read: Any) -> None:
    q = make_queue("strict", shards=2)

    def write(df: Any, mode: str = "append", **options: str) -> Any:
        w = df.write.format("ignis").option("store", store_url).mode(mode)
        for k, v in options.items():
            w = w.option(k, v)
        return lambda: w.save()

    ok = spark.createDataFrame([(b"x",)], "payload binary")
    assert "option queue (or topic) is missing" in _error(write(ok))
    assert "queue 'nope' not found" in _error(write(ok, queue="nope"))
    assert "cannot be overwritten" in _error(write(ok, "overwrite", queue="strict"))
    assert "needs a column 'payload'" in _error(write(spark.createDataFrame([("x",)], "body string"), queue="strict"))
    assert "column payload is int" in _error(write(spark.createDataFrame([(1,)], "payload int"), queue="strict"))
    assert "unknown column(s) extra" in _error(write(spark.createDataFrame([(b"x", 1)], "payload binary, extra int"),
                                                     queue="strict"))
    big = spark.createDataFrame([(b"x",)] * 5 + [(b"y" * (2 << 20),)], "payload binary").coalesce(1)
    assert "exceeds the maximum of 1048576 bytes" in _error(write(big, queue="strict"))
    assert "unknown option(s) bogus" in _error(lambda: read(queue="strict", bogus=1).collect())
    assert "option magazine='nope'" in _error(lambda: read(queue="strict", magazine="nope").collect())
    assert "option since='yesterday'" in _error(lambda: read(queue="strict", since="yesterday").collect())
    assert "queue 'missing' not found" in _error(lambda: read(queue="missing").collect())
    assert q.stats().published == 0  # nothing of any of it was written


def test_a_worker_freezes_its_long_lived_objects_once_and_a_driver_never(spark: Any) -> None:
    import gc

    from ignis_pipeline.stores import freeze_worker_objects

    before = gc.get_freeze_count()
    assert freeze_worker_objects() is False  # not in a Spark task: this process is left alone
    assert gc.get_freeze_count() == before

    def in_task(_: Any) -> Any:
        import gc

        from ignis_pipeline.stores import freeze_worker_objects

        freeze_worker_objects()  # True in a fresh worker, False in one an earlier task froze: either is right
        yield (freeze_worker_objects(), gc.get_freeze_count() > 0)

    assert spark.sparkContext.parallelize(range(4), 4).mapPartitions(in_task).collect() == [(False, True)] * 4


def test_read_windows_cover_a_range_once_with_small_ends() -> None:
    from ignis_pipeline.reader import EDGE_WINDOWS, PEEK_WINDOW, windows

    for first, last in [(1, 31_250), (7, 7), (1, 100), (1, 2 * sum(EDGE_WINDOWS)), (1, 2 * sum(EDGE_WINDOWS) + 1),
                        (1_000, 50_000)]:
        cut = windows(first, last)
        slots = [slot for start, end in cut for slot in range(start, end + 1)]
        assert slots == list(range(first, last + 1))  # every slot once, in order
        assert max(end - start + 1 for start, end in cut) <= PEEK_WINDOW
        if last - first + 1 > 2 * sum(EDGE_WINDOWS):
            sizes = [end - start + 1 for start, end in cut]
            assert sizes[:2] == list(EDGE_WINDOWS) and sizes[-2:] == list(reversed(EDGE_WINDOWS))
    assert windows(5, 4) == []


def test_store_credentials_are_refused_in_options() -> None:
    with pytest.raises(Exception, match="carries credentials") as caught:
        SourceOptions.parse({"store": "aerospike://admin:s3cret@db:3000/ignis", "queue": "q"})
    assert "s3cret" not in str(caught.value)


def test_lmdb_store_is_refused_on_another_host(store_url: str) -> None:
    from ignis_pipeline.stores import check_host

    from ignis.errors import StoreUnavailable

    options = SourceOptions.parse({"store": store_url, "queue": "q"})
    moved = SourceOptions(**{**options.__dict__, "planner_host": "driver-elsewhere"})
    if options.is_lmdb:
        with pytest.raises(StoreUnavailable, match="only with a local master"):
            check_host(moved)
    else:
        check_host(moved)  # every executor reaches Aerospike with the same URL


def test_a_job_refuses_lmdb_with_a_master_on_other_hosts() -> None:
    from ignis_pipeline.session import check_master

    from ignis.errors import InvalidInputError

    for master in ("spark://spark-master:7077", "spark://10.1.2.3:7077", "spark://127.0.0.1:7077,spark-b:7077",
                   "yarn", "k8s://https://127.0.0.1:6443", "spark://myhost.example:7077"):
        with pytest.raises(InvalidInputError, match="local master"):
            check_master(master, "lmdb:///data")
        check_master(master, "aerospike://aero:3000/ignis")  # every executor reaches Aerospike with the same URL
    # Every executor on this host: local masters, and a standalone master on the loopback address.
    for master in ("local", "local[2]", "local[*]", "local-cluster[2,1,1024]", "spark://127.0.0.1:7077",
                   "spark://localhost:7077", "spark://[::1]:7077", "spark://127.0.0.1:7077,127.0.0.1:7078"):
        check_master(master, "lmdb:///data")


def test_a_bad_read_fails_at_load_with_the_message_on_the_first_line(spark: Any, ignis: Ignis, store_url: str,
                                                                      make_queue: Any) -> None:
    from ignis.errors import QueueNotFound

    make_queue("real")

    def first_line(**options: str) -> str:
        reader = spark.read.format("ignis").option("store", store_url)
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception) as caught:
            reader.load()  # no action: the options and the queues are checked when the DataFrame is made
        return str(caught.value).splitlines()[0]

    missing = QueueNotFound("nosuch", ignis.client_id)
    assert first_line(queue="real,nosuch").endswith(f"ignis.errors.QueueNotFound: {missing}")
    assert first_line(queue="real", magazine="nope").endswith(
        "ignis.errors.InvalidInputError: option magazine='nope': must be main, sideline, dead or all")
    assert first_line(queue="real", bogus="1").endswith(
        "ignis.errors.InvalidInputError: unknown option(s) bogus for format 'ignis'; known: store, clientId, farmId, "
        "queue, topic, magazine, since, until, startingTimestamp, endingTimestamp, subjectFilter, slotsPerPartition, "
        "maxMessagesPerTrigger, chunkSize, maxMessagesPerSecondPerTask, delay")
    assert first_line().endswith(
        "ignis.errors.InvalidInputError: option queue (or topic) is missing: name one queue, a comma list, or * for "
        "every queue; or option topic: a topic, or a comma list of topics")
    data = spark.createDataFrame([(b"x",)], "payload binary")
    with pytest.raises(Exception) as caught:
        data.write.format("ignis").option("store", store_url).option("queue", "nosuch").mode("append").save()
    assert str(caught.value).splitlines()[0].endswith(f"ignis.errors.QueueNotFound: {missing}")
    assert spark.read.format("ignis").option("store", store_url).option("queue", "real").load().count() == 0


def test_register_leaves_the_sessions_own_errors_and_interpreter_alone(spark: Any) -> None:
    import ignis_pipeline

    before = (spark.sparkContext.pythonExec, dict(spark.sparkContext.environment))
    ignis_pipeline.register(spark)
    assert (spark.sparkContext.pythonExec, dict(spark.sparkContext.environment)) == before
    assert spark.conf.get("spark.sql.execution.pyspark.udf.hideTraceback.enabled") == "false"  # UDFs keep theirs


def test_the_docs_data_source_snippet_runs_with_the_venv_python_not_activated(store_url: str, make_queue: Any,
                                                                               tmp_path: Path) -> None:
    """The snippet of docs/pipeline/index.md as written, run by the venv's interpreter with the venv not
    activated: no venv on PATH, no PYSPARK_PYTHON. Only its store (the option, and IGNIS_STORE for the calls
    that name none) and its output paths are pointed at this test's."""
    if not store_url.startswith("lmdb:"):
        pytest.skip("one store is enough: this is about the interpreter of Spark's Python workers")
    text = (ROOT / "docs" / "pipeline" / "index.md").read_text()
    code = text.split("## The data source", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert 'ignis_pipeline.register(spark)' in code and "lmdb:///var/lib/ignis" in code
    code = (code.replace("lmdb:///var/lib/ignis", store_url).replace("/data/orders", str(tmp_path / "out"))
            .replace("/data/ckpt", str(tmp_path / "ckpt")))
    q = make_queue("orders", shards=2, maxDeliveries=1)
    make_queue("orders-copy", shards=2)
    q.publish_many([b"m%d" % i for i in range(20)])
    q.nack(q.fire_many(5), "timeout")  # five dead letters with reason timeout, for the snippet's query
    script = tmp_path / "snippet.py"
    script.write_text(code + textwrap.dedent(f"""
        for query in spark.streams.active:  # the snippet's stream: let it consume what is there, then stop
            query.processAllAvailable()
            query.stop()
        print("ROWS", spark.read.parquet({str(tmp_path / "out")!r}).count())
    """))
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
                                                             "PYTHONPATH")}
    env["IGNIS_STORE"] = store_url  # the snippet's write and stream name no store: IGNIS_STORE, as documented
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != Path(sys.executable).parent.resolve())
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    out = proc.stdout.decode()
    shown = re.findall(r"^\|\s*(\d+)\|\s*(\d+)\|$", out, re.MULTILINE)  # .show() of shard | count
    assert sum(int(count) for _, count in shown) == 5, out
    assert out.strip().endswith("ROWS 15")  # every main message consumed into the sink
    assert ignis_stats(store_url, "orders-copy") == 20  # the snippet's write: every row of `df` published


def test_write_delays_rows_by_the_delay_option_or_their_due_at_and_the_read_shows_due_at(
        spark: Any, store_url: str, make_queue: Any, read: Any) -> None:
    import datetime as dt

    q = make_queue("later", shards=2)
    rows = [("due-later", dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)),
            ("due-already", dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)), ("no-due", None)]
    spark.createDataFrame(rows, "payload string, due_at timestamp").write.format("ignis").option(
        "store", store_url).option("queue", "later").mode("append").save()
    assert sorted(m.payload for m in q.fire_many(10)) == ["due-already", "no-due"]
    assert q.stats().delayed == 1  # due-later waits
    spark.createDataFrame([("optioned",)], "payload string").write.format("ignis").option(
        "store", store_url).option("queue", "later").option("delay", "1").mode("append").save()
    assert q.stats().delayed == 2
    got, deadline = [], time.monotonic() + 15
    while not got and time.monotonic() < deadline:
        got += q.fire_many(10, timeout=0.5)
    assert [m.payload for m in got] == ["optioned"] and got[0].envelope.due_at is not None
    exported = {r["payload"]: r["due_at"] for r in read(queue="later").collect()}  # (claimed, not acked: stored)
    assert exported[b"optioned"] is not None and exported[b"no-due"] is None
    with pytest.raises(Exception, match=r"delay 4e\+08 s is longer than queue later's messageExpirySeconds"):
        spark.createDataFrame([("x",)], "payload string").write.format("ignis").option(
            "store", store_url).option("queue", "later").option("delay", "400000000").mode("append").save()
