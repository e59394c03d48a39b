#!/usr/bin/env python3
"""The operator at scale: time to Ready, deletion, memory, and what an idle operator costs.

    .venv/bin/python bench/bench_operator.py                      # kmock emulator: 1000 objects, cold start
    .venv/bin/python bench/bench_operator.py --objects 200 --json
    .venv/bin/python bench/bench_operator.py --kubeconfig /path/admin.kubeconfig            # a real API server
    .venv/bin/python bench/bench_operator.py --kubeconfig K --objects 10000 --idle-seconds 600
    .venv/bin/python bench/bench_operator.py --topics 1000                    # topics: 1000 x (1 + 3 subscriptions)
    .venv/bin/python bench/bench_operator.py --kubeconfig K --topics 1000 --namespace-prefix k8s-topics-bench-

Without --kubeconfig (kmock's API emulator, in-process, fresh lmdb stores with durability=fast):
* operator: N IgnisQueue objects already exist in the emulator (over HTTP, as a cluster would serve them)
  when kopf starts; the clock runs from operator start until every object has status Ready=True and its
  queue record is in the store (checked at the end).
* handler: the same N objects through `reconcile_object` directly, one after another.
The best-known queue-operator figure is ~17 objects/s; it is printed next to ours for scale (measured
elsewhere, not in this run). Needs the test extra (kmock): pip install -e '.[test]'.

With --kubeconfig PATH (a real kube-apiserver; the bench needs rights to create the CRD, namespaces and
IgnisQueues: an admin kubeconfig), the operator runs as `ignis operator` in a subprocess, cluster-wide,
on a temporary lmdb store (or --store URL), with the kubeconfig as its KUBECONFIG (or
--operator-kubeconfig: e.g. one of the chart's ServiceAccount, to run it with the chart's rights only):
1. the CRD is applied (crds/), namespaces ignis-bench-00.. are created (and emptied of earlier runs);
2. apply: N IgnisQueues are server-side applied, --concurrency at a time, spread over --namespaces;
3. ready: a watch started before the apply sees every object Ready=True; the figure is the time from
   the end of the apply to the last Ready (target <= 60 s at 10,000);
4. memory: the operator's resident set size, sampled every second (peak; target <= 400 MiB at 10,000);
5. idle: once the create burst is over (30 s without an operator write, at most --settle-seconds: the
   operator posts the Created Events after the status writes, in the background; with --topics, quiet for
   a whole figures pass: a topic's subscription count comes with the pass after its subscriptions),
   --idle-seconds with
   nothing to do: the operator's CPU (target <= 5% of a core), API writes
   (target <= 10 a minute; counted from the API server's apiserver_request_total for ignisqueues and
   events, every write of the window is the operator's), changed objects seen on the watch, and log lines
   (target <= 60 an hour, scaled from the window);
6. delete: every IgnisQueue deleted (--concurrency requests at a time); the figure is the time from the
   first call until the watch has seen every object go (target <= 120 s), and the objects left (stuck)
   after --delete-timeout.
The machine's load (1-minute load average, and the CPU of kube-apiserver and etcd) is printed with each
phase: on a shared machine it explains a slow figure.

With --topics N, the objects are N IgnisTopics with 3 subscriptions each (IgnisQueues with spec.subscribe): 4N
objects. On the emulator the topics row runs beside a row of 4N plain queues (same operator settings, side by
side; target: topics' objects/s at least 0.9 of the queues'), then idle: once the burst's Events are posted, one
drift and one figures pass over every object, then the operator's API writes over 3 more of each (target: 0).
On a real API server the phases are those above, with both CRDs, the topics and subscriptions applied together
in one burst (a subscription may come before its topic: it waits and follows it), and deleted together (a
topic's deletion waits for its subscriptions). The targets are the queues' (Ready <= 60 s, gone <= 120 s, idle
writes, CPU and log lines).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml
from ignis_operator.emulation import declare_resources, kube_configuration, start_operator
from ignis_operator.handlers import (
    GROUP,
    PLURAL,
    VERSION,
    OperatorConfig,
    OperatorContext,
    reconcile_object,
)
from ignis_operator.topics import TOPIC_PLURAL
from ignis_operator.wiring import build_registry
from kmock import KubernetesEmulator, Server
from rich.console import Console
from rich.table import Table

from ignis.storage import Storage, open_store

PEER_OBJECTS_PER_SECOND = 17.0
NAMESPACE = "bench"


class LoglessEmulator(KubernetesEmulator):
    """kmock records every request for test assertions and matches each new request against that whole
    record (O(requests) per request, so O(n^2) for a run). Nothing here asserts on requests, so only the
    request being served is kept: the figure measures the operator, not the emulator's log. The operator's
    writes are counted (`writes`)."""

    writes = 0

    async def _handle(self, request: Any) -> Any:
        del self._requests[:-1]
        agent = request.headers.get("User-Agent", "")
        if str(request.method.value).upper() in ("POST", "PATCH", "PUT", "DELETE") and agent.startswith(("kopf/",
                                                                                                 "ignis-operator/")):
            self.writes += 1
        return await super()._handle(request)


def manifest(i: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
            "metadata": {"name": f"q{i:05d}", "namespace": NAMESPACE, "uid": f"uid-{i}", "resourceVersion": "1",
                         "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"handlerType": "bench.v1", "shards": 8, "concurrency": 2}}


def topic_manifests(i: int) -> list[tuple[str, dict[str, Any]]]:
    """Topic i and its 3 subscriptions, as (plural, body)."""
    meta = {"namespace": NAMESPACE, "resourceVersion": "1", "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z"}
    topic = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisTopic",
             "metadata": {**meta, "name": f"t{i:05d}", "uid": f"uid-t{i}"}, "spec": {"shards": 8}}
    subs = [(PLURAL, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
                      "metadata": {**meta, "name": f"t{i:05d}-s{j}", "uid": f"uid-t{i}-s{j}"},
                      "spec": {"handlerType": "bench.v1", "shards": 8, "concurrency": 2,
                               "subscribe": {"topic": f"t{i:05d}", "filter": f"sensors/{j}/#"}}})
            for j in range(3)]
    return [(TOPIC_PLURAL, topic), *subs]


def ready_count(emulator: KubernetesEmulator, plurals: tuple[str, ...] = (PLURAL,)) -> int:
    count = 0
    for (resource, _, _), obj in list(emulator.objects.items()):
        if resource.plural not in plurals or obj.deleted:
            continue
        conditions = (obj.raw.get("status") or {}).get("conditions") or []
        count += any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return count


def count_records(store: Storage) -> int:
    return len(store.with_client(NAMESPACE).list_queues(active=True))


async def bench_operator(n: int, workdir: Path, timeout: float) -> dict[str, Any]:
    store = open_store(f"lmdb://{workdir}/operator?durability=fast")
    # long pass periods: this measures the create path, not the figures / resync passes
    config = OperatorConfig(figures_interval_seconds=3600, resync_interval_seconds=3600)
    async with LoglessEmulator() as emulator, Server(emulator):
        declare_resources(emulator)
        server = str(emulator.url).rstrip("/")
        registry = build_registry(OperatorContext(store, config, kube=kube_configuration(server)),
                                  cluster_login=False)
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


async def bench_topics_operator(topics: int, workdir: Path, timeout: float, *, plain: bool = False
                                ) -> dict[str, Any]:
    """`topics` IgnisTopics with 3 subscriptions each (or, `plain`, as many plain queues as those objects), all in
    the emulator when kopf starts: the time until every object is Ready (the passes' periods long, as in
    bench_operator: this is the create path). Then idle: once the burst is over (its Events posted, no write for
    `QUIET_SECONDS`), one drift and one figures pass (what they find to write, e.g. a topic's subscription count,
    is written), then the operator's API writes over IDLE_PASSES more of each (target: 0). The passes are run on
    the operator's own event loop, one after another."""
    store = open_store(f"lmdb://{workdir}/{'plain' if plain else 'topics'}?durability=fast")
    config = OperatorConfig(figures_interval_seconds=3600, resync_interval_seconds=3600, resync_jitter_seconds=0,
                            figures_queues_per_second=100_000, status_writes_per_second=1000,
                            backoff_seconds=0.5, backoff_max_seconds=5.0)
    objects = [m for i in range(topics) for m in topic_manifests(i)]
    if plain:
        objects = [(PLURAL, manifest(i)) for i in range(len(objects))]
    ctx = OperatorContext(store, config)
    async with LoglessEmulator() as emulator, Server(emulator):
        declare_resources(emulator)
        server = str(emulator.url).rstrip("/")
        ctx.kube = kube_configuration(server)
        registry = build_registry(ctx, cluster_login=False)
        async with aiohttp.ClientSession(base_url=server) as session:
            for plural, body in objects:
                async with session.post(f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{plural}", json=body) as r:
                    r.raise_for_status()
        plurals = (PLURAL, TOPIC_PLURAL)
        started = time.perf_counter()
        thread, stop, _ready = start_operator(registry, server, [NAMESPACE])
        deadline = started + timeout
        while ready_count(emulator, plurals) < len(objects) and time.perf_counter() < deadline:
            await asyncio.sleep(0.1)
        elapsed = time.perf_counter() - started
        done = ready_count(emulator, plurals)
        # ---- idle: the burst's Events first, then passes on the operator's loop
        settle_started, last, quiet_since = time.perf_counter(), emulator.writes, time.perf_counter()
        while time.perf_counter() - settle_started < 600:
            await asyncio.sleep(0.5)
            backlog = ctx.api._events.qsize() if ctx.api is not None and ctx.api._events is not None else 0
            if emulator.writes != last or backlog:
                last, quiet_since = emulator.writes, time.perf_counter()
            elif time.perf_counter() - quiet_since >= QUIET_SECONDS:
                break
        settled = time.perf_counter() - settle_started
        background = ctx.background

        async def one_pass() -> None:
            for run in (background.drift_pass, background.figures_pass):
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), background.loop))

        await one_pass()  # what the first passes find to write
        writes0, idle0 = emulator.writes, time.perf_counter()
        for _ in range(IDLE_PASSES):
            await one_pass()
        idle = {"settle_seconds": round(settled, 1), "passes": IDLE_PASSES,
                "seconds": round(time.perf_counter() - idle0, 1), "api_writes": emulator.writes - writes0}
        stop.set()
        await asyncio.to_thread(thread.join, 30)
    view = store.with_client(NAMESPACE)
    records = len(view.list_queues(active=True)) + len(view.list_topics())
    store.close()
    what = f"{len(objects)} plain queues" if plain else f"{topics} topics x (1 + 3 subscriptions)"
    return {"row": f"operator: {what}", "objects": len(objects), "ready": done, "records": records,
            "seconds": elapsed, "objects_per_second": done / elapsed if elapsed else 0.0, "idle": idle}


