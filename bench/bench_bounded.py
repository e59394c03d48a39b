#!/usr/bin/env python3
"""Publish throughput of a bounded queue (maxLength / maxBytes; ignis.bounds) against an unbounded one, side by
side in one run (issue 49: a bounded queue publishes at >= 0.9x an unbounded one).

    .venv/bin/python bench/bench_bounded.py                                   # lmdb (durability=fast)
    .venv/bin/python bench/bench_bounded.py --aerospike 127.0.0.1:3000/test   # and a real Aerospike server
    .venv/bin/python bench/bench_bounded.py --json

Rows: `publish` (one message a call, one thread), `publish x8` (eight threads), `publish_many` (1000 a call). Each
round publishes N messages of 256 bytes into a fresh unbounded queue, a queue bounded by maxLength, and one bounded
by maxLength and maxBytes, in alternating order; the bound is set well above N, so every publish takes the guarded
path and none is refused (a refusal is a different, cheaper path). The median of the rounds is reported, and the
ratio bounded / unbounded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ignis import Ignis, QueueSpec

PAYLOAD = b"x" * 256
SHARDS = 32


def timed(fn: Callable[[], int]) -> float:
    start = time.perf_counter()
    count = fn()
    return count / (time.perf_counter() - start)


def publish_loop(queue: Any, n: int) -> int:
    for _ in range(n):
        queue.publish(PAYLOAD)
    return n


def publish_threads(queue: Any, n: int, threads: int = 8) -> int:
    each = n // threads
    workers = [threading.Thread(target=publish_loop, args=(queue, each)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return each * threads


def publish_many(queue: Any, n: int) -> int:
    for start in range(0, n, 1000):
        queue.publish_many([PAYLOAD] * min(1000, n - start))
    return n


ROWS = {"publish": publish_loop, "publish x8": publish_threads, "publish_many": publish_many}
KINDS = {"unbounded": {}, "maxLength": {"maxLength": 10**9}, "maxLength+maxBytes": {"maxLength": 10**9,
                                                                                   "maxBytes": 10**12}}


def run(url: str, n: int, rounds: int) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, list[float]]] = {row: {kind: [] for kind in KINDS} for row in ROWS}
    with Ignis(url) as ignis:
        for r in range(rounds):
            order = list(KINDS) if r % 2 == 0 else list(reversed(KINDS))
            for row, fn in ROWS.items():
                for kind in order:
                    name = f"bench-{uuid.uuid4().hex[:8]}"
                    ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=SHARDS, concurrency=0,
                                                **KINDS[kind]))
                    queue = ignis.queue(name)
                    results[row][kind].append(timed(lambda queue=queue, fn=fn: fn(queue, n)))
                    queue.main.release_reserved()
    return {row: {kind: statistics.median(v) for kind, v in kinds.items()} for row, kinds in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=20000, help="messages per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--aerospike", help="host:port/namespace of a real server to measure too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = {"lmdb (fast)": f"lmdb://{tempfile.mkdtemp(prefix='bench-bounded-')}/store?durability=fast"}
    if args.aerospike:
        run_id = uuid.uuid4().hex[:6]
        stores["aerospike"] = f"aerospike://{args.aerospike}?farm=bb{run_id}&client=bb{run_id}"
    report: dict[str, Any] = {}
    for store, url in stores.items():
        n = args.n if store.startswith("lmdb") else max(args.n // 4, 1000)
        figures = run(url, n, args.rounds)
        report[store] = {row: {**{k: round(v) for k, v in kinds.items()},
                               **{f"ratio {k}": round(v / kinds["unbounded"], 3) for k, v in kinds.items()
                                  if k != "unbounded"}}
                         for row, kinds in figures.items()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for store, rows in report.items():
        print(f"\n{store}  (messages/s, median of {args.rounds}; ratio = bounded / unbounded, target >= 0.9)")
        print(f"{'row':<14}{'unbounded':>12}{'maxLength':>12}{'ratio':>8}{'+maxBytes':>12}{'ratio':>8}")
        for row, f in rows.items():
            print(f"{row:<14}{f['unbounded']:>12}{f['maxLength']:>12}{f['ratio maxLength']:>8}"
                  f"{f['maxLength+maxBytes']:>12}{f['ratio maxLength+maxBytes']:>8}")


if __name__ == "__main__":
    main()
