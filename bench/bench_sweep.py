#!/usr/bin/env python3
"""Sweep throughput on lmdb, as a ratio to the raw store calls the same records need, and how sweep
time grows with the backlog.

    .venv/bin/python bench/bench_sweep.py                 # 100 queues x 32 shards, 20 stuck per shard
    .venv/bin/python bench/bench_sweep.py --per-shard 50 --json

Set-up: `queues` queues of `shards` shards each; every shard gets `per-shard` messages, all claimed
long ago and never settled (a stuck backlog: every record must be re-homed).

1. raw: the ceiling, on the same records in the same run — per shard one `peek` of the claimed range,
   one `load` of copies into a scratch magazine and one `delete` of those copies (read + write +
   delete of as many records as the sweep moves, with no sweep logic, pointers or threads);
2. sweep: `Sweeper.sweep_all()` with the default 64-thread pool (and, on a fresh backlog of the same
   size, 1 thread), moving every record to the sideline; reported as records examined and moved per
   second and as a ratio to the raw rate. On lmdb all threads share one process, one GIL and one
   write lock, so a big pool costs more than it gives (it is sized for Aerospike's network waits);
   the growth runs use the last pool size listed;
3. growth: after the big sweep, sweeps with 0, `k`, 4k and 16k new stuck records per queue — the time
   must follow the new slots, not the total history (it reads from the stored sweep pointer).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ignis_workers.sweeper import Sweeper
from rich.console import Console
from rich.table import Table

from ignis import Ignis, QueueSpec
from ignis.envelope import Envelope, now_ms
from ignis.storage import open_store
from ignis.storage.base import Storage

OLD = 10**9  # fireTS far in the past (epoch ms): every claim is abandoned


def declare(store: Storage, queues: int, shards: int) -> list[str]:
    client = Ignis(store)
    names = [f"q{i:03d}" for i in range(queues)]
    for name in names:
        client.apply(QueueSpec.build(name=name, handlerType="bench", shards=shards, sweepDurationSeconds=300,
                                     shovel={"enabled": False}))
    return names


def stick(store: Storage, names: list[str], shards: int, per_shard: int, payload: bytes) -> None:
    """Load `per_shard` messages into every shard and claim them with an ancient fireTS."""
    at = now_ms()
    for name in names:
        items = [(shard, Envelope(payload, f"{name}-{shard}-{i}-{at}", at)) for shard in range(shards)
                 for i in range(per_shard)]
        store.load(name, items, 86400)
        for shard in range(shards):
            store.claim(name, shard, per_shard, OLD)


def raw_pass(store: Storage, names: list[str], shards: int) -> int:
    """Read + write + delete the same records with bare store calls. Returns records handled."""
    handled = 0
    for name in names:
        pointers = store.pointers(name, shards)
        for shard in range(shards):
            found = store.peek(name, shard, 1, pointers[shard].fire)
            refs = store.load("scratch", [(shard, env) for _, env in found], 86400)
            store.delete(refs)
            handled += len(found)
    return handled


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--per-shard", type=int, default=20)
    parser.add_argument("--growth-k", type=int, default=32, help="new stuck records per queue, first step")
    parser.add_argument("--payload", type=int, default=256)
    parser.add_argument("--threads", default="64,1",
                        help="pool sizes to compare, comma-separated (each sweeps a fresh backlog of the same size)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    console = Console(stderr=True)
    tmp = Path(tempfile.mkdtemp(prefix="ignis-bench-sweep-"))
    store = open_store(f"lmdb://{tmp}/store?durability=fast")
    payload = b"x" * args.payload
    try:
        console.print(f"setting up {args.queues} queues x {args.shards} shards x {args.per_shard} stuck ...")
        names = declare(store, args.queues, args.shards)
        stick(store, names, args.shards, args.per_shard, payload)
        total = args.queues * args.shards * args.per_shard

        raw_s, raw_n = timed(lambda: raw_pass(store, names, args.shards))
        assert raw_n == total, (raw_n, total)
        epoch = store.next_epoch()
        sweeps = []
        for i, threads in enumerate(int(t) for t in args.threads.split(",")):
            if i:  # the previous sweep moved the backlog: stick a fresh one of the same size
                stick(store, names, args.shards, args.per_shard, payload)
            sweeper = Sweeper(store, epoch_source=lambda: epoch, threads=threads)
            sweep_s, reports = timed(sweeper.sweep_all)
            moved = sum(r.main.moved for r in reports)
            examined = sum(r.main.examined for r in reports)
            assert moved == total and all(r.ok for r in reports), (moved, total)
            sweeps.append({"threads": threads, "seconds": round(sweep_s, 3),
                           "examined_per_s": round(examined / sweep_s), "moved_per_s": round(moved / sweep_s),
                           "ratio_to_raw": round(raw_s / sweep_s, 3)})
            if i < len(args.threads.split(",")) - 1:
                sweeper.close()

        growth = []
        for k in (0, args.growth_k, 4 * args.growth_k, 16 * args.growth_k):
            per_shard = k // args.shards
            if k:
                stick(store, names, args.shards, max(per_shard, 1), payload)
            history = sum(p.fire for n in names[:1] for p in store.pointers(n, args.shards).values())
            seconds, reps = timed(sweeper.sweep_all)
            growth.append({"new_per_queue": max(per_shard, 1) * args.shards if k else 0,
                           "history_per_queue": history, "moved": sum(r.moved for r in reps),
                           "seconds": round(seconds, 4)})
        sweeper.close()
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)

    result = {
        "queues": args.queues, "shards": args.shards, "records": total,
        "raw": {"seconds": round(raw_s, 3), "records_per_s": round(raw_n / raw_s)},
        "sweeps": sweeps,
        "growth": growth,
    }
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    table = Table(title=f"sweep of {total} stuck records ({args.queues} queues x {args.shards} shards), lmdb")
    for column in ("pass", "seconds", "records/s", "ratio to raw"):
        table.add_column(column, justify="right" if column != "pass" else "left")
    table.add_row("raw peek+load+delete", f"{raw_s:.3f}", f"{raw_n / raw_s:,.0f}", "1.00")
    for row in sweeps:
        table.add_row(f"sweep ({row['threads']} threads)", f"{row['seconds']:.3f}", f"{row['moved_per_s']:,}",
                      f"{row['ratio_to_raw']:.2f}")
    Console().print(table)
    g = Table(title="sweep time vs backlog: new slots since the last sweep, not total history")
    for column in ("new stuck / queue", "history / queue", "moved", "seconds"):
        g.add_column(column, justify="right")
    for row in growth:
        g.add_row(str(row["new_per_queue"]), str(row["history_per_queue"]), str(row["moved"]), f"{row['seconds']:.4f}")
    Console().print(g)


if __name__ == "__main__":
    main()
