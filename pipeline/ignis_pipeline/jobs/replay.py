"""`ignis pipeline replay --from PATH --to QUEUE`: publish an export again through the `ignis` format's
writer, ids, keys, headers and codecs kept; `--where` selects rows (SQL over the export's columns),
`--rate` caps messages per second across all tasks, `--canary N` publishes the first N (in export
order), waits until they are settled, and goes on only if at least 95% were acked.

An export of `--magazine all` also holds the sideline and the dead letters: messages that failed. Only
the main magazine's rows are replayed unless others are asked for (`--magazine sideline|dead|all`), so a
replay never re-publishes dead letters as fresh messages by accident; the rows left out are counted. Rows of
records that were no IgnisMQ message (codec `unreadable`: their payload describes what was found) are never
replayed, and counted apart."""

from __future__ import annotations

import sys
from typing import Any

from ignis.envelope import CODEC_UNREADABLE
from ignis.errors import InvalidInputError
from ignis_pipeline.jobs.export import read_export
from ignis_pipeline.jobs.gate import gated, rate_options
from ignis_pipeline.jobs.progress import spark_progress
from ignis_pipeline.session import check_store_reachable

WRITTEN = ["payload", "id", "key", "headers", "codec"]
MAGAZINES = {"main": ("main",), "sideline": ("sideline",), "dead": ("dead",), "all": ("main", "sideline", "dead")}


def replay(spark: Any, store: dict[str, str], source: str, queue: str, *, fmt: str = "parquet",
           where: str | None = None, rate: float | None = None, canary: int | None = None,
           canary_timeout: float = 300.0, magazine: str = "main") -> dict[str, Any]:
    if magazine not in MAGAZINES:
        raise InvalidInputError(f"--magazine {magazine!r}: must be main, sideline, dead or all")
    check_store_reachable(spark, store["store"])
    from pyspark.sql import functions as F

    rows = read_export(spark, source, fmt)
    if where:
        rows = rows.where(where)
    left_out = 0
    if magazine != "all":
        chosen = F.coalesce(F.col("magazine").isin(*MAGAZINES[magazine]), F.lit(False))
        left_out = rows.where(~chosen).count()  # (partition pruning: reads no file of the chosen magazine)
        rows = rows.where(chosen)
    readable = F.coalesce(F.col("codec") != F.lit(CODEC_UNREADABLE), F.lit(True))
    unreadable = rows.where(~readable).count()
    rows = rows.where(readable)

    def publish(df: Any, description: str) -> int:
        count = df.count()
        data = df.select(*WRITTEN)
        writer = data.write.format("ignis").mode("append").option("queue", queue)
        for key, value in {**store, **rate_options(data, rate, spark.sparkContext.defaultParallelism)}.items():
            writer = writer.option(key, value)
        with spark_progress(spark, description):
            writer.save()
        return count

    return {"from": source, "queue": queue, "magazine": magazine, "leftOut": left_out, "unreadable": unreadable,
            **gated(rows, store, queue, canary=canary, canary_timeout=canary_timeout, publish=publish)}


if __name__ == "__main__":  # spark-submit .../jobs/replay.py --from PATH --to QUEUE
    from ignis_pipeline.runner import run_job

    sys.exit(run_job("replay", sys.argv[1:]))
