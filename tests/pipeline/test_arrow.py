"""The read's Arrow batches, the export that writes them with pyarrow in its tasks (jobs/arrow_export.py: no
row conversion in Spark's JVM), and the check that a Spark master answers before a session starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ignis_pipeline import schema
from ignis_pipeline.jobs import arrow_export
from ignis_pipeline.jobs.export import export, read_export, read_options
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.reader import IgnisReader
from ignis_pipeline.session import check_master_answers, master_addresses

from ignis import Ignis
from ignis.envelope import Envelope, now_ms
from ignis.errors import InvalidInputError

IGNIS = Path(sys.executable).parent / "ignis"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(ignis: Ignis, store_url: str) -> dict[str, str]:
    return {"store": store_url, "farmId": ignis.store.farm_id, "clientId": ignis.client_id}


def _ts(ms: int | None) -> datetime | None:
    return None if ms is None else EPOCH + timedelta(milliseconds=ms)


def mixed_queue(make_queue: Any) -> Any:
    """A queue holding every kind of record the reader meets: bytes, str and JSON payloads, keys, headers,
    delivered (stamped) messages, a sideline with a reason and history, a dead letter with a history of
    three failures that was due later than it was loaded (due_at), a message delayed for ten minutes (in no
    magazine yet: not read), and a record that is no IgnisMQ message (unreadable)."""
    q = make_queue("mixed", shards=3, maxDeliveries=2)
    q.publish(b"\x00raw\xff", id="raw-1", key="cust-7", headers={"trace": "t1"})
    q.publish("text \u00e9", id="text-1")
    q.publish({"n": 1, "s": "x"}, id="json-1", headers={"a": "b", "c": "d"})
    refs = q.publish_many([b"m%d" % i for i in range(30)])
    q.publish_many([f"s{i}" for i in range(20)], key="cust-1", headers={"h": "v"})
    q.publish(b"later", id="delayed-1", delay=600)
    fired = q.fire_many(12)  # delivered once, unsettled: fired_at and attempts set
    q.nack(fired[:3], "timeout")  # attempts 1 < maxDeliveries 2: the sideline, history of one
    at = now_ms()
    q.dead.load([Envelope(b"dead", "dead-1", at - 5000, headers={"x": "y"}, key="cust-9", fire_ts=at - 1000,
                          attempts=3, reason="rejected", due_at=at - 4000,
                          history=[[at - 3000, "timeout", 1], [at - 2000, "timeout", 2], [at - 1000, "rejected", 3]])])
    forged = next(r.ref for r in refs if r.id not in {m.id for m in fired})
    if hasattr(q.store, "client"):  # another tool overwrote a record: the raw client, the lmdb internals
        q.store.client.put(q.store._ctx.data_key(forged), {"payload": 12345, "msgId": "x", "loadedAt": 1},
                           policy={"exists": 3, "ttl": -2})
    else:
        with q.store._ctx.env.env.begin(write=True) as txn:
            txn.put(q.store._ctx.data_key(forged), b"\x00\x01", db=q.store._ctx.data)
    return q


def stored_rows(q: Any) -> list[dict[str, Any]]:
    """Every record of the queue's three magazines as a row of the data source's schema, built from the
    store's own peek, field by field (not with schema.to_batch)."""
    rows = []
    for kind, magazine in (("main", q.main), ("sideline", q.sideline), ("dead", q.dead)):
        for shard, p in magazine.pointers().items():
            if not p.load:
                continue
            for ref, env in q.store.peek(magazine.name, shard, 1, p.load):
                rows.append({
                    "queue": q.name, "magazine": kind, "shard": shard, "slot": ref.slot, "id": env.msg_id,
                    "payload": env.payload, "codec": env.codec, "key": env.key,
                    "headers": sorted(env.headers.items()) if env.headers else None,
                    "loaded_at": _ts(env.loaded_at), "fired_at": _ts(env.fire_ts), "attempts": env.attempts,
                    "reason": env.reason,
                    "history": [{"reason": r, "at": _ts(t), "attempt": a} for t, r, a in env.history]
                    if env.history else None, "due_at": _ts(env.due_at)})
    return sorted(rows, key=lambda r: (r["magazine"], r["shard"], r["slot"]))


