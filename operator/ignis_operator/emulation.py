"""Running the operator against kmock's Kubernetes API emulator (tests and bench/bench_operator.py).
kmock is a test dependency, imported only when these helpers are called."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kopf

from ignis_operator.handlers import GROUP, PLURAL, VERSION
from ignis_operator.topics import TOPIC_PLURAL
from ignis_operator.wiring import bounded_session, configure


def declare_resources(emulator: Any) -> None:
    """Make the emulator's discovery list IgnisQueue, IgnisTopic and the resources kopf waits for."""
    from kmock import ResourceInfo

    emulator.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = ResourceInfo(
        kind="IgnisQueue", namespaced=True, singular="ignisqueue", shortnames={"iq"}, subresources={"status"},
        verbs={"list", "watch", "get", "patch", "create", "delete"})
    emulator.resources[f"{GROUP}/{VERSION}/{TOPIC_PLURAL}"] = ResourceInfo(
        kind="IgnisTopic", namespaced=True, singular="ignistopic", shortnames={"it"}, subresources={"status"},
        verbs={"list", "watch", "get", "patch", "create", "delete"})
    # kopf's discovery waits for these two even with scanning disabled
    emulator.resources["v1/namespaces"] = ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch"})
    emulator.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch"})
    emulator.resources["v1/events"] = ResourceInfo(kind="Event", namespaced=True, verbs={"create", "list"})


def kube_configuration(server: str) -> Any:
    """The operator's own API client (status writes of the background passes, Events) for `server`."""
    from kubernetes_asyncio import client

    return client.Configuration(host=server)


def emulator_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    configure(settings)
    settings.scanning.disabled = True  # the emulator has no namespace/CRD watch streams worth following
    settings.persistence.consistency_timeout = 0.2  # the emulator does not bump resourceVersion
    settings.watching.reconnect_backoff = 0.1
    return settings


def start_operator(registry: kopf.OperatorRegistry, server: str, namespaces: list[str]
                   ) -> tuple[threading.Thread, threading.Event, threading.Event]:
    """Run kopf against `server` on a thread with its own event loop (on stop, kopf cancels every task of
    its loop that it did not start with, which in a shared loop would include the caller's). Returns
    (thread, stop, ready)."""

    @kopf.on.login(registry=registry, id="login")
    async def login(**_: Any) -> Any:
        return bounded_session(kopf.ConnectionInfo(server=server, insecure=True))

    stop, ready = threading.Event(), threading.Event()
    operator = kopf.operator(registry=registry, settings=emulator_settings(), standalone=True,
                             namespaces=namespaces, stop_flag=stop, ready_flag=ready)
    thread = threading.Thread(target=asyncio.run, args=(operator,), name="kopf", daemon=True)
    thread.start()
    return thread, stop, ready
