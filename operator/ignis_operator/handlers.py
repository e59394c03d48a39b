"""The operator's per-object handling, shared by kopf's watch (wiring.py) and the background passes
(resync.py): the operator's context and settings, reconcile an object's record and settle its status, and
apply its deletionPolicy when it is deleted. Each is a thin shell around reconcile.py (IgnisQueue) or topics.py
(IgnisTopic), chosen by the object's kind; kopf itself is wired in wiring.py, which imports this module and
resync.py (neither imports it back).

Topics and subscriptions depend on each other, and `kubectl apply -f dir/` creates them in any order: a
subscription whose topic does not exist yet is Ready=False TopicNotFound and retried with backoff (and at once
when its topic becomes Ready); a topic whose deletion waits for subscriptions is Ready=False InUse, naming them,
re-checked with backoff (and at once when one of them is finalized)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.errors import InvalidSpecError, StoreError
from ignis.logs import Reachability
from ignis.storage.base import Storage
from ignis.topics.spec import TOPIC_KIND
from ignis_operator.catalog import Catalog, Declared, Guards
from ignis_operator.metrics import DRIFT_REPAIRS, QueueStates, timed
from ignis_operator.reconcile import (
    CONFLICT,
    DEACTIVATED,
    DELETED,
    INVALID_SPEC,
    STORE_UNAVAILABLE,
    SYNCED,
    TOPIC_NOT_FOUND,
    Owner,
    SyncResult,
    condition,
    figures_changed,
    figures_status,
    finalize_queue,
    invalid,
    parse_k8s_time,
    queue_figures,
    set_condition,
    spec_from_object,
    status_changes,
    status_for,
    sync_queue,
)
from ignis_operator.topics import (
    IN_USE,
    RETAINED,
    TOPIC_PLURAL,
    InUse,
    finalize_topic,
    subscriptions_by_topic,
    sync_topic,
    topic_figures,
    topic_figures_changed,
    topic_figures_status,
    topic_spec_from_object,
)

GROUP = "ignismq.io"
VERSION = "v1alpha1"
PLURAL = "ignisqueues"
FINALIZER = "ignismq.io/finalizer"  # the operator's own: added by `observe`, removed once deletionPolicy is applied

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
    probe_host: str = Field("0.0.0.0", min_length=1, description="address of the /metrics, /healthz and /readyz "
                            "port (127.0.0.1: reachable from this host only, e.g. on a shared host network)")

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
    catalog: Catalog = field(default_factory=Catalog)  # IgnisQueue objects
    topics: Catalog = field(default_factory=Catalog)  # IgnisTopic objects
    guards: Guards = field(default_factory=Guards)
    store_health: Reachability = field(default_factory=lambda: Reachability("store", log))
    api_health: Reachability = field(default_factory=lambda: Reachability("Kubernetes API", log))
    api: Any = None  # KubeApi, from start-up on
    background: Any = None  # resync.Background, from start-up on (its `passes` count the passes run)
    retries: dict[str, Retry] = field(default_factory=dict)  # by uid: objects waiting for the store
    finalizing: set[str] = field(default_factory=set)  # uids whose deletionPolicy is being applied now
    finalized: set[str] = field(default_factory=set)  # uids whose deletionPolicy is applied (finalizer going)
    released: set[str] = field(default_factory=set)  # uids whose finalizer a background pass removed (until gone)
    in_use: dict[str, InUse] = field(default_factory=dict)  # by uid: topics whose deletion waits for subscriptions
    poke: Any = None  # set by the background passes: wakes their retry loop at once (thread-safe)

    def event(self, entry: Declared, type_: str, reason: str, message: str) -> None:
        if self.api is not None:
            self.api.event(entry.ref, type_, reason, message)

    def catalog_of(self, entry: Declared) -> Catalog:
        return self.topics if is_topic(entry) else self.catalog

    def wake(self, catalog: Catalog, client_id: str, names: set[str], reason: str, now: float) -> None:
        """Retry now the objects of `catalog` named `names` in `client_id` that wait with `reason` (a topic that
        became Ready wakes its TopicNotFound subscriptions; a finalized subscription, its InUse topic)."""
        woken = False
        for uid, retry in list(self.retries.items()):
            entry = catalog.get(retry.key)
            if entry is None or entry.uid != uid or entry.name not in names or entry.client_id != client_id:
                continue
            waiting = self.in_use.get(uid) is not None if reason == IN_USE else entry.ready.get("reason") == reason
            if waiting and retry.due > now:
                self.retries[uid] = Retry(retry.key, retry.generation, retry.attempt, now, retry.kind, retry.since,
                                          retry.plural)
                woken = True
        if woken and self.poke is not None:
            self.poke()  # not at the retry loop's next tick: a subscription follows its topic at once


def is_topic(entry: Declared) -> bool:
    return entry.kind == TOPIC_KIND


def plural_of(entry: Declared) -> str:
    return TOPIC_PLURAL if is_topic(entry) else PLURAL


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
    plural: str = PLURAL  # which catalog `key` is in: ignisqueues or ignistopics


@dataclass(frozen=True, slots=True)
class Outcome:
    result: SyncResult
    figures: dict[str, Any] | None


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
    if is_topic(entry):
        return reconcile_topic_entry(ctx, entry, figures=figures)
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


def reconcile_topic_entry(ctx: OperatorContext, entry: Declared, *, figures: bool = True) -> Outcome | None:
    """reconcile_entry of an IgnisTopic: sync its record and, when Synced and `figures`, measure its figures."""
    key = _key(entry.namespace, entry.name)
    with ctx.guards.hold(("topic", *entry.key)):
        current = ctx.topics.get(entry.key)
        if ctx.guards.deleting(entry.uid) or current is None or current.uid != entry.uid or current.deleting:
            return None
        owner = Owner(entry.uid, key, parse_k8s_time(entry.created))
        synced_client_id = entry.status.get("clientId")
        with timed():
            try:
                spec = topic_spec_from_object(entry.name, entry.namespace, entry.spec, f"IgnisTopic {key}")
                if synced_client_id and spec.client_id != synced_client_id:
                    raise InvalidSpecError([f"clientId={spec.client_id!r}: clientId is immutable (the topic lives "
                                            f"in clientId {synced_client_id!r}); create a new IgnisTopic instead"])
            except InvalidSpecError as exc:
                return Outcome(invalid(entry.name, exc, entry.spec.get("clientId") or entry.namespace), None)
            try:
                result = sync_topic(ctx.store, spec, owner)
            except StoreError as exc:
                result = SyncResult(entry.name, spec.client_id, False, STORE_UNAVAILABLE, f"store unreachable: {exc}")
    measured = None
    if figures and result.reason == SYNCED:
        try:
            users = subscriptions_by_topic(ctx.store, result.client_id or entry.client_id).get(entry.name, [])
            measured = topic_figures(ctx.store, spec, users)
        except StoreError as exc:
            log.debug("figures of topic %s not measured: %s", key, exc)
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
    if outcome.figures is not None:
        if is_topic(entry):
            if topic_figures_changed(entry.status, outcome.figures, ctx.config.figures_change_percent):
                desired.update(topic_figures_status(outcome.figures))
        elif figures_changed(entry.status, outcome.figures, ctx.config.figures_change_percent):
            desired.update(figures_status(outcome.figures))
    if result.reason == SYNCED:
        ctx.store_health.answered()
        ctx.retries.pop(entry.uid, None)
        if is_topic(entry) and (result.created or previous.get("reason") != SYNCED):
            ctx.wake(ctx.catalog, result.client_id or entry.client_id, {entry.name}, TOPIC_NOT_FOUND, now)
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
        ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + ctx.config.backoff(attempt),
                                       plural=plural_of(entry))
        return status_changes(entry.status, desired)
    if result.reason == TOPIC_NOT_FOUND:
        # Retried with backoff (and at once when the topic becomes Ready: ctx.wake); one line and Event per generation.
        retry = ctx.retries.get(entry.uid)
        attempt = retry.attempt + 1 if retry is not None and retry.generation == entry.generation else 0
        ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + ctx.config.backoff(attempt),
                                       plural=plural_of(entry))
        if not previous and _topic_on_its_way(ctx, entry, result):
            return {}  # its IgnisTopic is declared, not handled yet (`kubectl apply -f dir/`): no status, no Warning
        if (previous.get("reason"), previous.get("observedGeneration")) != (result.reason, entry.generation):
            logger.info("%s", result.message)
            ctx.event(entry, "Warning", result.reason, result.message)
        return status_changes(entry.status, desired)
    ctx.retries.pop(entry.uid, None)
    if (previous.get("reason"), previous.get("observedGeneration")) != (result.reason, entry.generation):
        logger.warning("%s", result.message)  # one line and one Event per problem, not per resync
        ctx.event(entry, "Warning", result.reason, result.message)
    # CONFLICT: the resync re-checks, and the newer object wins once the older is gone.
    return status_changes(entry.status, desired)


def _topic_on_its_way(ctx: OperatorContext, entry: Declared, result: SyncResult) -> bool:
    """Whether the topic a subscription waits for is declared by an IgnisTopic of its namespace (and clientId) that
    the operator has not handled yet: it is being created, and the subscription follows it when it is Ready."""
    topic = (entry.spec.get("subscribe") or {}).get("topic")
    declared = ctx.topics.get((entry.namespace, str(topic))) if topic else None
    return declared is not None and not declared.deleting and not declared.ready and \
        declared.client_id == (result.client_id or entry.client_id)


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
    if is_topic(entry):
        return _finalize_topic(ctx, entry, now)
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
        return _finalize_unreachable(ctx, entry, previous, exc, now, "queue", qspec.deletion_policy.value, PLURAL)
    ctx.store_health.answered()
    logger.info("%s", done.message)
    if done.action in (DEACTIVATED, DELETED):
        ctx.event(entry, "Normal", done.action, done.message)
    if qspec.subscribe is not None:  # its topic's deletion may have waited for it
        ctx.wake(ctx.topics, qspec.client_id or entry.client_id, {qspec.subscribe.topic}, IN_USE, now)
    return True


def _finalize_unreachable(ctx: OperatorContext, entry: Declared, previous: Retry | None, exc: StoreError, now: float,
                          kind: str, policy: str, plural: str) -> bool:
    """A finalize the store did not answer: retried with backoff (False) until the finalizer timeout, counted from
    the first failed attempt; then the finalizer is released without the deletionPolicy, said loudly (True)."""
    ctx.store_health.failed(exc)
    same = previous is not None and previous.kind == FINALIZE
    attempt = previous.attempt + 1 if same else 0
    since = previous.since if same and previous.since else now
    waited = now - since
    cfg = ctx.config
    if waited >= cfg.finalizer_timeout_seconds:
        message = (f"store unreachable for {waited:.0f}s ({exc}); finalizer released WITHOUT applying "
                   f"deletionPolicy {policy}: clean up {kind} {entry.name!r} by hand")
        object_logger(entry).error("%s", message)
        ctx.event(entry, "Warning", "FinalizerTimeout", message)
        return True
    delay = min(cfg.backoff(attempt), max(cfg.finalizer_timeout_seconds - waited, 0.1))
    ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + delay, FINALIZE, since, plural)
    object_logger(entry).debug("deletionPolicy not applied yet (store unreachable): %s", exc)
    return False


def _finalize_topic(ctx: OperatorContext, entry: Declared, now: float) -> bool:
    """_finalize of an IgnisTopic: its deletionPolicy once no active subscription reads it. While some do: False,
    `ctx.in_use` names them (the caller writes the InUse condition), re-checked with backoff, without end (the
    finalizer timeout is for an unreachable store only)."""
    cfg = ctx.config
    logger = object_logger(entry)
    ctx.guards.begin_deletion(entry.uid)  # from now on the background passes leave its record alone
    previous = ctx.retries.pop(entry.uid, None)
    if entry.ready.get("reason") in (INVALID_SPEC, CONFLICT):
        return True  # this object never owned a record
    try:
        spec = topic_spec_from_object(entry.name, entry.namespace, entry.spec)
    except InvalidSpecError:
        return True
    owner = Owner(entry.uid, _key(entry.namespace, entry.name), parse_k8s_time(entry.created))
    same = previous is not None and previous.kind == FINALIZE
    attempt = previous.attempt + 1 if same else 0
    try:
        with ctx.guards.hold(("topic", *entry.key)):
            done = finalize_topic(ctx.store, spec, owner, default_client_id=entry.client_id)
    except StoreError as exc:
        return _finalize_unreachable(ctx, entry, previous, exc, now, "topic", spec.deletion_policy.value, TOPIC_PLURAL)
    ctx.store_health.answered()
    if isinstance(done, InUse):
        before = ctx.in_use.get(entry.uid)
        ctx.in_use[entry.uid] = done
        if before is None or before.subscriptions != done.subscriptions:
            logger.info("%s", done.message)
            if before is None:
                ctx.event(entry, "Warning", IN_USE, done.message)
        # since=0: waiting for subscriptions is no outage; the finalizer timeout does not run meanwhile
        ctx.retries[entry.uid] = Retry(entry.key, entry.generation, attempt, now + cfg.backoff(attempt), FINALIZE,
                                       0.0, TOPIC_PLURAL)
        return False
    ctx.in_use.pop(entry.uid, None)
    logger.info("%s", done.message)
    if done.action in (RETAINED, DELETED):
        ctx.event(entry, "Normal", done.action, done.message)
    return True


def in_use_status(ctx: OperatorContext, entry: Declared) -> dict[str, Any]:
    """The status patch that says why a topic's deletion waits ({} when it does not, or it says so already)."""
    waiting = ctx.in_use.get(entry.uid)
    if waiting is None:
        return {}
    ready = condition(entry.status, "Ready")
    if (ready.get("status"), ready.get("reason"), ready.get("message")) == ("False", IN_USE, waiting.message):
        return {}
    return {"conditions": set_condition(entry.status.get("conditions"), "Ready", False, IN_USE, waiting.message,
                                        generation=entry.generation)}
