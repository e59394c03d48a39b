"""kopf wiring: the IgnisQueue handlers registered on a registry of their own (so tests and the benchmark
can run several operators side by side), each a thin shell around reconcile.py.

* create / update / resume -> sync the record, patch status (observedGeneration, Ready, Synced), one
  INFO line per reconcile, a Normal Event `Created` / `Updated` when the record was created / changed;
  InvalidSpec -> Warning Event + kopf.PermanentError (no retry storm); store down -> Synced=False
  StoreUnavailable + kopf.TemporaryError with a bounded exponential delay.
* delete (kopf adds the finalizer) -> deletionPolicy and a Normal Event `Deactivated` / `Deleted`; a store
  unreachable for longer than `finalizer_timeout_seconds` releases the finalizer with a Warning Event and
  an error log.
* timer `figures` (30 s) -> status depth / inFlight / sidelined / dead.
* timer `resync` (60 s + per-object jitter) -> drift repair: re-apply, log and report any diff
  (`DriftRepaired` Warning Event, `ignis_operator_drift_repairs_total`); a resync that finds the record in
  sync logs at DEBUG only.

Kubernetes API calls (what the chart's RBAC grants, tests/deploy/test_rbac.py checks it against the calls
kopf makes): list/watch and patch of ignisqueues, patch of ignisqueues/status, create of events; with
`scanning` on, list/watch of customresourcedefinitions (and of namespaces when serving named namespaces).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.errors import InvalidSpecError, StoreError
from ignis.storage.base import Storage
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
    finalize_queue,
    invalid,
    now_rfc3339,
    parse_k8s_time,
    queue_figures,
    spec_from_object,
    status_for,
    sync_queue,
)

GROUP = "ignismq.io"
VERSION = "v1alpha1"
PLURAL = "ignisqueues"
FINALIZER = "ignismq.io/finalizer"

log = logging.getLogger(__name__)


class OperatorConfig(BaseSettings):
    """Operator timings (environment prefix IGNIS_OPERATOR_)."""

    model_config = SettingsConfigDict(env_prefix="IGNIS_OPERATOR_", extra="ignore")

    figures_interval_seconds: float = Field(30.0, gt=0, description="status figures refresh period")
    resync_interval_seconds: float = Field(60.0, gt=0, description="drift-repair period")
    resync_jitter_seconds: float = Field(10.0, ge=0, description="random extra first delay of the resync timer")
    finalizer_timeout_seconds: float = Field(300.0, ge=0,
                                             description="release the finalizer after the store is down this long")
    backoff_seconds: float = Field(2.0, gt=0, description="first retry delay when the store is unreachable")
    backoff_max_seconds: float = Field(120.0, gt=0, description="largest retry delay when the store is unreachable")
    scanning: bool = Field(True, description="let kopf watch CRDs (and, with named namespaces, Namespaces) so "
                           "changes are noticed without a restart; off = no cluster-scoped API calls at all")

    def backoff(self, retry: int) -> float:
        """Exponential, bounded: a store outage costs a handful of calls per object, not a storm."""
        return float(min(self.backoff_max_seconds, self.backoff_seconds * 2 ** min(retry, 20)))


@dataclass
class OperatorContext:
    store: Storage
    config: OperatorConfig = field(default_factory=OperatorConfig)
    states: QueueStates = field(default_factory=QueueStates)


def _key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}"


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


def build_registry(ctx: OperatorContext, *, cluster_login: bool = True) -> kopf.OperatorRegistry:
    """A registry with every IgnisQueue handler bound to `ctx`. `cluster_login`: authenticate like kubectl
    (in-cluster service account, else $KUBECONFIG / ~/.kube/config); tests and the benchmark register
    their own login to the API emulator instead."""
    registry = kopf.OperatorRegistry()  # a bare registry has no login handler of its own
    cfg = ctx.config
    resource = (GROUP, VERSION, PLURAL)

    if cluster_login:
        @kopf.on.login(registry=registry)
        def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
            return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, scanning=None if cfg.scanning else False)  # never re-enables what a caller disabled
        # The active index of every known client's queue set (new clients get theirs on first create).
        try:
            for client_id in {ctx.store.client_id, *ctx.store.list_clients()}:
                ctx.store.with_client(client_id).ensure_index()
        except StoreError as exc:  # start anyway: objects report StoreUnavailable and retry with backoff
            log.warning("cannot ensure the active indexes at start-up: %s", exc)

    def apply(body: kopf.Body, spec: Any, name: str, namespace: str | None, uid: str, meta: Any, status: Any,
              patch: kopf.Patch, retry: int, logger: Any, drift_check: bool = False) -> None:
        result = reconcile_object(ctx, name=name, namespace=namespace, uid=uid, spec=spec, meta=meta,
                                  synced_client_id=(status or {}).get("clientId"))
        status_patch = status_for(result, status, meta.get("generation"))
        if result.reason == INVALID_SPEC:
            status_patch.pop("clientId", None)  # keep the clientId the queue really lives in
        patch.status.update(status_patch)
        if result.reason == SYNCED:
            if drift_check and (result.created or result.diff):  # a record deleted or edited behind our back
                DRIFT_REPAIRS.inc()
                logger.warning("drift repaired: %s", result.message)
                kopf.warn(body, reason="DriftRepaired", message=result.message)
            elif result.created:
                logger.info("%s", result.message)
                kopf.event(body, type="Normal", reason="Created", message=result.message)
            elif result.diff:
                logger.info("%s", result.message)
                kopf.event(body, type="Normal", reason="Updated", message=result.message)
            elif drift_check:
                logger.debug("%s", result.message)  # every resync of every queue: not worth an INFO line
            else:
                logger.info("%s", result.message)
            return
        if result.reason == STORE_UNAVAILABLE:
            logger.warning("%s", result.message)
            if drift_check:
                return  # the timer comes back by itself
            raise kopf.TemporaryError(result.message, delay=cfg.backoff(retry))
        previous = next((c for c in (status or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
        if not drift_check or previous.get("reason") != result.reason:  # one event per problem, not per resync
            kopf.warn(body, reason=result.reason, message=result.message)
        if result.reason == INVALID_SPEC and not drift_check:
            raise kopf.PermanentError(result.message)  # a user must edit the object: retrying changes nothing
        # CONFLICT: no error; the resync timer re-checks, and the newer object wins once the older is gone.

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, registry=registry, field="spec")
    def on_spec(body: kopf.Body, spec: Any, name: str, namespace: str | None, uid: str, meta: Any, status: Any,
                patch: kopf.Patch, retry: int, logger: Any, **_: Any) -> None:
        apply(body, spec, name, namespace, uid, meta, status, patch, retry, logger)

    @kopf.timer(*resource, registry=registry, interval=cfg.resync_interval_seconds,
                initial_delay=lambda **_: cfg.resync_interval_seconds + random.uniform(0, cfg.resync_jitter_seconds))
    def resync(body: kopf.Body, spec: Any, name: str, namespace: str | None, uid: str, meta: Any, status: Any,
               patch: kopf.Patch, logger: Any, **_: Any) -> None:
        apply(body, spec, name, namespace, uid, meta, status, patch, 0, logger, drift_check=True)

    @kopf.timer(*resource, registry=registry, interval=cfg.figures_interval_seconds)
    def figures(spec: Any, name: str, namespace: str | None, status: Any, patch: kopf.Patch, logger: Any,
                **_: Any) -> None:
        ready = next((c for c in (status or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
        if not ready or ready.get("status") != "True":
            return  # no record of ours to measure (invalid, conflict, not yet synced)
        try:
            qspec = spec_from_object(name, namespace, spec)
            patch.status.update({**queue_figures(ctx.store, qspec), "figuresTime": now_rfc3339()})
        except (StoreError, InvalidSpecError) as exc:
            logger.debug("figures not refreshed: %s", exc)

    @kopf.on.delete(*resource, registry=registry)
    def on_delete(body: kopf.Body, spec: Any, name: str, namespace: str | None, uid: str, meta: Any,
                  status: Any, retry: int, runtime: Any, logger: Any, **_: Any) -> None:
        ctx.states.forget(_key(namespace, name))
        conditions = (status or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("reason") in (INVALID_SPEC, CONFLICT) for c in conditions):
            return  # this object never owned a record: nothing to undo
        try:
            qspec = spec_from_object(name, namespace, spec)
        except InvalidSpecError:
            return
        owner = Owner(uid, _key(namespace, name), parse_k8s_time(meta.get("creationTimestamp")))
        try:
            done = finalize_queue(ctx.store, qspec, owner)
        except StoreError as exc:
            waited = runtime.total_seconds()
            if waited >= cfg.finalizer_timeout_seconds:
                message = (f"store unreachable for {waited:.0f}s ({exc}); finalizer released WITHOUT applying "
                           f"deletionPolicy {qspec.deletion_policy.value}: clean up queue {name!r} by hand")
                logger.error("%s", message)
                kopf.warn(body, reason="FinalizerTimeout", message=message)
                return
            raise kopf.TemporaryError(f"store unreachable: {exc}", delay=min(
                cfg.backoff(retry), max(cfg.finalizer_timeout_seconds - waited, 0.1))) from None
        logger.info("%s", done.message)
        if done.action in (DEACTIVATED, DELETED):
            kopf.event(body, type="Normal", reason=done.action, message=done.message)

    return registry


def configure(settings: kopf.OperatorSettings, *, scanning: bool | None = None) -> None:
    """Our own finalizer name; handler progress kept in annotations (the structural schema of the status
    would prune kopf's own status fields); only warnings and errors become Events through logging (kopf
    would otherwise post an Event per handler log line, an API call each; our Normal Events are explicit
    `kopf.event` calls, which `posting.level` does not filter).

    `scanning=False` (kopf's `settings.scanning.disabled`; None leaves it as it is): no list/watch of CRDs
    and Namespaces, so a namespace-scoped install needs no cluster-scoped permission and kopf logs no "not
    enough permissions" warning; CRD changes are then noticed on restart (kopf/_core/reactor/observation.py)."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.WARNING
    if scanning is not None:
        settings.scanning.disabled = not scanning
