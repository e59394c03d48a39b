#!/usr/bin/env python3
"""Throughput of IgnisMQ's lmdb backend, side by side with lmdb-queue (`equeue`) and raw py-lmdb.

    .venv/bin/python bench/bench_lmdb.py                  # 20000 messages, best of 3, rich tables
    .venv/bin/python bench/bench_lmdb.py --json           # one JSON document on stdout
    .venv/bin/python bench/bench_lmdb.py --fsync          # plus a small fsync-mode publish comparison

Every measurement runs in its own fresh directory with 256-byte payloads and no fsync (ignis
`durability=fast`, equeue `sync=False`, raw lmdb `sync=False, metasync=False` with writemap, as both
queues open theirs). Drains are verified (every published message delivered exactly once, and gone
afterwards) before their speed is reported. See bench/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import equeue
import lmdb
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ignis import Ignis, Queue, QueueSpec

PAYLOAD_BYTES = 256
SHARDS = 32
PUBLISH_BATCH = 1000  # publish_many list size, and raw puts per transaction in the batched raw row
FIRE_BATCH = 100  # fire_many size in the batched drains
RAW_DELETE_BATCH = 100  # raw get+delete per transaction: the ceiling of the batched drains
MANY = 8  # consumer threads in the multi-threaded drains
TICK = 1000  # messages between progress updates: rare enough to cost nothing measurable
QUEUE = "bench"
RAW_MAP_SIZE = 1 << 36  # address space only: a sparse file, disk use is what is written
RAW_WRITEMAP = True
EQUEUE_MAP_SIZE = 1 << 34  # the peer's 1 GiB default fills up at a few million messages
EQUEUE_GET_TIMEOUT = 0.2  # equeue.get(0) gives up before looking; the wait after the last ack is untimed
_KEY = struct.Struct(">Q")  # raw keys: big-endian counter, so keys sort in insertion order

RAW, PEER, IGNIS = "raw lmdb", "lmdb-queue", "ignis"


class VerificationError(Exception):
    """A run stored or delivered the wrong messages, so its speed means nothing."""


# ---- results ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class DiskUsage:
    """data.mdb after publishing `messages` messages (the store closed, nothing consumed)."""

    messages: int
    used_bytes: int  # (info()['last_pgno'] + 1) * stat()['psize']: pages ever used, freelist included
    allocated_bytes: int  # os.stat(data.mdb).st_blocks * 512: what the filesystem really holds
    file_bytes: int  # st_size: can be the whole map for a writemap env (sparse file)

    def as_dict(self) -> dict[str, Any]:
        return {"messages": self.messages, "used_bytes": self.used_bytes,
                "used_bytes_per_message": self.used_bytes / self.messages,
                "allocated_bytes": self.allocated_bytes,
                "allocated_bytes_per_message": self.allocated_bytes / self.messages,
                "file_bytes": self.file_bytes}


@dataclass(slots=True)
class RunResult:
    seconds: float
    messages: int
    disk: DiskUsage | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Row:
    key: str
    system: str
    label: str
    run: Callable[[Run], RunResult]
    messages: int
    peer: str | None = None  # key of the lmdb-queue row this one is compared with
    ceiling: str | None = None  # key of the raw lmdb row this one is compared with
    results: list[RunResult] = field(default_factory=list)
    error: str | None = None

    @property
    def best(self) -> RunResult | None:
        """Best of the repeats; None once any repeat failed verification (a broken run taints the row)."""
        if self.error or not self.results:
            return None
        return max(self.results, key=lambda r: r.rate)

    @property
    def rate(self) -> float | None:
        best = self.best
        return best.rate if best else None

    @property
    def disk(self) -> DiskUsage | None:
        return self.results[-1].disk if self.results and not self.error else None


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    row: str
    baseline: str
    factor: float


TARGETS = (
    Target("ignis publish >= 1.0x lmdb-queue put", "ignis.publish", "peer.put", 1.0),
    Target("ignis drain, 1 consumer >= 1.0x lmdb-queue get+ack, 1 thread", "ignis.drain.1", "peer.get_ack.1",
           1.0),
    Target("ignis publish_many >= 3x lmdb-queue put", "ignis.publish_many", "peer.put", 3.0),
    Target("ignis batched drain, 1 consumer >= 3x lmdb-queue get+ack, 1 thread", "ignis.drain_batch.1",
           "peer.get_ack.1", 3.0),
)


# ---- plumbing shared by the rows ----------------------------------------------------------------------
class Run:
    """What one measurement gets: the payload, a fresh-directory factory and a progress callback."""

    def __init__(self, root: Path, messages: int, payload: bytes, progress: Progress, task: TaskID) -> None:
        self.root = root
        self.messages = messages
        self.payload = payload
        self._progress = progress
        self._task = task

    @contextmanager
    def directory(self, system: str) -> Iterator[str]:
        path = tempfile.mkdtemp(prefix=f"{system.replace(' ', '-')}-", dir=self.root)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def tick(self, done: int) -> None:
        self._progress.update(self._task, completed=done)


def chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(start + size, n))


def disk_usage(path: str, messages: int) -> DiskUsage:
    """Read the page high-water mark of a closed environment (read-only, no lock file needed)."""
    env = lmdb.open(path, readonly=True, lock=False)
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    st = os.stat(os.path.join(path, "data.mdb"))
    return DiskUsage(messages, used, st.st_blocks * 512, st.st_size)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise VerificationError(what)


def check_exactly_once(published: Sequence[Hashable], delivered: Sequence[Hashable]) -> None:
    counts = Counter(delivered)
    duplicated = sum(1 for c in counts.values() if c > 1)
    missing = len(set(published) - counts.keys())
    unknown = len(counts.keys() - set(published))
    check(len(delivered) == len(published) and not (duplicated or missing or unknown),
          f"delivered {len(delivered)} of {len(published)} published: {duplicated} duplicated, "
          f"{missing} missing, {unknown} never published")


def consume(run: Run, threads: int, worker: Callable[[list[Any]], float]) -> tuple[float, list[Any]]:
    """Start `threads` copies of `worker` together; each appends delivered ids to its own list and
    returns the perf_counter() of its last ack when the queue is empty. Returns (seconds from the
    start to the last ack, every delivered id): time spent noticing emptiness is not counted."""
    outs: list[list[Any]] = [[] for _ in range(threads)]
    ends = [0.0] * threads
    errors: list[BaseException] = []
    gate = threading.Barrier(threads + 1)

    def body(i: int) -> None:
        gate.wait()
        try:
            ends[i] = worker(outs[i])
        except BaseException as exc:  # re-raised in the main thread
            errors.append(exc)

    pool = [threading.Thread(target=body, args=(i,), name=f"bench-consumer-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    while gate.n_waiting < threads:  # so that the clock starts before any worker can
        time.sleep(0.001)
    start = time.perf_counter()
    gate.wait()
    for t in pool:
        while t.is_alive():
            t.join(0.1)
            run.tick(sum(map(len, outs)))
    if errors:
        raise errors[0]
    return max(ends) - start, [i for out in outs for i in out]


# ---- raw py-lmdb: the ceiling -------------------------------------------------------------------------
def raw_env(path: str, *, sync: bool = False) -> lmdb.Environment:
    # writemap as both queues open their environments: without it the "ceiling" would be slower than
    # the systems it bounds (dirty pages copied and pwrite()n at every commit).
    return lmdb.open(path, map_size=RAW_MAP_SIZE, sync=sync, metasync=sync, writemap=RAW_WRITEMAP)


def raw_put(run: Run, per_txn: int, *, sync: bool = False) -> RunResult:
    n, payload = run.messages, run.payload
    with run.directory(RAW) as path:
        env = raw_env(path, sync=sync)
        try:
            start = time.perf_counter()
            for tick in chunks(n, max(TICK, per_txn)):
                for txn_keys in chunks(len(tick), per_txn):
                    with env.begin(write=True) as txn:
                        for i in txn_keys:
                            txn.put(_KEY.pack(tick.start + i), payload)
                run.tick(tick.stop)
            seconds = time.perf_counter() - start
            entries = env.stat()["entries"]
        finally:
            env.close()
        check(entries == n, f"{entries} entries after {n} puts")
        return RunResult(seconds, n, disk_usage(path, n))


def raw_get_delete(run: Run, per_txn: int) -> RunResult:
    """Take the first record and delete it, `per_txn` at a time: what a queue's get+ack must do."""
    n, payload = run.messages, run.payload
    with run.directory(RAW) as path:
        env = raw_env(path)
        try:
            for txn_keys in chunks(n, PUBLISH_BATCH):
                with env.begin(write=True) as txn:
                    for i in txn_keys:
                        txn.put(_KEY.pack(i), payload)
            taken: list[int] = []
            next_tick = TICK
            start = end = time.perf_counter()
            while True:
                with env.begin(write=True) as txn:
                    cursor = txn.cursor()
                    more = cursor.first()
                    took = 0
                    while more and took < per_txn:
                        check(cursor.value() == payload, "raw record read back with a different value")
                        taken.append(_KEY.unpack(cursor.key())[0])
                        cursor.delete()  # moves to the next record
                        took += 1
                        more = bool(cursor.key())
                if not took:
                    break
                end = time.perf_counter()
                if len(taken) >= next_tick:
                    run.tick(len(taken))
                    next_tick += TICK
            left = env.stat()["entries"]
        finally:
            env.close()
        check_exactly_once(range(n), taken)
        check(left == 0, f"{left} records left after the drain")
        return RunResult(end - start, n)


