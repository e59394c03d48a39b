"""kopf wiring: the IgnisQueue handlers registered on a registry of their own (so tests and the benchmark
can run several operators side by side), each a thin shell around reconcile.py. Built to serve 10,000
queues on a small API server: an idle operator makes no API call and logs nothing.

kopf watches and dispatches; one handler, `observe`, sees every watch event of every object and does
what the object needs, as a Kubernetes controller does from `metadata` and `status`:

* keeps the catalog (catalog.py) the background passes read;
* a live object without the finalizer `ignismq.io/finalizer`: adds it (kopf applies it as a JSON patch
  with a resourceVersion precondition), and nothing else: no record is written before a deletion is
  sure to come back through the operator;
* a generation not handled yet (`metadata.generation` != `status.observedGeneration`): syncs the record
  and patches status (observedGeneration, Ready, Synced and the first figures, so DEPTH and SIDELINED show
  at Ready). One INFO line and a Normal Event `Created` / `Updated` per change; InvalidSpec -> one
  Warning Event and line per generation, no retries; store down -> Synced=False StoreUnavailable,
  retried with a capped, jittered exponential backoff by the background passes;
* an object being deleted that still has the finalizer: applies its deletionPolicy, one INFO line and a
  Normal Event `Deactivated` / `Deleted` (skipped quietly when the namespace is being deleted), and
  removes the finalizer in the same patch. A store that does not answer: retried in the background, and
  after `finalizer_timeout_seconds` the finalizer is released with a Warning Event and an ERROR line.

`start` / `stop` run the background passes (resync.py) on the operator's event loop: drift repair every
`resync_interval_seconds` over one bulk read of the store, figures refreshed at a bounded rate and written
only when they moved past `figures_change_percent`, retries, and the API server probe.

kopf itself has nothing per object to do (no creation, update, deletion handlers, timers or daemons): no
diff-base or progress annotations, no finalizer of its own, so nothing of kopf ever holds a deletion (and
no timer can: there are none). Per created object the operator makes two API writes (finalizer, status)
and posts one Event.

Kubernetes API calls (what the chart's RBAC grants, tests/deploy/test_rbac.py checks it against the calls
made): list/watch and patch of ignisqueues, patch of ignisqueues/status, create of events; with `scanning`
on, list/watch of customresourcedefinitions (and of namespaces when serving named namespaces).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.errors import InvalidSpecError, StoreError
from ignis.logs import Reachability
from ignis.storage.base import Storage
from ignis_operator.catalog import Catalog, Declared, Guards
from ignis_operator.metrics import DRIFT_REPAIRS, QueueStates, timed
from ignis_operator.reconcile import (
    CONFLICT,
    DEACTIVATED,
    DELETED,
    INVALID_SPEC,
    STORE_UNAVAILABLE,
    SYNCED,
    Owner,
    SyncResult,
    figures_changed,
    figures_status,
    finalize_queue,
    invalid,
    parse_k8s_time,
    queue_figures,
    spec_from_object,
    status_changes,
    status_for,
    sync_queue,
)

GROUP = "ignismq.io"
VERSION = "v1alpha1"
PLURAL = "ignisqueues"
FINALIZER = "ignismq.io/finalizer"  # the operator's own: added by `observe`, removed once deletionPolicy is applied
KOPF_FINALIZER = "ignismq.io/kopf"  # kopf's setting: a finalizer kopf would manage, never needed (no handler of kopf's)
API_CONNECTIONS = 32  # kopf's connections to the API server, watches included
LIST_CHUNK = 500
# kopf runs one worker per object with events (kopf/_core/reactor/queueing.py); unbounded, 10,000 objects applied
# at once meant 10,000 workers each holding its event, a handler coroutine and a queued API request: ~30 KiB
# apiece, 400+ MiB at the peak. At most WORKER_LIMIT work at once; the others' events wait in kopf's per-object
# queues. A worker keeps its slot for kopf's idle_timeout (5 s) after its last event, which caps a burst at
# WORKER_LIMIT / 5 objects a second: 400/s, above what the API server takes in (a shorter idle_timeout made
# kopf start a new worker for most later events of an object, which costs CPU).
WORKER_LIMIT = 2000

log = logging.getLogger(__name__)


class OperatorConfig(BaseSettings):
    """Operator timings (environment prefix IGNIS_OPERATOR_)."""

    model_config = SettingsConfigDict(env_prefix="IGNIS_OPERATOR_", extra="ignore")

    figures_interval_seconds: float = Field(30.0, gt=0, description="a figures pass starts at most this often")
    figures_queues_per_second: float = Field(20.0, gt=0, description="queues whose figures a pass reads per second "
                                             "(the store load of the figures: 10,000 queues take 500 s a pass)")
    figures_change_percent: float = Field(10.0, ge=0, description="a figure is rewritten when it moved by this "
                                          "percentage of its written value (at least 1), or to or from 0")
    status_writes_per_second: float = Field(10.0, gt=0, description="the background passes' status writes, at most")
    resync_interval_seconds: float = Field(60.0, gt=0, description="drift-repair period")
    resync_jitter_seconds: float = Field(10.0, ge=0, description="random extra delay of each resync pass")
    finalizer_timeout_seconds: float = Field(300.0, ge=0,
                                             description="release the finalizer after the store is down this long")
    backoff_seconds: float = Field(2.0, gt=0, description="first retry delay when the store is unreachable")
    backoff_max_seconds: float = Field(120.0, gt=0, description="largest retry delay when the store is unreachable")
    scanning: bool = Field(True, description="let kopf watch CRDs (and, with named namespaces, Namespaces) so "
                           "changes are noticed without a restart; off = no cluster-scoped API calls at all")

    def backoff(self, retry: int) -> float:
        """Exponential, capped and jittered (up to 20% shorter, so retries of many objects spread out): a
        store outage costs a handful of calls per object, not a storm."""
        return float(min(self.backoff_max_seconds, self.backoff_seconds * 2 ** min(retry, 20))
                     * (1 - 0.2 * random.random()))


@dataclass
class OperatorContext:
    """What the handlers share. `kube`: the kubernetes_asyncio Configuration of the operator's own API
    client (the CLI loads it like the sweeper does, ignis.kube.load_configuration; tests point it at the API
    emulator); None = load it at start-up."""

    store: Storage
    config: OperatorConfig = field(default_factory=OperatorConfig)
    states: QueueStates = field(default_factory=QueueStates)
    kube: Any = None
    catalog: Catalog = field(default_factory=Catalog)
    guards: Guards = field(default_factory=Guards)
    store_health: Reachability = field(default_factory=lambda: Reachability("store", log))
    api_health: Reachability = field(default_factory=lambda: Reachability("Kubernetes API", log))
    api: Any = None  # KubeApi, from start-up on
    background: Any = None  # resync.Background, from start-up on (its `passes` count the passes run)
    retries: dict[str, Retry] = field(default_factory=dict)  # by uid: objects waiting for the store
    finalizing: set[str] = field(default_factory=set)  # uids whose deletionPolicy is being applied now
    finalized: set[str] = field(default_factory=set)  # uids whose deletionPolicy is applied (finalizer going)
    released: set[str] = field(default_factory=set)  # uids whose finalizer a background pass removed (until gone)

    def event(self, entry: Declared, type_: str, reason: str, message: str) -> None:
        if self.api is not None:
            self.api.event(entry.ref, type_, reason, message)


RECONCILE = "reconcile"
FINALIZE = "finalize"


@dataclass
class Retry:
    """An object the store could not take, to try again at `due` (event-loop time)."""

    key: tuple[str, str]
    generation: int
    attempt: int
    due: float
    kind: str = RECONCILE  # or FINALIZE: its deletionPolicy
    since: float = 0.0  # FINALIZE: when the first attempt failed (the finalizer timeout counts from there)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: SyncResult
    figures: dict[str, int | None] | None


def _key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}"


def object_logger(entry: Declared) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose lines name the object like kopf's do (`[namespace/name]`, JSON `"object"`). The
    handlers log through it rather than kopf's `logger`: every INFO line of kopf's loggers is kopf's
    bookkeeping and goes to DEBUG (kopflogs.py)."""
    return logging.LoggerAdapter(log, {"k8s_ref": {"namespace": entry.namespace, "name": entry.name}})


