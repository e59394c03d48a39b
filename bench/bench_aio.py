#!/usr/bin/env python3
"""The asyncio API against the blocking one, side by side in one run (issue 29, part 1):

* publish throughput at the same concurrency, for each C of `--concurrency`: C asyncio tasks awaiting
  `AsyncQueue.publish` vs C threads calling `Queue.publish` (target: async >= 0.8x sync);
* end-to-end latency at a fixed rate: a publisher on an intended schedule in another process (as in the
  latency issue's method: producers and consumers are different pods), `--consumers` consumers waiting for
  each message (tasks doing `async for` over an `AsyncQueue.iterator` each vs threads in
  `Queue.fire(timeout=)`), handler entry - send time, p50 / p99 from an HDR histogram (the latency issue's
  bounds; it has 4 consumer workers at 1,000 msg/s). As in the latency issue's method, the messages of a
  warm-up (`--warmup` seconds: new connections, first claims) are delivered and not counted.

    .venv/bin/python bench/bench_aio.py [--server host:port/ns] [--concurrency 1,8,32] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.table import Table

from ignis import Ignis, QueueSpec
from ignis.aio import AsyncIgnis

PAYLOAD = b"x" * 1024
STAMP = struct.Struct(">d?")  # send time, counted (False: a warm-up message)


def sync_publish_rate(q: Any, concurrency: int, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * concurrency

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            q.publish(PAYLOAD)
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


async def async_publish_rate(q: Any, concurrency: int, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * concurrency

    async def work(i: int) -> None:
        while time.perf_counter() < stop:
            await q.publish(PAYLOAD)
            counts[i] += 1

    started = time.perf_counter()
    await asyncio.gather(*(work(i) for i in range(concurrency)))
    return sum(counts) / (time.perf_counter() - started)


def schedule(publish: Any, rate: int, seconds: float, warmup: float = 0.0) -> None:
    start = time.perf_counter()
    first_counted = int(rate * warmup)
    for i in range(first_counted + int(rate * seconds)):
        time.sleep(max(0.0, start + i / rate - time.perf_counter()))
        publish(STAMP.pack(time.time(), i >= first_counted) + PAYLOAD)


def record(hist: HdrHistogram, data: bytes) -> None:
    """The message's e2e latency, if it counts (not a warm-up message)."""
    sent, counted = STAMP.unpack_from(data)
    if counted:
        hist.record_value(max(1, int((time.time() - sent) * 1e6)))


def run_publisher(url: str, queue: str, rate: int, seconds: float, warmup: float) -> None:
    """The e2e phase's publisher (`_publish`): its own process, so it shares neither the GIL nor the handle
    with the consumers measured."""
    with Ignis(url) as ignis:
        schedule(ignis.queue(queue).publish, rate, seconds, warmup)


def publish_phase(url: str, q: Any, rate: int, seconds: float, where: str, warmup: float) -> None:
    """Publish on schedule from another process (`where="process"`) or from this thread on `q` itself."""
    if where == "thread":
        time.sleep(0.5)  # the consumers are waiting
        schedule(q.publish, rate, seconds, warmup)
        return
    proc = subprocess.Popen([sys.executable, __file__, "_publish", url, q.name, str(rate), str(seconds),
                             str(warmup)])
    if proc.wait(timeout=120 + warmup + seconds) != 0:
        raise RuntimeError(f"the publisher process failed (exit {proc.returncode})")


def sync_e2e(q: Any, url: str, rate: int, seconds: float, consumers: int, where: str, warmup: float
             ) -> HdrHistogram:
    hist = HdrHistogram(1, 60_000_000, 3)  # microseconds
    expected = int(rate * warmup) + int(rate * seconds)
    lock = threading.Lock()
    got = [0]
    done = threading.Event()

    def consume() -> None:
        while not done.is_set():
            m = q.fire(timeout=0.2)
            if m is None:
                continue
            with lock:
                record(hist, m.data)
            m.ack()
            with lock:
                got[0] += 1
                if got[0] >= expected:
                    done.set()

    for _ in range(consumers):
        threading.Thread(target=consume, daemon=True).start()
    publish_phase(url, q, rate, seconds, where, warmup)
    done.wait(30)
    return hist


async def async_e2e(aq: Any, q: Any, url: str, rate: int, seconds: float, consumers: int, where: str,
                    warmup: float) -> HdrHistogram:
    hist = HdrHistogram(1, 60_000_000, 3)
    expected = int(rate * warmup) + int(rate * seconds)
    got = [0]
    done = asyncio.Event()

    async def consume() -> None:
        async with aq.iterator(prefetch=1, wait=1.0) as it:
            async for m in it:
                record(hist, m.data)
                await m.ack()
                got[0] += 1
                if got[0] >= expected:
                    done.set()
                if done.is_set():
                    return

    tasks = [asyncio.create_task(consume()) for _ in range(consumers)]
    await asyncio.to_thread(publish_phase, url, q, rate, seconds, where, warmup)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return hist


def ms(hist: HdrHistogram, q: float) -> float:
    return round(hist.get_value_at_percentile(q) / 1000, 2)


