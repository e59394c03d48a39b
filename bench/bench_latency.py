#!/usr/bin/env python3
"""End-to-end latency of IgnisMQ, with RabbitMQ beside it in the same run, the OpenMessaging Benchmark way.

    .venv/bin/python bench/bench_latency.py                                   # lmdb, 100 and 1,000 msg/s, max
    .venv/bin/python bench/bench_latency.py --server 127.0.0.1:3000/test      # ... and Aerospike
    .venv/bin/python bench/bench_latency.py --amqp amqp://guest:guest@127.0.0.1:5672/%2F   # ... and RabbitMQ
    .venv/bin/python bench/bench_latency.py --idle-queues 1000                # the idle cost only

Method (OpenMessaging Benchmark): a producer process publishes 1 KiB messages at a fixed rate on an intended
schedule (message i is due at t0 + i/rate; a stall shows as publish delay, so it is not hidden: no
coordinated omission), after a warm-up whose messages are not counted. Each publish is synchronous (it
returns once stored, or confirmed by the broker), so the fixed-rate runs publish from --producers threads
(4), each on its share of the schedule, as OpenMessaging's producers keep several sends in flight; "max"
is one synchronous publisher back to back. Each payload carries the wall-clock
time its publish began; a consumer process (never the producer's) records handler entry time minus that
time: the end-to-end latency. Publish latency (the call's duration), publish delay (how late the call began
against its schedule) and end-to-end latency go into HDR histograms (`hdrhistogram`) and are reported as
p50 / p99 / p99.9 / max. "max" publishes back to back from one synchronous publisher. Every run checks that
each published message was delivered exactly once.

IgnisMQ: one queue of 16 shards, a push Consumer in another process with 4 workers (the queue's
concurrency), default store settings (lmdb: durability fsync). RabbitMQ (when one answers at --amqp; pika
from PyPI, Debian's rabbitmq-server): a durable quorum queue, persistent messages, publisher confirms (each
publish returns once confirmed), 4 consumers with manual acks and prefetch 100 in another process.

The idle phase (`--idle-queues N`): a consumer process serving N declared, empty queues; after it settled,
its CPU (% of one core) and its store calls per second per queue over a window.

Output: a table per system, JSON (`--json`), and a PNG of the end-to-end latency percentiles of every
system and rate (`--plot`, default bench/latency.png).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hdrh.histogram import HdrHistogram
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
PAYLOAD_BYTES = 1024
HEAD = struct.Struct(">QQ")  # seq, publish began (epoch ns)
PERCENTILES = (50.0, 99.0, 99.9)
MAX_LATENCY_US = 3_600_000_000  # 1 h: what an HDR histogram here can hold
console = Console(width=150)


def histogram() -> HdrHistogram:
    return HdrHistogram(1, MAX_LATENCY_US, 3)


def summary(h: HdrHistogram) -> dict[str, float]:
    """p50 / p99 / p99.9 / max in milliseconds."""
    if not h.get_total_count():
        return {"count": 0}
    out: dict[str, float] = {f"p{p:g}": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}
    out["max"] = h.get_max_value() / 1000
    out["count"] = h.get_total_count()
    return out


def payload(seq: int) -> bytes:
    return HEAD.pack(seq, time.time_ns()) + b"x" * (PAYLOAD_BYTES - HEAD.size)


# ---- consumer processes ------------------------------------------------------------------------------
class Recorder:
    """What a consumer process saw: per delivery (seq, publish began ns, handler entered ns); progress on
    stdout; the whole record written to a file at the end."""

    def __init__(self) -> None:
        self.rows = array.array("q")
        self.lock = threading.Lock()

    def saw(self, data: bytes) -> None:
        entered = time.time_ns()
        seq, began = HEAD.unpack_from(data)
        with self.lock:
            self.rows.extend((seq, began, entered))

    def report_progress(self, stop: threading.Event) -> None:
        while not stop.wait(0.1):
            print(f"seen {len(self.rows) // 3}", flush=True)

    def dump(self, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.rows.tobytes())


def run_ignis_consumer(url: str, queue: str, out: str) -> None:
    from ignis import Consumer, Ignis

    recorder = Recorder()
    stop = threading.Event()
    with Ignis(url) as ignis:
        consumer = Consumer(ignis, queues=[queue])
        consumer.register(queue, lambda m: recorder.saw(m.data))
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        consumer.start()
        print("ready", flush=True)
        recorder.report_progress(stop)
        consumer.stop()
    recorder.dump(out)


def run_amqp_consumer(url: str, queue: str, out: str, consumers: int) -> None:
    import pika

    recorder = Recorder()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def consume() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)

        def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
            recorder.saw(body)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message)
        while not stop.is_set():
            connection.process_data_events(time_limit=0.1)
        connection.close()

    threads = [threading.Thread(target=consume, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    recorder.report_progress(stop)
    for t in threads:
        t.join(5)
    recorder.dump(out)


def run_idle_consumer(url: str, queues: int, settle: float, window: float) -> None:
    """Consume `queues` empty queues; after `settle` s, print this process's CPU and store calls over `window` s."""
    from prometheus_client import REGISTRY

    from ignis import Consumer, Ignis

    def calls() -> float:
        return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    with Ignis(url) as ignis:
        consumer = Consumer(ignis)
        consumer.register("idle", lambda m: None)
        consumer.start()
        time.sleep(settle)
        c0, k0, t0 = cpu(), calls(), time.monotonic()
        time.sleep(window)
        c1, k1, t1 = cpu(), calls(), time.monotonic()
        threads = threading.active_count()
        consumer.stop()
    elapsed = t1 - t0
    print(json.dumps({"cpu_percent": round(100 * (c1 - c0) / elapsed, 2),
                      "store_calls_per_s": round((k1 - k0) / elapsed, 1),
                      "store_calls_per_s_per_queue": round((k1 - k0) / elapsed / queues, 3),
                      "threads": threads}), flush=True)