# ---- lmdb-queue (equeue): the peer --------------------------------------------------------------------
def peer_queue(path: str, *, sync: bool = False) -> equeue.Queue[bytes]:
    # Shipped defaults otherwise (lease 30 s, recover and vacuum threads on): the peer as users get it.
    return equeue.Queue(path, sync=sync, map_size=EQUEUE_MAP_SIZE)


def peer_put(run: Run, *, sync: bool = False) -> RunResult:
    n, payload = run.messages, run.payload
    with run.directory(PEER) as path:
        queue = peer_queue(path, sync=sync)
        try:
            start = time.perf_counter()
            for tick in chunks(n, TICK):
                for _ in tick:
                    queue.put(payload)
                run.tick(tick.stop)
            seconds = time.perf_counter() - start
            stats = queue.stats()
        finally:
            queue.close()
        check(stats["pending"] == n and stats["total"] == n, f"stats after {n} puts: {stats}")
        return RunResult(seconds, n, disk_usage(path, n))


def peer_get_ack(run: Run, threads: int) -> RunResult:
    """get + record.ack() per message; threads share one Queue (it is thread-safe, and LMDB allows
    one environment handle per process anyway)."""
    n, payload = run.messages, run.payload
    with run.directory(PEER) as path:
        queue = peer_queue(path)
        try:
            published = [queue.put(payload) for _ in range(n)]

            def worker(out: list[int]) -> float:
                last = 0.0
                while True:
                    try:
                        record = queue.get(timeout=EQUEUE_GET_TIMEOUT)
                    except equeue.QueueEmpty:
                        return last
                    check(record.payload == payload, f"job {record.job_id}: payload differs")
                    record.ack()
                    out.append(record.job_id)
                    last = time.perf_counter()

            seconds, delivered = consume(run, threads, worker)
            stats = queue.stats()
        finally:
            queue.close()
        check_exactly_once(published, delivered)
        check(stats["done"] == n and stats["pending"] == stats["running"] == 0, f"stats after drain: {stats}")
        return RunResult(seconds, n)


