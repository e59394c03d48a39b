#!/usr/bin/env python3
"""What OpenTelemetry tracing (ignis.tracing) costs the publish path, side by side in one run, on lmdb:

- before: the publish methods without the tracing wrapper (Queue.publish.__wrapped__): the code before it;
- off:  as if the `otel` extra were not installed (ignis.tracing sees no opentelemetry package);
- api:  opentelemetry-api installed, no SDK configured (the API's default proxy provider): the issue's
        "nil when no SDK is configured";
- sdk:  an SDK TracerProvider with no span processor (spans made, sampled, exported nowhere): what
        turning tracing on costs at least, the headers included (needs opentelemetry-sdk; skipped without).

    .venv/bin/python bench/bench_tracing.py                       # 20 rounds of 2000 publishes per mode
    .venv/bin/python bench/bench_tracing.py --messages 5000 --rounds 30 --json

Each round publishes `--messages` 256-byte messages with `publish` (one at a time: the lean path) and with
`publish_many` (lists of 100) in each mode in turn, the order rotated per round, each mode into a store of its
own (durability=fast: no fsync, so the store is as cheap as it gets and the tracing share as large as it
gets). Throughput per mode is over all its rounds; a ratio to `before` is the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ignis import Ignis, Queue, QueueSpec, tracing

PAYLOAD = b"x" * 256
BATCH = 100


def set_mode(mode: str) -> None:
    tracing.set_tracer_provider(None)
    if mode == "off":  # what an import without the extra leaves
        tracing._trace, tracing._GLOBAL_SLOT = None, False  # type: ignore[assignment]
        return
    tracing._trace, tracing._GLOBAL_SLOT = _TRACE, _GLOBAL_SLOT
    if mode == "sdk":
        from opentelemetry.sdk.trace import TracerProvider

        tracing.set_tracer_provider(TracerProvider())


def open_queue(stack: ExitStack, root: Path, name: str) -> Queue:
    ignis = stack.enter_context(Ignis(f"lmdb://{root}/{name}?durability=fast"))
    ignis.apply(QueueSpec.build(name="bench", handlerType="bench", shards=8))
    return ignis.queue("bench")


def timed(q: Queue, mode: str, n: int, fn: Callable[[Queue, int, str], None]) -> float:
    set_mode("api" if mode == "before" else mode)
    started = time.perf_counter()
    fn(q, n, mode)
    return time.perf_counter() - started


def method(q: Queue, name: str, mode: str) -> Callable[..., Any]:
    bound = getattr(q, name)
    return bound.__wrapped__.__get__(q) if mode == "before" else bound


def one_by_one(q: Queue, n: int, mode: str) -> None:
    publish = method(q, "publish", mode)
    for _ in range(n):
        publish(PAYLOAD)


def batched(q: Queue, n: int, mode: str) -> None:
    publish_many = method(q, "publish_many", mode)
    batch = [PAYLOAD] * BATCH
    for _ in range(n // BATCH):
        publish_many(batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if _TRACE is None:
        sys.exit("opentelemetry-api is not installed: pip install 'ignismq[otel]'")
    try:
        import opentelemetry.sdk  # noqa: F401
        modes = ["before", "off", "api", "sdk"]
    except ImportError:
        modes = ["before", "off", "api"]
    # The machine's speed drifts (a shared host): the modes take turns in short chunks, each on a store of its
    # own, so a drift hits them alike; a ratio is the median of the per-round ratios (paired rounds).
    works = {"publish": one_by_one, "publish_many": batched}
    seconds: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in works}
    with tempfile.TemporaryDirectory() as root, ExitStack() as stack:
        queues = {(w, m): open_queue(stack, Path(root), f"{w}-{m}") for w in works for m in modes}
        for (w, m), q in queues.items():
            timed(q, m, 200, works[w])  # warm up: handles, reservations
        for r in range(args.rounds):
            order = modes[r % len(modes):] + modes[:r % len(modes)]  # no mode always first (or last)
            for w, fn in works.items():
                for m in order:
                    seconds[w][m].append(timed(queues[w, m], m, args.messages, fn))
        for (w, m), q in queues.items():
            assert q.stats().published == 200 + args.rounds * args.messages, (w, m)
    set_mode("api")
    total = args.rounds * args.messages
    rates = {w: {m: total / sum(s) for m, s in by_mode.items()} for w, by_mode in seconds.items()}
    ratios = {w: {m: statistics.median(b / x for b, x in zip(by_mode["before"], by_mode[m], strict=True))
                  for m in modes[1:]} for w, by_mode in seconds.items()}
    if args.json:
        print(json.dumps({"messages_per_round": args.messages, "rounds": args.rounds, "rates": rates,
                          "ratios_to_before": ratios, "seconds": seconds}, indent=2))
        return
    print(f"publish throughput, msg/s over {args.rounds} rounds of {args.messages} per mode (lmdb, durability=fast);"
          " ratio: median of the per-round throughput ratios")
    others = modes[1:]
    print(f"{'':14}" + "".join(f"{m:>10}" for m in modes) + "".join(f"{m + '/before':>12}" for m in others))
    for w in works:
        print(f"{w:14}" + "".join(f"{rates[w][m]:10,.0f}" for m in modes)
              + "".join(f"{ratios[w][m]:12.3f}" for m in others))

_TRACE, _GLOBAL_SLOT = tracing._trace, tracing._GLOBAL_SLOT

if __name__ == "__main__":
    main()
