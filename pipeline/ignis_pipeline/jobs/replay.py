"""`ignis pipeline replay --from PATH --to QUEUE`: publish an export again through the `ignis` format's
writer, ids, keys, headers and codecs kept; `--where` selects rows (SQL over the export's columns),
`--rate` caps messages per second across all tasks, `--canary N` publishes the first N (in export
order), waits until they are settled, and goes on only if at least 95% were acked."""

from __future__ import annotations

import sys
from typing import Any

from ignis_pipeline.jobs.export import read_export
from ignis_pipeline.jobs.gate import gated, rate_options
from ignis_pipeline.jobs.progress import spark_progress
from ignis_pipeline.session import check_store_reachable

WRITTEN = ["payload", "id", "key", "headers", "codec"]


def replay(spark: Any, store: dict[str, str], source: str, queue: str, *, fmt: str = "parquet",
           where: str | None = None, rate: float | None = None, canary: int | None = None,
           canary_timeout: float = 300.0) -> dict[str, Any]:
    check_store_reachable(spark, store["store"])
    rows = read_export(spark, source, fmt)
    if where:
        rows = rows.where(where)

    def publish(df: Any, description: str) -> int:
        count = df.count()
        data = df.select(*WRITTEN)
        writer = data.write.format("ignis").mode("append").option("queue", queue)
        for key, value in {**store, **rate_options(data, rate, spark.sparkContext.defaultParallelism)}.items():
            writer = writer.option(key, value)
        with spark_progress(spark, description):
            writer.save()
        return count

    return {"from": source, "queue": queue, **gated(rows, store, queue, canary=canary,
                                                     canary_timeout=canary_timeout, publish=publish)}


if __name__ == "__main__":  # spark-submit .../jobs/replay.py --from PATH --to QUEUE
    from ignis_pipeline.cli import run_job

    sys.exit(run_job("replay", sys.argv[1:]))