# ---- ignis --------------------------------------------------------------------------------------------
@contextmanager
def ignis_queue(path: str, durability: str = "fast") -> Iterator[Queue]:
    with Ignis(f"lmdb://{path}?durability={durability}") as ignis:
        ignis.apply(QueueSpec.build(name=QUEUE, handlerType=QUEUE, shards=SHARDS))
        yield ignis.queue(QUEUE)


def check_published(queue: Queue, n: int) -> None:
    stats = queue.stats()
    check(stats.published == n and stats.depth == n, f"after publishing {n}: {stats}")


def ignis_publish(run: Run, *, durability: str = "fast") -> RunResult:
    n, payload = run.messages, run.payload
    with run.directory(IGNIS) as path:
        with ignis_queue(path, durability) as queue:
            start = time.perf_counter()
            for tick in chunks(n, TICK):
                for _ in tick:
                    queue.publish(payload)
                run.tick(tick.stop)
            seconds = time.perf_counter() - start
            check_published(queue, n)
        return RunResult(seconds, n, disk_usage(path, n))


def ignis_publish_many(run: Run) -> RunResult:
    n, payload = run.messages, run.payload
    batch = [payload] * PUBLISH_BATCH
    with run.directory(IGNIS) as path:
        with ignis_queue(path) as queue:
            start = time.perf_counter()
            for part in chunks(n, PUBLISH_BATCH):
                queue.publish_many(batch if len(part) == PUBLISH_BATCH else batch[:len(part)])
                run.tick(part.stop)
            seconds = time.perf_counter() - start
            check_published(queue, n)
        return RunResult(seconds, n, disk_usage(path, n))


