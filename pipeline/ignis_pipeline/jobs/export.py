"""`ignis pipeline export QUEUE... --to PATH`: a snapshot of queue magazines in Parquet (or JSON),
partitioned by queue and magazine; `ignis pipeline export --topic NAME --to PATH`: a topic's retained log (a
publish-time window of it with --since/--until), partitioned by topic. Reading is non-destructive: nothing is
claimed or acked.

Parquet to a local path with executors on this host is written by the read tasks with pyarrow
(arrow_export.py: no rows in Spark's JVM); anything else goes through Spark's writer (`df.write`)."""

from __future__ import annotations

import sys
from typing import Any

from ignis.client import Ignis
from ignis.errors import InvalidInputError
from ignis_pipeline import schema
from ignis_pipeline.jobs import arrow_export
from ignis_pipeline.jobs.progress import spark_progress
from ignis_pipeline.session import check_store_reachable

FORMATS = ("parquet", "json")
# How the Parquet files are laid out: no dictionary for message ids and slots (unique: parquet-mr builds one
# for every page until it outgrows its 1 MB limit and falls back, CPU for nothing) nor for payloads (opaque
# bytes: hashing and comparing every payload for a dictionary was the largest single cost of Spark's
# Parquet writer in the export, measured; compression still catches repeated payloads), and no min/max
# statistics for payloads (no query ranges over them; computing them compares every payload). Per-column
# parquet-mr settings ("#column"), passed as write options (Spark hands them to the Parquet writer); the
# pyarrow writer (arrow_export.py) takes the same column lists.
NO_DICTIONARY = ("id", "slot", "payload")
NO_STATISTICS = ("payload",)
PARQUET_OPTIONS = {**{f"parquet.enable.dictionary#{c}": "false" for c in NO_DICTIONARY},
                   **{f"parquet.column.statistics.enabled#{c}": "false" for c in NO_STATISTICS}}
# The session of the export job (`ignis pipeline export`, its spark-submit module; `--conf` overrides). A
# write partitioned by queue and magazine is otherwise preceded by a sort of every row by those columns
# (spark.sql.optimizer.plannedWrite.enabled: "add logical sort operators to V1 write commands"), about
# an eighth of Spark's CPU for an export (bench/README.md). Without it a task keeps one open file per
# directory it meets, "If number of writers needed reaches this limit, task will sort rest of output"
# (spark.sql.maxConcurrentOutputFileWriters); a task's slot ranges come from few queues and magazines.
# Session settings, so `export()` in someone else's session leaves theirs alone (and sorts).
SESSION_CONF = {"spark.sql.optimizer.plannedWrite.enabled": "false", "spark.sql.maxConcurrentOutputFileWriters": "4"}


def read_options(store: dict[str, str], queues: list[str], magazine: str = "main", since: str | None = None,
                 until: str | None = None) -> dict[str, str]:
    """The `ignis` format's options for `queues` (empty = every queue of the client)."""
    given = {**store, "queue": ",".join(queues) if queues else "*", "magazine": magazine, "since": since,
             "until": until}
    return {key: value for key, value in given.items() if value is not None}


def topic_read_options(store: dict[str, str], topic: str, since: str | None = None, until: str | None = None,
                       subject_filter: str | None = None) -> dict[str, str]:
    """The `ignis` format's options for a topic's retained log: --since/--until as its publish-time window
    (startingTimestamp inclusive, endingTimestamp exclusive: Spark's Kafka source's)."""
    given = {**store, "topic": topic, "startingTimestamp": since, "endingTimestamp": until,
             "subjectFilter": subject_filter}
    return {key: value for key, value in given.items() if value is not None}


def read_queues(spark: Any, store: dict[str, str], queues: list[str], magazine: str = "main",
                since: str | None = None, until: str | None = None) -> Any:
    """The `ignis` format over `queues` (empty = every queue of the client)."""
    return spark.read.format("ignis").options(**read_options(store, queues, magazine, since, until)).load()


def require_queues(store: dict[str, str], queues: list[str]) -> None:
    """QueueNotFound for the first named queue that does not exist."""
    with Ignis(store["store"], farm_id=store["farmId"], client_id=store["clientId"], purge_interval=0) as ignis:
        for name in queues:
            ignis.record(name)