# ---- the producer side ------------------------------------------------------------------------------------
@dataclass
class Trial:
    system: str
    rate: str  # "100", "1000" or "max"
    publish: HdrHistogram = field(default_factory=histogram)
    delay: HdrHistogram = field(default_factory=histogram)
    e2e: HdrHistogram = field(default_factory=histogram)
    published: int = 0
    measured: int = 0
    achieved_rate: float = 0.0
    lost: int = 0
    duplicates: int = 0
    e2e_by_percentile: list[tuple[float, float]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"system": self.system, "rate": self.rate, "achieved_rate": round(self.achieved_rate, 1),
                "published": self.published, "measured": self.measured, "lost": self.lost,
                "duplicates": self.duplicates, "publish_ms": summary(self.publish), "delay_ms": summary(self.delay),
                "e2e_ms": summary(self.e2e)}


class ConsumerProcess:
    """A consumer process: `script` (this file, or another bench that imports it) run with `args` and the path its
    Recorder writes to."""

    def __init__(self, args: list[str], script: str = __file__) -> None:
        self.out = tempfile.mktemp(prefix="ignis-latency-", suffix=".bin")
        self.proc = subprocess.Popen([sys.executable, script, *args, self.out], stdout=subprocess.PIPE, text=True)
        self.seen = 0
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if line.strip() != "ready":
            raise RuntimeError(f"consumer process did not start: {line!r}")
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("seen "):
                self.seen = int(line.split()[1])

    def finish(self, expected: int, timeout: float) -> array.array:
        deadline = time.monotonic() + timeout
        while self.seen < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # duplicates, if any, arrive too
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        rows = array.array("q")
        with open(self.out, "rb") as f:
            rows.frombytes(f.read())
        os.unlink(self.out)
        return rows