QUIET_SECONDS = 5.0
IDLE_PASSES = 3


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


# ---- a real API server ----------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[1]
BENCH_PREFIX = "ignis-bench-"  # --namespace-prefix
BENCH_NS = BENCH_PREFIX + "{:02d}"
WRITE_VERBS = {"POST", "PATCH", "PUT", "DELETE", "APPLY"}
OPERATOR_RESOURCES = {"ignisqueues", "ignistopics", "events"}


class Cluster:
    """The API server of a kubeconfig, over aiohttp with the kubeconfig's TLS material and credentials."""

    def __init__(self, configuration: Any, limit: int = 64) -> None:
        self.configuration = configuration
        self.limit = limit

    async def __aenter__(self) -> Cluster:
        c = self.configuration
        context = ssl.create_default_context(cafile=c.ssl_ca_cert) if c.ssl_ca_cert else ssl.create_default_context()
        if not c.verify_ssl:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if c.cert_file:
            context.load_cert_chain(c.cert_file, c.key_file)
        headers = {}
        token = c.api_key.get("authorization") or c.api_key.get("BearerToken")
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        self.session = aiohttp.ClientSession(base_url=c.host, headers=headers,
                                             connector=aiohttp.TCPConnector(ssl=context, limit=self.limit))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    async def call(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                   content_type: str = "application/json", ok: tuple[int, ...] = ()) -> Any:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        async with self.session.request(method, path, data=data, params=params,
                                        headers={"Content-Type": content_type}) as resp:
            text = await resp.text()
            if resp.status >= 300 and resp.status not in ok:
                raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
            return json.loads(text) if text and resp.content_type == "application/json" else text

    async def writes(self) -> dict[str, float]:
        """apiserver_request_total of write verbs: for the operator's resources, and for all resources."""
        text = await self.call("GET", "/metrics")
        out = {"operator": 0.0, "all": 0.0}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
            if labels.get("verb") not in WRITE_VERBS:
                continue
            value = float(line.rsplit(" ", 1)[1])
            out["all"] += value
            if labels.get("resource") in OPERATOR_RESOURCES:
                out["operator"] += value
        return out


