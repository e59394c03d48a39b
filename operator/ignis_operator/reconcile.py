"""The reconciler as plain functions over a `Storage`: what kopf (wiring.py, handlers.py) and the manifest-file
mode (embedded.py) both run. Nothing here knows about Kubernetes API calls.

Ownership: the operator is the only writer of declared queues' records, but two IgnisQueue objects
(or two manifest files) may claim the same (clientId, queue). The claim is recorded on the queue
record itself, in the extra bin `owner` ({uid, ref, since}), so every operator replica and the
embedded mode see the same answer. The older claim wins; an inactive record (a Retained deletion)
is a released claim. The bin is not a config bin: QueueSpec.from_bins ignores it and drift repair
compares config bins only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ignis import names
from ignis.errors import InvalidInputError, InvalidSpecError
from ignis.queue import Queue
from ignis.spec import API_VERSION, KIND, DeletionPolicy, QueueSpec, ordered_change
from ignis.storage.base import Storage, client_view
from ignis.topics.subscriptions import prepare as prepare_subscription

log = logging.getLogger(__name__)

OWNER_BIN = "owner"

# Condition reasons (CamelCase, as Kubernetes conventions want).
SYNCED = "Synced"
INVALID_SPEC = "InvalidSpec"
CONFLICT = "Conflict"
STORE_UNAVAILABLE = "StoreUnavailable"
# A subscription whose topic does not exist (yet): not the user's mistake to fix in this object (its topic may be
# applied in the same `kubectl apply -f dir/`, after it), so it is retried with backoff, not left as InvalidSpec.
TOPIC_NOT_FOUND = "TopicNotFound"


@dataclass(frozen=True, slots=True)
class Owner:
    """Who declares a queue: an IgnisQueue object (uid, namespace/name, creation time) or a manifest file."""

    uid: str
    ref: str
    since_ms: int

    def as_bin(self) -> dict[str, Any]:
        return {"uid": self.uid, "ref": self.ref, "since": self.since_ms}

    @classmethod
    def from_bin(cls, value: Any) -> Owner | None:
        if not isinstance(value, Mapping) or not value.get("uid"):
            return None
        return cls(str(value["uid"]), str(value.get("ref", "")), int(value.get("since", 0) or 0))

    def precedes(self, other: Owner) -> bool:
        """The older claim wins; the uid breaks a tie so every replica agrees."""
        return (self.since_ms, self.uid) < (other.since_ms, other.uid)


APPLIED = "applied"
REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class SyncResult:
    """The outcome of syncing one queue declaration (`action` applied) or of its removal (removed)."""

    name: str
    client_id: str | None
    ready: bool
    reason: str
    message: str
    created: bool = False
    diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # bin -> (stored, declared); drift repaired
    source: str | None = None
    action: str = APPLIED

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "clientId": self.client_id, "ready": self.ready, "reason": self.reason,
                "message": self.message, "created": self.created, "source": self.source, "action": self.action,
                "diff": {k: {"stored": a, "declared": b} for k, (a, b) in self.diff.items()}}


def spec_from_object(name: str, namespace: str | None, spec: Mapping[str, Any], source: str | None = None
                     ) -> QueueSpec:
    """The QueueSpec of an IgnisQueue object (clientId defaults to the namespace). Raises InvalidSpecError."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    doc = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": dict(spec)}
    return QueueSpec.from_manifest(doc, source)