def reconcile_object(ctx: OperatorContext, *, name: str, namespace: str | None, uid: str, spec: Mapping[str, Any],
                     meta: Mapping[str, Any], synced_client_id: str | None = None) -> SyncResult:
    """Sync one IgnisQueue object; store errors become a StoreUnavailable result. Metrics recorded.
    `synced_client_id` (status.clientId) guards clientId immutability where the API server has no CEL."""
    owner = Owner(uid, _key(namespace, name), parse_k8s_time(meta.get("creationTimestamp")))
    with timed():
        try:
            qspec = spec_from_object(name, namespace, spec, f"IgnisQueue {_key(namespace, name)}")
            if synced_client_id and qspec.client_id != synced_client_id:
                raise InvalidSpecError([f"clientId={qspec.client_id!r}: clientId is immutable (the queue lives "
                                        f"in clientId {synced_client_id!r}); create a new IgnisQueue instead"])
        except InvalidSpecError as exc:
            result = invalid(name, exc, spec.get("clientId") or namespace)
        else:
            try:
                result = sync_queue(ctx.store, qspec, owner)
            except StoreError as exc:
                result = SyncResult(name, qspec.client_id, False, STORE_UNAVAILABLE, f"store unreachable: {exc}")
    ctx.states.record(_key(namespace, name), result.reason)
    return result


