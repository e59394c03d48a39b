"""Benchmark (not a test): the `ignis` Spark data source against a plain single-process loop over the
storage interface, in one run, on one lmdb store.

    .venv/bin/python bench/bench_spark.py                  # 1,000,000 messages of 256 bytes, ~6 minutes
    .venv/bin/python bench/bench_spark.py --messages 100000 --json

Read: (a) a loop that peeks every record of every shard and writes Parquet with pyarrow, against (b) the
export job (`ignis pipeline export`) through the data source on local[2].
Write: (a) a loop that reads (a)'s Parquet file with pyarrow and publishes each batch with publish_many,
against (b) `df.write.format("ignis")` of the export, on local[2].
Floor: (c) the same Parquet export of a data source that reads nothing (it yields one ready-made batch of
the real schema over and over, as many rows as the store holds): what Spark itself costs for these rows on
this machine, in CPU seconds of the JVM and its Python workers. That plus the CPU of the reading alone
(peek + Arrow, which any read through Spark does too), spread perfectly over every core, is the fastest the
export could be here; when even that is slower than the loop, no read code can meet the read target on
this machine, and the run says so.
The first full-size run of each Spark job counts as start-up (the JVM is still compiling its hot code);
`--warmup` more full-size rounds (default 2) run untimed, as a JVM benchmark harness warms up before it
measures; then `--rounds` rounds (default 3) run the loops and the Spark jobs side by side. Reported:
medians over the rounds (steady state; the ratio is the median of each round's own ratio), and rows/s
with the session's start-up plus the first run added (what a one-off job in a new process pays).
Targets: read >= 1.0x the loop, write >= 0.7x the loop (steady state).

On an Aerospike server, on a Spark standalone cluster:

    .venv/bin/python bench/bench_spark.py --server 127.0.0.1:3000/test          # 200,000 messages of 256 bytes
    .venv/bin/python bench/bench_spark.py --server 127.0.0.1:3000/test --messages 500000 --json

fills a queue of its own (a farm and clientId of its own, its sets truncated at the end) on the server,
starts a standalone master and two workers on 127.0.0.1 (tests/support/spark_cluster.py: executors in
JVMs of their own, one core each), and compares, side by side in each round: (a) a single-process loop
with the raw aerospike client, a scan of the queue's data set turned into the export's columns and
written to one Parquet file with pyarrow, as plain_read does; against (b) the export job on the cluster
(`ignis pipeline --master spark://... export`: the data source's batch reads in both executors).
Target: the export >= 1.5x the loop (two workers read in parallel). Ratio: median of each round's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from ignis_pipeline import schema
from ignis_pipeline.jobs import export as export_job
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from ignis import Ignis, QueueSpec

READ_TARGET, WRITE_TARGET = 1.0, 0.7
# The export's CPU per row (driver and executors, every process of the Spark side) against the loop's: at most
# this much more. A target any machine can measure, whatever its cores (bench/README.md).
CPU_TARGET = 1.2
CLUSTER_TARGET = 1.5  # --server: the export on a two-worker standalone cluster against the raw-client loop
PUBLISH_CHUNK = 10_000
PEEK_WINDOW = 4_096


def fill(ignis: Ignis, messages: int, size: int) -> None:
    q = ignis.queue("bench")
    payload = os.urandom(size)
    for start in range(0, messages, PUBLISH_CHUNK):
        q.publish_many([payload] * min(PUBLISH_CHUNK, messages - start))


def batches(ignis: Ignis) -> Any:
    """Every record of every shard of `bench`, peeked through the storage interface, as Arrow batches."""
    store, q = ignis.store, ignis.queue("bench")
    for shard, p in q.main.pointers().items():
        for first in range(1, p.load + 1, PEEK_WINDOW):
            records = store.peek("bench", shard, first, min(p.load, first + PEEK_WINDOW - 1))
            if records:
                yield schema.to_batch("bench", "main", shard, records)


def write_parquet(path: Path, arrow_batches: Any) -> int:
    """Arrow batches into one Parquet file, laid out as the export lays out its files; the rows written."""
    rows = 0
    columns = schema.ARROW_SCHEMA.names
    with pq.ParquetWriter(path, schema.ARROW_SCHEMA,
                          use_dictionary=[c for c in columns if c not in export_job.NO_DICTIONARY],
                          write_statistics=[c for c in columns if c not in export_job.NO_STATISTICS]) as out:
        for batch in arrow_batches:
            out.write_batch(batch)
            rows += batch.num_rows
    return rows


def plain_read(ignis: Ignis, path: Path) -> int:
    """(a): every batch into one Parquet file, laid out as the export lays out its files."""
    return write_parquet(path, batches(ignis))


def spark_cpu_seconds() -> float:
    """CPU time so far of this process's descendants (the JVM, a standalone cluster's daemons and executors,
    their Python workers): what they cost, whichever core ran them. A descendant that ended and was waited
    for still counts, in its parent's children times (pyspark's daemon reaps the workers it forks)."""
    me = psutil.Process().cpu_times()
    total = me.children_user + me.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def cpu_timed(fn: Any, *args: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process and its descendants, result): a Spark job's driver and
    executors."""
    cpu = time.process_time() + spark_cpu_seconds()
    wall, result = timed(fn, *args)
    return wall, time.process_time() + spark_cpu_seconds() - cpu, result