def ignis_drain(run: Run, threads: int, batch: int) -> RunResult:
    """batch == 1: fire() then message.ack(); otherwise fire_many(batch) then queue.ack(batch)."""
    n, payload = run.messages, run.payload
    with run.directory(IGNIS) as path, ignis_queue(path) as queue:
        refs = queue.publish_many([payload] * n)

        def one_by_one(out: list[str]) -> float:
            last = 0.0
            while (message := queue.fire()) is not None:
                check(message.data == payload, f"message {message.id}: payload differs")
                message.ack()
                out.append(message.id)
                last = time.perf_counter()
            return last

        def batched(out: list[str]) -> float:
            last = 0.0
            while messages := queue.fire_many(batch):
                for message in messages:
                    check(message.data == payload, f"message {message.id}: payload differs")
                queue.ack(messages)
                out.extend(message.id for message in messages)
                last = time.perf_counter()
            return last

        seconds, delivered = consume(run, threads, one_by_one if batch == 1 else batched)
        check_exactly_once([ref.id for ref in refs], delivered)
        stats = queue.stats()
        check(stats.depth == 0 and stats.consumed == n, f"after the drain: {stats}")
        left = sum(envelope is not None for envelope in queue.store.read([ref.ref for ref in refs]))
        check(left == 0, f"{left} acked messages still stored")
        return RunResult(seconds, n)


# ---- the rows -----------------------------------------------------------------------------------------
def main_rows(n: int) -> list[Row]:
    return [
        Row("raw.put.1", RAW, "put, 1 per write txn", lambda r: raw_put(r, 1), n),
        Row("raw.put.1000", RAW, f"put, {PUBLISH_BATCH} per write txn", lambda r: raw_put(r, PUBLISH_BATCH), n),
        Row("raw.get_delete.1", RAW, "get+delete, 1 per write txn", lambda r: raw_get_delete(r, 1), n),
        Row("raw.get_delete.100", RAW, f"get+delete, {RAW_DELETE_BATCH} per write txn",
            lambda r: raw_get_delete(r, RAW_DELETE_BATCH), n),
        Row("peer.put", PEER, "put", peer_put, n, ceiling="raw.put.1"),
        Row("peer.get_ack.1", PEER, "get+ack, 1 thread", lambda r: peer_get_ack(r, 1), n,
            ceiling="raw.get_delete.1"),
        Row(f"peer.get_ack.{MANY}", PEER, f"get+ack, {MANY} threads", lambda r: peer_get_ack(r, MANY), n,
            ceiling="raw.get_delete.1"),
        Row("ignis.publish", IGNIS, "publish", ignis_publish, n, peer="peer.put", ceiling="raw.put.1"),
        Row("ignis.publish_many", IGNIS, f"publish_many (lists of {PUBLISH_BATCH})", ignis_publish_many, n,
            peer="peer.put", ceiling="raw.put.1000"),
        Row("ignis.drain.1", IGNIS, "fire + message.ack, 1 consumer", lambda r: ignis_drain(r, 1, 1), n,
            peer="peer.get_ack.1", ceiling="raw.get_delete.1"),
        Row(f"ignis.drain.{MANY}", IGNIS, f"fire + message.ack, {MANY} consumers",
            lambda r: ignis_drain(r, MANY, 1), n, peer=f"peer.get_ack.{MANY}", ceiling="raw.get_delete.1"),
        Row("ignis.drain_batch.1", IGNIS, f"fire_many({FIRE_BATCH}) + queue.ack, 1 consumer",
            lambda r: ignis_drain(r, 1, FIRE_BATCH), n, peer="peer.get_ack.1", ceiling="raw.get_delete.100"),
        Row(f"ignis.drain_batch.{MANY}", IGNIS, f"fire_many({FIRE_BATCH}) + queue.ack, {MANY} consumers",
            lambda r: ignis_drain(r, MANY, FIRE_BATCH), n, peer=f"peer.get_ack.{MANY}",
            ceiling="raw.get_delete.100"),
    ]


