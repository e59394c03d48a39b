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
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from rich.console import Console
from rich.table import Table

from ignis import Ignis, QueueSpec

ENV = "IGNIS_TEST_AEROSPIKE"
CONSUMERS = (1, 8, 32)
PAYLOAD = b"x" * 256
# A consumer thread that found nothing to claim sleeps this long before it fires again (the Consumer's
# poll does the same, longer): a thread spinning on an empty queue would take the interpreter lock
# from the threads that have work, and the drain would measure the spin.
IDLE_SLEEP = 0.001


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


def raw_round(client: Any, namespace: str, set_name: str, threads: int, n: int, tag: str) -> dict[str, float]:
    """The raw client's put/s, get/s and operate/s (one counter record) with `threads` threads."""
    from aerospike_helpers.operations import operations as ops

    keys = [(namespace, set_name, f"raw-{tag}-{i}") for i in range(n)]
    put = threaded(threads, n, lambda i: client.put(keys[i], {"payload": PAYLOAD}))
    get = threaded(threads, n, lambda i: client.get(keys[i]))
    # 32 counter records, as a 32-shard queue has 32 meta records (one record for all would be refused
    # with RECORD_BUSY past the server's transaction-pending-limit at 32 threads).
    counters = [(namespace, set_name, f"counter-{tag}-{k}") for k in range(32)]
    operate = threaded(threads, n, lambda i: client.operate(counters[i % 32], [ops.increment("n", 1), ops.read("n")]))
    # The two calls any publish here must make (DESIGN §3: a message's key holds the slot its shard's
    # counter hands out, so the increment and the write are two records): the ceiling of a publish.
    bins = {"payload": PAYLOAD, "msgId": uuid.uuid4().hex, "loadedAt": 0, "codec": "bytes", "attempts": 0}

    def two_calls(i: int) -> None:
        _, _, got = client.operate(counters[i % 32], [ops.increment("n", 1), ops.read("n")])
        client.put((namespace, set_name, f"two-{tag}-{i % 32}-{got['n']}"), bins)
    publish_floor = threaded(threads, n, two_calls)
    return {"put/s": n / put, "get/s": n / get, "operate/s": n / operate, "operate+put/s": n / publish_floor}