def loop_timed(fn: Any, *args: Any) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process alone, result): a single-process loop (the idle JVM's
    background work is not the loop's)."""
    cpu = time.process_time()
    wall, result = timed(fn, *args)
    return wall, time.process_time() - cpu, result


def spark_writer_export(spark: Any, store: dict[str, str], queues: list[str], to: str) -> dict[str, Any]:
    """The export through Spark's Parquet writer (what it was before jobs/arrow_export.py): the "before" of
    each round, in the same run."""
    from ignis_pipeline.jobs.arrow_export import ARROW_CONF

    spark.conf.set(ARROW_CONF, "false")
    try:
        return export_job.export(spark, store, queues, to)
    finally:
        spark.conf.unset(ARROW_CONF)


def per_100k(cpu_seconds: float, rows: int) -> float:
    """CPU-seconds per 100,000 rows."""
    return cpu_seconds * 100_000 / rows


def plain_write(ignis: Ignis, path: Path, queue: str) -> int:
    q = ignis.queue(queue)
    rows = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PUBLISH_CHUNK, columns=["payload"]):
        rows += len(q.publish_many(batch.column("payload").to_pylist()))
    return rows


class _Rows(InputPartition):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class _FloorReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.batch_file, rows, tasks = options["batch"], int(options["rows"]), int(options["tasks"])
        self.parts = [_Rows(rows // tasks + (i < rows % tasks)) for i in range(tasks)]

    def partitions(self) -> list[InputPartition]:
        return list(self.parts)

    def read(self, partition: InputPartition) -> Any:
        with pa.memory_map(self.batch_file) as source:
            batch = pa.ipc.open_stream(source).read_next_batch()
        left = partition.rows  # type: ignore[attr-defined]
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


class FloorSource(DataSource):
    """Spark's own cost for a Python data source of this schema: every row is a copy of a real one (options
    `batch`: an Arrow IPC file of one batch, `rows`, `tasks`), and reading costs nothing."""

    @classmethod
    def name(cls) -> str:
        return "ignis-bench-floor"

    def schema(self) -> str:
        return schema.DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return _FloorReader(self.options)


def floor_export(spark: Any, ignis: Ignis, rows: int, to: Path) -> None:
    """(c): `rows` copies of real records through the export's write path (Parquet, partitioned by queue
    and magazine), in as many tasks as the export's coalesce makes."""
    pointers = ignis.queue("bench").main.pointers()
    shard = next(s for s, p in pointers.items() if p.load)
    records = ignis.store.peek("bench", shard, 1, min(pointers[shard].load, PEEK_WINDOW))
    batch_file = to.with_suffix(".arrow")
    with pa.OSFile(str(batch_file), "wb") as sink, pa.ipc.new_stream(sink, schema.ARROW_SCHEMA) as out:
        out.write_batch(schema.to_batch("bench", "main", shard, records))
    spark.dataSource.register(FloorSource)
    spark.read.format(FloorSource.name()).option("batch", str(batch_file)).option("rows", rows).option(
        "tasks", max(1, spark.sparkContext.defaultParallelism)).load().write.mode("overwrite").partitionBy(
        "queue", "magazine").parquet(str(to))


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)  # progress on stderr, results on stdout


def start_spark(master: str, url: str) -> Any:
    """The session, and what any first job pays once: Python workers forked and importing ignis, the JVM's
    first Parquet and Arrow code compiled. A small export and write of the `warm-up` queue do that."""
    from ignis_pipeline.jobs.export import SESSION_CONF, read_queues
    from ignis_pipeline.session import build_session

    # The export job's own session settings, as `ignis pipeline export` runs it.
    spark = build_session("bench-spark", master, {
        **SESSION_CONF, "spark.ui.enabled": "false", "spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "2"})
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


# ---- --server: an Aerospike server, a standalone cluster ------------------------------------------------
def raw_scan_export(url: str, queue: str, path: Path) -> int:
    """(a) of --server: every record of the queue's data set, scanned with the raw aerospike client (one
    query without a filter: the server streams the set's records from every partition), turned into the
    export's Arrow columns and written to one Parquet file laid out as the export's files are."""
    from urllib.parse import parse_qsl, urlsplit

    import aerospike

    from ignis import names
    from ignis.envelope import Envelope
    from ignis.storage.aerospike import PURGED, TOMBSTONE
    from ignis.storage.base import SlotRef

    parts = urlsplit(url)
    host, _, port = parts.netloc.rpartition(":")
    client_id = dict(parse_qsl(parts.query))["client"]
    prefix = f"{queue}_SHARD_"
    by_shard: dict[int, list[tuple[Any, Any]]] = {}
    client = aerospike.client({"hosts": [(host, int(port))]}).connect()
    try:
        for key, _, bins in client.query(parts.path.strip("/"), names.data_set(client_id)).results(
                {"total_timeout": 600_000}):
            user_key = key[2]
            if not bins or TOMBSTONE in bins or PURGED in bins or not str(user_key).startswith(prefix):
                continue
            shard, _, slot = str(user_key)[len(prefix):].partition("_")
            ref = SlotRef(queue, int(shard), int(slot))
            by_shard.setdefault(ref.shard, []).append((ref, Envelope.from_bins(bins)))
    finally:
        client.close()

    def in_slot_order() -> Any:
        for shard in sorted(by_shard):
            records = sorted(by_shard[shard], key=lambda r: r[0].slot)
            for at in range(0, len(records), PEEK_WINDOW):
                yield schema.to_batch(queue, "main", shard, records[at:at + PEEK_WINDOW])

    return write_parquet(path, in_slot_order())


def drop_sets(url: str) -> None:
    """Truncate every set of this run's farm and clientId (and nothing shared with anyone else)."""
    import contextlib
    from urllib.parse import parse_qsl, urlsplit

    import aerospike

    from ignis import names

    parts = urlsplit(url)
    host, _, port = parts.netloc.rpartition(":")
    query = dict(parse_qsl(parts.query))
    namespace, farm, client_id = parts.path.strip("/"), query["farm"], query["client"]
    for wait in (5, 10, 20, 30, 0):  # a server restarted meanwhile (it is shared): its sets are still ours
        try:
            client = aerospike.client({"hosts": [(host, int(port))]}).connect()
            break
        except aerospike.exception.AerospikeError:
            if not wait:
                raise
            log(f"cannot reach {host}:{port} to drop this run's sets (farm {farm}); again in {wait} s")
            time.sleep(wait)
    try:
        for set_name in (names.queue_set(farm, client_id), names.system_set(farm), names.data_set(client_id),
                         names.meta_set(client_id)):
            client.truncate(namespace, set_name, 0)
        with contextlib.suppress(aerospike.exception.AerospikeError):
            client.index_remove(namespace, names.active_index(farm, client_id))
    finally:
        client.close()


def server_cpu_seconds() -> float:
    """CPU time so far of the Aerospike server processes (asd) on this machine: the loop's scan and the
    export's batch reads both cost the server, on the same cores."""
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] == "asd":
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
    return total


def server_main(args: argparse.Namespace) -> int:
    import uuid

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from ignis_pipeline.jobs.export import SESSION_CONF, export
    from ignis_pipeline.session import build_session
    from support.spark_cluster import standalone_cluster, wait_for_executors

    hostport, _, namespace = args.server.partition("/")
    run = uuid.uuid4().hex[:8]
    url = f"aerospike://{hostport}/{namespace or 'test'}?farm=bench{run}&client=bench{run}"
    store = {"store": url, "farmId": f"bench{run}", "clientId": f"bench{run}"}
    n = args.messages or 200_000
    work = Path(tempfile.mkdtemp(prefix="ignis-bench-spark-cluster-", dir=args.dir))
    samples: dict[str, list[float]] = {}
    try:
        with Ignis(url, purge_interval=0) as ignis:
            for name in ("bench", "warm-up"):
                ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
            ignis.queue("warm-up").publish_many([b"w" * args.size] * 10_000)
            log(f"filling {n} x {args.size} B on {hostport} ...")
            fill_s, _ = timed(fill, ignis, n, args.size)
            log(f"  {fill_s:.1f} s")
            with standalone_cluster(work / "spark", workers=args.workers, cores_per_worker=1) as cluster:
                conf = {**cluster.session_conf(), **SESSION_CONF, "spark.driver.memory": "1g",
                        "spark.executor.memory": "1g"}
                startup_s, spark = timed(build_session, "bench-spark-cluster", cluster.master_url, conf)
                spark.sparkContext.setLogLevel("ERROR")
                wait_for_executors(spark, args.workers)
                log(f"cluster {cluster.master_url}: {args.workers} workers, session up in {startup_s:.1f} s")
                export(spark, store, ["warm-up"], str(work / "warm"))  # Python workers started, code compiled
                for w in range(args.warmup):
                    log(f"warm-up round {w + 1}/{args.warmup}")
                    export(spark, store, ["bench"], str(work / f"export-warm-{w}"))
                    spark_writer_export(spark, store, ["bench"], str(work / f"before-warm-{w}"))
                    floor_export(spark, ignis, n, work / f"floor-warm-{w}")
                # What reading alone costs (peek + Arrow through the storage interface, no Spark, no Parquet):
                # the export's tasks do this work too.
                read_cpu = time.process_time()
                sum(b.num_rows for b in batches(ignis))
                read_cpu = time.process_time() - read_cpu
                counts = set()
                for r in range(args.rounds):
                    log(f"round {r + 1}/{args.rounds}")
                    server = server_cpu_seconds()
                    loop_s, loop_cpu, loop_rows = loop_timed(raw_scan_export, url, "bench", work / f"loop-{r}.parquet")
                    loop_server = server_cpu_seconds() - server
                    export_s, export_cpu, result = cpu_timed(export, spark, store, ["bench"], str(work / f"export-{r}"))
                    export_server = server_cpu_seconds() - server - loop_server
                    before_s, before_cpu, before = cpu_timed(spark_writer_export, spark, store, ["bench"],
                                                             str(work / f"before-{r}"))
                    floor_s, floor_cpu, _ = cpu_timed(floor_export, spark, ignis, n, work / f"floor-{r}")
                    written = pq.ParquetFile(work / f"loop-{r}.parquet").metadata.num_rows
                    floor_rows = spark.read.parquet(str(work / f"floor-{r}")).count()
                    counts |= {loop_rows, result["exported"], before["exported"], written, floor_rows}
                    log(f"  loop {loop_s:.2f} s ({loop_cpu:.2f} CPU-s, server {loop_server:.2f}), export on the "
                        f"cluster {export_s:.2f} s ({export_cpu:.2f} CPU-s: {export_cpu / loop_cpu:.2f}x the loop's; "
                        f"server {export_server:.2f}): {loop_s / export_s:.2f}x; through Spark's writer "
                        f"{before_s:.2f} s ({before_cpu:.2f} CPU-s: {before_cpu / loop_cpu:.2f}x); floor "
                        f"{floor_s:.2f} s ({floor_cpu:.2f} CPU-s)")
                    for key, value in (("loop", loop_s), ("export", export_s), ("ratio", loop_s / export_s),
                                       ("loop_client_cpu", loop_cpu), ("export_client_cpu", export_cpu),
                                       ("cpu_ratio", export_cpu / loop_cpu), ("before", before_s),
                                       ("before_cpu", before_cpu), ("before_cpu_ratio", before_cpu / loop_cpu),
                                       ("loop_cpu", loop_cpu + loop_server), ("export_cpu", export_cpu + export_server),
                                       ("floor", floor_s), ("floor_cpu", floor_cpu)):
                        samples.setdefault(key, []).append(value)
                spark.stop()
            if counts != {n}:
                log(f"row counts differ ({sorted(counts)} for {n} messages): the run is not valid")
                return 1
    finally:
        drop_sets(url)
        shutil.rmtree(work, ignore_errors=True)
    med = {key: statistics.median(values) for key, values in samples.items()}
    cores = os.cpu_count() or 1
    # The fastest the export could be here: Spark's own CPU for these rows (the floor, reading nothing) plus
    # the reading itself, spread perfectly over every core of the machine.
    best_s = (med["floor_cpu"] + read_cpu) / cores
    doc = {"messages": n, "payloadBytes": args.size, "server": args.server, "workers": args.workers,
           "loopRowsPerSecond": round(n / med["loop"]), "clusterRowsPerSecond": round(n / med["export"]),
           "ratio": round(med["ratio"], 2), "ratioPerRound": [round(x, 2) for x in samples["ratio"]],
           "target": CLUSTER_TARGET, "cores": cores,
           "loopCpuSeconds": round(med["loop_cpu"], 2), "exportCpuSeconds": round(med["export_cpu"], 2),
           "floorSeconds": round(med["floor"], 2), "floorCpuSeconds": round(med["floor_cpu"], 2),
           "readCpuSeconds": round(read_cpu, 2), "bestPossibleRatio": round(med["loop"] / best_s, 2),
           # The export's own measured CPU (its reads' server CPU included) spread perfectly over every core.
           "cpuBoundRatio": round(med["loop"] / (med["export_cpu"] / cores), 2),
           # CPU-seconds per 100,000 rows: the loop's process, and the export's driver and cluster (master, workers,
           # executors, their Python workers); the server's apart.
           "loopCpuPer100kRows": round(per_100k(med["loop_client_cpu"], n), 3),
           "exportCpuPer100kRows": round(per_100k(med["export_client_cpu"], n), 3),
           "loopCpuPer100kRowsWithServer": round(per_100k(med["loop_cpu"], n), 3),
           "exportCpuPer100kRowsWithServer": round(per_100k(med["export_cpu"], n), 3),
           "cpuRatio": round(med["cpu_ratio"], 2), "cpuRatioPerRound": [round(x, 2) for x in samples["cpu_ratio"]],
           "cpuTarget": CPU_TARGET,
           "loopSeconds": round(med["loop"], 2), "exportSeconds": round(med["export"], 2),
           # The same export through Spark's writer (spark.ignis.export.arrowWriter=false), in the same rounds.
           "sparkWriterSeconds": round(med["before"], 2),
           "sparkWriterCpuPer100kRows": round(per_100k(med["before_cpu"], n), 3),
           "sparkWriterCpuRatio": round(med["before_cpu_ratio"], 2)}
    doc["verdict"] = "PASS" if doc["ratio"] >= CLUSTER_TARGET else "FAIL"
    doc["cpuVerdict"] = "PASS" if doc["cpuRatio"] <= CPU_TARGET else "FAIL"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"export from Aerospike: raw-client loop {doc['loopRowsPerSecond']:>9,} rows/s   standalone cluster "
              f"({args.workers} workers) {doc['clusterRowsPerSecond']:>9,} rows/s   ratio {doc['ratio']:.2f}x "
              f"(rounds {doc['ratioPerRound']})   target >= {CLUSTER_TARGET}x: {doc['verdict']}")
        print(f"CPU-s per 100,000 rows: loop {doc['loopCpuPer100kRows']:.3f}, export (driver and cluster) "
              f"{doc['exportCpuPer100kRows']:.3f}   ratio {doc['cpuRatio']:.2f}x (rounds {doc['cpuRatioPerRound']})   "
              f"target <= {CPU_TARGET}x: {doc['cpuVerdict']}   (with the server's: loop "
              f"{doc['loopCpuPer100kRowsWithServer']:.3f}, export {doc['exportCpuPer100kRowsWithServer']:.3f})")
        print(f"wall: loop {doc['loopSeconds']} s, export {doc['exportSeconds']} s; through Spark's writer (before) "
              f"{doc['sparkWriterSeconds']} s, {doc['sparkWriterCpuPer100kRows']:.3f} CPU-s per 100,000 rows "
              f"({doc['sparkWriterCpuRatio']:.2f}x the loop's)")
        print(f"CPU-s (with the server's): loop {doc['loopCpuSeconds']}, export {doc['exportCpuSeconds']}; floor "
              f"(Spark writing these rows, reading nothing) {doc['floorSeconds']} s, {doc['floorCpuSeconds']} CPU-s; "
              f"reading alone {doc['readCpuSeconds']} CPU-s: on {cores} cores the export can be at best "
              f"{doc['bestPossibleRatio']:.2f}x the loop (server not counted); at the CPU the export measured, server "
              f"included, at best {doc['cpuBoundRatio']:.2f}x"
              + (": the target is out of reach on this machine" if doc["cpuBoundRatio"] < CLUSTER_TARGET else ""))
        print(f"{n:,} messages of {args.size} bytes on {args.server}; {cores} cores on this machine, shared by the "
              "server, the loop, the driver, the executors (and whatever else runs)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=None, help="default 1,000,000 (lmdb), 200,000 (--server)")
    parser.add_argument("--server", default=None, metavar="HOST:PORT/NS",
                        help="an Aerospike server: the export on a standalone cluster against a raw-client loop")
    parser.add_argument("--workers", type=int, default=2, help="--server: standalone workers (one core each)")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", default=None, help="where the store and outputs go (a real disk)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed full-size rounds of the Spark jobs first")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (medians)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.server:
        return server_main(args)
    args.messages = args.messages or 1_000_000
    work = Path(tempfile.mkdtemp(prefix="ignis-bench-spark-", dir=args.dir))
    url = f"lmdb://{work}/store?durability=fast&map_size=64g"
    rounds = range(args.rounds)
    samples: dict[str, list[float]] = {}

    def sample(**values: float) -> None:
        for key, value in values.items():
            samples.setdefault(key, []).append(value)

    try:
        with Ignis(url, purge_interval=0) as ignis:
            targets = [f"{kind}-target-{r}" for r in rounds for kind in ("loop", "spark")]
            for name in ("bench", "spark-first", "warm-up", *targets):
                ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
            ignis.queue("warm-up").publish_many([b"w" * args.size] * 20_000)
            log(f"filling {args.messages} x {args.size} B ...")
            fill_s, _ = timed(fill, ignis, args.messages, args.size)
            log(f"  {fill_s:.1f} s")

            from ignis_pipeline.jobs.export import export

            # What reading alone costs (peek + Arrow, no Parquet): any read through Spark does this work too.
            read_cpu = time.process_time()
            sum(b.num_rows for b in batches(ignis))
            read_cpu = time.process_time() - read_cpu

            startup_s, spark = timed(start_spark, args.master, url)
            log(f"SparkSession start-up (session, first Python workers, JIT warm-up): {startup_s:.2f} s")
            store = {"store": url, "farmId": "local", "clientId": "default"}
            # The first full-size run of each Spark job still pays for the JVM compiling its hot code (about
            # twice a later run), so it counts as start-up; the rounds after it are the steady state.
            first_export_s, _ = timed(export, spark, store, ["bench"], str(work / "export-first"))
            floor_export(spark, ignis, args.messages, work / "floor-first")
            frame = spark.read.parquet(str(work / "export-first")).select("payload")

            def spark_write(queue: str) -> None:
                frame.write.format("ignis").option("store", url).option("queue", queue).mode("append").save()

            first_write_s, _ = timed(spark_write, "spark-first")
            # The JVM goes on compiling for a few more full-size runs (measured: the export's CPU falls from
            # about 10 to 7-7.5 CPU-s over its first three or four runs): untimed warm-up rounds, as a JVM
            # benchmark harness runs warm-up iterations before it measures.
            for w in range(args.warmup):
                log(f"warm-up round {w + 1}/{args.warmup}")
                export(spark, store, ["bench"], str(work / f"export-warm-{w}"))
                spark_writer_export(spark, store, ["bench"], str(work / f"before-warm-{w}"))
                floor_export(spark, ignis, args.messages, work / f"floor-warm-{w}")
                spark_write("spark-first")
            counts = set()
            for r in rounds:  # loop and Spark side by side in each round: they share its load
                log(f"round {r + 1}/{args.rounds}")
                loop_read_s, loop_cpu, loop_rows = loop_timed(plain_read, ignis, work / "loop.parquet")
                export_s, export_cpu, result = cpu_timed(export, spark, store, ["bench"], str(work / f"export-{r}"))
                before_s, before_cpu, before = cpu_timed(spark_writer_export, spark, store, ["bench"],
                                                         str(work / f"before-{r}"))
                floor_s, floor_cpu, _ = cpu_timed(floor_export, spark, ignis, args.messages, work / f"floor-{r}")
                loop_write_s, loop_written = timed(plain_write, ignis, work / "loop.parquet", f"loop-target-{r}")
                write_s, _ = timed(spark_write, f"spark-target-{r}")
                counts |= {loop_rows, result["exported"], before["exported"], loop_written,
                           ignis.queue(f"spark-target-{r}").stats().published,
                           spark.read.parquet(str(work / f"floor-{r}")).count()}
                log(f"  read: loop {loop_read_s:.2f} s ({loop_cpu:.2f} CPU-s), export {export_s:.2f} s "
                    f"({export_cpu:.2f} CPU-s: {export_cpu / loop_cpu:.2f}x the loop's), through Spark's writer "
                    f"{before_s:.2f} s ({before_cpu:.2f} CPU-s: {before_cpu / loop_cpu:.2f}x), floor "
                    f"{floor_s:.2f} s ({floor_cpu:.2f} CPU-s); write: loop {loop_write_s:.2f} s, "
                    f"df.write {write_s:.2f} s")
                sample(loop_read=loop_read_s, loop_cpu=loop_cpu, cpu_ratio=export_cpu / loop_cpu, before=before_s,
                       before_cpu=before_cpu, before_cpu_ratio=before_cpu / loop_cpu,
                       export=export_s, export_cpu=export_cpu, floor=floor_s,
                       floor_cpu=floor_cpu, loop_write=loop_write_s, write=write_s,
                       read_ratio=loop_read_s / export_s, write_ratio=loop_write_s / write_s)
            spark.stop()
            if counts != {args.messages}:
                log(f"row counts differ ({sorted(counts)} for {args.messages} messages): the run is not valid")
                return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n = args.messages
    med = {key: statistics.median(values) for key, values in samples.items()}
    loop_read_s, export_s, export_cpu, floor_s, floor_cpu = (
        med["loop_read"], med["export"], med["export_cpu"], med["floor"], med["floor_cpu"])
    loop_write_s, write_s = med["loop_write"], med["write"]
    # The fastest the export could be here: Spark's own CPU for these rows (the floor) plus the reading
    # itself, spread perfectly over every core. Below the loop's time, nothing in the read code can help.
    cores = os.cpu_count() or 1
    best_s = (floor_cpu + read_cpu) / cores
    doc = {
        "messages": n, "payloadBytes": args.size, "master": args.master, "startupSeconds": round(startup_s, 2),
        "read": {"loopRowsPerSecond": round(n / loop_read_s), "sparkRowsPerSecond": round(n / export_s),
                 "sparkRowsPerSecondWithStartup": round(n / (first_export_s + startup_s)),
                 "ratio": round(med["read_ratio"], 2), "ratioPerRound": [round(x, 2) for x in samples["read_ratio"]],
                 "ratioWithStartup": round(loop_read_s / (first_export_s + startup_s), 2), "target": READ_TARGET,
                 # The best any read could do here: Spark's own cost for these rows, reading nothing.
                 "floorRowsPerSecond": round(n / floor_s), "floorRatio": round(loop_read_s / floor_s, 2),
                 "exportCpuSeconds": round(export_cpu, 2), "floorCpuSeconds": round(floor_cpu, 2),
                 "readCpuSeconds": round(read_cpu, 2), "cores": cores,
                 "bestPossibleRatio": round(loop_read_s / best_s, 2),
                 # CPU-seconds per 100,000 rows: the loop (one process) and the export (driver and executors).
                 "loopCpuPer100kRows": round(per_100k(med["loop_cpu"], n), 3),
                 "exportCpuPer100kRows": round(per_100k(export_cpu, n), 3),
                 "cpuRatio": round(med["cpu_ratio"], 2),
                 "cpuRatioPerRound": [round(x, 2) for x in samples["cpu_ratio"]], "cpuTarget": CPU_TARGET,
                 "loopSeconds": round(loop_read_s, 2), "exportSeconds": round(export_s, 2),
                 # The same export through Spark's writer (spark.ignis.export.arrowWriter=false), same rounds.
                 "sparkWriterSeconds": round(med["before"], 2),
                 "sparkWriterCpuPer100kRows": round(per_100k(med["before_cpu"], n), 3),
                 "sparkWriterCpuRatio": round(med["before_cpu_ratio"], 2)},
        "write": {"loopRowsPerSecond": round(n / loop_write_s), "sparkRowsPerSecond": round(n / write_s),
                  "sparkRowsPerSecondWithStartup": round(n / (first_write_s + startup_s)),
                  "ratio": round(med["write_ratio"], 2), "ratioPerRound": [round(x, 2) for x in samples["write_ratio"]],
                  "ratioWithStartup": round(loop_write_s / (first_write_s + startup_s), 2), "target": WRITE_TARGET},
    }
    for part in ("read", "write"):
        doc[part]["verdict"] = "PASS" if doc[part]["ratio"] >= doc[part]["target"] else "FAIL"
    doc["read"]["cpuVerdict"] = "PASS" if doc["read"]["cpuRatio"] <= CPU_TARGET else "FAIL"
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        for part in ("read", "write"):
            d = doc[part]
            print(f"{part:5}  loop {d['loopRowsPerSecond']:>9,} rows/s   spark {d['sparkRowsPerSecond']:>9,} rows/s "
                  f"({d['sparkRowsPerSecondWithStartup']:,} with start-up)   ratio {d['ratio']:.2f}x "
                  f"({d['ratioWithStartup']:.2f}x with start-up)   target >= {d['target']}x: {d['verdict']}")
        d = doc["read"]
        print(f"cpu    CPU-s per 100,000 rows: loop {d['loopCpuPer100kRows']:.3f}, export (driver and executors) "
              f"{d['exportCpuPer100kRows']:.3f}   ratio {d['cpuRatio']:.2f}x (rounds {d['cpuRatioPerRound']})   "
              f"target <= {CPU_TARGET}x: {d['cpuVerdict']}")
        print(f"wall   loop {d['loopSeconds']} s, export {d['exportSeconds']} s; through Spark's writer (before) "
              f"{d['sparkWriterSeconds']} s, {d['sparkWriterCpuPer100kRows']:.3f} CPU-s per 100,000 rows "
              f"({d['sparkWriterCpuRatio']:.2f}x the loop's)")
        print(f"floor  a source that reads nothing: {d['floorRowsPerSecond']:>9,} rows/s "
              f"({d['floorRatio']:.2f}x the read loop), {d['floorCpuSeconds']} CPU-s; reading alone "
              f"{d['readCpuSeconds']} CPU-s; on {cores} cores the "
              f"export can be at best {d['bestPossibleRatio']:.2f}x the loop"
              + (": the read target is out of reach on this machine" if d["bestPossibleRatio"] < READ_TARGET else ""))
        print(f"SparkSession start-up {doc['startupSeconds']} s; {n:,} messages of {args.size} bytes, {args.master}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
