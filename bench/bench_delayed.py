#!/usr/bin/env python3
"""Delayed delivery at volume (issue 28): does a backlog of delayed messages slow publish and fire on the same
queue, and what does moving due messages cost?

    .venv/bin/python bench/bench_delayed.py                                  # lmdb (fsync), 1,000,000 delayed
    .venv/bin/python bench/bench_delayed.py --server 127.0.0.1:3000/test     # and Aerospike

For each store, side by side in one run:
* two queues alike, one empty and one holding BACKLOG delayed messages due in an hour; publish (one call per
  message) and fire+ack rates on each, in alternating rounds; the ratio backlog / empty (target: no slower);
* MOVE messages published with a short delay and moved to main when due: the time from due to all moved, and
  the store writes per delayed message (Aerospike: the server's own write and delete counters, read before and
  after; lmdb: record puts and deletes counted in the store's transactions). Target: at most 2 besides the
  delayed message's own write;
* lateness under a steady load on the backlogged queue (100 msg/s for 10 s, each due 1 s after its publish),
  fired by a waiting consumer: fire time minus due time, p50 / p99 / max (target: p99 under 1 s; none early).
Prints a table; `--json FILE` writes the figures. Every run uses fresh sets (Aerospike: truncated afterwards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ignis import Ignis, QueueSpec
from ignis.delay import MOVE_BATCH, move_due
from ignis.envelope import now_ms

PAYLOAD = b"x" * 256
SINGLE_MOVES = 2_000  # delayed messages published one call each, for their extra writes
FIRE_STOCK = 20_000  # deliverable messages in each queue when fire+ack is timed
console = Console(stderr=True)


def rate(fn: Any, seconds: float) -> float:
    """Calls of fn() per second over about `seconds`."""
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        fn()
        done += 1
    return done / elapsed


def fill_backlog(queue: Any, count: int, due_in_s: float) -> float:
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"backlog of {count:,} delayed messages", total=count)
        for start in range(0, count, 1000):
            n = min(1000, count - start)
            queue.publish_many([PAYLOAD] * n, delay=due_in_s)
            progress.advance(task, n)
    return count / (time.perf_counter() - started)


def server_writes(ignis: Ignis) -> int:
    """Aerospike: record writes and deletes the namespace has done (single and batch), from its statistics."""
    store = ignis.store
    text = store.client.info_all(f"namespace/{store._ns}")  # type: ignore[attr-defined]
    total = 0
    for _, answer in text.values():
        stats = dict(item.split("=", 1) for item in answer.strip().split(";") if "=" in item)
        total += sum(int(stats.get(k, 0)) for k in ("client_write_success", "client_delete_success",
                                                     "batch_sub_write_success", "batch_sub_delete_success",
                                                     "client_udf_complete", "client_lang_write_success"))
    return total


class CountingTxn:
    """lmdb: counts the record puts and deletes of the store's write transactions (cursors' included)."""

    def __init__(self) -> None:
        self.writes = 0

    def install(self, ignis: Ignis) -> None:
        env = ignis.store._ctx.env.env  # type: ignore[attr-defined]
        counter = self
        real_begin = env.begin

        class Counted:
            """A write transaction or cursor whose record writes are counted (publish_many writes with a
            cursor's putmulti; purges delete through a cursor)."""

            def __init__(self, inner: Any) -> None:
                self._inner = inner

            def _one(self, name: str, *a: Any, **k: Any) -> Any:
                counter.writes += 1
                return getattr(self._inner, name)(*a, **k)

            def put(self, *a: Any, **k: Any) -> Any:
                return self._one("put", *a, **k)

            def delete(self, *a: Any, **k: Any) -> Any:
                return self._one("delete", *a, **k)

            def pop(self, *a: Any, **k: Any) -> Any:
                return self._one("pop", *a, **k)

            def putmulti(self, items: Any, *a: Any, **k: Any) -> Any:
                consumed, added = self._inner.putmulti(items, *a, **k)
                counter.writes += consumed
                return consumed, added

            def cursor(self, *a: Any, **k: Any) -> Any:
                return Counted(self._inner.cursor(*a, **k))

            def __getattr__(self, name: str) -> Any:
                return getattr(self._inner, name)

            def __iter__(self) -> Any:
                return iter(self._inner)

            def __enter__(self) -> Any:
                self._inner.__enter__()
                return self

            def __exit__(self, *exc: Any) -> Any:
                return self._inner.__exit__(*exc)

        class Env:
            def begin(self, *a: Any, **k: Any) -> Any:
                write = (a[2] if len(a) > 2 else k.get("write", False))
                txn = real_begin(*a, **k)
                return Counted(txn) if write else txn

            def __getattr__(self, name: str) -> Any:
                return getattr(env, name)

        ignis.store._ctx.env.env = Env()  # type: ignore[attr-defined]


def one_store(url: str, backlog: int, moves: int, seconds: float, rounds: int, aerospike: bool,
              empty_url: str | None = None) -> dict[str, Any]:
    """`empty_url`: the queue without a backlog in a store of its own (lmdb: a store's size changes what each of
    its commits costs, so a backlog in the same file would slow both queues alike and hide it)."""
    out: dict[str, Any] = {"store": "aerospike" if aerospike else "lmdb", "backlog": backlog}
    with Ignis(url) as ignis, Ignis(empty_url or url) as other:
        for name in ("backlog", "moves"):
            ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=16))
        other.apply(QueueSpec.build(name="empty", handlerType="empty", shards=16))
        empty = other.queue("empty")
        loaded, moving = (ignis.queue(n) for n in ("backlog", "moves"))
        loaded.publish(b"warm", delay=0.01)  # the delay index (Aerospike) before anything is timed
        time.sleep(2.0)
        move_due(loaded.main)
        while loaded.fire() is not None:
            pass
        out["backlog_publish_per_s"] = round(fill_backlog(loaded, backlog, 3600), 1)
        console.print(f"{out['store']}: {backlog:,} delayed, {loaded.stats().delayed:,} counted")
        samples: dict[str, list[float]] = {"publish": [], "fire_ack": []}
        for r in range(rounds):
            pair = {}
            for queue in (empty, loaded) if r % 2 == 0 else (loaded, empty):
                pub = rate(lambda q=queue: q.publish(PAYLOAD), seconds)
                # Both queues hold the same backlog of deliverable messages while fire+ack is timed, so every
                # timed call delivers one (an empty fire is cheaper and would skew the ratio).
                queue.publish_many([PAYLOAD] * max(0, FIRE_STOCK - queue.stats().depth))

                def fire_ack(q: Any = queue) -> None:
                    m = q.fire()
                    if m is None:
                        raise RuntimeError(f"{q.name} ran dry: raise FIRE_STOCK")
                    m.ack()

                fire = rate(fire_ack, seconds)
                pair[queue.name] = (pub, fire)
            samples["publish"].append(pair["backlog"][0] / pair["empty"][0])
            samples["fire_ack"].append(pair["backlog"][1] / pair["empty"][1])
            out.setdefault("rounds", []).append({k: [round(v, 1) for v in vs] for k, vs in pair.items()})
        for queue in (empty, loaded):  # what the timed fires left: drained, so the lateness run starts clean
            while batch := queue.fire_many(1000):
                queue.ack(batch)
        out["publish_ratio"] = round(statistics.median(samples["publish"]), 3)
        out["fire_ack_ratio"] = round(statistics.median(samples["fire_ack"]), 3)
        counter = None if aerospike else CountingTxn()
        if counter is not None:
            counter.install(ignis)

        def writes_of(action: Any) -> int:
            """The store writes `action` makes (Aerospike: the namespace's counters; lmdb: the counted puts)."""
            before = server_writes(ignis) if aerospike else counter.writes  # type: ignore[union-attr]
            action()
            return (server_writes(ignis) if aerospike else counter.writes) - before  # type: ignore[union-attr]

        # The move: MOVES messages due in 2 s, moved by one mover; writes counted around the move only.
        published = writes_of(lambda: moving.publish_many([PAYLOAD] * moves, delay=2))
        time.sleep(2.2)
        started = time.perf_counter()
        moved = 0

        def move_all() -> None:
            nonlocal moved
            while moved < moves and time.perf_counter() - started < 300:
                moved += move_due(moving.main) or 0

        writes = writes_of(move_all)
        out["move_seconds"] = round(time.perf_counter() - started, 3)
        out["moved"] = moved
        out["moved_per_s"] = round(moved / max(out["move_seconds"], 1e-9), 1)
        out["writes_per_moved_message"] = round(writes / max(moved, 1), 3)
        fired = moving.fire_many(moves + 10)
        out["fired_after_move"] = len(fired)
        moving.ack(fired)
        # Extra writes: what a delayed message costs (its publish and its move) beyond the same message published
        # without a delay, for publish_many (batches of 1,000) and for one publish call per message.
        plain = writes_of(lambda: [moving.publish_many([PAYLOAD] * MOVE_BATCH)  # a producer's batches of 1,000
                                   for _ in range(moves // MOVE_BATCH)])
        out["extra_writes_per_delayed_message"] = round((published + writes - plain) / max(moved, 1), 3)
        while batch := moving.fire_many(1000):
            moving.ack(batch)
        single = SINGLE_MOVES
        plain_single = writes_of(lambda: [moving.publish(PAYLOAD) for _ in range(single)])
        while batch := moving.fire_many(1000):
            moving.ack(batch)

        def publish_and_move_singles() -> None:  # counted as one: this process's own mover moves them as they
            for _ in range(single):              # fall due, in the small batches a trickle gives
                moving.publish(PAYLOAD, delay=1)
            deadline = time.perf_counter() + 120
            while moving.stats().delayed and time.perf_counter() < deadline:
                time.sleep(0.05)
                move_due(moving.main)

        delayed_single = writes_of(publish_and_move_singles)
        moved_single = single if not moving.stats().delayed else 0
        out["moved_single"] = moved_single
        out["extra_writes_per_single_delayed_publish"] = round((delayed_single - plain_single) / max(moved_single, 1),
                                                               3)
        while batch := moving.fire_many(1000):
            moving.ack(batch)
        out.update(lateness(ignis, loaded))
        if aerospike:
            client = ignis.store.client  # type: ignore[attr-defined]
            for set_name in (ignis.store._ctx.data_set, ignis.store._ctx.meta_set):  # type: ignore[attr-defined]
                client.truncate(ignis.store._ns, set_name, 0)  # type: ignore[attr-defined]
    return out


def lateness(ignis: Ignis, queue: Any, count: int = 1000, spread_s: float = 10.0) -> dict[str, Any]:
    """Under a steady load, on the queue holding the backlog: `count` messages published with delays spread
    over `spread_s` seconds, fired by a waiting consumer as they fall due; how late each was fired (fire time
    minus due time), p50 / p99 / max in ms. Nothing may fire early."""
    import threading

    late: list[float] = []
    early: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            got = queue.fire_many(100, timeout=0.2)
            for m in got:
                if m.envelope.due_at is not None and m.payload == b"due":
                    delta = now_ms() - m.envelope.due_at
                    (late if delta >= 0 else early).append(delta)
            if got:
                queue.ack(got)  # one commit for the batch: a steady load the fsync'd store sustains

    worker = threading.Thread(target=consume)
    worker.start()
    started = time.monotonic()
    for i in range(count):  # a steady publisher: one every spread_s / count seconds, each due 1 s later
        time.sleep(max(0.0, started + i * spread_s / count - time.monotonic()))
        queue.publish(b"due", delay=1.0)
    deadline = time.monotonic() + 30
    while len(late) + len(early) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    worker.join()
    late.sort()
    pick = (lambda q: round(late[min(len(late) - 1, int(q * len(late)))], 1)) if late else (lambda q: None)
    return {"late_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": late[-1] if late else None},
            "fired_late": len(late), "fired_early": len(early)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="Aerospike host:port/namespace (also measured)")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--moves", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=2.0, help="per rate sample")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-lmdb", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    run = uuid.uuid4().hex[:6]
    if not args.no_lmdb:
        with tempfile.TemporaryDirectory(prefix="ignis-delayed-") as tmp:
            results.append(one_store(f"lmdb://{tmp}/store", args.backlog, args.moves, args.seconds, args.rounds,
                                     False, empty_url=f"lmdb://{tmp}/empty"))
    if args.server:
        results.append(one_store(f"aerospike://{args.server}?farm=bd{run}&client=bd{run}", args.backlog, args.moves,
                                 args.seconds, args.rounds, True))
    table = Table(title=f"a backlog of delayed messages vs none, same queue shape (16 shards, {len(PAYLOAD)} B)")
    for column in ("store", "backlog", "publish backlog/none", "fire+ack backlog/none", "moved/s",
                   "writes per moved message",
                   "extra writes per delayed message (batch / single publish)", "fired after due, ms p50 / p99 / max",
                   "early"):
        table.add_column(column, justify="right")
    for r in results:
        late = r["late_ms"]
        table.add_row(r["store"], f"{r['backlog']:,}", f"{r['publish_ratio']:.2f}x", f"{r['fire_ack_ratio']:.2f}x",
                      f"{r['moved_per_s']:,.0f}", f"{r['writes_per_moved_message']:.2f}",
                      f"{r['extra_writes_per_delayed_message']:.3f} / "
                      f"{r['extra_writes_per_single_delayed_publish']:.3f}",
                      f"{late['p50']} / {late['p99']} / {late['max']}", str(r["fired_early"]))
    Console().print(table)
    if args.json:
        args.json.write_text(json.dumps({"at": now_ms(), "results": results}, indent=2))
    sys.exit(0 if all(r["moved"] == r["fired_after_move"] == args.moves
             and r["moved_single"] == SINGLE_MOVES and not r["fired_early"] for r in results)
             else 1)


if __name__ == "__main__":
    main()