def parse_k8s_time(text: str | None) -> int:
    """creationTimestamp (RFC 3339) to epoch ms; 0 when absent."""
    if not text:
        return 0
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def config_drift(stored: Mapping[str, Any] | None, declared: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Config bins whose stored value differs from the declaration (all of them when the record is gone)."""
    stored = stored or {}
    return {k: (stored.get(k), v) for k, v in declared.items() if stored.get(k) != v}


def check_declaration(kind: str, name: str, client_id: str, bins: Mapping[str, Any], active: bool, shards: int,
                      owner: Owner) -> tuple[SyncResult | None, Owner]:
    """What an object declaring a queue or topic (`kind`) already in the store may not do: take it from an older
    declaration (Conflict; only while the record is active), or shrink its shards (InvalidSpec). Else (None, the
    owner to write: a claim keeps its age across re-syncs)."""
    holder = Owner.from_bin(bins.get(OWNER_BIN))
    if holder is not None and holder.uid != owner.uid and active and holder.precedes(owner):
        return SyncResult(name, client_id, False, CONFLICT,
                          f"{kind} {name!r} of clientId {client_id!r} is already declared by {holder.ref} "
                          f"(the older declaration wins); rename this {kind} or delete one of them"), owner
    stored_shards = int(bins.get("shards", 0) or 0)
    if shards < stored_shards:
        return SyncResult(name, client_id, False, INVALID_SPEC,
                          f"shards={shards}: shards may grow, never shrink ({kind} {name!r} has {stored_shards} in "
                          "the store)"), owner
    if holder is not None and holder.uid == owner.uid:
        owner = Owner(owner.uid, owner.ref, holder.since_ms)
    return None, owner


def sync_queue(store: Storage, spec: QueueSpec, owner: Owner, *, default_client_id: str | None = None
               ) -> SyncResult:
    """Create or update the queue record of `spec` (runtime bins untouched), register its clientId, and
    report. Idempotent: a second run over an unchanged store writes the same bins and reports no drift.
    Store errors propagate (the caller decides about retries)."""
    client_id = spec.client_id or default_client_id or store.client_id
    s = client_view(store, client_id)
    current = s.get_queue(spec.name)
    declared = spec.config_bins()
    if current is not None:
        refused, owner = check_declaration("queue", spec.name, client_id, current.bins, current.active, spec.shards,
                                           owner)
        if refused is not None:
            return refused
        problem = ordered_change(spec.name, spec.ordered, current.bins)
        if problem is not None:
            return SyncResult(spec.name, client_id, False, INVALID_SPEC, problem)
    if spec.subscribe is not None and s.get_topic(spec.subscribe.topic) is None:
        return SyncResult(spec.name, client_id, False, TOPIC_NOT_FOUND,
                          f"topic {spec.subscribe.topic!r} does not exist in clientId {client_id!r} (yet): apply its "
                          "IgnisTopic; the subscription is created once it exists (retried with backoff)")
    try:  # a subscription: its topic exists and stays; a new one's cursor is set where it starts (ignis.topics)
        prepare_subscription(s, spec, current)
    except InvalidInputError as exc:
        return SyncResult(spec.name, client_id, False, INVALID_SPEC, str(exc))
    diff = config_drift(current.bins if current else None, declared)
    s.register_client(client_id)  # so the sweeper finds this client's queue set
    created = s.apply_queue(spec.name, {**declared, OWNER_BIN: owner.as_bin()}, spec.record_ttl_seconds)
    if created:
        s.ensure_index()  # a new clientId has a new queue set, and the set its own index
    if created:
        message = f"queue record created ({spec.shards} shards)"
    elif diff:
        message = "queue record updated: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(diff.items()))
    else:
        message = "queue record in sync"
    return SyncResult(spec.name, client_id, True, SYNCED, message, created=created, diff={} if created else diff)


# What finalize_queue did: also the reason of the Normal Event the operator posts about it.
DEACTIVATED = "Deactivated"
DELETED = "Deleted"
UNTOUCHED = "Untouched"


@dataclass(frozen=True, slots=True)
class Finalized:
    """The outcome of applying a deletion policy: `action` (Deactivated, Deleted, Untouched), `message`."""

    action: str
    message: str

    def __str__(self) -> str:
        return self.message


def finalize_queue(store: Storage, spec: QueueSpec, owner: Owner, *, default_client_id: str | None = None
                   ) -> Finalized:
    """Apply the deletion policy of a declaration that goes away. Only the owner of the record acts (a
    Conflict loser going away must not touch the winner's queue). Returns what was done, for logs/events."""
    client_id = spec.client_id or default_client_id or store.client_id
    s = client_view(store, client_id)
    current = s.get_queue(spec.name)
    if current is None:
        return Finalized(UNTOUCHED, f"queue {spec.name!r} has no record; nothing to do")
    holder = Owner.from_bin(current.bins.get(OWNER_BIN))
    if holder is not None and holder.uid != owner.uid:
        return Finalized(UNTOUCHED, f"queue {spec.name!r} is owned by {holder.ref}; left untouched")
    if spec.deletion_policy is DeletionPolicy.DELETE:
        removed = sum(s.purge_magazine(m) for m in (spec.name, names.sideline_of(spec.name), names.dead_of(spec.name)))
        s.delete_queue(spec.name)
        return Finalized(DELETED, f"queue {spec.name!r} deleted with {removed} messages (deletionPolicy Delete)")
    s.set_queue_active(spec.name, False)
    return Finalized(DEACTIVATED, f"queue {spec.name!r} deactivated, data kept (deletionPolicy Retain)")


def queue_figures(store: Storage, spec: QueueSpec, *, default_client_id: str | None = None
                  ) -> dict[str, Any]:
    """Live figures for the status: depth, inFlight, delayed, sidelined, dead, oldestAgeSeconds (whole
    seconds the oldest waiting message has waited; None when none waits) and fullPercent (a bounded queue's fill in
    percent of its bound; None when unbounded); a subscription's also its topic, lag and expired."""
    client_id = spec.client_id or default_client_id or store.client_id
    s = client_view(store, client_id)
    queue = Queue(s, spec)
    stats = queue.stats(in_flight=True)
    age = stats.oldest_age_seconds
    figures: dict[str, Any] = {"depth": stats.depth, "inFlight": stats.in_flight or 0, "delayed": stats.delayed,
                               "sidelined": stats.sidelined, "dead": stats.dead,
                               AGE_FIGURE: None if age is None else int(age), FULL_FIGURE: stats.full_percent}
    if spec.subscribe is not None and queue.cursor is not None:
        # Kafka's consumer lag: the topic's messages past the subscription's position (depth adds what waits in its
        # own magazines: retries and the like). Its oldest age is already the older of the two.
        lag = sum(max(p.load - p.fire, 0) for p in queue.cursor.pointers().values())
        figures.update({TOPIC_FIGURE: spec.subscribe.topic, "lag": lag, "expired": stats.expired})
    return figures


def subscription_status(topic: str, figures: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields of a subscription: its topic, lag and the messages it lost to the topic's retention."""
    return {TOPIC_FIGURE: topic, **{k: figures[k] for k in SUBSCRIPTION_FIGURES}}


# ---- status ------------------------------------------------------------------------------------------
def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
                  *, generation: int | None = None, now: str | None = None) -> list[dict[str, Any]]:
    """A new conditions list with `type_` set; lastTransitionTime changes only when the status does."""
    result = [dict(c) for c in (conditions or []) if c.get("type") != type_]
    previous = next((c for c in conditions or [] if c.get("type") == type_), None)
    value = "True" if status else "False"
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == value else None
    condition = {"type": type_, "status": value, "reason": reason, "message": message,
                 "lastTransitionTime": since or now or now_rfc3339()}
    if generation is not None:
        condition["observedGeneration"] = generation
    result.append(condition)
    return sorted(result, key=lambda c: c["type"])


def condition(status: Mapping[str, Any] | None, type_: str = "Ready") -> dict[str, Any]:
    """The condition `type_` of a status ({} when it has none)."""
    return next((dict(c) for c in (status or {}).get("conditions") or [] if c.get("type") == type_), {})


def status_for(result: SyncResult, old_status: Mapping[str, Any] | None, generation: int | None) -> dict[str, Any]:
    """The status for a sync outcome: Synced says whether the store holds the declaration, Ready whether
    the queue is usable as declared. A sync that found the record as declared keeps conditions that already
    say so (same status, reason and generation) as they are, message included: nothing a user reads changed,
    so nothing needs writing."""
    conditions = list((old_status or {}).get("conditions") or [])
    unchanged = result.ready and not result.created and not result.diff and all(
        (c.get("status"), c.get("reason"), c.get("observedGeneration")) == ("True", result.reason, generation)
        for c in (condition(old_status, "Ready"), condition(old_status, "Synced")))
    if not unchanged:
        conditions = set_condition(conditions, "Synced", result.ready, result.reason, result.message,
                                   generation=generation)
        conditions = set_condition(conditions, "Ready", result.ready, result.reason, result.message,
                                   generation=generation)
    status: dict[str, Any] = {"conditions": conditions}
    if generation is not None:
        status["observedGeneration"] = generation
    if result.client_id:
        status["clientId"] = result.client_id
    return status


def status_changes(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `desired` whose value differs from `current`: a status patch that writes only what
    changed (empty: no API call at all)."""
    current = current or {}
    return {k: v for k, v in desired.items() if current.get(k) != v}


# ---- figures -----------------------------------------------------------------------------------------
FIGURES = ("depth", "inFlight", "delayed", "sidelined", "dead")
SUBSCRIPTION_FIGURES = ("lag", "expired")  # a subscription's, beside FIGURES
TOPIC_FIGURE = "topic"  # a subscription's topic (written with its figures)
AGE_FIGURE = "oldestAgeSeconds"  # absent from the status while nothing waits (a merge patch of null removes it)
FULL_FIGURE = "fullPercent"  # a bounded queue's fill in percent of its bound (ignis.bounds); absent when unbounded
FULL_CHANGE_POINTS = 5  # rewritten when it moved by this many points (or crossed 100): the alert reads Prometheus
FIGURES_CHANGE_PERCENT = 10.0
# An age grows by itself between two passes: it is rewritten only when it also moved by this much, so a queue
# that keeps up (ages of seconds, going up and down) is not rewritten every pass, nor a stuck one every 30 s.
AGE_CHANGE_SECONDS = 60


def figures_changed(written: Mapping[str, Any] | None, measured: Mapping[str, Any],
                    percent: float = FIGURES_CHANGE_PERCENT) -> bool:
    """Whether measured figures are worth a status write: a figure was never written, became 0 or stopped
    being 0, or moved by at least `percent` % of its written value (and by at least 1); the oldest age
    appeared or went, or moved by `percent` % and AGE_CHANGE_SECONDS. So an idle queue is never rewritten,
    and a busy one at most once per figures pass; Prometheus has the live figures."""
    written = written or {}
    if measured.get(TOPIC_FIGURE) != written.get(TOPIC_FIGURE):
        return True
    if any(count_changed(written.get(key), measured[key], percent)
           for key in (*FIGURES, *(k for k in SUBSCRIPTION_FIGURES if k in measured))):
        return True
    old_full, full = written.get(FULL_FIGURE), measured.get(FULL_FIGURE)
    if (old_full is None) != (full is None) or (old_full is not None and full is not None and (
            abs(full - old_full) >= FULL_CHANGE_POINTS or (old_full >= 100) != (full >= 100))):
        return True
    return age_changed(written.get(AGE_FIGURE), measured.get(AGE_FIGURE), percent)


def count_changed(old: float | None, new: float | None, percent: float) -> bool:
    """A counted figure worth a status write (figures_changed): never written, to or from 0, or moved by `percent` %
    of its written value and by at least 1."""
    if old is None or new is None or (old == 0) != (new == 0):
        return True
    return abs(new - old) >= max(1.0, abs(old) * percent / 100)


def age_changed(old: float | None, new: float | None, percent: float) -> bool:
    """An oldest age worth a status write: it appeared or went, or moved by `percent` % and AGE_CHANGE_SECONDS."""
    if (old is None) != (new is None):
        return True
    return old is not None and new is not None and abs(new - old) >= max(AGE_CHANGE_SECONDS, abs(old) * percent / 100)


def figures_status(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields of measured figures, with the time they were measured (an oldest age of None
    removes the field: nothing waits)."""
    subscription = subscription_status(measured[TOPIC_FIGURE], measured) if measured.get(TOPIC_FIGURE) else {}
    return {**{k: measured[k] for k in FIGURES}, AGE_FIGURE: measured.get(AGE_FIGURE),
            FULL_FIGURE: measured.get(FULL_FIGURE), **subscription, "figuresTime": now_rfc3339()}


def invalid(name: str, exc: InvalidSpecError, client_id: str | None = None, source: str | None = None) -> SyncResult:
    return SyncResult(name, client_id, False, INVALID_SPEC, "; ".join(exc.problems), source=source)
