"""Leader election (DESIGN §5): one async elector state machine over two lease backends.

    elector = LeaderElector(StoreLease(store), identity, on_started=..., on_stopped=...)
    await elector.run(stop_event, work=optional_coroutine_factory)

* `KubeLease` — a `coordination.k8s.io/v1` Lease, compare-and-set on `metadata.resourceVersion`
  (a merge patch carrying it as a precondition; the API server answers 409 Conflict to a stale one).
* `StoreLease` — the lease record of the store's `{farmId}_ignis_system` set
  (`Storage.get_lease/replace_lease`, compare-and-set on its version): the embedded mode.

The state machine is client-go's: a candidate tries every `retry_period` (with jitter) and takes the
lease when it is free (released: no holder) or when its record has not changed for
`lease_duration` of this process's own monotonic time — remote clocks are never compared. The leader
renews every `retry_period`; a renewal that finds another holder or loses the compare-and-set ends the
leadership at once, and failed renewals end it once `renew_deadline` has passed since the last good
one. Losing leadership cancels the guarded work at once: the `work` task is cancelled, `on_stopped`
runs, and `is_leading()` turns False — threads doing guarded work ask it before every write, and it
also turns False by itself when the last renewal is older than `renew_deadline` (a paused process
wakes up knowing it may no longer lead). `leaseTransitions` counts changes of holder. On stop (SIGTERM)
the leader releases the lease (holder cleared) so a standby takes over within one retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ignis.envelope import now_ms
from ignis.kube import describe_error
from ignis.logs import Reachability
from ignis.outage import STORE_HEALTH
from ignis.storage.base import LeaseRecord, Storage
from ignis_workers.metrics import LEADER, LEADER_TRANSITIONS

log = logging.getLogger(__name__)

LEASE_NAME = "ignis-sweeper"
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
# Each wait is retry_period shortened by up to 20%: candidates do not all knock at the same moment, and
# a released lease is still picked up within one retry period (2 s), which SIGTERM hand-over relies on.
JITTER = 0.2


def default_identity() -> str:
    """Unique per process: a restarted pod must not inherit its predecessor's leadership."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaseView:
    """A lease as read from a backend; `version` is the backend's compare-and-set token."""

    holder: str  # "" = released
    acquired_ms: int
    renewed_ms: int
    duration_s: float
    transitions: int
    version: str


class LeaseBackend(Protocol):
    async def read(self) -> LeaseView | None:
        """The lease, or None if it does not exist yet."""
        ...

    async def write(self, lease: LeaseView, expected: LeaseView | None) -> LeaseView | None:
        """Compare-and-set: create when `expected` is None, else replace only if the stored version is
        still `expected.version`. The stored lease, or None if another writer got there first."""
        ...


async def close_backend(backend: LeaseBackend) -> None:
    """Release what a backend holds (a Kubernetes client's connections); a no-op for the others."""
    close = getattr(backend, "close", None)
    if close is not None:
        await close()


class StoreLease:
    """The lease record in the store (embedded mode)."""

    what = "store"
    health = STORE_HEALTH

    def __init__(self, store: Storage, name: str = LEASE_NAME) -> None:
        self.store = store
        self.name = name

    @staticmethod
    def _view(record: LeaseRecord) -> LeaseView:
        return LeaseView(record.holder, record.acquired_ms, record.renewed_ms, record.duration_s,
                         record.transitions, str(record.version))

    async def read(self) -> LeaseView | None:
        record = await asyncio.to_thread(self.store.get_lease, self.name)
        return None if record is None else self._view(record)

    async def write(self, lease: LeaseView, expected: LeaseView | None) -> LeaseView | None:
        record = LeaseRecord(lease.holder, lease.acquired_ms, lease.renewed_ms, lease.duration_s, lease.transitions)
        stored = await asyncio.to_thread(self.store.replace_lease, self.name, record,
                                         0 if expected is None else int(expected.version))
        return None if stored is None else self._view(stored)