def select_rows(rows: list[Row], globs: str | None) -> list[Row]:
    """The rows whose key matches one of the comma-separated `globs` (all rows for None)."""
    if globs is None:
        return rows
    patterns = [g.strip() for g in globs.split(",") if g.strip()]
    return [row for row in rows if any(fnmatch.fnmatchcase(row.key, p) for p in patterns)]


def fsync_rows(n: int) -> list[Row]:
    return [
        Row("fsync.raw.put.1", RAW, "put, 1 per write txn, sync=True, metasync=True",
            lambda r: raw_put(r, 1, sync=True), n),
        Row("fsync.peer.put", PEER, "put, sync=True", lambda r: peer_put(r, sync=True), n,
            ceiling="fsync.raw.put.1"),
        Row("fsync.ignis.publish", IGNIS, "publish, durability=fsync",
            lambda r: ignis_publish(r, durability="fsync"), n, peer="fsync.peer.put", ceiling="fsync.raw.put.1"),
    ]


def measure(rows: list[Row], repeat: int, root: Path, payload: bytes, progress: Progress) -> None:
    """Round-robin over the rows, `repeat` times, so that a noisy spell on this shared machine hits
    every system rather than one row's every repeat."""
    overall = progress.add_task("all rows", total=repeat * len(rows))
    for round_ in range(1, repeat + 1):
        for row in rows:
            if row.error is None:
                task = progress.add_task(f"[{round_}/{repeat}] {row.system}: {row.label}", total=row.messages)
                gc.collect()  # so a collection owed by the previous row does not land in this one
                try:
                    row.results.append(row.run(Run(root, row.messages, payload, progress, task)))
                except VerificationError as exc:
                    row.error = f"verification failed: {exc}"
                except Exception as exc:  # a crashed row is reported; the other rows still run
                    row.error = f"crashed: {type(exc).__name__}: {exc}"
                progress.remove_task(task)
            progress.advance(overall)


# ---- reporting ----------------------------------------------------------------------------------------
def ratio(rows: dict[str, Row], key: str, other: str | None) -> float | None:
    """rate(key) / rate(other); None when either is missing or failed verification."""
    if other is None or other not in rows or key not in rows:
        return None
    mine, theirs = rows[key].rate, rows[other].rate
    return mine / theirs if mine and theirs else None


def paired_ratio(rows: dict[str, Row], key: str, other: str) -> float | None:
    """Median over rounds of rate(key) / rate(other) within the same round. The rows of one round run
    seconds apart, so a slow spell of the shared machine hits both sides of each ratio; best-of-R
    compares the luckiest moment of one row with the luckiest moment of another."""
    mine, theirs = rows.get(key), rows.get(other)
    if mine is None or theirs is None or mine.error or theirs.error or not mine.results:
        return None
    pairs = [a.rate / b.rate for a, b in zip(mine.results, theirs.results, strict=False) if b.rate > 0]
    return statistics.median(pairs) if pairs else None


def target_results(rows: dict[str, Row]) -> list[dict[str, Any]]:
    out = []
    for t in TARGETS:
        if t.row not in rows or t.baseline not in rows:  # a --rows selection left one side out
            continue
        value = ratio(rows, t.row, t.baseline)
        paired = paired_ratio(rows, t.row, t.baseline)
        out.append({"target": t.name, "row": t.row, "baseline": t.baseline, "required_ratio": t.factor,
                    "ratio": value, "pass": value is not None and value >= t.factor,
                    "paired_median_ratio": paired, "paired_pass": paired is not None and paired >= t.factor})
    return out