def reconcile_entry(ctx: OperatorContext, entry: Declared, *, figures: bool = True) -> Outcome | None:
    """Sync one catalogued object (blocking: run it in a thread), and measure its figures when it is
    Synced and `figures`. None when its deletion has begun or it is gone (its record is the finalizer's)."""
    with ctx.guards.hold(entry.key):
        current = ctx.catalog.get(entry.key)
        if ctx.guards.deleting(entry.uid) or current is None or current.uid != entry.uid or current.deleting:
            return None  # being deleted, or gone (a pass holds an older snapshot)
        result = reconcile_object(ctx, name=entry.name, namespace=entry.namespace, uid=entry.uid, spec=entry.spec,
                                  meta=entry.meta, synced_client_id=entry.status.get("clientId"))
        if result.reason == SYNCED:
            ctx.guards.asserted(entry.uid)
    measured = None
    if figures and result.reason == SYNCED:
        try:
            measured = queue_figures(ctx.store, spec_from_object(entry.name, entry.namespace, entry.spec))
        except (StoreError, InvalidSpecError) as exc:
            log.debug("figures of %s not measured: %s", _key(entry.namespace, entry.name), exc)
    return Outcome(result, measured)


def settle(ctx: OperatorContext, entry: Declared, outcome: Outcome, *, drift: bool, logger: Any,
           now: float) -> dict[str, Any]:
    """Log, post Events and schedule retries for an outcome; return the status fields that changed (the
    patch to write, {} for none). `drift`: the resync pass found this Ready object out of step with the
    store (a repair, not a user's change). `now`: event-loop time, for retry schedules."""
    result = outcome.result
    previous = entry.ready
    desired = status_for(result, entry.status, entry.generation)
    if result.reason == INVALID_SPEC:
        desired.pop("clientId", None)  # keep the clientId the queue really lives in
    if outcome.figures is not None and figures_changed(entry.status, outcome.figures,
                                                       ctx.config.figures_change_percent):
        desired.update(figures_status(outcome.figures))
    if result.reason == SYNCED:
        ctx.store_health.answered()
        ctx.retries.pop(entry.uid, None)
        if drift and (result.created or result.diff):  # a record deleted or edited behind our back
            DRIFT_REPAIRS.inc()
            logger.warning("drift repaired: %s", result.message)
            ctx.event(entry, "Warning", "DriftRepaired", result.message)
        elif result.created:
            logger.info("%s", result.message)
            ctx.event(entry, "Normal", "Created", result.message)
        elif result.diff:
            logger.info("%s", result.message)
            ctx.event(entry, "Normal", "Updated", result.message)
        elif previous.get("reason") not in (None, SYNCED):
            logger.info("%s (was %s)", result.message, previous["reason"])
        else:
            logger.debug("%s", result.message)  # every resync of every queue: not worth an INFO line
        return status_changes(entry.status, desired)
    if result.reason == STORE_UNAVAILABLE:
        ctx.store_health.failed(result.message)
        logger.debug("%s", result.message)
        if drift:
            return {}  # the next pass comes back by itself; an outage does not rewrite every status
        retry = ctx.retries.get(entry.uid)
        attempt = retry.attempt + 1 if retry is not None and retry.generation == entry.generation else 0
        ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + ctx.config.backoff(attempt))
        return status_changes(entry.status, desired)
    ctx.retries.pop(entry.uid, None)
    if (previous.get("reason"), previous.get("observedGeneration")) != (result.reason, entry.generation):
        logger.warning("%s", result.message)  # one line and one Event per problem, not per resync
        ctx.event(entry, "Warning", result.reason, result.message)
    # CONFLICT: the resync re-checks, and the newer object wins once the older is gone.
    return status_changes(entry.status, desired)


