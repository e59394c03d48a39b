#!/usr/bin/env python3
"""Memory bounded whatever the backlog (issue 49, part 3): the peak RSS of each long-lived role, and of
`ignis stats`, over a queue holding a small backlog and over the same queue holding a large one, side by side
in one run. Target: the large backlog's peak at most 1.2x the small one's, for every role.

    .venv/bin/python bench/bench_memory.py                                   # lmdb: 10,000 and 1,000,000
    .venv/bin/python bench/bench_memory.py --server 127.0.0.1:3000/test      # and a real Aerospike server
    .venv/bin/python bench/bench_memory.py --sizes 2000,20000 --json out.json --check

For each store and each backlog size N (`--sizes`), on a fresh store (lmdb: a temporary directory;
Aerospike: a farm and client of their own, whose sets are truncated afterwards):
1. fill: one 32-shard queue gets N messages of `--payload` bytes (publish_many in chunks), and a crashed
   consumer's share of them, `--abandoned` (a fraction of N), is claimed and never acked;
2. each role runs as a process of its own, one after another, and its peak RSS is read when it has exited
   (the kernel's high-water mark for that child: `os.wait4`'s ru_maxrss, the same figure as VmHWM); its
   anonymous memory (RssAnon: the heap, without the store's mapped file pages) is sampled every 50 ms:
   * `stats`: `ignis stats QUEUE -o json` (with the in-flight scan), checked against the known depth;
   * `operator`: `ignis operator` (kopf) against kmock's Kubernetes emulator, served from this process,
     with one IgnisQueue for the queue and a figures pass every second; it runs until the object's status
     carries the queue's depth and `--seconds` more;
   * `consumer`: a `Consumer` process (push, the queue's concurrency) that acks `--consume` messages, then
     idles `--seconds` more;
   * `sweeper`: `ignis sweeper` (the leader: store lease, sweep every second, clock 600 s ahead so the
     abandoned claims are overdue) until it has swept every abandoned claim and made `--passes` more passes.
Prints one table per store (peak RSS and private peak per role per size, the ratios, the target) and `--json
FILE` writes every figure. `--check` exits 1 when a ratio misses the target or a role did not do its work. The
target is on both figures on Aerospike, and on the private peak on lmdb: lmdb reads through a shared map of the
store's file, and every page a process touches counts in its RSS (shared page cache the kernel drops under
pressure; on a recent kernel a touched page can map a whole large folio of it: up to 2 MiB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ignis import Ignis, QueueSpec

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "membench"
HANDLER = "membench.v1"
SHARDS = 32
SWEEP_DURATION_SECONDS = 300  # the smallest allowed; the sweeper's clock runs CLOCK_AHEAD_SECONDS ahead
CLOCK_AHEAD_SECONDS = 600
ROLES = ("stats", "operator", "consumer", "sweeper")
TARGET = 1.2
GROUP, VERSION, PLURAL = "ignismq.io", "v1alpha1", "ignisqueues"
console = Console(stderr=True)


def size_list(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: expected two or more positive integers separated by commas")
    return sizes


# ---- the roles' processes -------------------------------------------------------------------------------
# A role's own high-water mark, written when it exits: VmHWM is per process image (os.wait4's ru_maxrss is not:
# Linux folds the forking parent's peak into it at exec, so a big parent would hide a small child).
REPORT_AT_EXIT = ("import atexit, os, runpy, sys; "
                  "atexit.register(lambda: open(os.environ['IGNIS_MEMBENCH_STATUS'], 'w')"
                  ".write(open('/proc/self/status').read())); "
                  "target = sys.argv[1]; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(target, run_name='__main__') if target.endswith('.py') "
                  "else runpy.run_module(target, run_name='__main__', alter_sys=True)")


class Measured:
    """A role's process: `python -m MODULE ARGS` (or a script), which writes its /proc/self/status when it exits
    (its VmHWM: the kernel's high-water mark of its resident set, file pages of the store's map included);
    its RssAnon (heap and other private memory, without mapped file pages) is sampled every 50 ms meanwhile."""

    def __init__(self, target: str, args: list[str], env: dict[str, str], stdout: Any = subprocess.PIPE,
                 stderr: Any = subprocess.PIPE) -> None:
        fd, self._status = tempfile.mkstemp(prefix="ignis-membench-", suffix=".status")
        os.close(fd)
        env = {**env, "IGNIS_MEMBENCH_STATUS": self._status}
        self.proc = subprocess.Popen([sys.executable, "-c", REPORT_AT_EXIT, target, *args], env=env, stdout=stdout,
                                     stderr=stderr, text=True, cwd=ROOT)
        self.peak_anon_kib = 0
        self.last_hwm_kib = 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        path = f"/proc/{self.proc.pid}/status"
        while not self._done.wait(0.05):
            try:
                with open(path) as f:
                    fields = _status_fields(f.read())
            except OSError:
                return
            self.peak_anon_kib = max(self.peak_anon_kib, fields.get("RssAnon", 0))
            self.last_hwm_kib = max(self.last_hwm_kib, fields.get("VmHWM", 0))

    def finish(self, timeout: float) -> tuple[int, int, str, str]:
        """Read its output to the end and wait for it: (exit status, peak RSS KiB, stdout, stderr)."""
        texts: dict[str, str] = {}

        def read(name: str, stream: Any) -> None:
            texts[name] = stream.read() if stream is not None else ""

        readers = [threading.Thread(target=read, args=(name, getattr(self.proc, name)), daemon=True)
                   for name in ("stdout", "stderr")]
        for r in readers:
            r.start()
        code, peak = self.wait(timeout)
        for r in readers:
            r.join(10)
        return code, peak, texts.get("stdout", ""), texts.get("stderr", "")

    def wait(self, timeout: float) -> tuple[int, int]:
        """(exit status, peak RSS in KiB: the VmHWM it wrote at exit; 0 when it did not exit cleanly). A child
        that outlives `timeout` is killed."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._done.set()
        self._sampler.join()
        try:
            fields = _status_fields(Path(self._status).read_text())
        finally:
            os.unlink(self._status)
        return code, fields.get("VmHWM", 0)


