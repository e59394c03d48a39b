"""The export's Parquet written by its read tasks with pyarrow: the data source's Arrow batches go straight
into files, and Spark's JVM never turns them into rows.

Through `df.write.parquet`, every Arrow batch a read task yields is turned into rows in the JVM and each
row is written again by parquet-mr: measured, that costs more CPU than reading the messages (bench/README.md,
"Spark's floor"). Here the same read (`IgnisReader`: its plan, partitions and `read`, unchanged) runs in
Spark tasks that write their batches with pyarrow, the way the benchmark's single-process loop does;
Spark schedules the tasks and carries back a list of file names.

The output is what Spark's writer makes of `partitionBy("queue", "magazine")`: a directory per queue and
magazine (`queue=orders/magazine=main`), columns without the two partition columns, snappy-compressed
`part-*.parquet` files, `_SUCCESS` at the end; readable by Spark (`read_export`), pyarrow and others.
Commit: each task attempt writes under `_temporary/<job>/<attempt>`; the driver moves the files of the
attempts that succeeded (what `collect` returns: a failed or duplicate attempt's files are never moved)
and removes `_temporary`. The driver moves what the executors wrote, so this runs only where they share
its disk: a local path and a master on this host (`usable`); elsewhere the export uses Spark's writer.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ignis_pipeline import schema

PARTITION_COLUMNS = ("queue", "magazine")
FILE_SCHEMA = pa.schema([f for f in schema.ARROW_SCHEMA if f.name not in PARTITION_COLUMNS])
# Rows buffered per file before they are written as one row group: a read yields batches of 256 to 4,096
# rows, and a row group per batch would make files that are mostly metadata (Spark's writer makes row
# groups of up to 128 MB).
ROW_GROUP_ROWS = 65_536
TEMPORARY = "_temporary"
# Spark's own switch for this session: "false" makes the export use Spark's Parquet writer.
ARROW_CONF = "spark.ignis.export.arrowWriter"


def escape(value: str) -> str:
    """A partition value as Spark writes it in a directory name (ExternalCatalogUtils.escapePathName)."""
    special = set('"#%\'*/:=?\\\x7f{[]^')
    return "".join(f"%{ord(c):02X}" if c in special or ord(c) < 0x20 else c for c in value)


def parquet_writer(path: Path | str, file_schema: pa.Schema, no_dictionary: Sequence[str],
                   no_statistics: Sequence[str]) -> pq.ParquetWriter:
    """A Parquet file laid out as the export's: no dictionary for `no_dictionary`, no statistics for
    `no_statistics` (jobs/export.py says why)."""
    names = file_schema.names
    return pq.ParquetWriter(path, file_schema, compression="snappy",
                            use_dictionary=[c for c in names if c not in no_dictionary],
                            write_statistics=[c for c in names if c not in no_statistics])


class BatchFile:
    """One Parquet file fed with Arrow batches, written in row groups of about ROW_GROUP_ROWS rows."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer = writer
        self.pending: list[pa.RecordBatch] = []
        self.buffered = 0
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.buffered += batch.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            # A table of the buffered batches is written without copying them into one first.
            self.writer.write_table(pa.Table.from_batches(self.pending), row_group_size=max(self.buffered, 1))
            self.rows += self.buffered
            self.pending, self.buffered = [], 0

    def close(self) -> None:
        self.flush()
        self.writer.close()


def make_dirs_under(base: Path, relative: str) -> None:
    """The directories of `relative`'s parent under `base`, made level by level and never `base` itself nor
    anything above it: a task whose job's staging directory was taken away (a failed job's task that still
    runs) fails here instead of making the export's directory again after the driver removed it."""
    at = base
    for part in Path(relative).parent.parts:
        at = at / part
        at.mkdir(exist_ok=True)


def write_partitions(reader: Any, root: str, name: str, groups: Iterable[Sequence[Any]],
                     no_dictionary: Sequence[str], no_statistics: Sequence[str],
                     partition_columns: Sequence[str] = PARTITION_COLUMNS) -> tuple[str, list[tuple[str, int]]]:
    """In a Spark task: read each input partition of `groups` and write its batches, one file per queue and
    magazine met (per value of `partition_columns`, the batches' first columns: a topic's export has one,
    `topic`), named `name`, under this attempt's own directory in `root`. That directory's name, and the files
    (relative to it) with their rows."""
    n = len(partition_columns)
    from pyspark import TaskContext

    context = TaskContext.get()
    own = f"attempt-{context.taskAttemptId() if context is not None else 0}"
    attempt = Path(root) / own
    attempt.mkdir(exist_ok=True)  # no parents: see make_dirs_under
    files: dict[tuple[str, ...], tuple[str, BatchFile]] = {}
    current: BatchFile | None = None
    try:
        for group in groups:
            for partition in group:
                for batch in reader.read(partition):
                    where = tuple(batch.column(i)[0].as_py() for i in range(n))  # one queue and magazine
                    file_schema = pa.schema(list(batch.schema)[n:])
                    found = files.get(where)
                    if found is None:
                        relative = "/".join(f"{c}={escape(v)}" for c, v in zip(partition_columns, where,
                                                                                 strict=True)) + f"/{name}"
                        make_dirs_under(attempt, relative)
                        found = (relative, BatchFile(parquet_writer(attempt / relative, file_schema, no_dictionary,
                                                                    no_statistics)))
                        files[where] = found
                    if current is not None and current is not found[1]:
                        current.flush()  # slot ranges come queue by queue: keep one file's rows in memory
                    current = found[1]
                    current.write(pa.RecordBatch.from_arrays(batch.columns[n:], schema=file_schema))
    finally:
        for _, out in files.values():
            out.close()
    return own, [(relative, out.rows) for relative, out in files.values()]