def build_registry(ctx: OperatorContext, *, cluster_login: bool = True) -> kopf.OperatorRegistry:
    """A registry with every IgnisQueue handler bound to `ctx`. `cluster_login`: authenticate like kubectl
    (in-cluster service account, else $KUBECONFIG / ~/.kube/config); tests and the benchmark register
    their own login to the API emulator instead."""
    from ignis_operator import kopflogs
    from ignis_operator.kubeapi import KubeApi
    from ignis_operator.resync import Background

    registry = kopf.OperatorRegistry()  # a bare registry has no login handler of its own
    kopflogs.install(ctx.api_health)  # before kopf runs: its login line is bookkeeping too
    cfg = ctx.config
    resource = (GROUP, VERSION, PLURAL)
    running: dict[str, Any] = {}

    if cluster_login:
        @kopf.on.login(registry=registry, id="login")
        async def login(**kwargs: Any) -> Any:
            info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
            return None if info is None else bounded_session(info)

    @kopf.on.startup(registry=registry, id="start")
    async def start(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, scanning=None if cfg.scanning else False)  # never re-enables what a caller disabled
        if ctx.kube is None:
            from ignis.kube import load_configuration

            ctx.kube = await load_configuration()
        ctx.api = KubeApi(ctx.kube, ctx.api_health)
        await ctx.api.start()
        # The active index of every known client's queue set (new clients get theirs on first create).
        try:
            await asyncio.to_thread(_ensure_indexes, ctx.store)
        except StoreError as exc:  # start anyway: objects report StoreUnavailable and retry with backoff
            ctx.store_health.failed(f"cannot ensure the active indexes at start-up: {exc}")
        ctx.background = Background(ctx)
        running["background"] = asyncio.create_task(ctx.background.run(), name="ignis operator passes")

    @kopf.on.cleanup(registry=registry, id="stop")
    async def stop(**_: Any) -> None:
        task = running.pop("background", None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if ctx.api is not None:
            await ctx.api.close()

    @kopf.on.event(*resource, registry=registry, id="observe")
    async def observe(event: Mapping[str, Any], body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        if event.get("type") == "DELETED":
            meta = body.get("metadata") or {}
            uid = meta.get("uid") or ""
            ctx.catalog.forget((meta.get("namespace") or "", meta.get("name") or ""), uid)
            ctx.guards.gone(uid)
            ctx.retries.pop(uid, None)
            ctx.finalized.discard(uid)
            ctx.released.discard(uid)
            return
        entry = ctx.catalog.observe(body)
        loop = asyncio.get_running_loop()
        if entry.deleting:
            waiting = entry.uid in ctx.finalizing or entry.uid in ctx.retries or entry.uid in ctx.finalized
            if FINALIZER in entry.finalizers and not waiting and await finalize(ctx, entry, now=loop.time()):
                patch.fns.append(remove_finalizer)
            return
        if FINALIZER not in entry.finalizers:
            patch.fns.append(add_finalizer)  # and nothing else in this cycle: the record comes after it
            return
        if not entry.needs_reconcile() or ctx.guards.deleting(entry.uid):
            return
        outcome = await asyncio.to_thread(reconcile_entry, ctx, entry)
        if outcome is None:
            return
        changes = settle(ctx, entry, outcome, drift=False, logger=object_logger(entry), now=loop.time())
        if changes:
            patch.status.update(changes)
            ctx.catalog.wrote(entry, changes)

    return registry


def add_finalizer(body: dict[str, Any]) -> None:
    """A kopf patch function (applied as a JSON patch with a resourceVersion precondition)."""
    finalizers = body.setdefault("metadata", {}).setdefault("finalizers", [])
    if FINALIZER not in finalizers:
        finalizers.append(FINALIZER)


def remove_finalizer(body: dict[str, Any]) -> None:
    meta = body.get("metadata") or {}
    if FINALIZER in (meta.get("finalizers") or []):
        meta["finalizers"] = [f for f in meta["finalizers"] if f != FINALIZER]


async def finalize(ctx: OperatorContext, entry: Declared, *, now: float) -> bool:
    """Apply an object's deletionPolicy (in a thread); True when its finalizer may go: the policy is
    applied, there was nothing to apply, or the store stayed unreachable past `finalizer_timeout_seconds`.
    False: a retry is scheduled (ctx.retries, kind FINALIZE)."""
    ctx.finalizing.add(entry.uid)
    try:
        done = await asyncio.to_thread(_finalize, ctx, entry, now)
    finally:
        ctx.finalizing.discard(entry.uid)
    if done:
        ctx.finalized.add(entry.uid)  # until the object is gone: the policy is never applied twice
    return done


def _finalize(ctx: OperatorContext, entry: Declared, now: float) -> bool:
    cfg = ctx.config
    logger = object_logger(entry)
    ctx.guards.begin_deletion(entry.uid)  # from now on the background passes leave its record alone
    ctx.states.forget(_key(entry.namespace, entry.name))
    previous = ctx.retries.pop(entry.uid, None)
    if entry.ready.get("reason") in (INVALID_SPEC, CONFLICT):
        return True  # this object never owned a record: nothing to undo
    try:
        qspec = spec_from_object(entry.name, entry.namespace, entry.spec)
    except InvalidSpecError:
        return True
    owner = Owner(entry.uid, _key(entry.namespace, entry.name), parse_k8s_time(entry.created))
    try:
        with ctx.guards.hold(entry.key):
            done = finalize_queue(ctx.store, qspec, owner)
    except StoreError as exc:
        ctx.store_health.failed(exc)
        attempt = previous.attempt + 1 if previous is not None and previous.kind == FINALIZE else 0
        since = previous.since if previous is not None and previous.kind == FINALIZE else now
        waited = now - since
        if waited >= cfg.finalizer_timeout_seconds:
            message = (f"store unreachable for {waited:.0f}s ({exc}); finalizer released WITHOUT applying "
                       f"deletionPolicy {qspec.deletion_policy.value}: clean up queue {entry.name!r} by hand")
            logger.error("%s", message)
            ctx.event(entry, "Warning", "FinalizerTimeout", message)
            return True
        delay = min(cfg.backoff(attempt), max(cfg.finalizer_timeout_seconds - waited, 0.1))
        ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + delay, FINALIZE, since)
        logger.debug("deletionPolicy not applied yet (store unreachable): %s", exc)
        return False
    ctx.store_health.answered()
    logger.info("%s", done.message)
    if done.action in (DEACTIVATED, DELETED):
        ctx.event(entry, "Normal", done.action, done.message)
    return True


def bounded_session(info: kopf.ConnectionInfo, limit: int = API_CONNECTIONS) -> Any:
    """kopf's login result with at most `limit` connections to the API server. kopf's own client has no
    limit: every object in handling is a request in flight on a connection of its own (a TLS connection
    holds a 256 KiB buffer), so 10,000 objects created at once meant thousands of connections, hundreds of
    MiB that the allocator then keeps, and as many TLS handshakes for the API server. Requests beyond the
    limit wait for a free connection. Call it on the operator's event loop (an async login handler)."""
    import aiohttp

    session_type = getattr(kopf, "AiohttpSession", None)
    if session_type is None:  # a kopf without custom sessions: its own, unbounded client
        return info
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, ssl=info.as_ssl_context()),
                                    headers=info.as_http_headers(), proxy=info.proxy_url, trust_env=info.trust_env)
    return session_type(aiohttp_session=session, server=info.server, default_namespace=info.default_namespace,
                        priority=info.priority, expiration=info.expiration)


