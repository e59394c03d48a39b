#!/usr/bin/env python3
"""IgnisMQ on Aerospike: publish and drain rates and storage calls per message for 1, 8 and 32
consumers, next to the raw client's put / get / operate rates measured in the same run (the ceiling).

    .venv/bin/python bench/bench_aerospike.py --server 127.0.0.1:3000/test     # or IGNIS_TEST_AEROSPIKE
    .venv/bin/python bench/bench_aerospike.py --emulator                       # calls per message only

Needs a server for any speed figure. `--emulator` runs the same code on the in-memory emulator of
tests/support: its calls-per-message column is real (the store's round trips are counted the same way),
its speeds mean nothing and are not printed. Every run writes into sets named after a random run id and
truncates them afterwards. Drains are verified: every published message delivered exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from rich.console import Console
from rich.table import Table

from ignis import Ignis, QueueSpec
from ignis.storage import aerospike_store

ENV = "IGNIS_TEST_AEROSPIKE"
CONSUMERS = (1, 8, 32)
PAYLOAD = b"x" * 256


def storage_calls() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)


def threaded(threads: int, total: int, work: Callable[[int], None]) -> float:
    """Run work(i) for i in range(total) over `threads` threads; seconds taken."""
    counter = iter(range(total))
    lock = threading.Lock()

    def body() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            work(i)

    pool = [threading.Thread(target=body) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


def raw_rows(client: Any, namespace: str, set_name: str, n: int) -> list[dict[str, Any]]:
    from aerospike_helpers.operations import operations as ops

    rows = []
    for threads in CONSUMERS:
        keys = [(namespace, set_name, f"raw-{threads}-{i}") for i in range(n)]
        put = threaded(threads, n, lambda i, keys=keys: client.put(keys[i], {"payload": PAYLOAD}))
        get = threaded(threads, n, lambda i, keys=keys: client.get(keys[i]))
        counter = (namespace, set_name, f"counter-{threads}")
        operate = threaded(threads, n, lambda i, c=counter: client.operate(c, [ops.increment("n", 1), ops.read("n")]))
        rows.append({"threads": threads, "put/s": n / put, "get/s": n / get, "operate/s": n / operate})
    return rows


def ignis_rows(ignis: Ignis, n: int) -> list[dict[str, Any]]:
    rows = []
    for consumers in CONSUMERS:
        name = f"bench-{consumers}"
        ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
        q = ignis.queue(name)
        calls = storage_calls()
        ids: list[str] = []
        publish = threaded(8, n, lambda i, q=q, ids=ids: ids.append(q.publish(PAYLOAD).id))
        publish_calls = (storage_calls() - calls) / n
        delivered: list[str] = []
        calls = storage_calls()

        def drain(_: int, q: Any = q, delivered: list[str] = delivered) -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                message = q.fire()
                if message is not None:
                    delivered.append(message.id)
                    message.ack()
                    return
                if len(delivered) >= n:
                    return

        drain_time = threaded(consumers, n, drain)
        drain_calls = (storage_calls() - calls) / n
        if sorted(delivered) != sorted(ids):
            raise SystemExit(f"drain with {consumers} consumers delivered {len(delivered)} messages, "
                             f"{len(set(delivered))} distinct, of {len(ids)} published")
        rows.append({"consumers": consumers, "publish/s": n / publish, "drain/s": n / drain_time,
                     "publish calls/msg": publish_calls, "fire+ack calls/msg": drain_calls,
                     "calls/delivered msg": publish_calls + drain_calls})
    return rows


def batched_row(ignis: Ignis, n: int, consumers: int = 8, batch: int = 100) -> dict[str, Any]:
    """publish_many in lists of 1000, fire_many(100) + one batched ack per batch."""
    ignis.apply(QueueSpec.build(name="bench-batched", handlerType="bench", shards=32))
    q = ignis.queue("bench-batched")
    calls = storage_calls()
    start = time.perf_counter()
    ids = [r.id for i in range(0, n, 1000) for r in q.publish_many([PAYLOAD] * min(1000, n - i))]
    publish = time.perf_counter() - start
    publish_calls = (storage_calls() - calls) / n
    delivered: list[str] = []
    lock = threading.Lock()
    calls = storage_calls()

    def drain(_: int) -> None:
        while len(delivered) < n:
            messages = q.fire_many(batch)
            if messages:
                q.ack(messages)
                with lock:
                    delivered.extend(m.id for m in messages)

    drain_time = threaded(consumers, consumers, drain)
    drain_calls = (storage_calls() - calls) / n
    if sorted(delivered) != sorted(ids):
        raise SystemExit(f"batched drain delivered {len(delivered)} of {len(ids)} messages")
    return {"consumers": f"{consumers} (batches)", "publish/s": n / publish, "drain/s": n / drain_time,
            "publish calls/msg": publish_calls, "fire+ack calls/msg": drain_calls,
            "calls/delivered msg": publish_calls + drain_calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get(ENV), help="host:port[/namespace]")
    parser.add_argument("--emulator", action="store_true", help="calls per message on the in-memory emulator")
    parser.add_argument("--messages", type=int, default=5000, help="messages per row")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args()
    console = Console()
    if not args.server and not args.emulator:
        console.print(f"bench_aerospike needs an Aerospike server: pass --server host:port[/namespace] or set "
                      f"{ENV}. With --emulator it reports calls per message only.", markup=False)
        return 0
    run = uuid.uuid4().hex[:8]
    if args.emulator:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support.aerospike_emulator import EmulatedServer

        aerospike_store.client_factory = EmulatedServer().client
        hostport, namespace = "emulator:3000", "test"
    else:
        hostport, _, namespace = args.server.partition("/")
        namespace = namespace or "test"
    url = f"aerospike://{hostport}/{namespace}?farm=b{run}&client=b{run}"
    ignis = Ignis(url)
    store = ignis.store
    try:
        raw = [] if args.emulator else raw_rows(store.client, namespace, f"b{run}_raw", args.messages)
        rows = ignis_rows(ignis, args.messages)
        rows.append(batched_row(ignis, args.messages))
    finally:
        if not args.emulator:
            for set_name in (f"b{run}_raw", f"b{run}_b{run}_ignis_queues", f"b{run}_data_set", f"b{run}_meta_set",
                             f"b{run}_ignis_system"):  # every set this run wrote
                store.client.truncate(namespace, set_name, 0)
        ignis.close()
    label = "EMULATOR (speeds mean nothing; calls per message are real)" if args.emulator else url
    if args.emulator:
        rows = [{k: v for k, v in row.items() if "/s" not in k} for row in rows]
    if args.json:
        print(json.dumps({"target": label, "messages": args.messages, "raw": raw, "ignis": rows}, indent=2))
        return 0
    console.print(f"[bold]{label}[/bold], {args.messages} messages of {len(PAYLOAD)} bytes per row")
    for title, data in (("raw client (ceiling)", raw), ("ignis", rows)):
        if not data:
            continue
        table = Table(title=title)
        for column in data[0]:
            table.add_column(column, justify="right")
        for row in data:
            table.add_row(*(f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row.values()))
        console.print(table)
    if raw:
        for row, ceiling in zip(rows, raw, strict=False):  # the batched row has no raw twin
            console.print(f"{row['consumers']:>2} consumers: publish {row['publish/s'] / ceiling['put/s']:.2f}x raw "
                          f"put, drain {row['drain/s'] / ceiling['get/s']:.2f}x raw get")
    return 0


if __name__ == "__main__":
    sys.exit(main())
