"""The operator's own Kubernetes API calls, beside kopf's watch and the patches kopf applies for handlers:
status writes of the background passes, every Event the operator posts, and the probe that notices the
API server is back after an outage. Through kubernetes_asyncio, configured like the sweeper's client
(ignis/kube.py: in-cluster first, then $KUBECONFIG / ~/.kube/config).

Events are posted in the background by four workers, after the status writes that make objects Ready (so
10,000 `Created` Events do not hold up 10,000 Ready conditions). An Event for a namespace that is being
deleted is skipped quietly: the API server refuses all new content there, and the object is going away
with its namespace. An API server that does not answer is one WARNING (and one INFO when it is back,
`Reachability`), whatever the number of calls that fail meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from datetime import UTC, datetime
from typing import Any

from ignis.kube import api_message, describe_error
from ignis.logs import Reachability, one_line
from ignis.version import package_version

log = logging.getLogger(__name__)

COMPONENT = "ignis-operator"
MAX_MESSAGE = 1024  # the API server refuses longer Event messages
TERMINATING_MEMORY_SECONDS = 300.0


def unreachable(exc: BaseException) -> bool:
    """Whether a failed call means the API server did not answer (or answered that it cannot serve now)."""
    import aiohttp

    status = getattr(exc, "status", None)
    if isinstance(status, int) and hasattr(exc, "reason"):
        return status == 429 or status >= 500
    return isinstance(exc, aiohttp.ClientError | TimeoutError | OSError)


def namespace_terminating(exc: BaseException) -> bool:
    """The API server's refusal to create anything in a namespace that is being deleted."""
    if getattr(exc, "status", None) != 403:
        return False
    return "NamespaceTerminating" in str(getattr(exc, "body", "")) or "being terminated" in api_message(exc)


class KubeApi:
    """Status writes, Events and an API probe on one kubernetes_asyncio client. `start` and `close` run on
    the operator's event loop; `event` may be called from any thread."""

    def __init__(self, configuration: Any, health: Reachability, *, event_workers: int = 4,
                 event_backlog: int = 100_000, timeout: float = 10.0) -> None:
        self.configuration = configuration
        self.health = health
        self.timeout = timeout
        self._event_workers = event_workers
        self._event_backlog = event_backlog
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[tuple[dict[str, Any], str, str, str]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._terminating: dict[str, float] = {}  # namespace -> until (monotonic)
        self._instance = socket.gethostname()
        self.dropped_events = 0
        self.posted_events = 0

    # ---- life ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        from kubernetes_asyncio import client

        self._client = client.ApiClient(self.configuration)
        self._client.user_agent = f"{COMPONENT}/{package_version()}"
        self._objects = client.CustomObjectsApi(self._client)
        self._core = client.CoreV1Api(self._client)
        self._discovery = client.CoreApi(self._client)
        self._loop = asyncio.get_running_loop()
        self._events = asyncio.Queue(self._event_backlog)
        self._workers = [asyncio.create_task(self._post_events(), name=f"ignis event poster {i}")
                         for i in range(self._event_workers)]

    async def close(self) -> None:
        """Stop posting (Events still queued are dropped) and close the client's connections."""
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers = []
        if self._client is not None:
            await self._client.close()
            self._client = None

    # ---- calls ---------------------------------------------------------------------------------------
    async def patch_status(self, group: str, version: str, plural: str, namespace: str, name: str,
                           status: dict[str, Any]) -> bool:
        """Merge-patch an object's status; True if written (False: gone, or the call failed and was logged)."""
        try:
            await self._objects.patch_namespaced_custom_object_status(
                group, version, namespace, plural, name, {"status": status},
                _content_type="application/merge-patch+json", _request_timeout=self.timeout)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                self.health.answered()
                return False  # deleted meanwhile
            self._failed(exc, f"status of {namespace}/{name} not written")
            return False
        self.health.answered()
        return True

    async def remove_finalizer(self, group: str, version: str, plural: str, namespace: str, name: str,
                               finalizer: str, finalizers: list[str], resource_version: str) -> bool | None:
        """Take `finalizer` off an object whose finalizers and resourceVersion the watch last showed: a JSON
        patch with the resourceVersion as precondition (no read: the operator may only list, watch and
        patch). True: removed (or the object is gone); None: the object changed since (try again with what
        the watch shows next); False: the call failed (logged)."""
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
               {"op": "replace", "path": "/metadata/finalizers", "value": [f for f in finalizers if f != finalizer]}]
        try:
            await self._objects.patch_namespaced_custom_object(
                group, version, namespace, plural, name, ops, _content_type="application/json-patch+json",
                _request_timeout=self.timeout)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status in (404, 409, 422):
                self.health.answered()
                return True if status == 404 else None
            self._failed(exc, f"finalizer of {namespace}/{name} not removed")
            return False
        self.health.answered()
        return True

    async def ping(self) -> bool:
        """Whether the API server answers (API discovery, which every authenticated client may read)."""
        try:
            await self._discovery.get_api_versions(_request_timeout=self.timeout)
        except Exception as exc:
            if not unreachable(exc):
                self.health.answered()
                return True
            self.health.failed(describe_error(exc))
            return False
        self.health.answered()
        return True

    def event(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Queue an Event about the object `ref` (apiVersion, kind, name, namespace, uid). Thread-safe; an
        Event that does not fit the backlog is dropped (counted in `dropped_events`)."""
        if self._loop is None or self._events is None:
            log.debug("no Event poster yet: %s %s %s", type_, reason, message)
            return
        item = (dict(ref), type_, reason, message)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._enqueue(item)
        else:
            self._loop.call_soon_threadsafe(self._enqueue, item)

    def _enqueue(self, item: tuple[dict[str, Any], str, str, str]) -> None:
        assert self._events is not None
        try:
            self._events.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped_events += 1
            log.debug("Event dropped (backlog full): %s %s", item[1], item[2])

    async def _post_events(self) -> None:
        assert self._events is not None
        while True:
            ref, type_, reason, message = await self._events.get()
            try:
                await self._post_event(ref, type_, reason, message)
            except Exception:  # an Event is never worth stopping the poster for
                log.exception("posting an Event failed")

    async def _post_event(self, ref: dict[str, Any], type_: str, reason: str, message: str) -> None:
        namespace = ref.get("namespace") or "default"
        until = self._terminating.get(namespace)
        if until is not None:
            if time.monotonic() < until:
                log.debug("Event %s for %s/%s skipped: namespace %s is being deleted", reason, namespace,
                          ref.get("name"), namespace)
                return
            del self._terminating[namespace]
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE - 3] + "..."
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{ref.get('name')}.", "namespace": namespace},
                "involvedObject": ref, "type": type_, "reason": reason, "action": reason, "message": message,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": self._instance, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            await self._core.create_namespaced_event(namespace, body, _request_timeout=self.timeout)
        except Exception as exc:
            if namespace_terminating(exc):
                self.health.answered()
                self._terminating[namespace] = time.monotonic() + TERMINATING_MEMORY_SECONDS
                log.debug("Event %s for %s/%s skipped: namespace %s is being deleted", reason, namespace,
                          ref.get("name"), namespace)
                return
            self._failed(exc, f"Event {reason} for {namespace}/{ref.get('name')} not posted")
            return
        self.posted_events += 1
        self.health.answered()

    def _failed(self, exc: BaseException, what: str) -> None:
        if unreachable(exc):
            self.health.failed(describe_error(exc))
            log.debug("%s: %s", what, describe_error(exc))
        else:
            self.health.answered()
            log.warning("%s: %s", what, one_line(describe_error(exc)))
