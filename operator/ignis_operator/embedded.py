"""Embedded mode: the operator's reconciler over a directory of IgnisQueue manifest files, no cluster.

Used by `ignis operator --manifests DIR` and by `ignis up`. Rules:

* Every IgnisQueue document of every *.yaml / *.yml file is applied with the same `sync_queue` the
  kopf operator runs; other kinds (a Namespace, the CRD) are skipped.
* An invalid document (bad YAML, a field out of range, shards shrinking) is reported and nothing of
  it is written; the other documents are still synced.
* The directory as a whole owns its queues (owner uid `manifests:<abs dir>`), so moving a queue
  between files is not a deletion. The same (clientId, queue) twice in the directory: the first
  file in sorted order wins, the second gets Conflict.
* A queue this directory owns in the store but no file declares any more was removed: its stored
  deletionPolicy is applied, as for a deleted custom resource (Retain: deactivated, data kept;
  Delete: messages and record removed). Removals are applied only in a pass where every file
  parsed and every document was valid, so a typo never deletes a queue.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ignis.errors import InvalidInputError, InvalidSpecError, StoreError
from ignis.manifest import manifest_files
from ignis.spec import KIND, QueueSpec
from ignis.storage.base import Storage, client_view
from ignis.topics.spec import TOPIC_KIND, TopicSpec
from ignis.topics.topic import check_names
from ignis_operator.metrics import DRIFT_REPAIRS, QueueStates, timed
from ignis_operator.reconcile import (
    CONFLICT,
    INVALID_SPEC,
    OWNER_BIN,
    REMOVED,
    STORE_UNAVAILABLE,
    Owner,
    SyncResult,
    finalize_queue,
    sync_queue,
)

log = logging.getLogger(__name__)

DEFAULT_RESYNC_SECONDS = 60.0  # re-apply everything even without file changes: drift repair


@dataclass(frozen=True, slots=True)
class _Declared:
    spec: QueueSpec
    client_id: str
    source: str


class ManifestSync:
    """Apply every IgnisQueue manifest under `directory` to `store`, and keep doing it on change."""

    def __init__(self, store: Storage, directory: Path, *, default_client_id: str = "default",
                 resync_seconds: float = DEFAULT_RESYNC_SECONDS) -> None:
        self.store = store
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise InvalidInputError(f"manifest directory {str(self.directory)!r} does not exist or is not a directory")
        self.default_client_id = default_client_id
        self.resync_seconds = resync_seconds
        self.owner_uid = f"manifests:{self.directory.resolve()}"
        self._since_ms = int(time.time() * 1000)
        self.states = QueueStates()  # the operator's metrics: reconciles by result, queues by state

    # ---- one pass ------------------------------------------------------------------------------------
    def sync_once(self, *, resync: bool = False) -> list[SyncResult]:
        """Apply every manifest; one result per document (or per unreadable file), then removals.
        `resync`: no file changed since the last pass, so any difference found is drift (counted)."""
        results: list[SyncResult] = []
        declared: dict[tuple[str, str], _Declared] = {}
        clean = True  # every file parsed and every document valid: removals are safe
        documents: list[tuple[str, object]] = []
        for file in manifest_files(self.directory):
            source = str(file)
            try:
                docs = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
            except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
                clean = False
                results.append(SyncResult(file.stem, None, False, INVALID_SPEC, f"not valid YAML: {_first_line(exc)}",
                                          source=source))
                continue
            documents += [(f"{source} (document {index})" if len(docs) > 1 else source, doc)
                          for index, doc in enumerate(docs, start=1)]
        # Topics first: a subscription needs its topic (IgnisTopic documents, then IgnisQueue ones).
        for where, doc in documents:
            if isinstance(doc, dict) and doc.get("kind") == TOPIC_KIND:
                outcome = self._apply_topic(doc, where)
                clean = clean and outcome.reason != INVALID_SPEC
                results.append(outcome)
        for where, doc in documents:
            if isinstance(doc, dict) and doc.get("kind") == KIND:
                outcome = self._apply(doc, where, declared, resync)
                clean = clean and outcome.reason != INVALID_SPEC
                results.append(outcome)
        if clean:
            results.extend(self._remove_undeclared(declared))
        else:
            log.info("manifest sync: removals skipped this pass because some manifests are invalid")
        return results

    def _apply(self, doc: object, where: str, declared: dict[tuple[str, str], _Declared], resync: bool = False
               ) -> SyncResult:
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        try:
            spec = QueueSpec.from_manifest(doc, where)  # clientId defaults to metadata.namespace, as in a cluster
        except InvalidSpecError as exc:
            client_id = self._client_of(doc)
            self.states.record(f"{client_id}/{name}", INVALID_SPEC)
            return SyncResult(name, client_id, False, INVALID_SPEC, "; ".join(exc.problems), source=where)
        client_id = spec.client_id or self.default_client_id
        key = (client_id, spec.name)
        if key in declared:
            return SyncResult(spec.name, client_id, False, CONFLICT,
                              f"queue {spec.name!r} of clientId {client_id!r} is also declared in "
                              f"{declared[key].source} (the first declaration wins)", source=where)
        declared[key] = _Declared(spec, client_id, where)
        owner = Owner(self.owner_uid, where, self._since_ms)
        try:
            with timed():
                result = sync_queue(self.store, spec, owner, default_client_id=self.default_client_id)
        except StoreError as exc:
            result = SyncResult(spec.name, client_id, False, STORE_UNAVAILABLE, str(exc))
        self.states.record(f"{client_id}/{spec.name}", result.reason)
        if resync and (result.created or result.diff):  # no file changed: the store did
            DRIFT_REPAIRS.inc()
            log.warning("drift repaired on queue %s/%s: %s", client_id, spec.name, result.message)
        elif result.created or result.diff:
            log.info("queue %s/%s (%s): %s", client_id, spec.name, where, result.message)
        return replace(result, source=where)

    def _apply_topic(self, doc: object, where: str) -> SyncResult:
        """Create or update a topic from its IgnisTopic document (topics the directory no longer declares are kept:
        their messages may be what subscriptions elsewhere read; delete one with `ignis topic delete`)."""
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = str(meta.get("name", "?")) if isinstance(meta, dict) else "?"
        try:
            spec = TopicSpec.from_manifest(doc, where)
        except InvalidSpecError as exc:
            return SyncResult(name, self._client_of(doc), False, INVALID_SPEC, "; ".join(exc.problems), source=where)
        client_id = spec.client_id or self.default_client_id
        store = client_view(self.store, client_id)
        try:
            current = store.get_topic(spec.name)
            if current is None:
                check_names(store, spec.name, "topic")
            elif spec.shards < int(current.bins.get("shards", 0) or 0):
                return SyncResult(spec.name, client_id, False, INVALID_SPEC,
                                  f"shards={spec.shards}: shards may grow, never shrink (topic {spec.name!r})",
                                  source=where)
            store.register_client(client_id)
            created = store.apply_topic(spec.name, spec.config_bins())
        except InvalidInputError as exc:
            return SyncResult(spec.name, client_id, False, INVALID_SPEC, str(exc), source=where)
        except StoreError as exc:
            return SyncResult(spec.name, client_id, False, STORE_UNAVAILABLE, str(exc), source=where)
        if created:
            log.info("topic %s/%s (%s): created (%d shards)", client_id, spec.name, where, spec.shards)
        return SyncResult(spec.name, client_id, True, "Synced", "topic record created" if created else
                          "topic record in sync", created=created, source=where)

    def _client_of(self, doc: object) -> str:
        """Best-effort clientId of a document that failed validation (for the report only)."""
        spec = doc.get("spec") if isinstance(doc, dict) else None
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        declared = spec.get("clientId") if isinstance(spec, dict) else None
        namespace = meta.get("namespace") if isinstance(meta, dict) else None
        return str(declared or namespace or self.default_client_id)

    def _remove_undeclared(self, declared: dict[tuple[str, str], _Declared]) -> list[SyncResult]:
        """Apply the stored deletionPolicy to queues this directory owns but no file declares any more."""
        results = []
        try:
            clients = self.store.list_clients()
        except StoreError as exc:
            log.warning("manifest sync: cannot list clients for removals: %s", exc)
            return results
        for client_id in clients:
            view = client_view(self.store, client_id)
            try:
                records = view.list_queues(active=True)
            except StoreError as exc:
                log.warning("manifest sync: cannot list queues of %s: %s", client_id, exc)
                continue
            for record in records:
                holder = Owner.from_bin(record.bins.get(OWNER_BIN))
                if holder is None or holder.uid != self.owner_uid or (client_id, record.name) in declared:
                    continue
                try:
                    spec = QueueSpec.from_bins(record.name, record.bins, client_id)
                    message = finalize_queue(self.store, spec, holder, default_client_id=client_id)
                except (StoreError, InvalidSpecError) as exc:
                    results.append(SyncResult(record.name, client_id, False, STORE_UNAVAILABLE, str(exc),
                                              source=holder.ref, action=REMOVED))
                    continue
                self.states.forget(f"{client_id}/{record.name}")
                log.info("manifest sync: %s (its manifest %s is gone)", message, holder.ref)
                results.append(SyncResult(record.name, client_id, True, "Removed", message, source=holder.ref,
                                          action=REMOVED))
        return results

    # ---- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, interval: float = 2.0) -> None:
        """Sync now, then whenever a manifest file changes (checked every `interval` seconds) and at
        least every `resync_seconds` (drift repair), until `stop` is set. Never raises."""
        snapshot: object = None
        last_full = 0.0
        while not stop.is_set():
            try:
                current = self._snapshot()
                if current != snapshot or time.monotonic() - last_full >= self.resync_seconds:
                    for result in self.sync_once(resync=current == snapshot):
                        if not result.ready:
                            log.warning("manifest %s: queue %s: %s: %s", result.source, result.name, result.reason,
                                        result.message)
                    snapshot = current
                    last_full = time.monotonic()
            except Exception:  # the loop must outlive any one bad pass (e.g. the directory vanished)
                log.exception("manifest sync pass failed")
            stop.wait(interval)

    def _snapshot(self) -> tuple[tuple[str, int, int], ...]:
        entries = []
        for file in manifest_files(self.directory):
            try:
                st = file.stat()
            except OSError:
                continue
            entries.append((str(file), st.st_mtime_ns, st.st_size))
        return tuple(entries)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
