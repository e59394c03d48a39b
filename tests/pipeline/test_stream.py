"""Streaming consume (`spark.readStream.format("ignis")`): at-least-once across a query killed mid-batch
and stopped between batches, restarted from its checkpoint."""

from __future__ import annotations

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

    with pytest.raises(Exception, match="consumes a queue's main magazine"):
        IgnisStreamReader(SourceOptions.parse({"store": store_url, "queue": "q", "magazine": "dead"}))
    with pytest.raises(Exception, match="exactly one queue"):
        IgnisStreamReader(SourceOptions.parse({"store": store_url, "queue": "a,b"}))