class Watch:
    """Every IgnisQueue in the cluster, from one list-then-watch: Ready and gone objects, and how many
    times objects changed (MODIFIED events) since `mark()`."""

    def __init__(self, cluster: Cluster, plural: str = PLURAL) -> None:
        self.cluster = cluster
        self.plural = plural
        self.objects: dict[str, dict[str, Any]] = {}  # "ns/name" -> {"ready": bool, "finalizers": [...]}
        self.ready_at: dict[str, float] = {}
        self.modified = 0
        self.events = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _see(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if not str(meta.get("namespace", "")).startswith(BENCH_PREFIX):
            return
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if kind == "DELETED":
            self.objects.pop(key, None)
            return
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (obj.get("status") or {}).get("conditions") or [])
        self.objects[key] = {"ready": ready, "finalizers": meta.get("finalizers") or []}
        if ready and key not in self.ready_at:
            self.ready_at[key] = time.monotonic()
        if kind == "MODIFIED":
            self.modified += 1

    async def _run(self) -> None:
        path = f"/apis/{GROUP}/{VERSION}/{self.plural}"
        version = None
        while True:
            if version is None:
                listed = await self.cluster.call("GET", path)
                self.objects.clear()
                for obj in listed.get("items") or []:
                    self._see("ADDED", obj)
                version = listed["metadata"]["resourceVersion"]
            params = {"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true",
                      "timeoutSeconds": "300"}
            try:
                async with self.cluster.session.get(path, params=params, timeout=aiohttp.ClientTimeout(None)) as r:
                    async for line in r.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            version = None  # 410 Gone: list again
                            break
                        version = (obj.get("metadata") or {}).get("resourceVersion", version)
                        if kind != "BOOKMARK":
                            self.events += 1
                            self._see(kind, obj)
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.5)

    def ready(self) -> int:
        return sum(o["ready"] for o in self.objects.values())