def drive(trial: Trial, publish: Any, rate: float | None, warmup: float, seconds: float, producers: int = 1) -> None:
    """Publish on the intended schedule (or back to back when rate is None) from `producers` threads, message
    `seq` due at start + seq / rate (thread k publishes seq = k, k + producers, ...); histograms after the
    warm-up. `publish` is called with (thread index, payload)."""
    start = time.monotonic()
    end = start + warmup + seconds
    interval = 1 / rate if rate else 0.0
    lock = threading.Lock()
    counter = iter(range(1 << 62))  # back to back: the next seq for whichever thread is free
    first_measured: list[int] = []
    measured_from: list[float] = []
    published: list[int] = []

    def run(k: int) -> None:
        publish_h, delay_h = histogram(), histogram()
        seq = k
        count = 0
        while True:
            if not rate:
                seq = next(counter)
            intended = start + seq * interval if rate else time.monotonic()
            if intended >= end:
                break
            now = time.monotonic()
            if intended > now:
                time.sleep(intended - now)
            began = time.monotonic()
            publish(k, payload(seq))
            done = time.monotonic()
            count += 1
            if began - start >= warmup:
                if not first_measured or seq < first_measured[0]:
                    with lock:
                        if not first_measured or seq < first_measured[0]:
                            first_measured[:] = [seq]
                            measured_from[:] = [began]
                publish_h.record_value(max(1, int((done - began) * 1e6)))
                delay_h.record_value(max(1, int((began - intended) * 1e6)))
            if rate:
                seq += producers
        with lock:
            trial.publish.add(publish_h)
            trial.delay.add(delay_h)
            published.append(count)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trial.published = sum(published)
    first = first_measured[0] if first_measured else trial.published
    trial.measured = trial.published - first
    trial.achieved_rate = trial.measured / (time.monotonic() - measured_from[0]) if measured_from else 0.0
    trial.first_measured = first  # type: ignore[attr-defined]


def account(trial: Trial, rows: array.array) -> None:
    """Delivery checks (every message exactly once) and the end-to-end histogram of the measured ones."""
    seen: dict[int, int] = {}
    first = trial.first_measured  # type: ignore[attr-defined]
    for i in range(0, len(rows), 3):
        seq, began, entered = rows[i], rows[i + 1], rows[i + 2]
        seen[seq] = seen.get(seq, 0) + 1
        if seen[seq] == 1 and seq >= first:
            trial.e2e.record_value(max(1, (entered - began) // 1000))
    trial.lost = sum(1 for s in range(trial.published) if s not in seen)
    trial.duplicates = sum(n - 1 for n in seen.values())
    trial.e2e_by_percentile = [(p, trial.e2e.get_value_at_percentile(p) / 1000) for p in _curve_points()]


def _curve_points() -> list[float]:
    points, p = [], 0.0
    while p < 99.99:
        points.append(round(p, 4))
        p = 100 - (100 - p) / 1.25 if p >= 50 else p + 5
    return [*points, 99.99, 100.0]


def commit_floor(work: Path, rate: float | None, commits: int = 300) -> dict[str, float]:
    """The disk's share of the lmdb figures: one durable commit of a 1 KiB message, made the way the store makes
    them with durability=fsync (data pages flushed in the commit, the meta page by a second flush; see
    ignis.storage.lmdb.environment), spaced as the run's messages are. A message costs two of them (its publish,
    its claim) whatever the code around them does. Spacing matters on a virtual machine: a flush that finds
    the CPU idle waits for it to wake (here 0.6 ms back to back, 1.4 ms at 10 ms apart)."""
    import lmdb

    path = tempfile.mkdtemp(prefix="floor-", dir=work)
    env = lmdb.open(path, map_size=1 << 28, sync=True, metasync=False, writemap=False)
    h = histogram()
    gap = 1 / rate if rate else 0.0
    body = os.urandom(1024)
    try:
        for i in range(commits):
            began = time.monotonic()
            with env.begin(write=True) as txn:
                txn.put(b"%08d" % i, body)
            env.sync(True)
            h.record_value(max(1, int((time.monotonic() - began) * 1e6)))
            if gap:
                time.sleep(max(0.0, gap - (time.monotonic() - began)))
    finally:
        env.close()
    return summary(h)


def ignis_trial(url: str, rate: float | None, label: str, args: argparse.Namespace) -> Trial:
    from ignis import Ignis, QueueSpec

    name = f"lat{uuid.uuid4().hex[:6]}"
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=args.shards, concurrency=args.consumers))
        queue = ignis.queue(name)
        consumer = ConsumerProcess(["_ignis-consumer", url, name])
        trial = Trial(system_name(url), label)
        try:
            drive(trial, lambda _k, body: queue.publish(body), rate, args.warmup, args.seconds, producers(rate, args))
            rows = consumer.finish(trial.published, timeout=120)
        finally:
            if consumer.proc.poll() is None:
                consumer.proc.kill()
        account(trial, rows)
        ignis.delete_queue(name)
    return trial


