"""The data source and the jobs on a real Spark standalone cluster: a master and two workers on 127.0.0.1
(tests/support/spark_cluster.py), so every task runs in an executor JVM of its own, in that JVM's Python
workers, and reaches the store itself.

Stores: lmdb in CI (one host: a master on the loopback address has its workers on this host, which is
what lmdb needs), and a real Aerospike server when IGNIS_TEST_AEROSPIKE is set (the emulator lives in
the test process, which no executor can reach)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ignis_pipeline.jobs.export import export
from ignis_pipeline.jobs.redrive import redrive
from ignis_pipeline.jobs.replay import replay
from ignis_pipeline.jobs.stats import stats
from support.polling import figure_lag, settles_to

from ignis import Ignis

pytestmark = pytest.mark.spark_cluster


@pytest.fixture
def store(ignis: Ignis, store_url: str) -> dict[str, str]:
    from ignis_pipeline.options import SourceOptions

    parsed = SourceOptions.parse({"store": store_url, "queue": "*", "farmId": ignis.store.farm_id,
                                  "clientId": ignis.client_id})
    return {"store": parsed.store, "farmId": parsed.farm_id, "clientId": parsed.client_id}


def _stored(q: Any, magazine: str | None = None) -> dict[str, Any]:
    """id -> envelope of every record of one magazine of a queue, read with the library."""
    name = magazine or q.name
    out = {}
    for shard, p in q.store.pointers(name, q.spec.shards).items():
        if p.load:
            out.update({env.msg_id: env for _, env in q.store.peek(name, shard, 1, p.load)})
    return out


def test_tasks_run_in_executor_jvms_and_their_own_python_workers(cluster_spark: Any) -> None:
    def where(_: Any) -> Any:
        import os

        def parent(pid: int) -> int:
            with open(f"/proc/{pid}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])

        def command(pid: int) -> str:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode()

        pid = os.getpid()
        jvm = parent(pid)
        while jvm > 1 and "java" not in command(jvm).split(" ", 1)[0]:
            jvm = parent(jvm)
        yield pid, jvm, command(jvm)

    found = cluster_spark.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect()
    driver_jvm = int(cluster_spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    assert {pid for pid, _, _ in found}.isdisjoint({os.getpid()})
    jvms = {jvm: cmd for _, jvm, cmd in found}
    assert driver_jvm not in jvms
    assert all("org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd for cmd in jvms.values()), jvms
    assert len(jvms) == 2  # both executors (one per worker) ran tasks


def test_read_and_write_on_the_cluster(cluster_spark: Any, store_url: str, make_queue: Any) -> None:
    q = make_queue("orders", shards=4, maxDeliveries=1)
    q.publish_many([b"m%d" % i for i in range(1_500)], headers={"src": "cluster"})
    q.nack(q.fire_many(100), "rejected")  # dead letters
    df = (cluster_spark.read.format("ignis").option("store", store_url).option("queue", "orders")
          .option("magazine", "all").option("slotsPerPartition", 97).load())
    rows = df.select("id", "magazine", "payload", "headers").collect()
    main, dead = _stored(q), _stored(q, f"{q.name}_DEAD")
    assert len(main) == 1_400 and len(dead) == 100
    assert {r.id: (r.magazine, r.payload) for r in rows} == {
        **{i: ("main", e.payload) for i, e in main.items()}, **{i: ("dead", e.payload) for i, e in dead.items()}}
    assert {r.headers["src"] for r in rows} == {"cluster"}
    assert df.where("magazine = 'dead'").count() == 100 and df.count() == 1_500  # reused DataFrame stays right
    more = q.publish_many([b"later"] * 30)
    assert df.count() == 1_530 and len(more) == 30

    sink = make_queue("sink", shards=3)
    data = cluster_spark.createDataFrame([(f"p{i}", f"id-{i}", f"k{i % 7}") for i in range(3_000)],
                                         "payload string, id string, key string").repartition(6)
    data.write.format("ignis").option("store", store_url).option("queue", "sink").option("chunkSize", 250) \
        .mode("append").save()
    written = _stored(sink)
    assert {i: (e.payload, e.key) for i, e in written.items()} == {
        f"id-{i}": (f"p{i}".encode(), f"k{i % 7}") for i in range(3_000)}


def test_jobs_on_the_cluster(cluster_spark: Any, store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    q = make_queue("work", shards=4, maxDeliveries=1)
    q.publish_many([b"t%d" % i for i in range(40)], headers={"kind": "t"})
    q.publish_many([b"o%d" % i for i in range(60)], key="cust-1")
    for m in q.fire_many(100):  # maxDeliveries 1: dead letters, 40 timeouts and 60 rejected
        q.nack([m], "timeout" if m.data.startswith(b"t") else "rejected")
    q.publish_many([b"x%d" % i for i in range(500)])

    done = export(cluster_spark, store, ["work"], str(tmp_path / "e"), magazine="all")
    assert done["exported"] == 600
    copy = make_queue("copy", shards=2)
    replayed = replay(cluster_spark, store, str(tmp_path / "e"), "copy")
    assert (replayed["published"], replayed["leftOut"]) == (500, 100)  # main rows only, by default
    assert {i: e.payload for i, e in _stored(copy).items()} == {i: e.payload for i, e in _stored(q).items()}

    timeouts = {i for i, e in _stored(q, "work_DEAD").items() if e.reason == "timeout"}
    moved = redrive(cluster_spark, store, "work", "dead", where="reason = 'timeout' and headers['kind'] = 't'")
    assert (moved["moved"], moved["gone"], len(timeouts)) == (40, 0, 40)
    assert timeouts <= set(_stored(q))
    assert {e.reason for e in _stored(q, "work_DEAD").values()} == {"rejected"}

    doc = stats(cluster_spark, store, ["work"])
    rows = {r["magazine"]: r for r in doc["magazines"]}
    assert (rows["main"]["stored"], rows["dead"]["stored"]) == (540, 60)
    assert (rows["main"]["depth"], rows["dead"]["depth"]) == (q.stats().depth, q.stats().dead) == (540, 60)
    assert rows["dead"]["reasons"] == {"rejected": 60}
    assert sum(rows["main"]["shards"].values()) == 540


def test_streaming_on_the_cluster(cluster_spark: Any, store_url: str, make_queue: Any, tmp_path: Path) -> None:
    q = make_queue("events", shards=4)
    published = {r.id for r in q.publish_many([b"e%d" % i for i in range(400)])}
    sink: list[str] = []

    def handle(df: Any, batch_id: int) -> None:
        sink.extend(r.id for r in df.select("id").collect())

    query = (cluster_spark.readStream.format("ignis").option("store", store_url).option("queue", "events")
             .option("maxMessagesPerTrigger", 150).load()
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert set(sink) == published
    assert q.stats().depth == 0  # every batch acked

    # Trigger.AvailableNow on the cluster: what is there at the start, then it stops by itself.
    now = {r.id for r in q.publish_many([b"n%d" % i for i in range(250)])}
    sink.clear()
    query = (cluster_spark.readStream.format("ignis").option("store", store_url).option("queue", "events")
             .option("maxMessagesPerTrigger", 100).load()
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "ckpt-now"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "an AvailableNow query must stop by itself"
    assert set(sink) == now and len(sink) == 250


def test_spark_submit_of_a_job_runs_on_the_cluster(spark_cluster: Any, cluster_spark: Any, ignis: Ignis,
                                                  store_url: str, make_queue: Any, tmp_path: Path) -> None:
    """`spark-submit --master spark://... jobs/export.py`: an application of its own on the cluster, beside the
    tests' session (which keeps its cores), with spark-submit's master, through the `ignis pipeline` CLI."""
    import ignis_pipeline.jobs.export as export_job
    from support.spark_cluster import spark_home

    make_queue("cli", shards=2).publish_many([b"c%d" % i for i in range(77)])
    env = {**os.environ, "IGNIS_STORE": store_url, "IGNIS_CLIENT_ID": ignis.client_id,
           "IGNIS_FARM_ID": ignis.store.farm_id, "PYSPARK_PYTHON": sys.executable}
    conf = [arg for key, value in spark_cluster.session_conf().items() for arg in ("--conf", f"{key}={value}")]
    submit = subprocess.run([str(spark_home() / "bin" / "spark-submit"), "--master", spark_cluster.master_url,
                             *conf, export_job.__file__, "cli", "--to", str(tmp_path / "out"), "-o", "json"],
                            capture_output=True, env=env, timeout=300)
    assert submit.returncode == 0, (submit.stdout + submit.stderr).decode()[-3000:]
    assert json.loads(submit.stdout)["exported"] == 77
    assert len(list((tmp_path / "out" / "queue=cli" / "magazine=main").glob("*.parquet"))) >= 1
    assert "ignis-pipeline-export" in [a["name"] for a in spark_cluster.status()["completedapps"]]


def test_cluster_status_lists_the_tests_application(spark_cluster: Any, cluster_spark: Any) -> None:
    running = spark_cluster.status()["activeapps"]
    assert [a["name"] for a in running] == ["ignis-cluster-tests"]


def test_delayed_writes_and_due_at_reads_on_the_cluster(cluster_spark: Any, store_url: str,
                                                        make_queue: Any) -> None:
    """Issue 28 on executors: rows written with a `due_at` column and with the `delay` option are stored as
    delayed messages by the executors' writers (none fireable before its due time), and the reader's `due_at`
    column shows a moved message's due time."""
    import datetime as dt
    import time

    from ignis.envelope import now_ms

    q = make_queue("later", shards=3)
    now = dt.datetime.now(dt.UTC)
    rows = [(f"later-{i}", now + dt.timedelta(minutes=10)) for i in range(40)] + \
        [(f"now-{i}", None) for i in range(40)]
    cluster_spark.createDataFrame(rows, "payload string, due_at timestamp").repartition(4).write.format(
        "ignis").option("store", store_url).option("queue", "later").mode("append").save()
    assert q.stats().delayed == 40 and q.stats().depth == 40
    cluster_spark.createDataFrame([(f"soon-{i}",) for i in range(20)], "payload string").repartition(2).write \
        .format("ignis").option("store", store_url).option("queue", "later").option("delay", "2").mode("append") \
        .save()
    assert q.stats().delayed == 60
    first = q.fire_many(100)
    assert sorted(m.payload for m in first) == sorted(f"now-{i}" for i in range(40))  # (a string column: str)
    q.ack(first)
    got: list[tuple[Any, int]] = []
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        batch = q.fire_many(100, timeout=0.5)
        got += [(m, now_ms()) for m in batch]
    assert sorted(m.payload for m, _ in got) == sorted(f"soon-{i}" for i in range(20))
    # Due 2 s after its task began writing (the `delay` option, counted from the end of the millisecond its clock
    # read: ignis.envelope.due_after), stored a moment later: later than its publish.
    assert all(0 < m.envelope.due_at - m.envelope.loaded_at <= 2001 for m, _ in got)
    assert all(fired >= m.envelope.due_at for m, fired in got)  # and none fired before it
    df = cluster_spark.read.format("ignis").option("store", store_url).option("queue", "later").load()
    dues = {r.payload: r.due_at for r in df.select("payload", "due_at").collect()}  # claimed, not acked: stored
    assert set(dues) == {f"soon-{i}".encode() for i in range(20)} and all(d is not None for d in dues.values())
    # The ten-minute ones wait, in no magazine the reader reads (on Aerospike the last move's settle may follow
    # the copy these fires took: support.polling.figure_lag).
    settles_to(lambda: q.stats().delayed, 40, figure_lag(q.main.store), "delayed once the soon ones were fired")