def _normal(row: dict[str, Any]) -> dict[str, Any]:
    """A row as pyarrow or Spark gives it, headers as sorted pairs (a map is pairs in Arrow, a dict in Spark)."""
    headers = row["headers"]
    if isinstance(headers, dict):
        headers = sorted(headers.items())
    elif headers is not None:
        headers = sorted(headers)
    history = row["history"]
    if history is not None:
        history = [h.asDict() if hasattr(h, "asDict") else dict(h) for h in history]
    return {**row, "headers": headers, "history": history}


def test_reader_batches_carry_every_field_of_a_mixed_queue(ignis: Ignis, store: dict[str, str],
                                                           make_queue: Any) -> None:
    q = mixed_queue(make_queue)
    reader = IgnisReader(SourceOptions.parse(read_options(store, ["mixed"], "all")))
    batches = [b for p in reader.partitions() for b in reader.read(p)]
    assert batches and all(isinstance(b, pa.RecordBatch) and b.schema.equals(schema.ARROW_SCHEMA) for b in batches)
    rows = sorted((_normal(r) for r in pa.Table.from_batches(batches).to_pylist()),
                  key=lambda r: (r["magazine"], r["shard"], r["slot"]))
    assert rows == stored_rows(q)
    by_id = {r["id"]: r for r in rows}
    assert len(rows) == 3 + 30 + 20 + 1  # the three singles, the two lots, the dead letter
    raw = by_id["raw-1"]
    assert (raw["payload"], raw["codec"], raw["key"], raw["headers"]) == (b"\x00raw\xff", "bytes", "cust-7",
                                                                         [("trace", "t1")])
    assert (by_id["text-1"]["payload"], by_id["text-1"]["codec"]) == ("text \u00e9".encode(), "str")
    assert (by_id["json-1"]["payload"], by_id["json-1"]["codec"]) == (b'{"n":1,"s":"x"}', "json")
    sidelined = [r for r in rows if r["magazine"] == "sideline"]
    assert len(sidelined) == 3
    assert all(r["reason"] == "timeout" and [(h["reason"], h["attempt"]) for h in r["history"]] == [("timeout", 1)]
               for r in sidelined)
    dead = by_id["dead-1"]
    assert (dead["magazine"], dead["reason"], dead["attempts"], dead["key"]) == ("dead", "rejected", 3, "cust-9")
    assert [(h["reason"], h["attempt"]) for h in dead["history"]] == [("timeout", 1), ("timeout", 2),
                                                                      ("rejected", 3)]
    assert dead["history"][0]["at"] == dead["fired_at"] - timedelta(seconds=2)
    assert dead["due_at"] == dead["loaded_at"] + timedelta(seconds=1)
    assert [r["id"] for r in rows if r["due_at"] is not None] == ["dead-1"]  # delayed-1 is not due: unread
    unreadable = [r for r in rows if r["codec"] == "unreadable"]
    assert len(unreadable) == 1 and unreadable[0]["reason"] == "unreadable"
    assert "ignis-unreadable" in dict(unreadable[0]["headers"])
    delivered = [r for r in rows if r["magazine"] == "main" and r["fired_at"] is not None]
    assert len(delivered) == 12 - 3 and all(r["attempts"] == 1 for r in delivered)


def _writer_of(root: Path) -> set[str]:
    return {pq.ParquetFile(f).metadata.created_by.split(" version")[0] for f in root.rglob("*.parquet")}


