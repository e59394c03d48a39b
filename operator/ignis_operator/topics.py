"""The reconciler of IgnisTopic objects as plain functions over a `Storage`, the twin of reconcile.py's queue
functions (sync_queue, finalize_queue, queue_figures): what kopf's handlers (handlers.py) and the background
passes (resync.py) run for topics. Nothing here knows about Kubernetes API calls.

Ownership is recorded as for queues: the topic record's extra bin `owner` ({uid, ref, since}); the older claim
wins, and a claim with an empty uid is a released one (a Retained deletion: topic records have no active flag).
TopicSpec.from_bins ignores the bin and drift repair compares config bins only.

A topic is deleted only once no active subscription reads it (`finalize_topic` answers InUse, naming them, until
then): with deletionPolicy Delete its messages and record go; with Retain both stay, unclaimed, for a later
IgnisTopic (or `ignis topic delete`) to take over.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ignis.errors import InvalidInputError
from ignis.spec import API_VERSION, DeletionPolicy
from ignis.storage.base import QueueRecord, Storage, client_view
from ignis.topics.spec import TOPIC_KIND, TopicSpec
from ignis.topics.topic import Topic, check_names
from ignis_operator.reconcile import (
    AGE_FIGURE,
    DELETED,
    INVALID_SPEC,
    OWNER_BIN,
    SYNCED,
    UNTOUCHED,
    Finalized,
    Owner,
    SyncResult,
    age_changed,
    check_declaration,
    config_drift,
    count_changed,
    now_rfc3339,
)

TOPIC_PLURAL = "ignistopics"
RETAINED = "Retained"  # what finalize_topic did under deletionPolicy Retain (also an Event reason)
IN_USE = "InUse"  # the Ready reason of a topic whose deletion waits for its subscriptions
RELEASED_OWNER = {"uid": "", "ref": "", "since": 0}  # a claim given up (Owner.from_bin reads it as none)
TOPIC_FIGURES = ("published", "retained", "retainedBytes", "subscriptions")
NAMES_SHOWN = 50  # subscriptionNames in the status: the first this many


def topic_spec_from_object(name: str, namespace: str | None, spec: Mapping[str, Any], source: str | None = None
                           ) -> TopicSpec:
    """The TopicSpec of an IgnisTopic object (clientId defaults to the namespace). Raises InvalidSpecError."""
    metadata = {"name": name, **({"namespace": namespace} if namespace else {})}
    doc = {"apiVersion": API_VERSION, "kind": TOPIC_KIND, "metadata": metadata, "spec": dict(spec)}
    return TopicSpec.from_manifest(doc, source)


def sync_topic(store: Storage, spec: TopicSpec, owner: Owner, *, default_client_id: str | None = None) -> SyncResult:
    """Create or update the topic record of `spec` (its figures' bins untouched), register its clientId, and
    report. Idempotent: a second run over an unchanged store reports no drift. Store errors propagate."""
    client_id = spec.client_id or default_client_id or store.client_id
    s = client_view(store, client_id)
    current = s.get_topic(spec.name)
    declared = spec.config_bins()
    if current is not None:
        refused, owner = check_declaration("topic", spec.name, client_id, current.bins, True, spec.shards, owner)
        if refused is not None:
            return refused
    else:
        try:
            check_names(s, spec.name, "topic")  # a queue of that name would share its records' keys
        except InvalidInputError as exc:
            return SyncResult(spec.name, client_id, False, INVALID_SPEC, str(exc))
    diff = config_drift(current.bins if current else None, declared)
    s.register_client(client_id)
    created = s.apply_topic(spec.name, {**declared, OWNER_BIN: owner.as_bin()})
    if created:
        message = f"topic record created ({spec.shards} shards, retention {spec.retention_seconds}s)"
    elif diff:
        message = "topic record updated: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(diff.items()))
    else:
        message = "topic record in sync"
    return SyncResult(spec.name, client_id, True, SYNCED, message, created=created, diff={} if created else diff)


def in_step(record: QueueRecord | None, declared: Mapping[str, Any], uid: str) -> bool:
    """Whether a topic record is as its object declares and owned by it (the drift pass's check)."""
    if record is None:
        return False
    holder = Owner.from_bin(record.bins.get(OWNER_BIN))
    return holder is not None and holder.uid == uid and not config_drift(record.bins, declared)


def subscriptions_by_topic(store: Storage, client_id: str) -> dict[str, list[str]]:
    """The active subscriptions of a clientId by topic, from one read of its queue records. A subscription
    deleted with deletionPolicy Retain keeps an inactive record: it reads nothing, and holds no topic back."""
    found: dict[str, list[str]] = defaultdict(list)
    for record in client_view(store, client_id).list_queues(True):
        topic = record.bins.get("subTopic")
        if topic:
            found[str(topic)].append(record.name)
    return {topic: sorted(names) for topic, names in found.items()}


@dataclass(frozen=True, slots=True)
class InUse:
    """A topic deletion that waits: these subscriptions still read it."""

    subscriptions: list[str]

    @property
    def message(self) -> str:
        names = ", ".join(self.subscriptions[:NAMES_SHOWN]) + (" ..." if len(self.subscriptions) > NAMES_SHOWN else "")
        return (f"deletion waits for {len(self.subscriptions)} subscription(s) that still read this topic: {names} "
                "(delete them, or remove their spec.subscribe by recreating them)")


def finalize_topic(store: Storage, spec: TopicSpec, owner: Owner, *, default_client_id: str | None = None
                   ) -> Finalized | InUse:
    """Apply the deletion policy of a topic declaration that goes away, once no active subscription reads it
    (until then: InUse, nothing done). Only the owner of the record acts."""
    client_id = spec.client_id or default_client_id or store.client_id
    s = client_view(store, client_id)
    current = s.get_topic(spec.name)
    if current is None:
        return Finalized(UNTOUCHED, f"topic {spec.name!r} has no record; nothing to do")
    holder = Owner.from_bin(current.bins.get(OWNER_BIN))
    if holder is not None and holder.uid != owner.uid:
        return Finalized(UNTOUCHED, f"topic {spec.name!r} is owned by {holder.ref}; left untouched")
    users = subscriptions_by_topic(store, client_id).get(spec.name)
    if users:
        return InUse(users)
    if spec.deletion_policy is DeletionPolicy.DELETE:
        removed = s.purge_magazine(spec.name)
        s.delete_topic(spec.name)
        return Finalized(DELETED, f"topic {spec.name!r} deleted with {removed} messages (deletionPolicy Delete)")
    s.apply_topic(spec.name, {OWNER_BIN: RELEASED_OWNER})  # the claim goes, the record and messages stay
    return Finalized(RETAINED, f"topic {spec.name!r} released, its messages kept (deletionPolicy Retain)")


def topic_figures(store: Storage, spec: TopicSpec, subscriptions: list[str], *,
                  default_client_id: str | None = None) -> dict[str, Any]:
    """Live figures for the status: published, retained (messages) and retainedBytes (estimated from a sample of
    each shard: about log2(retained) + 16 reads a shard), the active subscriptions (as the caller found them),
    and oldestAgeSeconds (None when the topic holds nothing)."""
    client_id = spec.client_id or default_client_id or store.client_id
    stats = Topic(client_view(store, client_id), spec).stats(subscriptions)
    age = stats.oldest_age_seconds
    return {"published": stats.published, "retained": stats.retained, "retainedBytes": stats.retained_bytes,
            "subscriptions": len(stats.subscriptions), "subscriptionNames": stats.subscriptions[:NAMES_SHOWN],
            AGE_FIGURE: None if age is None else int(age)}


def topic_figures_changed(written: Mapping[str, Any] | None, measured: Mapping[str, Any], percent: float) -> bool:
    """As reconcile.figures_changed, for a topic: a figure never written, to or from 0, or moved by `percent` %
    (and at least 1); the subscriptions' names changed; the oldest age appeared, went, or moved by `percent` % and
    AGE_CHANGE_SECONDS. A quiet topic is never rewritten (its retained bytes are an estimate: the threshold keeps
    the sample's noise out of the status)."""
    written = written or {}
    if any(count_changed(written.get(key), measured[key], percent) for key in TOPIC_FIGURES):
        return True
    if list(written.get("subscriptionNames") or []) != list(measured.get("subscriptionNames") or []):
        return True
    return age_changed(written.get(AGE_FIGURE), measured.get(AGE_FIGURE), percent)


def topic_figures_status(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The status fields of measured figures, with the time they were measured (None removes a field)."""
    return {**{k: measured[k] for k in TOPIC_FIGURES}, "subscriptionNames": list(measured["subscriptionNames"]),
            AGE_FIGURE: measured.get(AGE_FIGURE), "figuresTime": now_rfc3339()}