def _micro_time(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _ms(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return int(value.timestamp() * 1000)


class KubeLease:
    """A coordination.k8s.io/v1 Lease through kubernetes_asyncio (`api_client` is an ApiClient; `close`
    closes it)."""

    what = "Kubernetes API"

    def __init__(self, api_client: Any, namespace: str, name: str = LEASE_NAME) -> None:
        from kubernetes_asyncio import client

        self._client = client
        self.api = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name

    def _view(self, lease: Any) -> LeaseView:
        spec = lease.spec
        return LeaseView(spec.holder_identity or "", _ms(spec.acquire_time), _ms(spec.renew_time),
                         float(spec.lease_duration_seconds or 0), int(spec.lease_transitions or 0),
                         str(lease.metadata.resource_version or ""))

    async def read(self) -> LeaseView | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return self._view(await self.api.read_namespaced_lease(self.name, self.namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def write(self, lease: LeaseView, expected: LeaseView | None) -> LeaseView | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        c = self._client
        spec = c.V1LeaseSpec(holder_identity=lease.holder,  # "" = released, as client-go writes it
                             lease_duration_seconds=max(1, round(lease.duration_s)),
                             acquire_time=_micro_time(lease.acquired_ms) if lease.acquired_ms else None,
                             renew_time=_micro_time(lease.renewed_ms) if lease.renewed_ms else None,
                             lease_transitions=lease.transitions)
        try:
            if expected is None:
                body = c.V1Lease(api_version="coordination.k8s.io/v1", kind="Lease",
                                 metadata=c.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=spec)
                stored = await self.api.create_namespaced_lease(self.namespace, body)
            else:
                # A merge patch carrying metadata.resourceVersion is a precondition: the API server
                # applies it only if the version is unchanged, else answers 409 Conflict.
                patch = {"metadata": {"resourceVersion": expected.version},
                         "spec": self.api.api_client.sanitize_for_serialization(spec)}
                patch["spec"].setdefault("holderIdentity", lease.holder)
                stored = await self.api.patch_namespaced_lease(self.name, self.namespace, patch,
                                                               _content_type="application/merge-patch+json")
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first (create race or stale resourceVersion)
                return None
            raise
        return self._view(stored)

    async def close(self) -> None:
        await self.api.api_client.close()


class LeaderElector:
    """The elector state machine. `run` is a coroutine; the other methods are thread-safe reads."""

    def __init__(self, backend: LeaseBackend, identity: str | None = None, *,
                 lease_duration: float = LEASE_DURATION, renew_deadline: float = RENEW_DEADLINE,
                 retry_period: float = RETRY_PERIOD, jitter: float = JITTER,
                 on_started: Callable[[], None] | None = None, on_stopped: Callable[[], None] | None = None,
                 wall_clock: Callable[[], int] = now_ms) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError(f"need 0 < retry_period ({retry_period}) < renew_deadline ({renew_deadline}) "
                             f"< lease_duration ({lease_duration})")
        self.backend = backend
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.jitter = jitter
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.wall_clock = wall_clock
        self._leading = False
        self._last_renew = float("-inf")  # monotonic time of the last successful acquire/renew
        self._observed: LeaseView | None = None
        self._observed_at = float("-inf")
        self._mine: LeaseView | None = None  # the lease as we last wrote it
        # one WARNING when the lease backend stops answering, one INFO when it is back
        # (a store lease reports to the process-wide STORE_HEALTH: one WARNING per store outage per process)
        self.reachability = getattr(backend, "health", None) or Reachability(getattr(backend, "what", "lease backend"),
                                                                             log)

    # ---- state -------------------------------------------------------------------------------------
    def is_leading(self) -> bool:
        """True while this process leads and its last renewal is younger than the renew deadline."""
        return self._leading and time.monotonic() - self._last_renew < self.renew_deadline

    @property
    def holder(self) -> str | None:
        return self._observed.holder if self._observed else None

    # ---- one attempt -------------------------------------------------------------------------------
    async def try_acquire_or_renew(self) -> bool:
        """One round: True if this process holds the lease afterwards. Raises on backend errors."""
        current = await self.backend.read()
        now = time.monotonic()
        if current is None:
            wall = self.wall_clock()
            stored = await self.backend.write(
                LeaseView(self.identity, wall, wall, self.lease_duration, 0, ""), None)
            return self._took(stored, now)
        if self._observed is None or current.version != self._observed.version:
            self._note_holder(current)
            self._observed, self._observed_at = current, now
        mine = current.holder == self.identity
        if current.holder and not mine and now - self._observed_at < self.lease_duration:
            return False  # held by a live leader
        wall = self.wall_clock()
        lease = LeaseView(self.identity, current.acquired_ms if mine else wall, wall, self.lease_duration,
                          current.transitions if mine else current.transitions + 1, "")
        return self._took(await self.backend.write(lease, current), now)

    def _note_holder(self, current: LeaseView) -> None:
        """One INFO line when the lease changes hands (as seen by this candidate)."""
        previous = self._observed.holder if self._observed is not None else None
        if current.holder != previous and current.holder != self.identity:
            log.info("lease holder is now %s", current.holder or "nobody (released)",
                     extra={"event": "lease_holder", "identity": self.identity, "holder": current.holder,
                            "transitions": current.transitions})

    def _took(self, stored: LeaseView | None, at: float) -> bool:
        if stored is None:
            return False
        self._observed, self._observed_at, self._mine = stored, at, stored
        self._last_renew = at
        return True

    async def release(self) -> bool:
        """Clear the holder (if it is still us) so a standby takes over at once."""
        mine = self._mine
        if mine is None:
            return False
        current = await self.backend.read()
        if current is None or current.holder != self.identity:
            return False
        freed = LeaseView("", current.acquired_ms, self.wall_clock(), self.lease_duration, current.transitions, "")
        return await self.backend.write(freed, current) is not None

    # ---- the loop ----------------------------------------------------------------------------------
    def _wait_time(self) -> float:
        return self.retry_period * (1 - random.random() * self.jitter)

    async def run(self, stop: asyncio.Event, work: Callable[[], Awaitable[None]] | None = None) -> None:
        """Campaign until `stop` is set; while leading, run `work()` as a task (cancelled on loss)."""
        try:
            while not stop.is_set():
                try:
                    won = await asyncio.wait_for(self.try_acquire_or_renew(), self.renew_deadline)
                except Exception as exc:
                    self.reachability.failed(f"lease acquire failed: {describe_error(exc)}")
                    won = False
                else:
                    self.reachability.answered()
                if won:
                    await self._lead(stop, work)
                    if stop.is_set():
                        break
                await _wait(stop, self._wait_time())
        finally:
            if self._mine is not None:
                with contextlib.suppress(Exception):
                    if await asyncio.wait_for(self.release(), self.retry_period * 2):
                        log.info("released the lease", extra={"identity": self.identity})

    async def _lead(self, stop: asyncio.Event, work: Callable[[], Awaitable[None]] | None) -> None:
        self._leading = True
        LEADER.set(1)
        LEADER_TRANSITIONS.labels("won").inc()
        log.info("became leader", extra={"identity": self.identity})
        task: asyncio.Task[None] | None = None
        try:
            if self.on_started is not None:
                await asyncio.to_thread(self.on_started)
            if work is not None:
                task = asyncio.create_task(work())
            while not stop.is_set():
                await _wait(stop, self._wait_time(), task)
                if stop.is_set() or not self._leading or (task is not None and task.done()):
                    break  # stopping, stepped down (stale epoch), or the guarded work ended
                if not await self._renew():
                    break
        except Exception as exc:
            log.error("leading failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._leading = False
            LEADER.set(0)
            LEADER_TRANSITIONS.labels("lost").inc()
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            log.info("stopped leading", extra={"identity": self.identity})
            if self.on_stopped is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.on_stopped)

    async def _renew(self) -> bool:
        """Renew until it works or the renew deadline passes; False = leadership lost."""
        while True:
            left = self._last_renew + self.renew_deadline - time.monotonic()
            if left <= 0:
                log.warning("lease renewal deadline passed")
                return False
            try:
                renewed = await asyncio.wait_for(self.try_acquire_or_renew(), left)
            except Exception as exc:
                self.reachability.failed(f"lease renewal failed: {describe_error(exc)}")
                await asyncio.sleep(min(self.retry_period / 2, max(left, 0)))
            else:
                self.reachability.answered()
                return renewed

    def step_down(self) -> None:
        """Stop leading now (e.g. after StaleEpoch): is_leading() turns False at once, the guarded work
        is cancelled, and the loop campaigns again (winning again means a new epoch)."""
        self._leading = False


async def _wait(stop: asyncio.Event, seconds: float, task: asyncio.Task[None] | None = None) -> None:
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if task is not None:
        waits.append(task)  # type: ignore[arg-type]
    await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    if not waits[0].done():
        waits[0].cancel()