async def publish_rates(sync_q: Any, async_q: Any, concurrency: int, seconds: float, rounds: int
                        ) -> dict[str, Any]:
    """Publish throughput of C tasks against C threads, in alternating rounds (so drift hits both alike)."""
    ratios, sync_rates, async_rates = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            s = sync_publish_rate(sync_q, concurrency, seconds)
            a = await async_publish_rate(async_q, concurrency, seconds)
        else:
            a = await async_publish_rate(async_q, concurrency, seconds)
            s = sync_publish_rate(sync_q, concurrency, seconds)
        sync_rates.append(s)
        async_rates.append(a)
        ratios.append(a / s)
    return {"concurrency": concurrency, "sync_publish_per_s": round(statistics.median(sync_rates)),
            "async_publish_per_s": round(statistics.median(async_rates)),
            "async_over_sync": round(statistics.median(ratios), 3)}


async def one_store(urls: tuple[str, str], concurrencies: list[int], seconds: float, rate: int, rounds: int,
                    consumers: int = 1, publisher: str = "process", warmup: float = 2.0) -> dict[str, Any]:
    """Both phases on one store type. Each phase has a store of its own (`urls`: an lmdb environment, an
    Aerospike farm). The publish phase leaves hundreds of thousands of messages behind. In the same lmdb
    environment, they slowed the e2e phase's async claims. Measured beside a 200,000-message backlog: the
    async e2e p50 went from 0.5 ms to 1.2-3.5 ms, and the blocking API's stayed at 0.5 ms."""
    publish_url, e2e_url = urls
    async with AsyncIgnis(publish_url, threads=max(16, max(concurrencies) * 2)) as aig:
        await aig.apply(QueueSpec.build(name="pub", handlerType="pub", shards=16))
        sync_q, async_q = aig.sync.queue("pub"), aig.queue("pub")
        publish = [await publish_rates(sync_q, async_q, c, seconds, rounds) for c in concurrencies]
    async with AsyncIgnis(e2e_url) as aig:
        await aig.apply(QueueSpec.build(name="e2e", handlerType="e2e", shards=16))
        e2e_q = aig.sync.queue("e2e")
        sync_hist = await asyncio.to_thread(sync_e2e, e2e_q, e2e_url, rate, seconds * 2, consumers, publisher,
                                            warmup)
        async_hist = await async_e2e(aig.queue("e2e"), e2e_q, e2e_url, rate, seconds * 2, consumers, publisher,
                                     warmup)
    return {"store": publish_url.split(":")[0], "publish": publish,
            "rate": rate, "consumers": consumers, "publisher": publisher, "warmup_s": warmup,
            "sync_e2e_ms": {"p50": ms(sync_hist, 50), "p99": ms(sync_hist, 99)},
            "async_e2e_ms": {"p50": ms(async_hist, 50), "p99": ms(async_hist, 99)}}


def concurrency_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by commas, e.g. 1,8,32")
    return values


def main() -> None:
    if sys.argv[1:2] == ["_publish"]:
        url, queue, rate, seconds, warmup = sys.argv[2:7]
        run_publisher(url, queue, int(rate), float(seconds), float(warmup))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="Aerospike host:port/namespace (also measured)")
    parser.add_argument("--concurrency", type=concurrency_list, default=[1, 8, 32],
                        help="publishers (tasks against threads) of the throughput phase, one measurement each: "
                             "a comma-separated list")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=1,
                        help="consumers of the e2e phase: threads in fire() vs tasks over an iterator each")
    parser.add_argument("--publisher", choices=("process", "thread"), default="process",
                        help="where the e2e phase's publisher runs: its own process (the latency issue's method), or "
                             "a thread of the consumers' process on their handle")
    parser.add_argument("--warmup", type=float, default=2.0,
                        help="seconds of e2e messages before those counted, delivered and not counted (the latency "
                             "issue's method; 0 counts every message)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="ignis-aio-") as tmp:
        results.append(asyncio.run(one_store((f"lmdb://{tmp}/publish", f"lmdb://{tmp}/e2e"), args.concurrency,
                                             args.seconds, args.rate, args.rounds, args.consumers, args.publisher,
                                             args.warmup)))
    if args.server:
        publish_run, e2e_run = uuid.uuid4().hex[:6], uuid.uuid4().hex[:6]
        urls = (f"aerospike://{args.server}?farm=ba{publish_run}&client=ba{publish_run}",
                f"aerospike://{args.server}?farm=ba{e2e_run}&client=ba{e2e_run}")
        results.append(asyncio.run(one_store(urls, args.concurrency, args.seconds, args.rate, args.rounds,
                                             args.consumers, args.publisher, args.warmup)))
    console = Console()
    table = Table(title="publish throughput: C tasks against C threads, same run")
    for column in ("store", "concurrency", "publish/s sync", "publish/s async", "async/sync (target >= 0.8)"):
        table.add_column(column, justify="right")
    for r in results:
        for p in r["publish"]:
            table.add_row(r["store"], str(p["concurrency"]), f"{p['sync_publish_per_s']:,}",
                          f"{p['async_publish_per_s']:,}", f"{p['async_over_sync']:.2f}x")
    console.print(table)
    table = Table(title=f"e2e latency at {args.rate} msg/s, {args.consumers} consumer(s), same run")
    for column in ("store", "e2e ms p50/p99 sync", "e2e ms p50/p99 async"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r["store"], f"{r['sync_e2e_ms']['p50']} / {r['sync_e2e_ms']['p99']}",
                      f"{r['async_e2e_ms']['p50']} / {r['async_e2e_ms']['p99']}")
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