def test_topics_on_the_cluster(cluster_spark: Any, ignis: Ignis, store_url: str, tmp_path: Path) -> None:
    """Issue 48's Spark part on executors: a topic's retained log read with a publish-time window and a subject
    filter, a write that publishes rows with their subjects, and a subscription streamed (commit = ack)."""
    import time

    from ignis import QueueSpec, TopicSpec
    from ignis.envelope import now_ms

    ignis.apply(TopicSpec.build(name="events", shards=4))
    ignis.apply(QueueSpec.build(name="temps", handlerType="temps", shards=2,
                                subscribe={"topic": "events", "filter": "sensors/+/temp", "start": "earliest"}))
    t = ignis.topic("events")
    old = {r.id: "sensors/hall/temp" for r in t.publish_many([b"o%d" % i for i in range(300)],
                                                             subject="sensors/hall/temp")}
    time.sleep(0.05)
    starting = now_ms()
    time.sleep(0.05)
    subjects = ["sensors/kitchen/temp", "sensors/kitchen/humidity", "alerts"]
    rows = [(f"p{i}", subjects[i % 3], f"id-{i}", f"k{i % 5}") for i in range(1_200)]
    cluster_spark.createDataFrame(rows, "payload string, subject string, id string, key string").repartition(4) \
        .write.format("ignis").option("store", store_url).option("topic", "events").option("chunkSize", 100) \
        .mode("append").save()
    written = {f"id-{i}": subjects[i % 3] for i in range(1_200)}

    df = (cluster_spark.read.format("ignis").option("store", store_url).option("topic", "events")
          .option("slotsPerPartition", 97).load())
    got = {r.id: r.subject for r in df.select("id", "subject").collect()}
    assert got == {**old, **written}
    windowed = (cluster_spark.read.format("ignis").option("store", store_url).option("topic", "events")
                .option("startingTimestamp", starting).option("subjectFilter", "sensors/kitchen/#").load())
    assert {r.id for r in windowed.select("id").collect()} == {i for i, s in written.items()
                                                             if s.startswith("sensors/kitchen")}

    sink: list[str] = []
    query = (cluster_spark.readStream.format("ignis").option("store", store_url).option("queue", "temps")
             .option("maxMessagesPerTrigger", 150).load()
             .writeStream.foreachBatch(lambda frame, _: sink.extend(r.id for r in frame.select("id").collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    temps = {i for i, s in {**old, **written}.items() if s.endswith("/temp")}
    assert set(sink) == temps
    stats = ignis.queue("temps").stats(in_flight=True)
    assert (stats.depth, stats.in_flight) == (0, 0)  # every batch acked