def _status_fields(text: str) -> dict[str, int]:
    """The kB fields of a /proc/PID/status text."""
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB":
            out[name] = int(parts[0])
    return out


def role_env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"IGNIS_STORE": url, "PYTHONUNBUFFERED": "1"})
    return env


def client_of(url: str) -> str:
    return url.split("client=", 1)[1].split("&", 1)[0] if "client=" in url else "default"


def run_stats(url: str, expected_depth: int) -> dict[str, Any]:
    child = Measured("ignis.cli.app", ["stats", QUEUE, "-o", "json"], role_env(url))
    code, peak, out, err = child.finish(60)
    doc = json.loads(out) if code == 0 else {}
    return {"peak_kib": peak, "peak_anon_kib": child.peak_anon_kib, "exit": code,
            "did": f"depth {doc.get('depth')}, in flight {doc.get('in_flight')}",
            "ok": code == 0 and doc.get("depth") == expected_depth, "error": err.strip()[-500:] if code else ""}


def consumer_main(url: str, count: int, seconds: float) -> None:
    """`--role consumer`: a push consumer that acks `count` messages, idles `seconds` more, prints the count."""
    from ignis import Consumer

    acked = 0
    lock = threading.Lock()
    enough = threading.Event()
    with Ignis(url) as ignis:
        consumer = Consumer(ignis, queues=[QUEUE])

        @consumer.handler(HANDLER)
        def handle(message: Any) -> bool:
            nonlocal acked
            with lock:
                acked += 1
                if acked >= count:
                    enough.set()
            return True

        consumer.start()
        enough.wait(600)
        time.sleep(seconds)
        consumer.stop(30)
    print(json.dumps({"handled": acked}))


def run_consumer(url: str, count: int, seconds: float) -> dict[str, Any]:
    child = Measured(__file__, ["--role", "consumer", "--store-url", url, "--consume", str(count),
                                "--seconds", str(seconds)], role_env(url))
    code, peak, out, err = child.finish(120)
    handled = json.loads(out.strip().splitlines()[-1])["handled"] if code == 0 and out.strip() else 0
    return {"peak_kib": peak, "peak_anon_kib": child.peak_anon_kib, "exit": code, "did": f"handled {handled:,}",
            "ok": code == 0 and handled >= count, "error": err.strip()[-500:] if code else ""}