class Watches:
    """Several watches (IgnisQueue and IgnisTopic) read as one."""

    def __init__(self, watches: list[Watch]) -> None:
        self.watches = watches

    def start(self) -> None:
        for w in self.watches:
            w.start()

    async def stop(self) -> None:
        for w in self.watches:
            await w.stop()

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        return {f"{w.plural}/{k}": v for w in self.watches for k, v in w.objects.items()}

    @property
    def ready_at(self) -> dict[str, float]:
        return {f"{w.plural}/{k}": v for w in self.watches for k, v in w.ready_at.items()}

    @property
    def modified(self) -> int:
        return sum(w.modified for w in self.watches)

    def ready(self) -> int:
        return sum(w.ready() for w in self.watches)


class Operator:
    """`ignis operator` in a subprocess: its CPU, resident memory (peak sampled every second) and log."""

    def __init__(self, kubeconfig: str, store_url: str, log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.port = _free_port()
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ignis.cli.app", "--store", store_url, "operator", "--port", str(self.port)],
            env={**os.environ, **env, "KUBECONFIG": kubeconfig}, stdout=self._log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0
        self._sampler: asyncio.Task[None] | None = None

    def start_sampling(self) -> None:
        async def sample() -> None:
            while True:
                self.rss()
                await asyncio.sleep(1.0)

        self._sampler = asyncio.create_task(sample())

    def rss(self) -> int:
        rss = self.ps.memory_info().rss
        self.peak_rss = max(self.peak_rss, rss)
        return int(rss)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError("the operator exited:\n" + "\n".join(self.lines()[-30:]))
                try:
                    async with session.get(f"http://127.0.0.1:{self.port}/healthz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the operator did not come up")
                await asyncio.sleep(0.2)

    async def stop(self) -> int:
        if self._sampler is not None:
            self._sampler.cancel()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def machine_load() -> dict[str, Any]:
    """1-minute load average and the CPU seconds so far of the control plane's processes."""
    cpu = {}
    for proc in psutil.process_iter(["name"]):
        if proc.info["name"] in ("kube-apiserver", "etcd"):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                cpu[proc.info["name"]] = t.user + t.system
    return {"load1": os.getloadavg()[0], "cpu": cpu}


def load_delta(before: dict[str, Any], after: dict[str, Any], seconds: float) -> dict[str, Any]:
    return {"load1": round(after["load1"], 2),
            **{f"{k}_core_percent": round((after["cpu"].get(k, 0) - v) / seconds * 100, 1)
               for k, v in before["cpu"].items()}}


def cr_manifest(i: int, namespaces: int, topics: bool = False) -> tuple[str, str, dict[str, Any]]:
    """Object i of a run: a queue; with `topics`, of every 4 one topic and its 3 subscriptions (same namespace)."""
    if topics:
        t, j = divmod(i, 4)
        namespace, topic = BENCH_NS.format(t % namespaces), f"t{t:05d}"
        if j == 0:
            return namespace, topic, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisTopic",
                                      "metadata": {"name": topic, "namespace": namespace}, "spec": {"shards": 8}}
        name = f"{topic}-s{j}"
        return namespace, name, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
                                 "metadata": {"name": name, "namespace": namespace},
                                 "spec": {"handlerType": "bench.v1", "shards": 8, "concurrency": 2,
                                          "subscribe": {"topic": topic, "filter": f"sensors/{j}/#"}}}
    namespace, name = BENCH_NS.format(i % namespaces), f"q{i:05d}"
    return namespace, name, {"apiVersion": f"{GROUP}/{VERSION}", "kind": "IgnisQueue",
                             "metadata": {"name": name, "namespace": namespace},
                             "spec": {"handlerType": "bench.v1", "shards": 8, "concurrency": 2}}


