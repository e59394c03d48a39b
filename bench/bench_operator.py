#!/usr/bin/env python3
"""How fast the operator brings IgnisQueue objects to Ready, cold start, side by side with the bare
reconcile function (the ceiling: no API server, no kopf).

    .venv/bin/python bench/bench_operator.py                 # 1000 objects
    .venv/bin/python bench/bench_operator.py --objects 200 --json

Rows, measured in one run on fresh lmdb stores (durability=fast):
* operator: N IgnisQueue objects already exist in kmock's Kubernetes API emulator (over HTTP, as a
  cluster would serve them) when kopf starts; the clock runs from operator start until every object
  has status Ready=True and its queue record is in the store (checked at the end).
* handler: the same N objects through `reconcile_object` directly, one after another.
The best-known queue-operator figure is ~17 objects/s; it is printed next to ours for scale (measured
elsewhere, not in this run). Needs the test extra (kmock): pip install -e '.[test]'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from ignis_operator.emulation import declare_resources, start_operator
from ignis_operator.handlers import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorConfig,
    OperatorContext,
    build_registry,
    reconcile_object,
)
from kmock import KubernetesEmulator, Server
from rich.console import Console
from rich.table import Table

from ignis.storage import Storage, open_store

PEER_OBJECTS_PER_SECOND = 17.0
NAMESPACE = "bench"


class LoglessEmulator(KubernetesEmulator):
    """kmock records every request for test assertions and matches each new request against that whole
    record (O(requests) per request, so O(n^2) for a run). Nothing here asserts on requests, so only the
    request being served is kept: the figure measures the operator, not the emulator's log."""

    async def _handle(self, request: Any) -> Any:
        del self._requests[:-1]
        return await super()._handle(request)


def manifest(i: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
            "metadata": {"name": f"q{i:05d}", "namespace": NAMESPACE, "uid": f"uid-{i}", "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"handlerType": "bench.v1", "shards": 8, "concurrency": 2}}


def ready_count(emulator: KubernetesEmulator) -> int:
    count = 0
    for (resource, _, _), obj in list(emulator.objects.items()):
        if resource.plural != PLURAL or obj.deleted:
            continue
        conditions = (obj.raw.get("status") or {}).get("conditions") or []
        count += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return count


def count_records(store: Storage) -> int:
    return len(store.with_client(NAMESPACE).list_queues(active=True))


async def bench_operator(n: int, workdir: Path, timeout: float) -> dict[str, Any]:
    store = open_store(f"lmdb://{workdir}/operator?durability=fast")
    # long timers: this measures the create path, not the figures / resync timers
    config = OperatorConfig(figures_interval_seconds=3600, resync_interval_seconds=3600)
    registry = build_registry(OperatorContext(store, config), cluster_login=False)
    async with LoglessEmulator() as emulator, Server(emulator):
        declare_resources(emulator)
        server = str(emulator.url).rstrip("/")
        async with aiohttp.ClientSession(base_url=server) as session:
            for i in range(n):
                async with session.post(f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}",
                                        json=manifest(i)) as resp:
                    resp.raise_for_status()
        started = time.perf_counter()
        thread, stop, _ready = start_operator(registry, server, [NAMESPACE])
        deadline = started + timeout
        while True:
            if ready_count(emulator) >= n or time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.1)
        elapsed = time.perf_counter() - started
        done = ready_count(emulator)
        stop.set()
        await asyncio.to_thread(thread.join, 30)
    records = count_records(store)
    store.close()
    return {"row": "operator (kopf + kmock emulator + lmdb)", "objects": n, "ready": done, "records": records,
            "seconds": elapsed, "objects_per_second": done / elapsed if elapsed else 0.0}


def bench_handler(n: int, workdir: Path) -> dict[str, Any]:
    store = open_store(f"lmdb://{workdir}/handler?durability=fast")
    ctx = OperatorContext(store, OperatorConfig())
    docs = [manifest(i) for i in range(n)]
    started = time.perf_counter()
    ready = 0
    for doc in docs:
        meta = doc["metadata"]
        result = reconcile_object(ctx, name=meta["name"], namespace=meta["namespace"], uid=meta["uid"],
                                  spec=doc["spec"], meta=meta)
        ready += result.ready
    elapsed = time.perf_counter() - started
    records = count_records(store)
    store.close()
    return {"row": "handler only (reconcile_object + lmdb)", "objects": n, "ready": ready, "records": records,
            "seconds": elapsed, "objects_per_second": ready / elapsed if elapsed else 0.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on the operator row after this")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=getattr(logging, os.environ.get("BENCH_LOG", "ERROR")),
                        format="%(relativeCreated)d %(name)s %(message)s")
    with tempfile.TemporaryDirectory(prefix="ignis-bench-operator-") as tmp:
        rows = [asyncio.run(bench_operator(args.objects, Path(tmp), args.timeout)),
                bench_handler(args.objects, Path(tmp))]
    operator, handler = rows
    ok = all(r["ready"] == r["records"] == args.objects for r in rows)
    summary = {
        "rows": rows,
        "operator_vs_peer": operator["objects_per_second"] / PEER_OBJECTS_PER_SECOND,
        "operator_vs_handler": operator["objects_per_second"] / handler["objects_per_second"],
        "peer_objects_per_second": PEER_OBJECTS_PER_SECOND,
        "verified": ok,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        table = Table(title=f"cold start to Ready: {args.objects} IgnisQueue objects")
        for column in ("row", "ready", "records", "seconds", "objects/s"):
            table.add_column(column, justify="left" if column == "row" else "right")
        for r in rows:
            table.add_row(r["row"], str(r["ready"]), str(r["records"]), f"{r['seconds']:.2f}",
                          f"{r['objects_per_second']:.1f}")
        table.add_row("best-known queue operator (reference figure)", "", "", "", f"{PEER_OBJECTS_PER_SECOND:.1f}")
        console = Console()
        console.print(table)
        console.print(f"operator / peer figure: {summary['operator_vs_peer']:.1f}x   "
                      f"operator / bare handler: {summary['operator_vs_handler']:.3f}   verified: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