def export(spark: Any, store: dict[str, str], queues: list[str], to: str, *, magazine: str = "main",
           fmt: str = "parquet", since: str | None = None, until: str | None = None,
           overwrite: bool = False, topic: str | None = None, subject_filter: str | None = None) -> dict[str, Any]:
    """Export `queues` (every queue of the client when empty), or with `topic` that topic's retained log (its
    messages published in [since, until), those `subject_filter` selects)."""
    if fmt not in FORMATS:
        raise InvalidInputError(f"--format {fmt!r}: must be parquet or json")
    if topic is not None and queues:
        raise InvalidInputError(f"--topic {topic} and QUEUE arguments ({', '.join(queues)}): export a topic or queues, "
                                "not both")
    if topic is None and subject_filter is not None:
        raise InvalidInputError("--subject-filter selects a topic's messages: give --topic too")
    check_store_reachable(spark, store["store"])
    if topic is not None:
        require_topic(store, topic)  # before Spark creates anything at `to`
        options = topic_read_options(store, topic, since, until, subject_filter)
        partition_columns: tuple[str, ...] = ("topic",)
        done: dict[str, Any] = {"path": to, "format": fmt, "topic": topic}
    else:
        require_queues(store, queues)
        options = read_options(store, queues, magazine, since, until)
        partition_columns = arrow_export.PARTITION_COLUMNS
        done = {"path": to, "format": fmt, "queues": queues or ["*"], "magazine": magazine}
    if not overwrite and path_exists(spark, to):
        raise InvalidInputError(f"--to {to} already exists: add --overwrite to replace it, or choose another path")
    if fmt == "parquet" and (out := arrow_export.usable(spark, to)) is not None:
        # The data source's own read, its Arrow batches written by its tasks with pyarrow (arrow_export.py).
        from ignis_pipeline.options import SourceOptions
        from ignis_pipeline.reader import IgnisReader

        reader = IgnisReader(SourceOptions.parse(options))
        with spark_progress(spark, f"exporting to {to}"):
            exported = arrow_export.export(spark, reader, out, overwrite, NO_DICTIONARY, NO_STATISTICS,
                                           partition_columns)
        return {**done, "exported": exported}
    df = spark.read.format("ignis").options(**options).load()
    # As many write tasks as the cluster runs at once, each reading several slot ranges in turn (a
    # coalesce, no shuffle): a Python task and a committed output file cost Spark about a tenth of a
    # second each (bench/README.md), and one file per slot range would make many small files.
    df = df.coalesce(max(1, spark.sparkContext.defaultParallelism))
    # The count of what was written, taken by the write itself (an observed metric: "applied to the
    # DataFrame while it is being processed by an action", pyspark.sql.Observation), not by a second job.
    from pyspark.sql import Observation
    from pyspark.sql.functions import count, lit

    written = Observation("ignis-export")
    df = df.observe(written, count(lit(1)).alias("rows"))
    with spark_progress(spark, f"exporting to {to}"):
        df.write.mode("overwrite" if overwrite else "errorifexists").partitionBy(*partition_columns).options(
            **(PARQUET_OPTIONS if fmt == "parquet" else {})).format(fmt).save(to)
    return {**done, "exported": int(written.get["rows"])}


def require_topic(store: dict[str, str], topic: str) -> None:
    """TopicNotFound when the topic does not exist."""
    with Ignis(store["store"], farm_id=store["farmId"], client_id=store["clientId"], purge_interval=0) as ignis:
        ignis.topic_spec(topic)


def path_exists(spark: Any, path: str) -> bool:
    """Whether `path` exists, asked of the file system Spark would write it with (local, HDFS, s3a, ...)."""
    from py4j.protocol import Py4JJavaError

    context = spark.sparkContext
    try:
        where = context._jvm.org.apache.hadoop.fs.Path(path)
        return bool(where.getFileSystem(context._jsc.hadoopConfiguration()).exists(where))
    except Py4JJavaError as exc:  # e.g. no file system for the scheme, bad credentials
        reason = str(exc.java_exception.getMessage() or exc.java_exception.toString()).splitlines()[0]
        raise InvalidInputError(f"--to {path}: {reason}") from None


def read_export(spark: Any, path: str, fmt: str = "parquet", topic: bool = False) -> Any:
    """An export with the data source's schema (so the partition columns stay strings); `topic`: a topic's."""
    return spark.read.schema(schema.TOPIC_DDL if topic else schema.DDL).format(fmt).load(path)


if __name__ == "__main__":  # spark-submit .../jobs/export.py QUEUE... --to PATH
    from ignis_pipeline.runner import run_job

    sys.exit(run_job("export", sys.argv[1:]))
