#!/usr/bin/env python3
"""Ordered delivery (issue 49 part 1): an ordered queue's throughput against an unordered one's on the same store,
and order violations per key, with a consumer SIGKILLed mid-run.

    .venv/bin/python bench/bench_ordered.py                                  # lmdb
    .venv/bin/python bench/bench_ordered.py --server 127.0.0.1:3000/test     # and Aerospike

For each store, side by side in one run: two queues alike (64 shards, handlerTimeoutSeconds 1), one unordered and
one ordered; MESSAGES messages published with one of KEYS keys each (message n of a key carries n); then CONSUMERS
consumer processes, started together, fire + ack until the queue is drained. Throughput = messages / (last ack -
start). An order violation: per key, in ack order, a message acked after one with a higher n (counted per key). A
third run, on a fresh ordered queue, SIGKILLs one consumer a third of the way through (its held messages come again
when their holds end, handlerTimeoutSeconds later): its violations are counted too, and what the run left in the
store (the killed consumer may die between an ack and its report line: an ack not reported; the unordered queue's
killed claims would wait for the sweeper, a sweepDuration: not run). Target: ordered >= 0.5x unordered,
zero violations in the ordered runs. `--json FILE` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ignis import Ignis, QueueSpec

console = Console(stderr=True)
IDLE_EXIT_S = 3.0  # a consumer stops after this long without a message


def child(url: str, queue_name: str, work_ms: float) -> None:
    """A consumer process: `ready`, then waits for a line on stdin; fire + ack until idle, one line per ack
    (`m begin_ns ack_ns key:n`)."""
    out = sys.stdout
    with Ignis(url) as ignis:
        q = ignis.queue(queue_name)
        out.write("ready\n")
        out.flush()
        sys.stdin.readline()
        idle_until = time.monotonic() + IDLE_EXIT_S
        while time.monotonic() < idle_until:
            m = q.fire(timeout=0.2)
            if m is None:
                continue
            began = time.time_ns()
            if work_ms:
                time.sleep(work_ms / 1000)
            m.ack()
            out.write(f"m {began} {time.time_ns()} {m.envelope.payload.decode()}\n")
            out.flush()
            idle_until = time.monotonic() + IDLE_EXIT_S


def violations(acks: list[tuple[int, str, int]]) -> tuple[int, int]:
    """(violations, keys with any): per key, in ack order, a message acked after one with a higher n."""
    highest: dict[str, int] = defaultdict(lambda: -1)
    per_key: dict[str, int] = defaultdict(int)
    for _, key, n in sorted(acks):
        if n < highest[key]:
            per_key[key] += 1
        highest[key] = max(highest[key], n)
    return sum(per_key.values()), len(per_key)


def one_run(url: str, name: str, ordered: bool, messages: int, keys: int, consumers: int, work_ms: float,
            kill: bool) -> dict[str, Any]:
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=64, ordered=ordered, handlerTimeoutSeconds=1,
                                    concurrency=1))
        q = ignis.queue(name)
        for start in range(0, messages, 1000):
            idx = range(start, min(start + 1000, messages))
            q.publish_each([f"k{i % keys}:{i // keys}".encode() for i in idx], keys=[f"k{i % keys}" for i in idx])
    procs = [subprocess.Popen([sys.executable, __file__, "--child", url, name, str(work_ms)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(consumers)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    acks: list[tuple[int, str, int]] = []
    lock = threading.Lock()
    killed = threading.Event()

    def read(index: int, p: subprocess.Popen[str]) -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            _, _, acked, payload = line.split()
            key, n = payload.split(":")
            with lock:
                acks.append((int(acked), key, int(n)))
                if kill and not killed.is_set() and len(acks) >= messages // 3:
                    killed.set()
                    procs[0].send_signal(signal.SIGKILL)

    readers = [threading.Thread(target=read, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for r in readers:
        r.start()
    start = time.time_ns()
    for p in procs:
        p.stdin.write("go\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
    for p in procs:
        p.wait(timeout=3600)
    for r in readers:
        r.join(10)
    with Ignis(url) as ignis:  # what the run left in the store: waiting, or claimed and never settled
        stats = ignis.queue(name).stats(in_flight=True)
        left = stats.depth + (stats.in_flight or 0) + stats.sidelined
    last = max(at for at, _, _ in acks)
    seconds = (last - start) / 1e9
    distinct = {(key, n) for _, key, n in acks}
    count, keys_hit = violations(acks)
    return {"queue": name, "ordered": ordered, "killed": kill, "messages": messages, "acked": len(acks),
            "distinct_acked": len(distinct), "never_reported": messages - len(distinct), "left_in_store": left,
            "seconds": round(seconds, 3),
            "per_second": round(messages / seconds), "violations": count, "keys_with_violations": keys_hit}


def one_store(url_for: Any, store: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for label, ordered, kill in (("unordered", False, False), ("ordered", True, False),
                                 ("ordered, consumer SIGKILLed", True, True)):
        console.print(f"[bold]{store}[/]: {label} ...")
        r = one_run(url_for(label), f"bench-{'o' if ordered else 'u'}{'k' if kill else ''}", ordered, args.messages,
                    args.keys, args.consumers, args.work_ms, kill)
        r.update(store=store, run=label)
        runs.append(r)
    base = runs[0]["per_second"]
    for r in runs:
        r["ratio"] = round(r["per_second"] / base, 2)
    return runs


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="Aerospike host:port/namespace (also measured)")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--consumers", type=int, default=16)
    parser.add_argument("--work-ms", type=float, default=0.0, help="a handler's work per message")
    parser.add_argument("--no-lmdb", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    run = uuid.uuid4().hex[:6]
    if not args.no_lmdb:
        with tempfile.TemporaryDirectory(prefix="ignis-ordered-") as tmp:
            results += one_store(lambda label: f"lmdb://{tmp}/store", "lmdb", args)
    if args.server:
        results += one_store(lambda label: f"aerospike://{args.server}?farm=bo{run}&client=bo{run}", "aerospike",
                             args)
    table = Table(title=f"ordered vs unordered: 64 shards, {args.keys:,} keys, {args.consumers} consumer processes, "
                        f"{args.messages:,} messages, handler {args.work_ms:g} ms")
    for column in ("store", "run", "msg/s", "vs unordered", "order violations (keys)", "acks not reported / left",
                   "acked (with redeliveries)"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r["store"], r["run"], f"{r['per_second']:,}", f"{r['ratio']:.2f}x",
                      f"{r['violations']} ({r['keys_with_violations']})",
                      f"{r['never_reported']} / {r['left_in_store']}", f"{r['acked']:,}")
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"at": time.time(), "results": results}, indent=2))
    # (a killed consumer may die between an ack and its line: one ack not reported, nothing left in the store)
    ok = all(r["violations"] == 0 and r["left_in_store"] == 0 and r["never_reported"] <= int(r["killed"])
             for r in results if r["ordered"]) and all(r["ratio"] >= 0.5 for r in results if r["ordered"] and not
                                                       r["killed"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
