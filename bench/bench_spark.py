"""Benchmark (not a test): the `ignis` Spark data source against a plain single-process loop over the
storage interface, in one run, on one lmdb store.

    .venv/bin/python bench/bench_spark.py                  # 1,000,000 messages of 256 bytes
    .venv/bin/python bench/bench_spark.py --messages 100000 --json

Read: (a) a loop that peeks every record of every shard and writes Parquet with pyarrow, against (b) the
export job (`ignis pipeline export`) through the data source on local[2].
Write: (a) a loop that reads (a)'s Parquet file with pyarrow and publishes each batch with publish_many,
against (b) `df.write.format("ignis")` of the export, on local[2].
Rows/s are reported for the job alone (steady state) and with the SparkSession's start-up added.
Targets: read >= 1.0x the loop, write >= 0.7x the loop (steady state).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from ignis_pipeline import schema

from ignis import Ignis, QueueSpec

READ_TARGET, WRITE_TARGET = 1.0, 0.7
PUBLISH_CHUNK = 10_000
PEEK_WINDOW = 4_096


def fill(ignis: Ignis, messages: int, size: int) -> None:
    q = ignis.queue("bench")
    payload = os.urandom(size)
    for start in range(0, messages, PUBLISH_CHUNK):
        q.publish_many([payload] * min(PUBLISH_CHUNK, messages - start))


def plain_read(ignis: Ignis, path: Path) -> int:
    """Every record of every shard of `bench`, peeked through the storage interface, into one Parquet file."""
    store, q = ignis.store, ignis.queue("bench")
    rows = 0
    with pq.ParquetWriter(path, schema.ARROW_SCHEMA) as out:
        for shard, p in q.main.pointers().items():
            for first in range(1, p.load + 1, PEEK_WINDOW):
                records = store.peek("bench", shard, first, min(p.load, first + PEEK_WINDOW - 1))
                if records:
                    out.write_batch(schema.to_batch("bench", "main", shard, records))
                    rows += len(records)
    return rows


def plain_write(ignis: Ignis, path: Path) -> int:
    q = ignis.queue("loop-target")
    rows = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PUBLISH_CHUNK, columns=["payload"]):
        rows += len(q.publish_many(batch.column("payload").to_pylist()))
    return rows


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)  # progress on stderr, results on stdout


def start_spark(master: str, url: str) -> Any:
    """The session, and what any first job pays once: Python workers forked and importing ignis, the JVM's
    first Parquet and Arrow code compiled. A small export and write of the `warm-up` queue do that."""
    from ignis_pipeline.jobs.export import read_queues
    from ignis_pipeline.session import build_session

    spark = build_session("bench-spark", master, {
        "spark.ui.enabled": "false", "spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    store = {"store": url, "farmId": "local", "clientId": "default"}
    warm = read_queues(spark, store, ["warm-up"])
    with tempfile.TemporaryDirectory() as out:
        warm.write.mode("overwrite").parquet(out)
        spark.read.parquet(out).select("payload").write.format("ignis").option("store", url).option(
            "queue", "warm-up").mode("append").save()
    return spark


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - began, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", default=None, help="where the store and outputs go (a real disk)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ignis-bench-spark-", dir=args.dir))
    url = f"lmdb://{work}/store?durability=fast&map_size=16g"
    try:
        with Ignis(url, purge_interval=0) as ignis:
            for name in ("bench", "loop-target", "spark-target", "warm-up"):
                ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
            ignis.queue("warm-up").publish_many([b"w" * args.size] * 20_000)
            log(f"filling {args.messages} x {args.size} B ...")
            fill_s, _ = timed(fill, ignis, args.messages, args.size)
            log(f"  {fill_s:.1f} s")

            from ignis_pipeline.jobs.export import export

            loop_read_s, loop_rows = timed(plain_read, ignis, work / "loop.parquet")
            log(f"plain read loop: {loop_rows} rows in {loop_read_s:.2f} s")
            loop_write_s, loop_written = timed(plain_write, ignis, work / "loop.parquet")
            log(f"plain publish_many loop: {loop_written} rows in {loop_write_s:.2f} s")

            startup_s, spark = timed(start_spark, args.master, url)
            log(f"SparkSession start-up (session, first Python workers, JIT warm-up): {startup_s:.2f} s")
            store = {"store": url, "farmId": "local", "clientId": "default"}
            export_s, result = timed(export, spark, store, ["bench"], str(work / "export"))
            log(f"export on {args.master}: {result['exported']} rows in {export_s:.2f} s")
            frame = spark.read.parquet(str(work / "export")).select("payload")
            write_s, _ = timed(lambda: frame.write.format("ignis").option("store", url).option(
                "queue", "spark-target").mode("append").save())
            spark_written = ignis.queue("spark-target").stats().published
            log(f"df.write on {args.master}: {spark_written} rows in {write_s:.2f} s")
            spark.stop()
            if not (loop_rows == result["exported"] == args.messages == loop_written == spark_written):
                log("row counts differ: the run is not valid")
                return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n = args.messages
    doc = {
        "messages": n, "payloadBytes": args.size, "master": args.master, "startupSeconds": round(startup_s, 2),
        "read": {"loopRowsPerSecond": round(n / loop_read_s), "sparkRowsPerSecond": round(n / export_s),
                 "sparkRowsPerSecondWithStartup": round(n / (export_s + startup_s)),
                 "ratio": round(loop_read_s / export_s, 2),
                 "ratioWithStartup": round(loop_read_s / (export_s + startup_s), 2), "target": READ_TARGET},
        "write": {"loopRowsPerSecond": round(n / loop_write_s), "sparkRowsPerSecond": round(n / write_s),
                  "sparkRowsPerSecondWithStartup": round(n / (write_s + startup_s)),
                  "ratio": round(loop_write_s / write_s, 2),
                  "ratioWithStartup": round(loop_write_s / (write_s + startup_s), 2), "target": WRITE_TARGET},
    }
    for part in ("read", "write"):
        doc[part]["verdict"] = "PASS" if doc[part]["ratio"] >= doc[part]["target"] else "FAIL"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for part in ("read", "write"):
            d = doc[part]
            print(f"{part:5}  loop {d['loopRowsPerSecond']:>9,} rows/s   spark {d['sparkRowsPerSecond']:>9,} rows/s "
                  f"({d['sparkRowsPerSecondWithStartup']:,} with start-up)   ratio {d['ratio']:.2f}x "
                  f"({d['ratioWithStartup']:.2f}x with start-up)   target >= {d['target']}x: {d['verdict']}")
        print(f"SparkSession start-up {doc['startupSeconds']} s; {n:,} messages of {args.size} bytes, {args.master}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
