"""`ignis pipeline stats [QUEUE...] [--plot FILE.png] [-o json]`: backlog analytics over a snapshot of every
magazine (the `ignis` format, magazine=all), per queue and magazine: stored (every message stored, in flight
included), depth (not claimed yet: what `ignis stats` calls depth), in flight (fired, not settled), oldest
message age, age percentiles, attempts histogram, reasons (sideline, dead), top partition keys, and messages
stored per shard. Every queue asked (with none named: every queue of the client) has its main row, with its
delayed messages (not due yet, in no magazine), even when it stores no message."""

from __future__ import annotations

import sys
import time
from itertools import pairwise
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.window import Window

from ignis_pipeline.jobs.export import read_queues
from ignis_pipeline.jobs.progress import spark_progress
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.session import check_store_reachable
from ignis_pipeline.stores import open_driver_store

TOP_KEYS = 10
AGE_BUCKETS = (1, 10, 60, 300, 1800, 3600, 6 * 3600, 86400, 7 * 86400)  # seconds: the histogram's edges


def _bucket(age: Any) -> Any:
    expr = F.lit(len(AGE_BUCKETS))
    for i, edge in reversed(list(enumerate(AGE_BUCKETS))):
        expr = F.when(age < edge, F.lit(i)).otherwise(expr)
    return expr


def _delayed(store: dict[str, str], queues: list[str]) -> dict[str, int]:
    """Each queue asked (`queues`; none: every queue of the client) and its delayed messages (not due yet, so in
    no magazine): its delay record, read on the driver."""
    handle = open_driver_store(SourceOptions.parse({**store, "queue": ",".join(queues) or "*"}))
    try:
        names = list(queues) or sorted(record.name for record in handle.list_queues(active=None))
        return {q: state.count for q, state in zip(names, handle.delay_states(names), strict=True)}
    finally:
        handle.close()


def _row(queue: str, magazine: str, stored: int = 0, in_flight: int = 0, oldest: float | None = None,
         pct: Any = None) -> dict[str, Any]:
    p50, p90, p99 = pct or (None, None, None)
    return {"queue": queue, "magazine": magazine, "stored": stored, "depth": stored - in_flight, "inFlight": in_flight,
            "oldestAgeSeconds": _round(oldest), "ageSeconds": {"p50": _round(p50), "p90": _round(p90),
                                                               "p99": _round(p99)},
            "attempts": {}, "reasons": {}, "topKeys": [], "shards": {}, "ageHistogram": {}}


def stats(spark: Any, store: dict[str, str], queues: list[str]) -> dict[str, Any]:
    check_store_reachable(spark, store["store"])
    now = time.time()
    age = (F.lit(now) - F.col("loaded_at").cast("double"))
    df = (read_queues(spark, store, queues, "all")
          .select("queue", "magazine", "shard", "key", "attempts", "reason", "fired_at",
                  age.alias("age"))
          .cache())
    keys = ["queue", "magazine"]
    with spark_progress(spark, "reading the backlog"):
        summary = df.groupBy(*keys).agg(
            F.count("*").alias("stored"), F.count("fired_at").alias("inFlight"), F.max("age").alias("oldest"),
            F.percentile_approx("age", [0.5, 0.9, 0.99], 1000).alias("pct")).collect()
    shards = df.groupBy(*keys, "shard").count().collect()
    attempts = df.groupBy(*keys, "attempts").count().collect()
    reasons = df.where(F.col("reason").isNotNull()).groupBy(*keys, "reason").count().collect()
    ranked = (df.where(F.col("key").isNotNull()).groupBy(*keys, "key").count()
              .withColumn("rank", F.row_number().over(Window.partitionBy(*keys).orderBy(F.desc("count"), "key")))
              .where(F.col("rank") <= TOP_KEYS).collect())
    ages = df.groupBy(*keys, _bucket(F.col("age")).alias("bucket")).count().collect()
    df.unpersist()

    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in summary:
        out[(r.queue, r.magazine)] = _row(r.queue, r.magazine, r.stored, r.inFlight, r.oldest, r.pct)
    for r in shards:
        out[(r.queue, r.magazine)]["shards"][str(r.shard)] = r["count"]
    for r in attempts:
        out[(r.queue, r.magazine)]["attempts"][str(r.attempts)] = r["count"]
    for r in reasons:
        out[(r.queue, r.magazine)]["reasons"][r.reason] = r["count"]
    for r in sorted(ranked, key=lambda r: r["rank"]):
        out[(r.queue, r.magazine)]["topKeys"].append({"key": r.key, "count": r["count"]})
    for r in ages:
        out[(r.queue, r.magazine)]["ageHistogram"][bucket_label(r.bucket)] = r["count"]
    for queue, delayed in _delayed(store, queues).items():  # apart from depth; a queue storing none: zeros
        out.setdefault((queue, "main"), _row(queue, "main"))["delayed"] = delayed
    rows = [out[k] for k in sorted(out, key=lambda k: (k[0], ("main", "sideline", "dead").index(k[1])))]
    for row in rows:
        row["shards"] = dict(sorted(row["shards"].items(), key=lambda kv: int(kv[0])))
        row["attempts"] = dict(sorted(row["attempts"].items(), key=lambda kv: int(kv[0])))
        row["ageHistogram"] = {label: row["ageHistogram"].get(label, 0) for label in BUCKET_LABELS}
    return {"generatedAt": int(now * 1000), "queues": queues or ["*"], "magazines": rows}


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)


def _age(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


BUCKET_LABELS = ([f"<{_age(AGE_BUCKETS[0])}"] + [f"{_age(a)}-{_age(b)}" for a, b in pairwise(AGE_BUCKETS)]
                 + [f">={_age(AGE_BUCKETS[-1])}"])


def bucket_label(bucket: int) -> str:
    return BUCKET_LABELS[bucket]


if __name__ == "__main__":  # spark-submit .../jobs/stats.py [QUEUE...] [--plot FILE.png]
    from ignis_pipeline.runner import run_job

    sys.exit(run_job("stats", sys.argv[1:]))