def run_sweeper(url: str, abandoned: int, passes: int, timeout: float) -> dict[str, Any]:
    """`ignis sweeper` leads (a store lease of this fresh store) and sweeps every second; its JSON log lines say
    each pass and what it moved. Stopped (SIGTERM) once every abandoned claim moved and `passes` more passes."""
    env = role_env(url)
    env.update({"IGNIS_SWEEPER_CLOCK_OFFSET_SECONDS": str(CLOCK_AHEAD_SECONDS),
                "IGNIS_SWEEPER_LEASE_DURATION_SECONDS": "5", "IGNIS_SWEEPER_RENEW_DEADLINE_SECONDS": "4",
                "IGNIS_SWEEPER_RETRY_PERIOD_SECONDS": "1"})
    argv = ["sweeper", "--sweep-interval", "1", "--port", "-1", "--log-format", "json"]
    if url.startswith("lmdb:"):
        argv += ["--threads", "2"]  # what `ignis up` uses on lmdb (one write lock)
    child = Measured("ignis.cli.app", argv, env, stdout=subprocess.DEVNULL)
    moved = after = total_passes = 0
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    assert child.proc.stderr is not None
    for line in child.proc.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            errors.append(line.strip())
            continue
        if event.get("levelname", event.get("level", "")).upper() in ("ERROR", "CRITICAL"):
            errors.append(event.get("message", line.strip()))
        if event.get("event") == "sweep_pass":
            total_passes += 1
            if moved >= abandoned:
                after += 1
            moved += int(event.get("moved", 0))
        if (moved >= abandoned and after >= passes) or time.monotonic() > deadline:
            break
    child.proc.terminate()
    child.proc.stderr.read()
    code, peak = child.wait(60)
    return {"peak_kib": peak, "peak_anon_kib": child.peak_anon_kib, "exit": code,
            "did": f"swept {moved:,} in {total_passes} passes",
            "ok": moved >= abandoned and after >= passes and not errors, "error": "; ".join(errors)[-500:]}


def queue_manifest(spec: QueueSpec, namespace: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
            "metadata": {"name": spec.name, "namespace": namespace, "uid": f"uid-{uuid.uuid4().hex[:8]}",
                         "resourceVersion": "1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"handlerType": spec.handler_type, "shards": spec.shards, "concurrency": spec.concurrency,
                     "sweepDurationSeconds": spec.sweep_duration_seconds}}


def run_operator(url: str, spec: QueueSpec, expected_depth: int, seconds: float, timeout: float) -> dict[str, Any]:
    """`ignis operator` (kopf, cluster mode) against kmock's emulator served from a thread of this process; the
    IgnisQueue's namespace is the queue's clientId, so the operator adopts the queue the bench filled."""
    import aiohttp
    from ignis_operator.emulation import declare_resources
    from kmock import KubernetesEmulator, Server

    namespace = client_of(url)
    state: dict[str, Any] = {}
    started, stop = threading.Event(), threading.Event()

    async def serve() -> None:
        async with KubernetesEmulator() as emulator, Server(emulator):
            declare_resources(emulator)
            state["emulator"], state["url"] = emulator, str(emulator.url).rstrip("/")
            path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
            async with (aiohttp.ClientSession(base_url=state["url"]) as session,
                        session.post(path, json=queue_manifest(spec, namespace)) as resp):
                resp.raise_for_status()
            started.set()
            while not stop.is_set():
                await asyncio.sleep(0.1)
                # kmock records every request for its own assertions: keep only the newest (the operator's
                # status patches every second would otherwise pile up in this process, not the operator's)
                del emulator._requests[:-1]

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("kmock's emulator did not start")
    with tempfile.TemporaryDirectory(prefix="ignis-membench-kube-") as tmp:
        kubeconfig = Path(tmp) / "config"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": state["url"]}}],
            "users": [{"name": "kmock", "user": {}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}]}))
        env = role_env(url)
        env.update({"KUBECONFIG": str(kubeconfig), "IGNIS_OPERATOR_SCANNING": "false",
                    "IGNIS_OPERATOR_FIGURES_INTERVAL_SECONDS": "1", "IGNIS_OPERATOR_FIGURES_CHANGE_PERCENT": "0",
                    "IGNIS_OPERATOR_RESYNC_INTERVAL_SECONDS": "2", "IGNIS_OPERATOR_RESYNC_JITTER_SECONDS": "0"})
        child = Measured("ignis.cli.app", ["operator", "-n", namespace, "--port", "0", "--log-level", "WARNING"],
                         env, stdout=subprocess.DEVNULL)
        errors: list[str] = []
        assert child.proc.stderr is not None
        threading.Thread(target=lambda: errors.extend(line.strip() for line in child.proc.stderr  # type: ignore
                                                      if "ERROR" in line or "Traceback" in line), daemon=True).start()
        deadline = time.monotonic() + timeout
        depth = None
        while time.monotonic() < deadline and child.proc.poll() is None:
            status = status_of(state["emulator"], namespace)
            if status.get("depth") == expected_depth:
                depth = expected_depth
                break
            time.sleep(0.2)
        time.sleep(seconds if depth is not None else 0)
        child.proc.terminate()
        code, peak = child.wait(60)
    stop.set()
    thread.join(10)
    return {"peak_kib": peak, "peak_anon_kib": child.peak_anon_kib, "exit": code,
            "did": f"status depth {depth}", "ok": depth == expected_depth and not errors,
            "error": "; ".join(errors)[-500:]}