def test_arrow_export_writes_what_spark_writer_writes(spark: Any, ignis: Ignis, store: dict[str, str],
                                                      make_queue: Any, read: Any, tmp_path: Path) -> None:
    mixed_queue(make_queue)
    arrow_out, spark_out = tmp_path / "arrow", tmp_path / "spark"
    assert arrow_export.usable(spark, str(arrow_out)) == arrow_out
    done = export(spark, store, ["mixed"], str(arrow_out), magazine="all")
    spark.conf.set(arrow_export.ARROW_CONF, "false")
    try:
        assert arrow_export.usable(spark, str(spark_out)) is None
        assert export(spark, store, ["mixed"], str(spark_out), magazine="all")["exported"] == done["exported"] == 54
    finally:
        spark.conf.unset(arrow_export.ARROW_CONF)
    assert _writer_of(arrow_out) == {"parquet-cpp-arrow"} and _writer_of(spark_out) == {"parquet-mr"}
    # The same directories, as many files as Spark runs tasks at most, a _SUCCESS and nothing left over.
    layout = {p.parent.relative_to(arrow_out) for p in arrow_out.rglob("*.parquet")}
    assert layout == {p.parent.relative_to(spark_out) for p in spark_out.rglob("*.parquet")} == {
        Path(f"queue=mixed/magazine={m}") for m in ("main", "sideline", "dead")}
    for directory in layout:
        assert 1 <= len(list((arrow_out / directory).glob("*.parquet"))) <= spark.sparkContext.defaultParallelism
    assert sorted(p.name for p in arrow_out.iterdir() if not p.is_dir() or p.name.startswith("_")) == ["_SUCCESS"]

    def rows(df: Any) -> list[dict[str, Any]]:
        return sorted((_normal(r.asDict()) for r in df.collect()), key=lambda r: (r["magazine"], r["id"]))

    from_arrow = rows(read_export(spark, str(arrow_out)))
    assert from_arrow == rows(read_export(spark, str(spark_out)))
    assert from_arrow == rows(read(queue="mixed", magazine="all"))
    # Without the schema, Spark infers the same types from the files and the directory names.
    inferred = spark.read.parquet(str(arrow_out))
    assert {f.name: f.dataType.simpleString() for f in inferred.schema.fields} == {
        f.name: f.dataType.simpleString() for f in read_export(spark, str(spark_out)).schema.fields}


def test_an_export_of_many_rows_makes_large_row_groups(spark: Any, store: dict[str, str], make_queue: Any,
                                                      tmp_path: Path) -> None:
    q = make_queue("big", shards=1)
    for _ in range(2):
        q.publish_many([b"x" * 10] * 40_000)
    assert export(spark, store, ["big"], str(tmp_path / "e"))["exported"] == 80_000
    (file,) = (tmp_path / "e" / "queue=big" / "magazine=main").glob("*.parquet")
    meta = pq.ParquetFile(file).metadata
    assert meta.num_rows == 80_000
    assert meta.num_row_groups == 2  # 65,536 rows, then the rest: not one per read window of 4,096


def test_a_failed_arrow_export_leaves_nothing(spark: Any, store: dict[str, str], make_queue: Any,
                                             tmp_path: Path) -> None:
    make_queue("orders", shards=4).publish_many([b"m%d" % i for i in range(40)])
    reader = IgnisReader(SourceOptions.parse(read_options(store, ["orders"])))

    class Failing:  # defined here: pickled by value to the tasks
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def partitions(self) -> Any:
            return self.inner.partitions()

        def read(self, partition: Any) -> Any:
            yield from self.inner.read(partition)
            raise RuntimeError("the store went away")

    out = tmp_path / "e"
    with pytest.raises(Exception, match="the store went away"):
        arrow_export.export(spark, Failing(reader), out, False, (), ())
    assert not out.exists()


def reader_with(inner: Any, read: Any) -> Any:
    """A reader with `inner`'s partitions whose read is `read(inner, partition)` (a test's failing task). The
    class is made here, not at module level: cloudpickle sends a local class to the Python workers by value,
    where this test module cannot be imported."""

    class Wrapped:
        def partitions(self) -> Any:
            return inner.partitions()

        def read(self, partition: Any) -> Any:
            return read(inner, partition)

    return Wrapped()


def test_a_task_still_running_when_the_export_fails_leaves_nothing(spark: Any, store: dict[str, str],
                                                                  make_queue: Any, tmp_path: Path) -> None:
    # The first task fails at once; the other starts writing later, after the driver cleaned up (Spark lets
    # a task of an aborted job run on for its kill timeout, 2 s): it must not make the directory again.
    make_queue("orders", shards=4).publish_many([b"m%d" % i for i in range(40)])
    reader = IgnisReader(SourceOptions.parse(read_options(store, ["orders"])))

    def first_fails_others_late(inner: Any, partition: Any) -> Any:
        import time

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 0:
            raise RuntimeError("the store went away")
        time.sleep(1)
        yield from inner.read(partition)

    out = tmp_path / "e"
    with pytest.raises(Exception, match="the store went away"):
        arrow_export.export(spark, reader_with(reader, first_fails_others_late), out, False, (), ())
    time.sleep(3)  # the late task has written (or failed) by now
    assert not out.exists(), sorted(out.rglob("*"))


