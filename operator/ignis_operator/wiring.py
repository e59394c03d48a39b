"""kopf wiring: the IgnisQueue and IgnisTopic handlers registered on a registry of their own (so tests and the benchmark
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

IgnisTopic objects go through the same `observe` (one per resource, each with its catalog: ctx.catalog for
queues, ctx.topics for topics), with the same finalizer; a topic whose deletion waits for subscriptions gets a
Ready=False InUse condition naming them (handlers.py).

Kubernetes API calls (what the chart's RBAC grants, tests/deploy/test_rbac.py checks it against the calls
made): list/watch and patch of ignisqueues and ignistopics, patch of their status, create of events; with
`scanning` on, list/watch of customresourcedefinitions (and of namespaces when serving named namespaces).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from ignis.errors import StoreError
from ignis.storage.base import Storage
from ignis_operator.catalog import Catalog
from ignis_operator.handlers import (
    FINALIZER,
    GROUP,
    PLURAL,
    VERSION,
    OperatorContext,
    finalize,
    in_use_status,
    object_logger,
    reconcile_entry,
    settle,
)
from ignis_operator.topics import TOPIC_PLURAL

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

    def observer(catalog: Catalog) -> Any:
        async def observe(event: Mapping[str, Any], body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
            if event.get("type") == "DELETED":
                meta = body.get("metadata") or {}
                uid = meta.get("uid") or ""
                catalog.forget((meta.get("namespace") or "", meta.get("name") or ""), uid)
                ctx.guards.gone(uid)
                ctx.retries.pop(uid, None)
                ctx.finalized.discard(uid)
                ctx.released.discard(uid)
                ctx.in_use.pop(uid, None)
                return
            entry = catalog.observe(body)
            loop = asyncio.get_running_loop()
            if entry.deleting:
                waiting = entry.uid in ctx.finalizing or entry.uid in ctx.retries or entry.uid in ctx.finalized
                if FINALIZER in entry.finalizers and not waiting:
                    if await finalize(ctx, entry, now=loop.time()):
                        patch.fns.append(remove_finalizer)
                    elif changes := in_use_status(ctx, entry):  # a topic that subscriptions still read
                        patch.status.update(changes)
                        catalog.wrote(entry, changes)
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
                catalog.wrote(entry, changes)

        return observe

    # One handler id for both resources: kopf keys its per-object bookkeeping by object, not by id alone.
    kopf.on.event(*resource, registry=registry, id="observe")(observer(ctx.catalog))
    kopf.on.event(GROUP, VERSION, TOPIC_PLURAL, registry=registry, id="observe")(observer(ctx.topics))

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
