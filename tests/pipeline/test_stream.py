"""Streaming consume (`spark.readStream.format("ignis")`): at-least-once across a query killed mid-batch
and stopped between batches, restarted from its checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from ignis_pipeline.stream import decode_claims, encode_claims

from ignis.storage.base import SlotRef


def test_claims_encode_as_runs() -> None:
    refs = [SlotRef("q", 1, s) for s in (5, 3, 4, 9)] + [SlotRef("q", 0, 7)]
    assert encode_claims(refs) == "0:7-7,1:3-5,1:9-9"
    assert decode_claims(encode_claims(refs)) == [(0, 7, 7), (1, 3, 5), (1, 9, 9)]
    assert decode_claims("") == []


def _remaining(queue: Any) -> list[Any]:
    """Records still stored in main (claimed or not): everything a query consumed must be acked."""
    out = []
    for shard, p in queue.main.pointers().items():
        if p.load:
            out.extend(queue.store.peek(queue.name, shard, 1, p.load))
    return out


def test_query_killed_mid_batch_and_between_batches_loses_nothing(spark: Any, store_url: str, make_queue: Any,
                                                                   tmp_path: Path) -> None:
    q = make_queue("events", shards=4)
    published = {r.id for r in q.publish_many([b"e%d" % i for i in range(250)])}
    sink: list[str] = []
    state = {"kill_batch": 1, "killed": False}
    lock = threading.Lock()

    def handle(df: Any, batch_id: int) -> None:
        ids = [r.id for r in df.select("id").collect()]
        with lock:
            if batch_id == state["kill_batch"] and not state["killed"]:
                state["killed"] = True
                sink.extend(ids[: len(ids) // 2])  # half of the batch reached the sink, then the driver died
                raise RuntimeError("killed mid-batch")
            sink.extend(ids)

    def start() -> Any:
        stream = (spark.readStream.format("ignis").option("store", store_url).option("queue", "events")
                  .option("maxMessagesPerTrigger", 100).load())
        return (stream.writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(processingTime="100 milliseconds").start())

    query = start()
    with pytest.raises(Exception, match="killed mid-batch"):
        query.awaitTermination(120)
    assert state["killed"]
    assert set(sink) < published  # batch 0 and half of batch 1 only

    query = start()  # from the checkpoint: batch 1 again (its claimed slots), then the rest
    query.processAllAvailable()
    query.stop()  # between batches
    assert set(sink) == published
    more = {r.id for r in q.publish_many([b"late%d" % i for i in range(60)])}

    query = start()
    query.processAllAvailable()
    query.stop()
    assert set(sink) == published | more  # every message at least once
    assert len(sink) >= len(published | more)
    assert _remaining(q) == []  # and every one acked: nothing left claimed for the sweeper
    assert q.stats().depth == 0


def test_driver_killed_with_sigkill_mid_batch_then_restarted_loses_nothing(
        spark: Any, store_url: str, make_queue: Any, tmp_path: Path) -> None:
    if not store_url.startswith("lmdb:"):
        pytest.skip("the in-process test above covers the backend; this one is about the process dying")
    q = make_queue("events", shards=4)
    published = {r.id for r in q.publish_many([b"k%d" % i for i in range(250)])}
    sink, checkpoint = tmp_path / "sink.txt", tmp_path / "checkpoint"
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("stream_child.py")), store_url,
                            str(checkpoint), str(sink), "1"], capture_output=True, timeout=240,
                           start_new_session=True)  # its own process group: the kill takes only the child's
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-3000:]
    before = sink.read_text().split()
    assert 100 < len(before) < 250 and set(before) < published  # batch 0 and half of batch 1

    def handle(df: Any, batch_id: int) -> None:
        with sink.open("a") as out:
            out.write("".join(f"{r.id}\n" for r in df.select("id").collect()))

    query = (spark.readStream.format("ignis").option("store", store_url).option("queue", "events")
             .option("maxMessagesPerTrigger", 100).load()
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(checkpoint))
             .trigger(processingTime="100 milliseconds").start())
    query.processAllAvailable()
    query.stop()
    assert set(sink.read_text().split()) == published
    assert _remaining(q) == []


def test_a_stream_consumes_main_only(store_url: str) -> None:
    from ignis_pipeline.options import SourceOptions
    from ignis_pipeline.stream import IgnisStreamReader

    # Refused by the first call Spark makes (see IgnisStreamReader.__init__), before any store access.
    dead = IgnisStreamReader(SourceOptions.parse({"store": store_url, "queue": "q", "magazine": "dead"}))
    for call in (dead.check, dead.initialOffset, dead.getDefaultReadLimit, dead.prepareForTriggerAvailableNow):
        with pytest.raises(Exception, match="consumes a queue's main magazine"):
            call()
    two = IgnisStreamReader(SourceOptions.parse({"store": store_url, "queue": "a,b"}))
    for call in (two.check, two.initialOffset):
        with pytest.raises(Exception, match="exactly one queue"):
            call()


def test_a_stream_misuse_is_one_line_from_spark(spark: Any, store_url: str, ignis: Any, make_queue: Any,
                                                 tmp_path: Path) -> None:
    from ignis.errors import QueueNotFound

    make_queue("events", shards=2)
    query = (spark.readStream.format("ignis").option("store", store_url).option("queue", "events")
             .option("magazine", "dead").load()
             .writeStream.foreachBatch(lambda df, batch_id: None)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    with pytest.raises(Exception) as caught:
        query.awaitTermination(120)
    first = str(caught.value).splitlines()[0]
    assert first.endswith("ignis.errors.InvalidInputError: a streaming read consumes a queue's main magazine; read "
                          "the sideline and dead letters with a batch read (spark.read) instead"), first
    with pytest.raises(Exception) as caught:
        spark.readStream.format("ignis").option("store", store_url).option("queue", "nosuch").load()  # at load()
    assert str(caught.value).splitlines()[0].endswith(f"QueueNotFound: {QueueNotFound('nosuch', ignis.client_id)}")


def _available_now(spark: Any, store_url: str, queue: str, checkpoint: Path, handle: Any) -> Any:
    return (spark.readStream.format("ignis").option("store", store_url).option("queue", queue)
            .option("maxMessagesPerTrigger", 100).load()
            .writeStream.foreachBatch(handle).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start())


def test_available_now_delivers_what_was_there_at_the_start_then_stops(
        spark: Any, store_url: str, make_queue: Any, tmp_path: Path) -> None:
    q = make_queue("nightly", shards=4)
    refs = q.publish_many([b"s%d" % i for i in range(360)])
    acked = q.fire_many(30)
    q.ack(acked)  # acked slots below the target: holes the bounded claim passes over
    present = {r.id for r in refs} - {m.id for m in acked}
    target = {shard: p.load for shard, p in q.main.pointers().items()}
    sink: list[str] = []
    late: set[str] = set()

    def handle(df: Any, batch_id: int) -> None:
        sink.extend(r.id for r in df.select("id").collect())
        if batch_id == 0:  # published while the query runs, into the same shards: not for this run
            late.update(r.id for r in q.publish_many([b"late%d" % i for i in range(90)]))

    query = _available_now(spark, store_url, "nightly", tmp_path / "ckpt", handle)
    assert query.awaitTermination(180), "the query must stop by itself"
    assert query.exception() is None
    assert len(late) == 90
    assert sorted(sink) == sorted(present)  # exactly what was there at the start, each once
    batches = [p for p in query.recentProgress if p.numInputRows]
    assert len(batches) == 4  # 330 messages, 100 per trigger
    for progress in batches:  # no offset past the target
        fire = json.loads(progress.sources[0].endOffset)["fire"]
        assert all(int(fire[str(shard)]) <= last for shard, last in target.items() if str(shard) in fire), fire
    assert q.stats().depth == 90  # every delivered message acked, the late ones left unclaimed

    # The next scheduled run, from the same checkpoint: the late ones, and it stops again.
    sink.clear()
    query = _available_now(spark, store_url, "nightly", tmp_path / "ckpt", lambda df, _: sink.extend(
        r.id for r in df.select("id").collect()))
    assert query.awaitTermination(180)
    assert sorted(sink) == sorted(late)
    assert q.stats().depth == 0
    # And on an empty queue it stops at once, having read nothing.
    empty: list[int] = []
    query = _available_now(spark, store_url, "nightly", tmp_path / "ckpt", lambda df, _: empty.append(df.count()))
    assert query.awaitTermination(180)
    assert sum(empty) == 0


@pytest.mark.parametrize("backend", ["aerospike-emu"], indirect=True)
def test_available_now_awaits_a_write_in_flight_and_seals_one_that_never_lands(backend: Any) -> None:
    """On a store whose publish is two steps (Aerospike: allocate the slot, then write it), a slot below the
    target may still be written when the query claims it: it is awaited, delivered if it lands, sealed once
    the producer's write deadline is over if it does not. (In-process, on the emulator: no Spark needed.)"""
    from ignis_pipeline.options import SourceOptions
    from ignis_pipeline.stream import IgnisStreamReader
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from ignis import Ignis, QueueSpec
    from ignis.envelope import now_ms

    url = backend.url + "&total_timeout_ms=100&retries=0"  # a write deadline of about 1.4 s
    with Ignis(url, purge_interval=0) as client:
        client.apply(QueueSpec.build(name="q", handlerType="q", shards=1))
        q = client.queue("q")
        q.publish_many([b"a", b"b"])  # slots 1 and 2
        assert client.store.reserve("q", 0, 2) == 3  # slots 3 and 4: allocated, not written yet
        reader = IgnisStreamReader(SourceOptions.parse({"store": url, "queue": "q"}))
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()  # the target: slot 4
        q.publish(b"after")  # slot 5: past the target
        late = threading.Timer(0.3, client.store.load_reserved, (SlotRef("q", 0, 3), b"late", "late-id", now_ms(), 60))
        late.start()
        try:
            end = reader.latestOffset(start, ReadMaxRows(10))
        finally:
            late.join()
        assert decode_claims(end["claims"]) == [(0, 1, 3)]  # 3 landed while awaited; 4 never did
        assert end["fire"] == {"0": 3}
        assert not client.store.load_reserved(SlotRef("q", 0, 4), b"x", "x-id", now_ms(), 60)  # sealed: refused
        assert reader.latestOffset(end, ReadMaxRows(10)) == end  # the target reached: no new data, the query ends
        assert [m.data for m in q.fire_many(10)] == [b"after"]  # left for the next run
        reader.stop()