def test_a_retried_task_writes_its_rows_once(store: dict[str, str], make_queue: Any, tmp_path: Path) -> None:
    # local[2,2]: a failed task is tried again (local[2] fails the job at once). Each task's first attempt
    # writes some files and dies; only the second attempt's files may be committed.
    from ignis_pipeline.session import build_session
    from pyspark.sql import SparkSession

    q = make_queue("orders", shards=4)
    q.publish_many([b"m%d" % i for i in range(400)])
    reader = IgnisReader(SourceOptions.parse(read_options(store, ["orders"])))

    def first_attempt_dies(inner: Any, partition: Any) -> Any:
        from pyspark import TaskContext

        yield from inner.read(partition)
        if TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("first attempt")

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    session = build_session("ignis-retry-test", "local[2,2]", {"spark.ui.enabled": "false",
                                                               "spark.default.parallelism": "2"})
    session.sparkContext.setLogLevel("FATAL")
    try:
        out = tmp_path / "e"
        assert arrow_export.export(session, reader_with(reader, first_attempt_dies), out, False, (), ()) == 400
        ids = pa.concat_tables([pq.read_table(f, columns=["id"]) for f in out.rglob("*.parquet")]).column("id")
        assert len(ids) == 400 and len(set(ids.to_pylist())) == 400
        assert not (out / arrow_export.TEMPORARY).exists()
    finally:
        session.stop()


def test_spread_keeps_partitions_in_order_and_balances_slots() -> None:
    from ignis_pipeline import slots
    from ignis_pipeline.reader import SlotRangePartition, TailPartition

    parts = [SlotRangePartition(slots.SlotRange("q", "main", "q", s, a, b))
             for s, (a, b) in enumerate([(1, 100), (101, 200), (1, 50), (51, 60), (1, 190)])]
    parts.append(TailPartition([]))
    groups = arrow_export.spread(parts, 2)
    assert [p for g in groups for p in g] == parts  # exhaustive, disjoint, in order
    assert len(groups) == 2
    weights = [sum(p.range.last - p.range.first + 1 for p in g if hasattr(p, "range")) for g in groups]
    assert max(weights) <= 260, weights
    assert arrow_export.spread(parts[:1], 4) == [parts[:1]]
    assert arrow_export.spread([], 2) == []


def test_local_output_resolves_like_spark(spark: Any, tmp_path: Path) -> None:
    assert arrow_export.local_output(spark, f"file://{tmp_path}/x") == tmp_path / "x"
    assert arrow_export.local_output(spark, str(tmp_path / "y")) == tmp_path / "y"
    relative = arrow_export.local_output(spark, "some/dir")
    assert relative is not None and relative.is_absolute() and relative.parts[-2:] == ("some", "dir")


# ---- a master that does not answer ---------------------------------------------------------------------
def test_master_addresses() -> None:
    assert master_addresses("spark://127.0.0.1:7077") == [("127.0.0.1", 7077)]
    assert master_addresses("spark://a:1,b:2") == [("a", 1), ("b", 2)]
    assert master_addresses("spark://host") == [("host", 7077)]
    assert master_addresses("k8s://https://10.0.0.1:6443") == [("10.0.0.1", 6443)]
    assert master_addresses("k8s://api.example") == [("api.example", 443)]
    assert master_addresses("local[*]") == master_addresses("yarn") == []


def test_a_master_answers_if_one_of_its_addresses_does() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        check_master_answers(f"spark://127.0.0.1:{port}")
        check_master_answers(f"spark://127.0.0.1:1,127.0.0.1:{port}")
    with pytest.raises(InvalidInputError, match=r"^Spark master spark://127.0.0.1:1 does not answer \(127.0.0.1:1: "):
        check_master_answers("spark://127.0.0.1:1")


@pytest.mark.parametrize("job", [["stats"], ["export", "q", "--to", "{tmp}/x"], ["redrive", "q"]])
def test_an_unreachable_master_fails_within_10_s_with_exit_2(store_url: str, tmp_path: Path, job: list[str]) -> None:
    env = {**os.environ, "IGNIS_STORE": store_url}
    began = time.monotonic()
    proc = subprocess.run([str(IGNIS), "pipeline", "--master", "spark://127.0.0.1:1",
                           *(a.format(tmp=tmp_path) for a in job)], capture_output=True, text=True, env=env,
                          timeout=120)
    elapsed = time.monotonic() - began
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert elapsed < 10, elapsed
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: Spark master spark://127.0.0.1:1 does not answer (127.0.0.1:1: "), proc.stderr