def spread(partitions: Sequence[Any], tasks: int) -> list[list[Any]]:
    """Input partitions cut into at most `tasks` consecutive groups of about equal slot counts (a partition
    without a slot range, a tail, counts as one slot): consecutive, so a task meets few queues and magazines,
    as a coalesce would group them."""
    weights = [max(1, r.last - r.first + 1) if (r := getattr(p, "range", None)) is not None else 1
               for p in partitions]
    total = sum(weights)
    groups: list[list[Any]] = [[] for _ in range(max(1, min(tasks, len(partitions))))]
    done = 0
    for partition, weight in zip(partitions, weights, strict=True):
        at = min(len(groups) - 1, done * len(groups) // max(total, 1))
        groups[at].append(partition)
        done += weight
    return [g for g in groups if g]


def local_output(spark: Any, to: str) -> Path | None:
    """The local directory Spark would write `to` into (a path on this machine's disk), or None when its
    file system is another (HDFS, s3a, ...): asked of Hadoop, which resolves a relative path and
    fs.defaultFS as Spark's writer would."""
    context = spark.sparkContext
    path = context._jvm.org.apache.hadoop.fs.Path(to)
    fs = path.getFileSystem(context._jsc.hadoopConfiguration())
    if str(fs.getScheme()) != "file":
        return None
    return Path(str(fs.makeQualified(path).toUri().getPath()))


def usable(spark: Any, to: str) -> Path | None:
    """Where to write the export with pyarrow, or None to leave it to Spark's writer: a local path with a
    master whose executors all run on this host (they and the driver see the same disk), unless the session
    says `spark.ignis.export.arrowWriter=false`."""
    from ignis_pipeline.session import master_on_this_host

    if str(spark.conf.get(ARROW_CONF, "true")).strip().lower() == "false":
        return None
    if not master_on_this_host(str(spark.sparkContext.master)):
        return None
    return local_output(spark, to)


def export(spark: Any, reader: Any, out: Path, overwrite: bool, no_dictionary: Sequence[str],
           no_statistics: Sequence[str], partition_columns: Sequence[str] = PARTITION_COLUMNS) -> int:
    """The rows of `reader` (an IgnisReader) written to `out` as the export's Parquet; the count written."""
    partitions = reader.partitions()  # planned here, on the driver: the same plan Spark's read would run
    context = spark.sparkContext
    groups = spread(partitions, max(1, context.defaultParallelism))
    job = uuid.uuid4().hex
    existed = out.exists()
    if existed and overwrite:  # as Spark's overwrite does: the old output goes before the new is written
        shutil.rmtree(out) if out.is_dir() and not out.is_symlink() else out.unlink()
        existed = False
    staging = out / TEMPORARY / job
    staging.mkdir(parents=True)
    try:
        root = str(staging)

        def task(index: int, items: Iterator[list[Any]]) -> Iterator[tuple[str, list[tuple[str, int]]]]:
            yield write_partitions(reader, root, f"part-{index:05d}-{job}.c000.snappy.parquet", items,
                                   no_dictionary, no_statistics, partition_columns)

        results: list[tuple[str, list[tuple[str, int]]]] = []
        if groups:  # none when no queue matched
            context.setJobDescription(f"ignis export to {out}")
            try:
                results = context.parallelize(groups, len(groups)).mapPartitionsWithIndex(task).collect()
            finally:
                context.setJobDescription(None)
        # One result per task, from its attempt that succeeded: exactly those files are moved.
        exported = 0
        for attempt, files in results:
            for relative, rows in files:
                target = out / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                (staging / attempt / relative).replace(target)
                exported += rows
        (out / "_SUCCESS").touch()
        return exported
    except BaseException:
        retire(staging)
        if not existed:  # nothing half-written: the directory was this job's
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        retire(staging)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(out / TEMPORARY)


def retire(staging: Path) -> None:
    """Take the job's staging directory away in one rename before anything is removed: a task attempt that
    still runs (of a failed job, a speculative or zombie attempt) then finds no path to write under (it
    makes no parent directory), so it cannot write into, or make again, what the driver removes next."""
    with contextlib.suppress(FileNotFoundError):
        staging.rename(staging.with_name(f"{staging.name}.retired"))