def status_of(emulator: Any, namespace: str) -> dict[str, Any]:
    for (resource, ns, name), obj in list(emulator.objects.items()):
        if resource.plural == PLURAL and ns == namespace and name == QUEUE and not obj.deleted:
            return dict(obj.raw.get("status") or {})
    return {}


# ---- one store, one size --------------------------------------------------------------------------------
def fill(ignis: Ignis, spec: QueueSpec, n: int, payload: bytes, abandoned: int, chunk: int = 2000) -> None:
    ignis.apply(spec)
    queue = ignis.queue(QUEUE)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"{n:,} messages", total=n)
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            queue.publish_many([payload] * count)
            progress.advance(task, count)
        task = progress.add_task(f"{abandoned:,} claims abandoned", total=abandoned)
        claimed = 0
        while claimed < abandoned:
            got = queue.fire_many(min(chunk, abandoned - claimed))
            if not got:
                raise RuntimeError(f"only {claimed:,} of {abandoned:,} messages could be claimed")
            claimed += len(got)
            progress.advance(task, len(got))


def cleanup_aerospike(ignis: Ignis, marker: str) -> None:
    """Truncate every set of this run (their names carry `marker`, the run's farm and client id)."""
    store: Any = ignis.store
    client, ns = store.client, store._ns
    names: set[str] = set()
    for _, answer in client.info_all(f"sets/{ns}").values():
        for item in (answer or "").strip().split(";"):
            fields = dict(kv.split("=", 1) for kv in item.split(":") if "=" in kv)
            if marker in fields.get("set", ""):
                names.add(fields["set"])
    for name in sorted(names):
        try:  # a set of a million records takes the server longer than the client's default timeout
            client.truncate(ns, name, 0, {"total_timeout": 120_000})
        except Exception as exc:
            console.print(f"[yellow]truncate of {ns}.{name}: {type(exc).__name__}: {exc}; the server may finish it "
                          "anyway (`asinfo -v sets` shows)[/]")


def one_size(url: str, n: int, args: argparse.Namespace, marker: str | None) -> dict[str, Any]:
    abandoned = int(n * args.abandoned)
    consume = min(args.consume, n - abandoned)
    spec = QueueSpec.build(name=QUEUE, handlerType=HANDLER, shards=SHARDS, concurrency=4,
                           sweepDurationSeconds=SWEEP_DURATION_SECONDS)
    out: dict[str, Any] = {"size": n, "abandoned": abandoned, "consume": consume, "roles": {}}
    with Ignis(url) as ignis:
        started = time.perf_counter()
        fill(ignis, spec, n, b"x" * args.payload, abandoned)
        out["fill_seconds"] = round(time.perf_counter() - started, 1)
        depth = n - abandoned
        try:
            for role in args.roles:
                console.print(f"  {role} over {n:,} ...")
                if role == "stats":
                    result = run_stats(url, depth)
                elif role == "operator":
                    result = run_operator(url, spec, depth, args.seconds, args.timeout)
                elif role == "consumer":
                    result = run_consumer(url, consume, args.seconds)
                    depth -= consume
                else:
                    result = run_sweeper(url, abandoned, args.passes, args.timeout)
                out["roles"][role] = result
                if not result["ok"]:
                    console.print(f"  [red]{role} over {n:,}: {result['did']}; exit {result['exit']}; "
                                  f"{result['error']}[/]")
        finally:
            if marker is not None:
                cleanup_aerospike(ignis, marker)
    return out