def amqp_trial(url: str, rate: float | None, label: str, args: argparse.Namespace) -> Trial:
    import pika

    name = f"lat{uuid.uuid4().hex[:6]}"
    threads = producers(rate, args)
    connections = [pika.BlockingConnection(pika.URLParameters(url)) for _ in range(threads)]
    channels = [c.channel() for c in connections]  # a BlockingConnection is one thread's
    channels[0].queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for channel in channels:
        channel.confirm_delivery()  # each basic_publish returns once the broker confirmed it
    properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)

    def publish(k: int, body: bytes) -> None:
        channels[k].basic_publish("", name, body, properties, mandatory=True)

    consumer = ConsumerProcess(["_amqp-consumer", url, name, str(args.consumers)])
    trial = Trial("rabbitmq", label)
    try:
        drive(trial, publish, rate, args.warmup, args.seconds, threads)
        rows = consumer.finish(trial.published, timeout=120)
    finally:
        if consumer.proc.poll() is None:
            consumer.proc.kill()
    account(trial, rows)
    channels[0].queue_delete(name)
    for connection in connections:
        connection.close()
    return trial


def producers(rate: float | None, args: argparse.Namespace) -> int:
    """Producer threads: one for the back-to-back run ("as fast as one synchronous publisher goes"), else
    --producers (each publishes rate / producers on its share of the schedule)."""
    return 1 if rate is None else args.producers


def system_name(url: str) -> str:
    if url.startswith("aerospike"):
        return "ignis-aerospike"
    return "ignis-lmdb-fast" if "durability=fast" in url else "ignis-lmdb"


def amqp_answers(url: str) -> str | None:
    """None when a broker answers at `url`, else why not."""
    try:
        import pika
    except ImportError:
        return "pika is not installed (pip install pika)"
    try:
        pika.BlockingConnection(pika.URLParameters(url)).close()
        return None
    except Exception as exc:
        return f"no broker at {url}: {type(exc).__name__}: {exc}"