def one_by_one_round(ignis: Ignis, threads: int, n: int, name: str) -> dict[str, float]:
    """`threads` producers publish n messages one by one; then `threads` consumers fire + ack them one
    by one. Verified: every published message delivered exactly once."""
    ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
    q = ignis.queue(name)
    calls = storage_calls()
    ids: list[str] = []
    # As many producers as consumers: each rate is set against the raw client with as many threads.
    publish = threaded(threads, n, lambda i: ids.append(q.publish(PAYLOAD).id))
    publish_calls = (storage_calls() - calls) / n
    delivered: list[str] = []
    calls = storage_calls()

    def drain(_: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = q.fire()
            if message is not None:
                delivered.append(message.id)
                message.ack()
                return
            if len(delivered) >= n:
                return
            time.sleep(IDLE_SLEEP)  # nothing claimable right now: back off as a consumer does

    drain_time = threaded(threads, n, drain)
    drain_calls = (storage_calls() - calls) / n
    if sorted(delivered) != sorted(ids):
        raise SystemExit(f"drain with {threads} consumers delivered {len(delivered)} messages, "
                         f"{len(set(delivered))} distinct, of {len(ids)} published")
    return {"publish/s": n / publish, "drain/s": n / drain_time, "publish calls/msg": publish_calls,
            "fire+ack calls/msg": drain_calls}


def batched_round(ignis: Ignis, n: int, name: str, consumers: int = 8, batch: int = 100) -> dict[str, float]:
    """publish_many in lists of 1000; `consumers` threads fire_many(100) + one batched ack per batch."""
    ignis.apply(QueueSpec.build(name=name, handlerType="bench", shards=32))
    q = ignis.queue(name)
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
            else:
                time.sleep(IDLE_SLEEP)  # the others hold the rest: back off as a consumer does

    drain_time = threaded(consumers, consumers, drain)
    drain_calls = (storage_calls() - calls) / n
    if sorted(delivered) != sorted(ids):
        raise SystemExit(f"batched drain delivered {len(delivered)} of {len(ids)} messages")
    return {"publish/s": n / publish, "drain/s": n / drain_time, "publish calls/msg": publish_calls,
            "fire+ack calls/msg": drain_calls}


def summarize(samples: Sequence[dict[str, float]], keep: str = "median") -> dict[str, float]:
    """One row's figures from its rounds: each figure's median; with `keep="best"` the rates ("/s") are the
    highest round's instead. On a shared machine another process's burst only ever slows a run, so the fastest
    of a few is the steadiest reading of what the code can do, when the noise is bursts ("the lowest value gives
    a lower bound for how fast your machine can run the given code snippet; higher values ... are typically ...
    caused by other processes interfering with your timing accuracy", the timeit docs); bench/compare.py keeps
    the best as bench_lmdb's --repeat does."""
    row = {}
    for key in samples[0]:
        values = [sample[key] for sample in samples]
        row[key] = max(values) if keep == "best" and key.endswith("/s") else statistics.median(values)
    return row


def measure(ignis: Ignis, client: Any, namespace: str, raw_set: str, n: int, rounds: int,
            progress: Callable[[str], None], consumers: Sequence[int] = CONSUMERS,
            raw: bool = True, batched: bool = True, keep: str = "median") -> list[dict[str, Any]]:
    """Per row, `rounds` rounds of raw client then ignis back to back; the medians (`keep="best"`: the best
    rates, see summarize), and the median of each round's own ratio (a round's raw and ignis figures share the
    machine's load of the moment). `raw=False`: ignis only (bench/compare.py, which compares two revisions, not
    ignis with its ceiling)."""
    rows = []
    plans: list[tuple[str, int, Callable[[str], dict[str, float]]]] = [
        (str(t), t, lambda name, t=t: one_by_one_round(ignis, t, n, name)) for t in consumers]
    if batched:
        plans.append(("8 (batches)", 8, lambda name: batched_round(ignis, n, name)))
    for label, threads, run_ignis in plans:
        samples: list[dict[str, float]] = []
        for r in range(rounds):
            progress(f"consumers {label}, round {r + 1}/{rounds}")
            tag = f"{threads}-{len(rows)}-{r}"
            mine = run_ignis(f"bench-{len(rows)}-{r}")
            if not raw:
                samples.append(mine)
                continue
            ceiling = raw_round(client, namespace, raw_set, threads, n, tag)
            samples.append({**{f"raw {k}": v for k, v in ceiling.items()}, **mine,
                            "publish/raw put": mine["publish/s"] / ceiling["put/s"],
                            "publish/raw operate+put": mine["publish/s"] / ceiling["operate+put/s"],
                            "drain/raw get": mine["drain/s"] / ceiling["get/s"]})
        row: dict[str, Any] = {"consumers": label, **summarize(samples, keep)}
        row["calls/delivered msg"] = row["publish calls/msg"] + row["fire+ack calls/msg"]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default=os.environ.get(ENV), help="host:port[/namespace]")
    parser.add_argument("--emulator", action="store_true", help="calls per message on the in-memory emulator")
    parser.add_argument("--messages", type=int, default=20000, help="messages per row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row (medians are reported)")
    parser.add_argument("--keep", choices=("median", "best"), default="median",
                        help="of the rounds' rates, the median (default) or the best (the highest: bench/compare.py)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--consumers", default=",".join(map(str, CONSUMERS)),
                        help="comma list of consumer (and producer) thread counts of the one-by-one rows "
                             f"(default {','.join(map(str, CONSUMERS))}; none: '', with --batched only); the "
                             "batched row always has 8")
    parser.add_argument("--batched", choices=("with", "without", "only"), default="with",
                        help="the batched row (8 consumers, fire_many and batched acks): with the one-by-one rows "
                             "(default), without it, or only it (bench/compare.py pairs the revisions row by row)")
    parser.add_argument("--no-raw", action="store_true",
                        help="skip the raw client's rounds (the ceiling): ignis rows only, as bench/compare.py runs")
    args = parser.parse_args()
    try:
        consumers = [] if args.batched == "only" else [int(c) for c in args.consumers.split(",") if c.strip()]
        if (not consumers and args.batched != "only") or min(consumers, default=1) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--consumers {args.consumers!r}: a comma list of positive thread counts, e.g. 1,8,32")
    console = Console(width=max(Console().width, 180))
    if not args.server and not args.emulator:
        console.print(f"bench_aerospike needs an Aerospike server: pass --server host:port[/namespace] or set "
                      f"{ENV}. With --emulator it reports calls per message only.", markup=False)
        return 0
    run = uuid.uuid4().hex[:8]
    if args.emulator:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from support.aerospike_emulator import EmulatedServer

        from ignis.storage.aerospike import context  # (here: bench/compare.py runs the server rows on old trees)

        context.client_factory = EmulatedServer().client
        hostport, namespace = "emulator:3000", "test"
    else:
        hostport, _, namespace = args.server.partition("/")
        namespace = namespace or "test"
    url = f"aerospike://{hostport}/{namespace}?farm=b{run}&client=b{run}"
    ignis = Ignis(url)
    store = ignis.store
    status = console.status("starting")
    try:
        with status:
            if args.emulator:  # calls per message only: one round, no raw client
                rows = []
                for t in consumers:
                    rows.append({"consumers": str(t), **one_by_one_round(ignis, t, args.messages, f"bench-{t}")})
                if args.batched != "without":
                    rows.append({"consumers": "8 (batches)", **batched_round(ignis, args.messages,
                                                                           "bench-batched")})
                for row in rows:
                    row["calls/delivered msg"] = row["publish calls/msg"] + row["fire+ack calls/msg"]
            else:
                rows = measure(ignis, store.client, namespace, f"b{run}_raw", args.messages, args.rounds,
                               lambda text: status.update(text), consumers, raw=not args.no_raw,
                               batched=args.batched != "without", keep=args.keep)
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
        print(json.dumps({"target": label, "messages": args.messages, "rounds": args.rounds, "rows": rows},
                         indent=2))
        return 0
    kept = "best rates, median others" if args.keep == "best" else "medians"
    console.print(f"[bold]{label}[/bold], {args.messages} messages of {len(PAYLOAD)} bytes per row"
                  + ("" if args.emulator else f"; {kept} of {args.rounds} rounds, raw and ignis back to back"))
    table = Table()
    for column in rows[0]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*(f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    console.print(table)
    if not args.emulator and not args.no_raw and set(CONSUMERS) <= set(consumers) and args.batched == "with":
        # (the targets' rows ran)
        by = {row["consumers"]: row for row in rows}
        one, eight = by["1"], by["8"]
        console.print(f"one by one, 8 consumers: drain {eight['drain/raw get']:.2f}x raw get (target >= 0.30), "
                      f"{eight['drain/s'] / one['drain/s']:.2f}x the 1-consumer drain (target >= 2)")
        console.print("publish vs raw put, 1/8/32 threads: "
                      + " / ".join(f"{by[str(t)]['publish/raw put']:.2f}x" for t in CONSUMERS)
                      + " (target >= 0.45); vs the raw client making a publish's two calls (increment, put): "
                      + " / ".join(f"{by[str(t)]['publish/raw operate+put']:.2f}x" for t in CONSUMERS))
        console.print(f"batched, 8 consumers: drain {by['8 (batches)']['drain/raw get']:.2f}x the raw client's "
                      "get rate with 8 threads (target >= 1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