def row_dict(rows: dict[str, Row], row: Row) -> dict[str, Any]:
    best = row.best
    return {"key": row.key, "system": row.system, "row": row.label, "messages": row.messages,
            "msgs_per_s": row.rate, "best_seconds": best.seconds if best else None,
            "runs_msgs_per_s": [r.rate for r in row.results], "error": row.error,
            "vs_lmdb_queue": ratio(rows, row.key, row.peer), "vs_raw_lmdb": ratio(rows, row.key, row.ceiling)}


def source_state() -> dict[str, Any]:
    """Which ignis code was measured: HEAD plus a hash of any uncommitted change under ignis/, since
    the core changes often and a number without its code means little."""
    repo = Path(__file__).resolve().parent.parent

    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *argv], capture_output=True, text=True, timeout=10,
                              check=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
        diff = git("diff", "HEAD", "--", "ignis")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "ignis_uncommitted_diff": None}
    digest = hashlib.sha256(diff.encode()).hexdigest()[:12] if diff else None
    return {"commit": head, "ignis_uncommitted_diff": digest}


def report(args: argparse.Namespace, main: list[Row], fsync: list[Row], root: Path,
           load_before: tuple[float, float, float]) -> dict[str, Any]:
    rows = {row.key: row for row in main + fsync}
    return {
        "benchmark": "ignis lmdb throughput",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "py_lmdb": lmdb.__version__, "lmdb": ".".join(map(str, lmdb.version())),
                 "lmdb_queue": equeue.__version__, "directory": str(root),
                 # 1-minute load average before and after: other work on a shared machine shows here
                 "load_average_1m": [round(load_before[0], 2), round(os.getloadavg()[0], 2)]},
        "source": source_state(),
        "config": {"messages": args.messages, "repeat": args.repeat, "payload_bytes": PAYLOAD_BYTES,
                   "shards": SHARDS, "publish_batch": PUBLISH_BATCH, "fire_batch": FIRE_BATCH,
                   "threads": MANY, "fsync_messages": args.fsync_messages if args.fsync else None,
                   "settings": {RAW: f"sync=False metasync=False writemap={RAW_WRITEMAP}",
                                PEER: "sync=False, its other defaults", IGNIS: "durability=fast"}},
        "rows": [row_dict(rows, row) for row in main],
        "targets": target_results(rows),
        "disk": [{"key": row.key, "system": row.system, "row": row.label, **row.disk.as_dict()}
                 for row in main if row.disk],
        "fsync": [row_dict(rows, row) for row in fsync],
        "ok": all(row.error is None for row in main + fsync),
    }


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else ""


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "INVALID"


