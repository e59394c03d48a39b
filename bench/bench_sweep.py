#!/usr/bin/env python3
"""Sweep throughput on lmdb, as a ratio to the raw store calls the same records need, and how sweep
time grows with the backlog; and on Aerospike, next to the raw client doing the same record work.

    .venv/bin/python bench/bench_sweep.py                 # 100 queues x 32 shards, 20 stuck per shard
    .venv/bin/python bench/bench_sweep.py --per-shard 50 --json
    .venv/bin/python bench/bench_sweep.py --server 127.0.0.1:3000/test      # Aerospike (see below)

Aerospike (`--server host:port[/ns]`, or IGNIS_TEST_AEROSPIKE): one queue of 32 shards with `--records`
(default 16,000) claims abandoned long ago, swept by a Sweeper of 1, 8 and 64 threads; beside each, in the
same round, the raw client does the same record work in a pool of as many threads: a batch read of the
records, then per record a put of its copy and a remove of the original. Target: the sweep >= 1.5x that
loop. Every sweep move stays fenced and copy-before-delete (DESIGN §4). Rounds are repeated (`--rounds`) and
the median of each pool size's per-round ratios is reported.

The bench process takes the collector settings of the processes that sweep (`tune_collector`: `ignis sweeper`,
`ignis sweep` and `ignis up` call it at start); `--default-collector` keeps Python's, to see what they save.

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
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ignis_workers.sweeper import Sweeper, tune_collector
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


def aerospike_main(args: argparse.Namespace) -> None:
    """The sweep on a real server, next to the raw client's per-record loop (see the module doc)."""
    import statistics
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    hostport, _, namespace = args.server.partition("/")
    namespace = namespace or "test"
    run = uuid.uuid4().hex[:8]
    url = f"aerospike://{hostport}/{namespace}?farm=s{run}&client=s{run}"
    store = open_store(url)
    client = store.client  # type: ignore[attr-defined]
    console = Console(stderr=True)
    payload = b"x" * args.payload
    raw_source, raw_copy = f"s{run}_raw_src", f"s{run}_raw_dst"
    shards, per_shard = 32, max(args.records // 32, 1)
    total = shards * per_shard
    rows: list[dict[str, Any]] = []
    try:
        names = declare(store, 1, shards)
        epoch = store.next_epoch()
        for threads in (1, 8, 64):
            for r in range(args.rounds):
                console.print(f"{threads} thread(s), round {r + 1}/{args.rounds}: {total} abandoned claims")
                # raw: the same records' bins, written beside the queue; a batch read, then a put of the copy
                # and a remove of the original per record, on a pool of `threads`.
                at = now_ms()
                bins = Envelope(payload, "m", at, fire_ts=OLD, attempts=1).to_bins()
                keys = [(namespace, raw_source, f"{r}-{i}") for i in range(total)]
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(lambda key, bins=bins: client.put(key, bins), keys))
                started = time.perf_counter()
                found = []
                for i in range(0, total, 5000):
                    found.extend(client.batch_read(keys[i:i + 5000]).batch_records)

                def move_one(record: Any) -> None:
                    key = record.key
                    client.put((namespace, raw_copy, key[2]), record.record[2])
                    client.remove(key)

                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(move_one, found))
                raw_s = time.perf_counter() - started
                # the sweep, over a fresh backlog of the same size
                stick(store, names, shards, per_shard, payload)
                sweeper = Sweeper(store, epoch_source=lambda: epoch, threads=threads)
                sweep_s, reports = timed(sweeper.sweep_all)
                sweeper.close()
                moved = sum(r.main.moved for r in reports)
                if moved != total or not all(r.ok for r in reports):
                    raise SystemExit(f"the sweep moved {moved} of {total}: {[r.as_dict() for r in reports]}")
                rows.append({"threads": threads, "round": r + 1, "raw_per_s": total / raw_s,
                             "sweep_per_s": total / sweep_s, "ratio": raw_s / sweep_s})
    finally:
        for set_name in (raw_source, raw_copy, f"s{run}_data_set", f"s{run}_meta_set", f"s{run}_s{run}_ignis_queues",
                         f"s{run}_ignis_system"):
            client.truncate(namespace, set_name, 0)
        store.close()
    summary = []
    for threads in (1, 8, 64):
        mine = [row for row in rows if row["threads"] == threads]
        summary.append({"threads": threads, "raw_per_s": round(statistics.median(r["raw_per_s"] for r in mine)),
                        "sweep_per_s": round(statistics.median(r["sweep_per_s"] for r in mine)),
                        "ratio": round(statistics.median(r["ratio"] for r in mine), 2),
                        "ratios": [round(r["ratio"], 2) for r in mine]})
    if args.json:
        sys.stdout.write(json.dumps({"server": url, "records": total, "rounds": rows, "summary": summary},
                                    indent=2) + "\n")
        return
    table = Table(title=f"sweep of {total} abandoned claims (1 queue x 32 shards) on {hostport}/{namespace}: "
                        f"medians of {args.rounds} rounds")
    for column in ("threads", "raw batch read + put + remove /s", "sweep /s", "sweep / raw", "per round"):
        table.add_column(column, justify="right")
    for row in summary:
        table.add_row(str(row["threads"]), f"{row['raw_per_s']:,}", f"{row['sweep_per_s']:,}", f"{row['ratio']:.2f}x",
                      " ".join(f"{x:.2f}" for x in row["ratios"]))
    Console().print(table)
    Console().print("target: the sweep >= 1.5x the raw per-record loop")


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
    parser.add_argument("--server", default=os.environ.get("IGNIS_TEST_AEROSPIKE"),
                        help="host:port[/namespace]: measure on Aerospike instead of lmdb")
    parser.add_argument("--records", type=int, default=16_000, help="Aerospike: abandoned claims per sweep")
    parser.add_argument("--rounds", type=int, default=3, help="Aerospike: rounds per pool size")
    parser.add_argument("--lmdb", action="store_true", help="lmdb even when IGNIS_TEST_AEROSPIKE is set")
    parser.add_argument("--default-collector", action="store_true",
                        help="keep Python's collector settings (the sweeper service and `ignis sweep` tune them)")
    args = parser.parse_args()
    if not args.default_collector:
        tune_collector()  # as the processes that sweep do (ignis_workers.sweeper.tune_collector)
    if args.server and not args.lmdb:
        aerospike_main(args)
        return
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
