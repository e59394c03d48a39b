"""The operator's background passes, on its event loop, over the catalog of served objects (catalog.py)
rather than one kopf timer per object: 10,000 timers firing every 30-60 s cost a core in bookkeeping alone.

* **drift** every `resync_interval_seconds` (plus up to `resync_jitter_seconds`): one bulk read of each
  clientId's queue records, compared in memory with what the objects declare. A record that is missing,
  edited, inactive or owned by another object is re-synced (`drift repaired`: a WARNING line, a
  `DriftRepaired` Warning Event, `ignis_operator_drift_repairs_total`); a record whose TTL (queueExpiry x 2)
  is a quarter spent is re-asserted; objects in Conflict or never reconciled are reconciled again. The
  rest costs nothing: no store write, no API call, no log line.
* **figures** at most every `figures_interval_seconds`, reading `figures_queues_per_second` queues a second
  (10,000 queues: one pass in about 8 minutes), and writing a status only where `figures_changed` (a figure
  moved by `figures_change_percent`, or to or from 0), at most `status_writes_per_second`.
* **retries** of objects the store could not take (StoreUnavailable), each on its own capped, jittered
  exponential backoff; and, while kopf's requests fail, a probe of the API server (capped, jittered
  backoff) that logs the one INFO line when it answers again.

IgnisTopic objects (ctx.topics) go through the same passes: drift compares each clientId's topic records (one
bulk read) with what the objects declare, and re-creates a record deleted behind the operator's back; figures
(published, retained messages and bytes, subscriptions) are written only where `topic_figures_changed`, with
the subscriptions of every topic of a clientId found in one read of its queue records per pass.

A store outage is one WARNING line for all passes and objects (`OperatorContext.store_health`), and the
passes back off (capped, jittered) until it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from ignis.errors import InvalidSpecError, StoreError
from ignis.storage.base import QueueRecord, client_view
from ignis_operator.catalog import Declared
from ignis_operator.handlers import (
    FINALIZE,
    FINALIZER,
    GROUP,
    VERSION,
    OperatorContext,
    finalize,
    in_use_status,
    is_topic,
    object_logger,
    plural_of,
    reconcile_entry,
    settle,
)
from ignis_operator.reconcile import (
    INVALID_SPEC,
    OWNER_BIN,
    SYNCED,
    Owner,
    config_drift,
    figures_changed,
    figures_status,
    queue_figures,
    spec_from_object,
)
from ignis_operator.topics import (
    TOPIC_PLURAL,
    subscriptions_by_topic,
    topic_figures,
    topic_figures_changed,
    topic_figures_status,
    topic_spec_from_object,
)
from ignis_operator.topics import in_step as topic_in_step

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
PROBE_MAX_SECONDS = 30.0
RETRY_CONCURRENCY = 16  # due retries handled at once (each a store call in a thread and an API write)


def _jitter(seconds: float, spread: float = 0.2) -> float:
    return seconds * (1 - spread * random.random())


class Background:
    def __init__(self, ctx: OperatorContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.config
        self.loop = asyncio.get_running_loop()
        self._next_write = 0.0
        self.passes = {"drift": 0, "figures": 0}  # completed passes
        self._poked = asyncio.Event()
        self._retry_gate = asyncio.Semaphore(RETRY_CONCURRENCY)
        loop = self.loop
        ctx.poke = lambda: loop.call_soon_threadsafe(self._poked.set)  # (the finalizers run in threads)

    async def run(self) -> None:
        await asyncio.gather(self._forever("retries", self._retry_loop),
                             self._forever("drift", self._drift_loop),
                             self._forever("figures", self._figures_loop))

    async def _forever(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a loop; a bug in it is logged with its traceback and the loop starts again after a pause."""
        failures = 0
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the %s loop failed; restarting it", name)
                failures += 1
                await asyncio.sleep(_jitter(min(60.0, 2.0 ** failures)))

    # ---- retries and the API probe -------------------------------------------------------------------
    async def _retry_loop(self) -> None:
        probe_due, probe_failures = 0.0, 0
        while True:
            with contextlib.suppress(TimeoutError):  # a tick, or at once when poked (ctx.wake)
                await asyncio.wait_for(self._poked.wait(), TICK_SECONDS)
            self._poked.clear()
            now = self.loop.time()
            if self.ctx.api_health.down and now >= probe_due:
                if await self.ctx.api.ping():
                    probe_failures = 0
                else:
                    probe_failures += 1
                    probe_due = now + _jitter(min(PROBE_MAX_SECONDS, 2.0 ** probe_failures))
            due = []
            for uid, retry in list(self.ctx.retries.items()):
                if retry.due > now:
                    continue
                catalog = self.ctx.topics if retry.plural == TOPIC_PLURAL else self.ctx.catalog
                entry = catalog.get(retry.key)
                if entry is None or entry.uid != uid or (entry.deleting and retry.kind != FINALIZE):
                    self.ctx.retries.pop(uid, None)
                    continue
                due.append((retry.kind, entry))
            # Many at once when many are due (the subscriptions of topics that just became Ready: one by one they
            # trailed the watch path by a minute at 1,000 topics), a bounded number at a time.
            await asyncio.gather(*(self._retry(kind, entry) for kind, entry in due))

    async def _retry(self, kind: str, entry: Declared) -> None:
        async with self._retry_gate:
            if kind == FINALIZE:
                await self._finalize(entry)
            else:
                await self._reconcile(entry, drift=False)

    async def _finalize(self, entry: Declared) -> None:
        """Apply a deleted object's policy (a retry, or one the watch handler missed) and release it."""
        current = self.ctx.catalog_of(entry).get(entry.key)  # a pass's snapshot may be older than the watch
        if (current is None or current.uid != entry.uid or not current.deleting
                or FINALIZER not in current.finalizers or entry.uid in self.ctx.finalizing
                or entry.uid in self.ctx.released):  # removed already; the watch has not shown it yet
            return
        if entry.uid in self.ctx.finalized or await finalize(self.ctx, entry, now=self.loop.time()):
            await self._release(entry)
        elif changes := in_use_status(self.ctx, current):  # a topic that subscriptions still read
            await self._write(current, changes, limited=False)

    async def _release(self, entry: Declared, attempts: int = 5) -> None:
        """Remove the finalizer of an object whose deletionPolicy is applied, with the resourceVersion the
        watch shows (waiting for the watch to show a newer one after a conflict); a drift pass tries again
        if this does not succeed. One release per object at a time (the retries and the drift pass both
        call this), none again once one succeeded (`ctx.released`, until the watch shows the object gone)."""
        if entry.uid in self.ctx.released:
            return
        self.ctx.released.add(entry.uid)
        done: bool | None = None
        try:
            for _ in range(attempts):
                current = self.ctx.catalog_of(entry).get(entry.key)
                if current is None or current.uid != entry.uid or FINALIZER not in current.finalizers:
                    return
                done = await self.ctx.api.remove_finalizer(GROUP, VERSION, plural_of(current), current.namespace,
                                                           current.name, FINALIZER, current.finalizers,
                                                           current.resource_version)
                if done is not None:
                    return
                await asyncio.sleep(TICK_SECONDS)
        finally:
            if not done:
                self.ctx.released.discard(entry.uid)

    # ---- drift ---------------------------------------------------------------------------------------
    async def _drift_loop(self) -> None:
        failures = 0
        delay = self.cfg.resync_interval_seconds + random.uniform(0, self.cfg.resync_jitter_seconds)
        while True:
            await asyncio.sleep(delay)
            ok = await self.drift_pass()
            self.passes["drift"] += 1
            failures = 0 if ok else failures + 1
            delay = self.cfg.resync_interval_seconds + random.uniform(0, self.cfg.resync_jitter_seconds)
            if failures:
                delay = max(delay, self.cfg.backoff(failures))

    async def drift_pass(self) -> bool:
        """One pass over every served object; False when the store did not answer (the pass stopped)."""
        # Topics first: a subscription that waits for its topic finds it in the same pass.
        for catalog, topics in ((self.ctx.topics, True), (self.ctx.catalog, False)):
            groups: dict[str, list[Declared]] = defaultdict(list)
            for entry in catalog.snapshot():
                if entry.uid in self.ctx.retries:
                    continue
                if entry.deleting:
                    if FINALIZER in entry.finalizers:  # a deletion the watch handler did not finish (a bug?)
                        await self._finalize(entry)
                elif not self.ctx.guards.deleting(entry.uid):
                    groups[entry.client_id].append(entry)
            for client_id, entries in groups.items():
                try:
                    records = await asyncio.to_thread(self._records, client_id, topics)
                except StoreError as exc:
                    self.ctx.store_health.failed(exc)
                    return False
                self.ctx.store_health.answered()
                todo = await asyncio.to_thread(self._out_of_step, entries, records)
                for entry, drift in todo:
                    await self._reconcile(entry, drift=drift)
        return True

    def _records(self, client_id: str, topics: bool = False) -> dict[str, QueueRecord]:
        view = client_view(self.ctx.store, client_id)
        return {r.name: r for r in (view.list_topics() if topics else view.list_queues(None))}

    def _out_of_step(self, entries: list[Declared], records: dict[str, QueueRecord]
                     ) -> list[tuple[Declared, bool]]:
        """The objects to reconcile, each with whether it is a drift repair (a Ready object whose record
        changed behind the operator's back). Records the state of the others (`ignis_operator_queues`)."""
        todo = []
        for entry in entries:
            ready = entry.ready
            reason = ready.get("reason")
            key = f"{entry.namespace}/{entry.name}"
            topic = is_topic(entry)  # (topics are not counted in the queue-state gauge)
            if entry.needs_reconcile():
                todo.append((entry, False))
            elif reason == INVALID_SPEC:
                if not topic:
                    self.ctx.states.record(key, INVALID_SPEC)  # the user must edit it: nothing to retry
            elif reason == SYNCED and ready.get("status") == "True":
                if topic:
                    declared = self.ctx.topics.declared(entry)
                    if declared is None or not topic_in_step(records.get(entry.name), declared.bins, entry.uid):
                        todo.append((entry, True))
                elif self._in_step(entry, records.get(entry.name)):
                    self.ctx.states.record(key, SYNCED)
                else:
                    todo.append((entry, True))
            else:
                todo.append((entry, False))  # Conflict (the older object may be gone) and the like
        return todo

    def _in_step(self, entry: Declared, record: QueueRecord | None) -> bool:
        declared = self.ctx.catalog.declared(entry)
        if record is None or declared is None or not record.active:
            return False
        holder = Owner.from_bin(record.bins.get(OWNER_BIN))
        if holder is None or holder.uid != entry.uid:
            return False
        if config_drift(record.bins, declared.bins):
            return False
        return not self.ctx.guards.assert_due(entry.uid, declared.ttl_seconds)

    async def _reconcile(self, entry: Declared, *, drift: bool) -> None:
        # An object with no figures yet (a subscription that waited for its topic, a create the store refused) gets
        # them with the write that makes it Ready, as on the watch path: not one more write from the figures pass.
        first = "figuresTime" not in entry.status
        outcome = await asyncio.to_thread(reconcile_entry, self.ctx, entry, figures=first)
        if outcome is None:
            return
        changes = settle(self.ctx, entry, outcome, drift=drift, logger=object_logger(entry), now=self.loop.time())
        if changes:  # a retry's write makes an object Ready, as the watch path's would: not held to the figures' rate
            await self._write(entry, changes, limited=drift)

    # ---- figures -------------------------------------------------------------------------------------
    async def _figures_loop(self) -> None:
        failures = 0
        while True:
            started = self.loop.time()
            ok = await self.figures_pass()
            self.passes["figures"] += 1
            failures = 0 if ok else failures + 1
            wait = self.cfg.figures_interval_seconds - (self.loop.time() - started)
            if failures:
                wait = max(wait, self.cfg.backoff(failures))
            await asyncio.sleep(max(wait, TICK_SECONDS))

    async def figures_pass(self) -> bool:
        """Measure every Ready object's figures at the configured rate; write those that changed enough.
        False when the store did not answer (the pass stopped)."""
        entries = [e for catalog in (self.ctx.topics, self.ctx.catalog) for e in catalog.snapshot()
                   if not e.deleting and e.ready.get("status") == "True" and not self.ctx.guards.deleting(e.uid)]
        try:  # each clientId's subscriptions by topic: one read of its queue records a pass
            subscriptions = await asyncio.to_thread(self._subscriptions, {e.client_id for e in entries if is_topic(e)})
        except StoreError as exc:
            self.ctx.store_health.failed(exc)
            return False
        per_second = max(1, int(self.cfg.figures_queues_per_second))
        for start in range(0, len(entries), per_second):
            began = self.loop.time()
            try:
                measured = await asyncio.to_thread(self._measure, entries[start:start + per_second], subscriptions)
            except StoreError as exc:
                self.ctx.store_health.failed(exc)
                return False
            self.ctx.store_health.answered()
            for entry, figures in measured:
                current = self.ctx.catalog_of(entry).get(entry.key)  # the freshest status (a write may have landed)
                if current is None or current.uid != entry.uid or current.deleting:
                    continue
                if is_topic(entry):
                    if topic_figures_changed(current.status, figures, self.cfg.figures_change_percent):
                        await self._write(current, topic_figures_status(figures))
                elif figures_changed(current.status, figures, self.cfg.figures_change_percent):
                    await self._write(current, figures_status(figures))
            if start + per_second < len(entries):
                await asyncio.sleep(max(0.0, 1.0 - (self.loop.time() - began)))
        return True

    def _subscriptions(self, client_ids: set[str]) -> dict[str, dict[str, list[str]]]:
        return {client_id: subscriptions_by_topic(self.ctx.store, client_id) for client_id in client_ids}

    def _measure(self, entries: list[Declared], subscriptions: dict[str, dict[str, list[str]]]
                 ) -> list[tuple[Declared, dict[str, Any]]]:
        out: list[tuple[Declared, dict[str, Any]]] = []
        for entry in entries:
            try:
                if is_topic(entry):
                    topic = topic_spec_from_object(entry.name, entry.namespace, entry.spec)
                    users = subscriptions.get(entry.client_id, {}).get(entry.name, [])
                    out.append((entry, topic_figures(self.ctx.store, topic, users, default_client_id=entry.client_id)))
                    continue
                spec = spec_from_object(entry.name, entry.namespace, entry.spec)
            except InvalidSpecError:
                continue
            out.append((entry, queue_figures(self.ctx.store, spec, default_client_id=entry.client_id)))
        return out

    # ---- status writes -------------------------------------------------------------------------------
    async def _write(self, entry: Declared, changes: dict[str, Any], *, limited: bool = True) -> None:
        """Patch a status; `limited`: at most `status_writes_per_second` with the passes' other writes (a busy
        farm's figures never flood the API)."""
        if limited:  # the slot is taken before the wait, so writers waiting at once each get their own
            now = self.loop.time()
            slot = max(now, self._next_write)
            self._next_write = slot + 1.0 / self.cfg.status_writes_per_second
            if slot > now:
                await asyncio.sleep(slot - now)
        if await self.ctx.api.patch_status(GROUP, VERSION, plural_of(entry), entry.namespace, entry.name, changes):
            self.ctx.catalog_of(entry).wrote(entry, changes)