def _ensure_indexes(store: Storage) -> None:
    for client_id in {store.client_id, *store.list_clients()}:
        store.with_client(client_id).ensure_index()


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's change detection (the last handled spec, kept in an annotation) is not used: reconciles follow
    `metadata.generation`, as Kubernetes controllers do. Nothing is stored (an API write less per object)
    and no essence is built (kopf would deep-copy every body of every event for it)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings, *, scanning: bool | None = None) -> None:
    """kopf as the operator uses it: a watch that dispatches every event to `observe`. No diff-base; kopf's
    own finalizer is a name it never adds (the operator manages `ignismq.io/finalizer` itself: kopf would
    remove a finalizer of its name that none of its handlers needs); kopf posts no Events (the operator posts
    its own, kubeapi.py, so none is ever an API error retried at ERROR nine times); lists (at start and
    after a lost watch) come in pages; and no wait on timers or daemons when an object is deleted (there
    are none; were one added, kopf would re-check a stopping one every `cancellation_polling` seconds, 60 by
    default, holding the deletion that long).

    `scanning=False` (kopf's `settings.scanning.disabled`; None leaves it as it is): no list/watch of CRDs
    and Namespaces, so a namespace-scoped install needs no cluster-scoped permission and kopf logs no "not
    enough permissions" warning; CRD changes are then noticed on restart (kopf/_core/reactor/observation.py)."""
    settings.persistence.finalizer = KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.enabled = False
    settings.watching.chunk_size = LIST_CHUNK
    settings.queueing.worker_limit = WORKER_LIMIT
    settings.background.cancellation_polling = 1.0
    settings.background.instant_exit_timeout = 0.5
    if scanning is not None:
        settings.scanning.disabled = not scanning