def plural_of(body: dict[str, Any]) -> str:
    return TOPIC_PLURAL if body["kind"] == "IgnisTopic" else PLURAL


async def prepare(cluster: Cluster, namespaces: int) -> None:
    """The CRDs (created or replaced from crds/), the namespaces, and no object left from a run before."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for source in ("ignisqueues.ignismq.io.yaml", "ignistopics.ignismq.io.yaml"):
        crd = yaml.safe_load((REPO / "crds" / source).read_text())
        await cluster.call("PATCH", f"{path}/{crd['metadata']['name']}", body=crd,
                           params={"fieldManager": "ignis-bench", "force": "true"},
                           content_type="application/apply-patch+yaml")
        deadline = time.monotonic() + 60
        while True:
            got = await cluster.call("GET", f"{path}/{crd['metadata']['name']}")
            conditions = got.get("status", {}).get("conditions", [])
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the CRD never became Established")
            await asyncio.sleep(0.2)
    for n in range(namespaces):
        await cluster.call("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": BENCH_NS.format(n)}}, ok=(409,))
    existing = (await cluster.call("GET", "/api/v1/namespaces")).get("items") or []
    for namespace in sorted(ns["metadata"]["name"] for ns in existing):
        if not namespace.startswith(BENCH_PREFIX):
            continue  # earlier runs may have used more namespaces: every one of them is emptied
        for plural in (PLURAL, TOPIC_PLURAL):
            base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}"
            left = (await cluster.call("GET", base)).get("items") or []
            for obj in left:  # an earlier run's objects: no operator is running, so take the finalizer off
                await cluster.call("PATCH", f"{base}/{obj['metadata']['name']}",
                                   body={"metadata": {"finalizers": None}},
                                   content_type="application/merge-patch+json", ok=(404,))
            if left:
                await cluster.call("DELETE", base)


async def apply_all(cluster: Cluster, n: int, namespaces: int, concurrency: int, topics: bool = False) -> None:
    """Server-side apply of N objects (what `kubectl apply --server-side` sends), `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        namespace, name, body = cr_manifest(i, namespaces, topics)
        async with gate:
            await cluster.call("PATCH", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural_of(body)}/{name}",
                               body=body, params={"fieldManager": "ignis-bench", "force": "true"},
                               content_type="application/apply-patch+yaml")

    await asyncio.gather(*(one(i) for i in range(n)))


async def delete_all(cluster: Cluster, n: int, namespaces: int, concurrency: int, topics: bool = False) -> None:
    """Every object deleted, `concurrency` requests at a time (what `kubectl delete iq --all` sends; one
    deletecollection of 1,000 finalized objects outlives the API server's 60 s request timeout)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        namespace, name, body = cr_manifest(i, namespaces, topics)
        async with gate:
            await cluster.call("DELETE", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural_of(body)}/{name}",
                               ok=(404,))

    await asyncio.gather(*(one(i) for i in range(n)))


async def settle(cluster: Cluster, limit: float, quiet: float = 30.0) -> float:
    """Wait until the create burst is over: its Events posted (the operator posts them after the status
    writes, in the background) and no write to the operator's resources for `quiet` seconds; at most
    `limit` seconds. Returns the seconds waited."""
    started = time.monotonic()
    last, quiet_since = (await cluster.writes())["operator"], time.monotonic()
    while time.monotonic() - started < limit:
        await asyncio.sleep(5)
        now = (await cluster.writes())["operator"]
        if now != last:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet:
            break
    return time.monotonic() - started


async def until(check: Any, timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


async def bench_cluster(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration,
                                  persist_config=False)
    topics = bool(args.topics)
    n = args.topics * 4 if topics else args.objects
    result = {"objects": n, "namespaces": args.namespaces, "topics": args.topics or 0,
              "operator_kubeconfig": args.operator_kubeconfig or args.kubeconfig}
    store_url = args.store or f"lmdb://{workdir}/store?durability=fast"
    async with Cluster(configuration, limit=max(8, args.concurrency)) as cluster:
        await prepare(cluster, args.namespaces)
        watch = Watches([Watch(cluster)] + ([Watch(cluster, TOPIC_PLURAL)] if topics else []))
        watch.start()
        operator = Operator(args.operator_kubeconfig or args.kubeconfig, store_url,
                            Path(args.operator_log or workdir / "operator.log"), env={})
        try:
            await operator.wait_ready()
            operator.start_sampling()
            await asyncio.sleep(3)  # kopf lists and starts watching
            # ---- apply -> Ready
            load0, started, cpu0 = machine_load(), time.monotonic(), operator.cpu()
            await apply_all(cluster, n, args.namespaces, args.concurrency, topics)
            applied = time.monotonic()
            await until(lambda: len(watch.objects) >= n and watch.ready() >= n, args.timeout)
            last_ready = max(watch.ready_at.values()) if watch.ready_at else float("nan")
            result["apply"] = {"seconds": round(applied - started, 1), "ready": watch.ready(),
                               "ready_after_apply_seconds": round(last_ready - applied, 1),
                               "ready_after_apply_start_seconds": round(last_ready - started, 1),
                               "operator_cpu_seconds": round(operator.cpu() - cpu0, 1),
                               "load": load_delta(load0, machine_load(), time.monotonic() - started)}
            result["memory"] = {"rss_mib_after_ready": round(operator.rss() / 2**20, 1)}
            # ---- idle
            # With topics, a topic is often Ready before its subscriptions exist: its `subscriptions` figure is
            # written by the next figures pass, which takes objects / 20 s (IGNIS_OPERATOR_FIGURES_QUEUES_PER_SECOND)
            # plus its 30 s interval. Quiet must outlast a whole pass, or the idle window counts those first writes.
            quiet = args.quiet_seconds or (n / 20 + 30 if topics else 30.0)
            result["settle_seconds"] = round(await settle(cluster, args.settle_seconds, quiet), 1)
            result["settle_quiet_seconds"] = quiet
            lines0, cpu0, writes0, modified0 = len(operator.lines()), operator.cpu(), await cluster.writes(), \
                watch.modified
            load0, t0 = machine_load(), time.monotonic()
            await asyncio.sleep(args.idle_seconds)
            seconds = time.monotonic() - t0
            writes1 = await cluster.writes()
            idle_lines = operator.lines()[lines0:]
            result["idle"] = {
                "seconds": round(seconds, 1),
                "cpu_core_percent": round((operator.cpu() - cpu0) / seconds * 100, 2),
                "api_writes_per_minute": round((writes1["operator"] - writes0["operator"]) / seconds * 60, 2),
                "all_api_writes_per_minute": round((writes1["all"] - writes0["all"]) / seconds * 60, 2),
                "objects_changed": watch.modified - modified0,
                "log_lines": len(idle_lines),
                "log_lines_per_hour": round(len(idle_lines) / seconds * 3600, 1),
                "log_sample": idle_lines[:5],
                "load": load_delta(load0, machine_load(), seconds)}
            result["memory"]["rss_mib_idle_end"] = round(operator.rss() / 2**20, 1)
            # ---- delete
            load0, started, cpu0 = machine_load(), time.monotonic(), operator.cpu()
            await delete_all(cluster, n, args.namespaces, args.concurrency, topics)
            called = time.monotonic()
            await until(lambda: not watch.objects, args.delete_timeout - (called - started))
            gone = time.monotonic()
            stuck = sorted(watch.objects)
            result["delete"] = {"call_seconds": round(called - started, 1),
                                "gone_seconds": round(gone - started, 1) if not stuck else None,
                                "stuck": len(stuck), "stuck_sample": stuck[:5],
                                "operator_cpu_seconds": round(operator.cpu() - cpu0, 1),
                                "load": load_delta(load0, machine_load(), gone - started)}
        finally:
            await watch.stop()
            code = await operator.stop()
            result["memory"] = {**result.get("memory", {}), "rss_mib_peak": round(operator.peak_rss / 2**20, 1)}
            lines = operator.lines()
            result["operator"] = {"exit_code": code, "log_lines": len(lines),
                                  "error_lines": [line for line in lines if " ERROR " in line][:10]}
    return result


TARGETS = [  # (what, (section, key), limit)
    ("Ready after the apply returns (s)", ("apply", "ready_after_apply_seconds"), 60.0),
    ("every object gone after the delete began (s)", ("delete", "gone_seconds"), 120.0),
    ("operator peak resident memory (MiB)", ("memory", "rss_mib_peak"), 400.0),
    ("idle operator CPU (% of a core)", ("idle", "cpu_core_percent"), 5.0),
    ("idle API writes a minute", ("idle", "api_writes_per_minute"), 10.0),
    ("idle log lines an hour", ("idle", "log_lines_per_hour"), 60.0),
]


def report_cluster(result: dict[str, Any], as_json: bool) -> bool:
    checks = []
    for what, (section, key), limit in TARGETS:
        value = (result.get(section) or {}).get(key)
        checks.append({"what": what, "value": value, "target": limit,
                       "met": value is not None and value == value and value <= limit})
    result["targets"] = checks
    ok = all(c["met"] for c in checks) and result["delete"]["stuck"] == 0 and result["apply"]["ready"] == \
        result["objects"] and result["operator"]["exit_code"] == 0
    result["verified"] = ok
    if as_json:
        print(json.dumps(result, indent=2))
        return ok
    console = Console()
    what = (f"{result['topics']} IgnisTopics x (1 + 3 subscriptions) = {result['objects']} objects"
            if result.get("topics") else f"{result['objects']} IgnisQueues")
    table = Table(title=f"operator on a real API server: {what} in {result['namespaces']} namespaces")
    for column in ("figure", "value", "target", "met"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    for c in checks:
        table.add_row(c["what"], "-" if c["value"] is None else f"{c['value']}", f"<= {c['target']:g}",
                      "yes" if c["met"] else "NO")
    console.print(table)
    for section in ("apply", "idle", "delete", "memory", "operator"):
        console.print(f"{section}: {json.dumps(result.get(section), default=str)}")
    console.print(f"verified: {ok}")
    return ok


def main() -> int:
    global BENCH_PREFIX, BENCH_NS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=None, help="IgnisQueues (1000 on the emulator, 10000 on "
                        "a real API server)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up waiting for Ready after this")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kubeconfig", help="measure on the API server of this kubeconfig (admin rights)")
    parser.add_argument("--namespaces", type=int, default=10, help="real server: namespaces the objects spread over")
    parser.add_argument("--concurrency", type=int, default=32, help="real server: apply requests at a time")
    parser.add_argument("--settle-seconds", type=float, default=900.0,
                        help="real server: after Ready, wait at most this long for 30 s without operator writes "
                        "(the create burst's Events) before the idle window")
    parser.add_argument("--idle-seconds", type=float, default=600.0, help="real server: the idle window")
    parser.add_argument("--quiet-seconds", type=float, default=None,
                        help="real server: seconds without an operator write that end the settle (default 30; with "
                        "--topics, one figures pass: objects / 20 + 30)")
    parser.add_argument("--delete-timeout", type=float, default=300.0, help="real server: give up on deletion")
    parser.add_argument("--store", help="real server: the operator's store URL (default: a temporary lmdb)")
    parser.add_argument("--operator-log", help="real server: keep the operator's log in this file")
    parser.add_argument("--topics", type=int, default=0, help="N IgnisTopics with 3 subscriptions each (4N objects) "
                        "instead of plain queues")
    parser.add_argument("--namespace-prefix", default=BENCH_PREFIX,
                        help="real server: the bench's namespaces are PREFIX00, PREFIX01, ...")
    parser.add_argument("--operator-kubeconfig",
                        help="real server: the operator's own kubeconfig, e.g. the chart's ServiceAccount's, so it "
                             "runs with those rights only (default: --kubeconfig)")
    args = parser.parse_args()
    logging.basicConfig(level=getattr(logging, os.environ.get("BENCH_LOG", "ERROR")),
                        format="%(relativeCreated)d %(name)s %(message)s")
    BENCH_PREFIX, BENCH_NS = args.namespace_prefix, args.namespace_prefix + "{:02d}"
    if args.kubeconfig:
        for option, path in (("--kubeconfig", args.kubeconfig), ("--operator-kubeconfig", args.operator_kubeconfig)):
            if path and not Path(path).is_file():
                parser.error(f"{option} {path}: no such file")
        args.objects = args.objects or 10_000
        with tempfile.TemporaryDirectory(prefix="ignis-bench-operator-") as tmp:
            result = asyncio.run(bench_cluster(args, Path(tmp)))
        return 0 if report_cluster(result, args.json) else 1
    if args.topics:
        return bench_topics_main(args)
    args.objects = args.objects or 1000
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


TOPIC_OBJECTS_PER_SECOND_SHARE = 0.9  # topics' objects/s to Ready, at least this share of plain queues' (side by side)


def bench_topics_main(args: argparse.Namespace) -> int:
    """--topics on the emulator: topics with their subscriptions beside as many plain queues, and idle writes."""
    with tempfile.TemporaryDirectory(prefix="ignis-bench-operator-") as tmp:
        plain = asyncio.run(bench_topics_operator(args.topics, Path(tmp), args.timeout, plain=True))
        topics = asyncio.run(bench_topics_operator(args.topics, Path(tmp), args.timeout))
    rows = [plain, topics]
    ratio = topics["objects_per_second"] / plain["objects_per_second"] if plain["objects_per_second"] else 0.0
    ok = all(r["ready"] == r["records"] == r["objects"] and r["idle"]["api_writes"] == 0 for r in rows) and \
        ratio >= TOPIC_OBJECTS_PER_SECOND_SHARE
    summary = {"rows": rows, "topics_vs_plain": ratio, "verified": ok}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0 if ok else 1
    table = Table(title=f"cold start to Ready on the emulator: {args.topics} topics with 3 subscriptions each, "
                        f"beside {plain['objects']} plain queues")
    for column in ("row", "ready", "records", "seconds", "objects/s", "idle: 3 passes (s)", "idle API writes"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for r in rows:
        table.add_row(r["row"], str(r["ready"]), str(r["records"]), f"{r['seconds']:.2f}",
                      f"{r['objects_per_second']:.1f}", f"{r['idle']['seconds']:.1f}", str(r["idle"]["api_writes"]))
    console = Console()
    console.print(table)
    console.print(f"topics / plain queues (objects/s): {ratio:.2f} (target >= {TOPIC_OBJECTS_PER_SECOND_SHARE})   "
                  f"verified: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