def throughput_table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in (("system", "left"), ("row", "left"), ("msg/s (best)", "right"),
                          ("all runs, msg/s", "right"), ("vs lmdb-queue", "right"), ("vs raw lmdb", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        runs = " ".join(f"{v / 1000:.1f}k" for v in r["runs_msgs_per_s"])
        table.add_row(r["system"], r["row"], _rate(r["msgs_per_s"]), runs, _x(r["vs_lmdb_queue"]),
                      _x(r["vs_raw_lmdb"]), style="bold" if r["system"] == IGNIS else None)
    return table


def print_human(result: dict[str, Any], console: Console) -> None:
    cfg, host = result["config"], result["host"]
    console.print(f"[bold]IgnisMQ lmdb throughput[/] {result['date']}  python {host['python']}, "
                  f"{host['cpus']} cpus, py-lmdb {host['py_lmdb']} (LMDB {host['lmdb']}), "
                  f"lmdb-queue {host['lmdb_queue']}; load average (1 min) before/after "
                  f"{host['load_average_1m'][0]}/{host['load_average_1m'][1]}")
    src = result["source"]
    dirty = f" + uncommitted ignis/ changes (diff {src['ignis_uncommitted_diff']})" \
        if src["ignis_uncommitted_diff"] else ""
    console.print(f"ignis at commit {src['commit']}{dirty}")
    console.print(f"{cfg['messages']} messages of {cfg['payload_bytes']} bytes per row, best of "
                  f"{cfg['repeat']}; no fsync anywhere; ignis queue with {cfg['shards']} shards; "
                  f"fresh directories under {host['directory']}")
    console.print("; ".join(f"{system}: {flags}" for system, flags in cfg["settings"].items()))
    console.print(throughput_table("Throughput", result["rows"]))
    for r in result["rows"] + result["fsync"]:
        if r["error"]:
            console.print(f"[red]{r['system']}: {r['row']}: {r['error']}[/]")

    targets = Table(title="Targets", title_justify="left")
    for name in ("target", "best of R", "result", "median of per-round ratios", "result"):
        targets.add_column(name)
    for t in result["targets"]:
        targets.add_row(t["target"], _x(t["ratio"]) or "no valid number",
                        "[green]PASS[/]" if t["pass"] else "[red]FAIL[/]",
                        _x(t["paired_median_ratio"]) or "no valid number",
                        "[green]PASS[/]" if t["paired_pass"] else "[red]FAIL[/]")
    console.print(targets)

    disk = Table(title=f"Disk after publishing {cfg['messages']} messages (data.mdb)", title_justify="left")
    for name in ("system", "published with", "used B/msg", "allocated B/msg", "file size"):
        disk.add_column(name, justify="left" if name in ("system", "published with") else "right")
    for d in result["disk"]:
        disk.add_row(d["system"], d["row"], f"{d['used_bytes_per_message']:.0f}",
                     f"{d['allocated_bytes_per_message']:.0f}", f"{d['file_bytes'] / 2**20:,.1f} MiB")
    console.print(disk)
    console.print("used = (env.info()['last_pgno'] + 1) * env.stat()['psize'] (pages in use, freelist "
                  "included); allocated = os.stat(data.mdb).st_blocks * 512")
    if result["fsync"]:
        console.print(throughput_table(f"fsync mode, {cfg['fsync_messages']} messages per row",
                                       result["fsync"]))
        console.print("lmdb-queue opens LMDB with writemap=True, map_async=True: its sync=True commits "
                      "with msync(MS_ASYNC), which does not wait for the disk (no fsync per put).")


# ---- main ---------------------------------------------------------------------------------------------
def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=positive, default=20000, help="messages per row (default 20000)")
    parser.add_argument("--repeat", type=positive, default=3, help="runs per row, best kept (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    parser.add_argument("--fsync", action="store_true", help="add a small fsync-mode publish comparison")
    parser.add_argument("--fsync-messages", type=positive, default=1000,
                        help="messages per row in the fsync comparison (default 1000)")
    parser.add_argument("--rows", default=None, metavar="GLOBS",
                        help="only the rows whose key matches one of these comma-separated globs, e.g. "
                             "'ignis.*' (keys: raw.put.1, peer.put, ignis.publish, ignis.drain.8, ...)")
    parser.add_argument("--list-rows", action="store_true",
                        help="print the keys of the rows --rows selects, one a line, and run nothing "
                             "(bench/compare.py pairs the revisions row by row with it)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the temporary stores go (default: the system temp dir; use a real disk)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    payload = os.urandom(PAYLOAD_BYTES)
    load_before = os.getloadavg()
    main_set = select_rows(main_rows(args.messages), args.rows)
    if not main_set:
        print(f"error: --rows {args.rows!r} matches no row (keys: "
              f"{', '.join(row.key for row in main_rows(1))})", file=sys.stderr)
        return 2
    if args.list_rows:
        print("\n".join(row.key for row in main_set))
        return 0
    fsync_set = fsync_rows(args.fsync_messages) if args.fsync else []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="ignis-bench-", dir=args.dir) as tmp:
        root = Path(tmp)
        with Progress(*columns, console=Console(stderr=True), transient=True,
                      refresh_per_second=4) as progress:
            measure(main_set, args.repeat, root, payload, progress)
            if fsync_set:
                measure(fsync_set, args.repeat, root, payload, progress)
        result = report(args, main_set, fsync_set, root, load_before)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        # Piped output would otherwise wrap at rich's 80-column default.
        print_human(result, Console(width=None if sys.stdout.isatty() else 132))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
