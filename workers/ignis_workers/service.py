"""The sweeper service (`ignis sweeper`): leader election, the sweep loop, the shovel loop, metrics and
probes, in one process.

    service = SweeperService(store, SweeperSettings(), clock=None)
    service.run(stop)          # blocks until the threading.Event `stop` is set; releases the lease

Threads: the elector runs in its own asyncio loop; a sweep loop runs `Sweeper.sweep_all` every
`sweep_interval_seconds` on the 64-thread pool; a shovel loop runs each active queue's shovel every
`shovelInterval` (its own seconds, 0 = every second) on a small pool. Both loops do anything only
while this process leads: on winning the lease the service takes a new fencing epoch from the store,
every pointer write carries it, and losing the lease (or a StaleEpoch from the store) stops the work
before its next batch. The probe server answers /metrics, /healthz and /readyz (= the store answers).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.delay import move_due
from ignis.envelope import now_ms
from ignis.errors import IgnisError, InvalidInputError, StaleEpoch, StoreError
from ignis.logs import one_line
from ignis.outage import Backoff
from ignis.probes import ProbeServer
from ignis.queue import Queue
from ignis.spec import QueueSpec
from ignis.storage.base import Storage, client_view
from ignis.version import package_version
from ignis_workers.election import (
    LEASE_NAME,
    KubeLease,
    LeaderElector,
    LeaseBackend,
    StoreLease,
    close_backend,
    default_identity,
)
from ignis_workers.metrics import (
    QUEUE_DEAD,
    QUEUE_DELAYED,
    QUEUE_DEPTH,
    QUEUE_FULL,
    QUEUE_GAUGES,
    QUEUE_IN_FLIGHT,
    QUEUE_OLDEST_AGE,
    QUEUE_OLDEST_IN_FLIGHT,
    QUEUE_SIDELINED,
    QUEUE_SWEEP_DURATION,
    SWEEP_INTERVAL,
    SWEEP_LAST_PASS,
    SWEEP_PASSES,
    SWEEPER_INFO,
    TOPIC_GAUGES,
)
from ignis_workers.shovel import Shovel
from ignis_workers.sweeper import SWEEP_SLOTS_IN_MEMORY, LeadershipLost, Sweeper
from ignis_workers.topics import keep_topics

log = logging.getLogger(__name__)


class SweeperSettings(BaseSettings):
    """Every knob of the sweeper process; environment prefix IGNIS_SWEEPER_ (e.g.
    IGNIS_SWEEPER_SWEEP_INTERVAL_SECONDS=30)."""

    model_config = SettingsConfigDict(env_prefix="IGNIS_SWEEPER_", extra="ignore")

    sweep_interval_seconds: float = Field(60.0, gt=0, description="time between sweep passes")
    threads: int = Field(64, ge=1, le=1024, description="sweep pool size (one task per queue)")
    batch_size: int = Field(1000, ge=1, le=100_000, description="slots read per sweep batch")
    slots_in_memory: int = Field(SWEEP_SLOTS_IN_MEMORY, ge=1, le=10_000_000,
                                 description="slots the sweep's rounds hold at once, all threads together (at least "
                                             "one batch): the sweeper's memory bound; more lets rounds run side by "
                                             "side")
    shovel_tick_seconds: float = Field(1.0, gt=0, description="how often due shovels are looked for")
    shovel_threads: int = Field(16, ge=1, le=256, description="queues shovelled at the same time")
    shovel_budget: int = Field(10_000, ge=1, description="messages one shovel pass of one queue may move")
    delay_tick_seconds: float = Field(0.5, gt=0, description="how often the leader moves due delayed messages")
    refresh_gauges: bool = Field(True, description="refresh depth/in-flight/sideline/dead gauges each pass")
    lease: Literal["store", "kubernetes"] = Field("store", description="lease backend")
    lease_name: str = Field(LEASE_NAME, min_length=1)
    lease_namespace: str | None = Field(None, description="namespace of the Lease (default: the pod's)")
    lease_duration_seconds: float = Field(15.0, gt=0)
    renew_deadline_seconds: float = Field(10.0, gt=0)
    retry_period_seconds: float = Field(2.0, gt=0)
    identity: str | None = Field(None, description="candidate id (default: host-pid-random)")
    probe_host: str = "0.0.0.0"
    probe_port: int = Field(9090, ge=-1, le=65535, description="/metrics, /healthz, /readyz; 0 = any, -1 = off")
    clock_offset_seconds: float = Field(0.0, description="demos/tests: shift the sweeper's clock")
    clock_rate: float = Field(1.0, gt=0, description="demos: run the sweeper's clock this many times faster")


def load_sweeper_settings(**overrides: Any) -> SweeperSettings:
    """Settings from the environment plus overrides; a bad value is an InvalidInputError naming it."""
    try:
        return SweeperSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = [f"IGNIS_SWEEPER_{'_'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}"
                    for e in exc.errors(include_url=False)]
        raise InvalidInputError("invalid sweeper settings: " + "; ".join(problems)) from None


def scaled_clock(offset_seconds: float = 0.0, rate: float = 1.0) -> Callable[[], int]:
    """Epoch ms, shifted and/or sped up from now (identity when offset 0 and rate 1)."""
    if offset_seconds == 0 and rate == 1:
        return now_ms
    start = now_ms()
    return lambda: start + int(offset_seconds * 1000) + int((now_ms() - start) * rate)


def _pod_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip()
    except OSError:
        return "default"


class SweeperService:
    def __init__(self, store: Storage, settings: SweeperSettings | None = None, *,
                 clock: Callable[[], int] | None = None,
                 lease_backend: Callable[[], LeaseBackend] | None = None) -> None:
        self.store = store
        self.settings = s = settings or SweeperSettings()
        self.clock = clock or scaled_clock(s.clock_offset_seconds, s.clock_rate)
        self._lease_backend = lease_backend
        self._epoch: int | None = None
        self.elector: LeaderElector | None = None
        self.passes = 0
        self.sweeper = Sweeper(store, epoch_source=self._current_epoch, clock=self.clock, threads=s.threads,
                               batch_size=s.batch_size, guard=self.leading, slots_in_memory=s.slots_in_memory)
        self.shovel = Shovel(store, epoch_source=self._current_epoch, budget=s.shovel_budget, clock=self.clock,
                             guard=self.leading)
        self._wake = threading.Event()  # set when leadership is won: sweep at once
        self.probes: ProbeServer | None = None  # set while run() serves them
        self.identity = s.identity or default_identity()  # chosen now, so the start-up line can name it
        self._elector_error: Exception | None = None
        self._kube: Any = None  # the kubernetes_asyncio Configuration (lease=kubernetes)

    # ---- leadership ----------------------------------------------------------------------------------
    def leading(self) -> bool:
        return self._epoch is not None and self.elector is not None and self.elector.is_leading()

    def _current_epoch(self) -> int:
        epoch = self._epoch
        if epoch is None:
            raise LeadershipLost("no epoch: this process does not lead")
        return epoch

    def _on_started(self) -> None:
        self._epoch = self.store.next_epoch()
        SWEEP_LAST_PASS.set(time.time())  # a new leader is not "late" before its first pass could end
        log.info("leading with epoch %d", self._epoch, extra={"epoch": self._epoch, "event": "leading",
                                                               "identity": self._identity()})
        self._wake.set()

    def _on_stopped(self) -> None:
        log.info("not leading", extra={"epoch": self._epoch, "event": "stopped", "identity": self._identity()})
        self._epoch = None
        # Only the leader reports queue figures: a standby keeping its last values would be summed with
        # (or mistaken for) the new leader's. A gauge's children are dropped, so the series end.
        for gauge in (*QUEUE_GAUGES, *TOPIC_GAUGES):
            gauge.clear()
        SWEEP_LAST_PASS.set(float("nan"))

    def _identity(self) -> str | None:
        return self.elector.identity if self.elector else None

    def ready(self) -> tuple[bool, str]:
        try:
            self.store.list_clients()
        except Exception as exc:
            return False, f"store {self.store.url} unreachable: {type(exc).__name__}: {exc}"
        role = "leader" if self.leading() else "standby"
        return True, f"ok ({role}, store {self.store.url})"

    # ---- the process ----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Campaign, sweep and shovel until `stop` is set; then release the lease and return."""
        s = self.settings
        if self._lease_backend is None and s.lease == "kubernetes":
            self._kube = self._load_kube_config()  # fail fast, before any thread starts, with a one-line error
        self._announce()
        probes = None
        if s.probe_port >= 0:
            probes = self.probes = ProbeServer(s.probe_host, s.probe_port, ready=self.ready).start()
            log.info("probes on port %d", probes.port, extra={"port": probes.port})
        elector_thread = threading.Thread(target=self._run_elector, args=(stop,), name="ignis-elector")
        elector_thread.start()
        loops = [threading.Thread(target=self._sweep_loop, args=(stop,), name="ignis-sweep-loop"),
                 threading.Thread(target=self._shovel_loop, args=(stop,), name="ignis-shovel-loop"),
                 threading.Thread(target=self._delay_loop, args=(stop,), name="ignis-delay-loop")]
        for t in loops:
            t.start()
        try:
            while not stop.wait(0.5):  # a timed wait lets signal handlers run promptly
                pass
        finally:
            stop.set()
            self._wake.set()
            elector_thread.join()  # releases the lease
            for t in loops:
                t.join()
            self.sweeper.close()
            if probes is not None:
                probes.stop()
            log.info("sweeper stopped", extra={"event": "exit"})
        if self._elector_error is not None:
            raise self._elector_error

    def _lease_where(self) -> str:
        s = self.settings
        if self._lease_backend is not None:
            return "custom"
        if s.lease == "kubernetes":
            return f"kubernetes Lease {s.lease_namespace or _pod_namespace()}/{s.lease_name}"
        return f"store lease {s.lease_name}"

    def _announce(self) -> None:
        """The start-up line: what an SRE needs to know which process this is and what it talks to."""
        s = self.settings
        identity = s.identity or self.identity
        version = package_version()
        SWEEP_INTERVAL.set(s.sweep_interval_seconds)
        SWEEP_LAST_PASS.set(float("nan"))
        SWEEPER_INFO.info({"version": version, "identity": identity, "lease": s.lease})
        log.info("ignis sweeper %s starting: store %s, %s, identity %s, sweep every %gs on %d threads",
                 version, self.store.url, self._lease_where(), identity, s.sweep_interval_seconds, s.threads,
                 extra={"event": "start", "version": version, "store": self.store.url, "lease": self._lease_where(),
                        "identity": identity, "sweep_interval_seconds": s.sweep_interval_seconds,
                        "threads": s.threads})

    def _make_backend(self) -> LeaseBackend:
        if self._lease_backend is not None:
            return self._lease_backend()
        if self.settings.lease == "store":
            return StoreLease(self.store, self.settings.lease_name)
        from kubernetes_asyncio import client

        return KubeLease(client.ApiClient(self._kube), self.settings.lease_namespace or _pod_namespace(),
                         self.settings.lease_name)

    @staticmethod
    def _load_kube_config() -> Any:
        """Like the operator: in-cluster first, then $KUBECONFIG / ~/.kube/config (ignis/kube.py)."""
        from ignis.kube import KubeConfigError, load_configuration

        try:
            return asyncio.run(load_configuration())
        except KubeConfigError as exc:
            raise InvalidInputError(f"lease=kubernetes: {exc}") from None

    def _run_elector(self, stop: threading.Event) -> None:
        s = self.settings

        async def main() -> None:
            astop = asyncio.Event()
            loop = asyncio.get_running_loop()
            threading.Thread(target=lambda: (stop.wait(), loop.call_soon_threadsafe(astop.set)),
                             daemon=True, name="ignis-stop-bridge").start()
            backend = self._make_backend()
            self.elector = LeaderElector(
                backend, s.identity or self.identity, lease_duration=s.lease_duration_seconds,
                renew_deadline=s.renew_deadline_seconds, retry_period=s.retry_period_seconds,
                on_started=self._on_started, on_stopped=self._on_stopped)
            try:
                await self.elector.run(astop)
            finally:
                await close_backend(backend)  # a Kubernetes client's connections: no "Unclosed" ERROR at exit

        try:
            asyncio.run(main())
        except Exception as exc:
            log.exception("elector failed; stopping")
            self._elector_error = exc
            stop.set()

    def _guarded(self, what: str, fn: Callable[[], Any], backoff: Backoff | None = None) -> Any:
        """fn(), or None when it failed. A store failure is said once per outage (ignis.outage) and counted
        by the loop's `backoff`, which sets its next wait; a bug still logs its traceback."""
        backoff = backoff or Backoff()
        try:
            result = fn()
        except StaleEpoch as exc:
            log.warning("stale epoch, stepping down: %s", exc, extra={"event": "stale_epoch"})
            if self.elector is not None:
                self.elector.step_down()
        except LeadershipLost as exc:
            log.info("%s stopped: %s", what, exc)
        except StoreError as exc:
            backoff.failed(what, exc)
        except Exception as exc:
            log.error("%s failed: %s: %s", what, type(exc).__name__, one_line(exc),
                      exc_info=not isinstance(exc, IgnisError))
        else:
            return result
        return None

    def _sweep_loop(self, stop: threading.Event) -> None:
        interval = self.settings.sweep_interval_seconds
        backoff = Backoff(cap=interval)
        wait = interval
        while not stop.is_set():
            self._wake.wait(wait)
            self._wake.clear()
            wait = interval
            if stop.is_set() or not self.leading():
                continue
            epoch = self._epoch
            started = time.time()
            reports = self._guarded("sweep", self.sweeper.sweep_all, backoff)
            ended = time.time()
            if reports is None:
                if backoff.failing:  # the store failed: try again sooner than an interval, backing off
                    wait = min(interval, backoff.delay)
                continue
            if all(r.ok for r in reports):
                backoff.ok()
            self.passes += 1
            SWEEP_PASSES.labels("ok" if all(r.ok for r in reports) else "failed").inc()
            if self.leading():
                SWEEP_LAST_PASS.set(ended)
            log.info("sweep pass: %d queue(s), %d moved", len(reports), sum(r.moved for r in reports),
                     extra={"event": "sweep_pass", "epoch": epoch, "identity": self._identity(),
                            "started": started, "ended": ended, "queues": len(reports),
                            "moved": sum(r.moved for r in reports),
                            "failed": sum(not r.ok for r in reports)})
            if self.settings.refresh_gauges and self.leading():
                self._guarded("gauges", self._refresh_gauges)
            if self.leading():  # topics' byte bounds (and their gauges)
                self._guarded("topics", lambda: keep_topics(self.store, gauges=self.settings.refresh_gauges,
                                                            leading=self.leading))

    def _refresh_gauges(self) -> None:
        for client_id, name in self.sweeper.active_queues():
            try:
                store = client_view(self.store, client_id)
                record = store.get_queue(name)
                if record is None:
                    continue
                queue = Queue(store, QueueSpec.from_bins(name, record.bins, client_id))
                stats = queue.stats()
                in_flight, oldest = queue.in_flight_summary()
                if not self.leading():
                    return  # lost the lease meanwhile: the gauges were cleared and must stay so
                QUEUE_DEPTH.labels(name).set(stats.depth)
                QUEUE_IN_FLIGHT.labels(name).set(in_flight)
                QUEUE_SIDELINED.labels(name).set(stats.sidelined)
                QUEUE_DEAD.labels(name).set(stats.dead)
                # The sweeper's clock: a demo's clock runs ahead, and its sweep judges ages by it too.
                QUEUE_OLDEST_IN_FLIGHT.labels(name).set(max(0.0, (self.clock() - oldest) / 1000) if oldest else 0.0)
                QUEUE_SWEEP_DURATION.labels(name).set(queue.spec.sweep_duration_seconds)
                QUEUE_DELAYED.labels(name).set(stats.delayed)
                # Wall-clock age (Queue.stats): producers stamp messages by theirs, not by the sweeper's clock.
                age = stats.oldest_age_seconds
                QUEUE_OLDEST_AGE.labels(name).set(math.nan if age is None else age)
                # A bounded queue's fill (ignis.bounds), as a ratio of its bound; NaN when unbounded (never alerts).
                QUEUE_FULL.labels(name).set(math.nan if stats.full_percent is None else stats.full_percent / 100)
            except StoreError:
                raise  # the store failed: said once by the caller, not once per queue
            except Exception as exc:
                log.warning("gauges of %s/%s: %s: %s", client_id, name, type(exc).__name__, one_line(exc))

    def _shovel_loop(self, stop: threading.Event) -> None:
        due: dict[tuple[str, str], float] = {}
        busy: set[tuple[str, str]] = set()
        lock = threading.Lock()
        tick = self.settings.shovel_tick_seconds
        backoff = Backoff()
        wait = tick
        with ThreadPoolExecutor(self.settings.shovel_threads, thread_name_prefix="ignis-shovel") as pool:
            while not stop.wait(wait):
                wait = tick
                if not self.leading():
                    due.clear()  # a new leader starts every queue's schedule afresh
                    continue
                queues = self._guarded("shovel scan", self._shovel_queues, backoff)
                if queues is None and backoff.failing:  # the store failed: back off (said once per outage)
                    wait = max(tick, backoff.delay)
                    continue
                backoff.ok()
                for key, interval in (queues or {}).items():
                    now = time.monotonic()
                    with lock:
                        if key in busy or due.get(key, 0) > now:
                            continue
                        busy.add(key)
                    due[key] = now + max(interval, 1)

                    def one(key: tuple[str, str] = key) -> None:
                        try:
                            report = self._guarded("shovel", lambda: self.shovel.shovel_queue(*key))
                            if report is not None and (report.moved or report.dead_lettered):
                                log.info("shovelled %s/%s: %d back, %d dead", key[0], key[1], report.moved,
                                         report.dead_lettered, extra={"event": "shovel", **report.as_dict()})
                        finally:
                            with lock:
                                busy.discard(key)

                    pool.submit(one)

    def _delay_loop(self, stop: threading.Event) -> None:
        """The leader moves every queue's due delayed messages (ignis.delay), for queues no consumer process
        follows (the consumers' own movers share the work through the store's per-queue lease)."""
        backoff = Backoff()
        wait = self.settings.delay_tick_seconds
        while not stop.wait(wait):
            wait = self.settings.delay_tick_seconds
            if not self.leading():
                continue
            moved = self._guarded("move due delayed messages", self._move_due, backoff)
            if moved is None and backoff.failing:
                wait = max(wait, backoff.delay)
                continue
            backoff.ok()

    def _move_due(self) -> int:
        """One look at every active queue's delay record (one batch read per client) and a move where some are
        held. Returns how many messages moved."""
        moved = 0
        for client_id in self.store.list_clients():
            store = client_view(self.store, client_id)
            records = store.list_queues(True)
            states = store.delay_states([r.name for r in records])
            for record, state in zip(records, states, strict=True):
                if state.count and (state.next_due is None or state.next_due <= now_ms()):
                    queue = Queue(store, QueueSpec.from_bins(record.name, record.bins, client_id))
                    moved += move_due(queue.main) or 0
        return moved

    def _shovel_queues(self) -> dict[tuple[str, str], int]:
        """(client, queue) -> shovel interval seconds, for active queues whose shovel is on."""
        out = {}
        for client_id in self.store.list_clients():
            store = client_view(self.store, client_id)
            for record in store.list_queues(True):
                if int(record.bins.get("shovelConcur", 0) or 0) > 0:
                    out[(client_id, record.name)] = int(record.bins.get("shovelInterval", 0) or 0)
        return out