def one_store(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    sizes = []
    for n in args.sizes:
        if kind == "lmdb":
            with tempfile.TemporaryDirectory(prefix="ignis-membench-") as tmp:
                sizes.append(one_size(f"lmdb://{tmp}/store", n, args, None))  # the default durability
        else:
            run = f"mem{uuid.uuid4().hex[:6]}"
            sizes.append(one_size(f"aerospike://{args.server}?farm={run}&client={run}", n, args, run))
    ratios, private = {}, {}
    for role in args.roles:
        for out, key in ((ratios, "peak_kib"), (private, "peak_anon_kib")):
            small, large = sizes[0]["roles"][role][key], sizes[-1]["roles"][role][key]
            out[role] = round(large / small, 3) if small else None
    # lmdb reads through a shared map of the store's file: the pages a process touched count in its RSS (shared,
    # clean or written back, dropped by the kernel under pressure), so there the target is on private memory.
    checked = private if kind == "lmdb" else {r: max(ratios[r] or 0, private[r] or 0) or None for r in ratios}
    return {"store": kind, "sizes": sizes, "ratios": ratios, "private_ratios": private, "checked_ratios": checked}


def table(result: dict[str, Any]) -> Table:
    sizes = result["sizes"]
    t = Table(title=f"{result['store']}: peak RSS, MiB (RssAnon peak, sampled), by backlog", title_justify="left")
    t.add_column("role")
    for s in sizes:
        t.add_column(f"{s['size']:,} messages", justify="right")
    t.add_column(f"{sizes[-1]['size']:,} / {sizes[0]['size']:,}: RSS (private)", justify="right")
    t.add_column("target", justify="right")
    t.add_column("did (largest)")
    what = "private" if result["store"] == "lmdb" else "both"
    for role, ratio in result["ratios"].items():
        cells = [f"{s['roles'][role]['peak_kib'] / 1024:.1f} ({s['roles'][role]['peak_anon_kib'] / 1024:.1f})"
                 for s in sizes]
        checked = result["checked_ratios"][role]
        colour = "green" if checked is not None and checked <= TARGET else "red"
        private = result["private_ratios"][role]
        t.add_row(role, *cells, f"[{colour}]{ratio or 0:.2f}x ({private or 0:.2f}x)[/]", f"{what} ≤ {TARGET}x",
                  sizes[-1]["roles"][role]["did"])
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="Aerospike host:port/namespace (also measured)")
    parser.add_argument("--no-lmdb", action="store_true", help="skip the lmdb store")
    parser.add_argument("--sizes", type=size_list, default=[10_000, 1_000_000],
                        help="backlog sizes, smallest first (the ratio is the last over the first)")
    parser.add_argument("--roles", default=",".join(ROLES), help=f"a subset of {','.join(ROLES)}")
    parser.add_argument("--payload", type=int, default=200, help="bytes per message")
    parser.add_argument("--abandoned", type=float, default=0.2, help="fraction of the backlog claimed, never acked")
    parser.add_argument("--consume", type=int, default=5000, help="messages the consumer acks")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long a role keeps running after its work")
    parser.add_argument("--passes", type=int, default=2, help="sweep passes after every abandoned claim moved")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a role may take")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed or a role failed")
    parser.add_argument("--role", choices=("consumer",), help=argparse.SUPPRESS)
    parser.add_argument("--store-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "consumer":
        consumer_main(args.store_url, args.consume, args.seconds)
        return
    args.roles = [r for r in args.roles.split(",") if r]
    if not args.roles or set(args.roles) - set(ROLES):
        parser.error(f"--roles {','.join(args.roles)!r}: choose among {','.join(ROLES)}")
    if not 0 <= args.abandoned < 1:
        parser.error("--abandoned: a fraction in [0, 1)")
    results = []
    if not args.no_lmdb:
        results.append(one_store("lmdb", args))
    if args.server:
        results.append(one_store("aerospike", args))
    for result in results:
        Console().print(table(result))
    if args.json:
        args.json.write_text(json.dumps({"at": time.time(), "target": TARGET, "results": results}, indent=2))
    missed = [f"{r['store']} {role} {ratio}x" for r in results for role, ratio in r["checked_ratios"].items()
              if ratio is None or ratio > TARGET]
    failed = [f"{r['store']} {role} at {s['size']:,}" for r in results for s in r["sizes"]
              for role, got in s["roles"].items() if not got["ok"]]
    for line in missed + failed:
        console.print(f"[red]missed: {line}[/]")
    if args.check and (missed or failed):
        sys.exit(1)


if __name__ == "__main__":
    main()