# ---- idle cost -----------------------------------------------------------------------------------------
def idle_trial(url: str, queues: int, args: argparse.Namespace) -> dict[str, Any]:
    from ignis import Ignis, QueueSpec

    run = uuid.uuid4().hex[:6]
    sep = "&" if "?" in url else "?"
    scoped = f"{url}{sep}client=idle{run}" if url.startswith("aerospike") else url
    with Ignis(scoped) as ignis:
        with console.status(f"declaring {queues} idle queues"):
            for i in range(queues):
                ignis.apply(QueueSpec.build(name=f"idle{run}q{i}", handlerType="idle", shards=args.shards,
                                            concurrency=1))
        proc = subprocess.run([sys.executable, __file__, "_idle-consumer", scoped, str(queues), str(args.idle_settle),
                               str(args.idle_window)], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"idle consumer failed: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        for i in range(queues):
            ignis.delete_queue(f"idle{run}q{i}")
    return {"system": system_name(url), "queues": queues, **result}


# ---- output ----------------------------------------------------------------------------------------------
def fmt(s: dict[str, float]) -> str:
    if not s.get("count"):
        return "-"
    return " / ".join(f"{s[k]:.2f}" if s[k] < 10 else f"{s[k]:,.0f}" for k in ("p50", "p99", "p99.9", "max"))


def show(trials: list[Trial]) -> None:
    table = Table(title="latency, ms: p50 / p99 / p99.9 / max")
    for col in ("system", "rate", "msg/s", "publish", "publish delay", "end to end", "lost", "dup"):
        table.add_column(col, justify="right" if col not in ("system",) else "left")
    for t in trials:
        table.add_row(t.system, t.rate, f"{t.achieved_rate:,.0f}", fmt(summary(t.publish)), fmt(summary(t.delay)),
                      fmt(summary(t.e2e)), str(t.lost), str(t.duplicates))
    console.print(table)


def plot(trials: list[Trial], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    styles = {"ignis-lmdb": "-", "ignis-lmdb-fast": "-.", "ignis-aerospike": "--", "rabbitmq": ":"}
    for t in trials:
        if not t.e2e_by_percentile:
            continue
        xs = [1 / (1 - p / 100) if p < 100 else 1e5 for p, _ in t.e2e_by_percentile]
        ys = [max(v, 0.001) for _, v in t.e2e_by_percentile]
        ax.plot(xs, ys, styles.get(t.system, "-"), label=f"{t.system} @ {t.rate} msg/s", linewidth=1.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = [1, 2, 10, 100, 1000, 10000]
    ax.set_xticks(ticks, ["p0", "p50", "p90", "p99", "p99.9", "p99.99"])
    ax.set_xlabel("percentile")
    ax.set_ylabel("end-to-end latency, ms (log)")
    ax.set_title("End-to-end latency, 1 KiB messages, consumers in another process")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    console.print(f"plot: {path}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        mode, rest = sys.argv[1], sys.argv[2:]
        if mode == "_ignis-consumer":
            run_ignis_consumer(*rest)
        elif mode == "_amqp-consumer":
            run_amqp_consumer(rest[0], rest[1], rest[3], int(rest[2]))
        elif mode == "_idle-consumer":
            run_idle_consumer(rest[0], int(rest[1]), float(rest[2]), float(rest[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,1000,max", help="comma-separated msg/s, or 'max'")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per run (not counted)")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--consumers", type=int, default=4, help="consumer workers (in another process)")
    parser.add_argument("--producers", type=int, default=4,
                        help="producer threads of the fixed-rate runs (each waits for its publish to be confirmed)")
    parser.add_argument("--server", help="Aerospike host:port/namespace (also measured)")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F",
                        help="RabbitMQ URL, measured when a broker answers there")
    parser.add_argument("--no-lmdb", action="store_true", help="skip the lmdb store")
    parser.add_argument("--lmdb-durability", default="fsync",
                        help="comma-separated lmdb durability modes to measure (fsync, fast), each its own store")
    parser.add_argument("--idle-queues", type=int, default=1000, help="queues of the idle phase (0: skip it)")
    parser.add_argument("--idle-only", action="store_true", help="only the idle phase")
    parser.add_argument("--idle-settle", type=float, default=10.0)
    parser.add_argument("--idle-window", type=float, default=20.0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, default=HERE / "latency.png")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ignis-latency-"))
    modes = [] if args.no_lmdb else [m.strip() for m in args.lmdb_durability.split(",") if m.strip()]
    urls = [f"lmdb://{work}/store-{mode}?durability={mode}" for mode in modes]
    if args.server:
        hostport, _, namespace = args.server.partition("/")
        urls.append(f"aerospike://{hostport}/{namespace or 'test'}?farm=lat&client=lat{uuid.uuid4().hex[:6]}")
    broker = amqp_answers(args.amqp)
    if broker is not None:
        console.print(f"RabbitMQ not measured: {broker}")
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    trials: list[Trial] = []
    floors: dict[str, dict[str, float]] = {}
    if not args.idle_only:
        for label in rates:
            rate = None if label == "max" else float(label)
            for url in urls:
                with console.status(f"{system_name(url)} at {label} msg/s"):
                    trials.append(ignis_trial(url, rate, label, args))
                show(trials[-1:])
            if modes:
                floors[label] = commit_floor(work, rate)
                console.print(f"lmdb durable commit alone at {label} msg/s spacing, ms: {fmt(floors[label])} "
                              "(a message takes two: publish and claim)")
            if broker is None:
                with console.status(f"rabbitmq at {label} msg/s"):
                    trials.append(amqp_trial(args.amqp, rate, label, args))
                show(trials[-1:])
        show(trials)
        if trials and args.plot:
            plot(trials, args.plot)
    idle = []
    if args.idle_queues:
        for url in urls:
            with console.status(f"{system_name(url)}: a consumer of {args.idle_queues} idle queues"):
                idle.append(idle_trial(url, args.idle_queues, args))
            console.print(idle[-1])
    if args.json:
        args.json.write_text(json.dumps({"trials": [t.as_dict() for t in trials], "idle": idle,
                                         "lmdb_commit_floor_ms": floors,
                                         "args": {k: str(v) for k, v in vars(args).items()}}, indent=2))


if __name__ == "__main__":
    main()
