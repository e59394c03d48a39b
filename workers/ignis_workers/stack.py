"""The embedded stack (`ignis up`): what a cluster runs, in one process on one store, with no cluster.

    with EmbeddedStack(store, [Path("queues")], load_sweeper_settings(probe_port=9090)) as stack:
        stack.first_sync        # what the initial manifest pass did
        stack.wait_leading(30)  # the sweeper has won the (store-backed) lease

Parts, each on its own thread:
* manifest sync — the operator's embedded mode (`ignis_operator.embedded.ManifestSync`) over every
  given directory: files are re-read when they change, and drift is repaired on a timer;
* the sweeper service — store-backed leader election, sweep and shovel loops; it also serves
  /metrics, /healthz and /readyz, which cover the whole process (one Prometheus registry).

Several `ignis up` (or `ignis sweeper`) processes on one store are safe: one of them leads the sweep.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ignis_operator.embedded import ManifestSync
from ignis_operator.reconcile import SyncResult

from ignis.storage.base import Storage
from ignis_workers.service import SweeperService, SweeperSettings

log = logging.getLogger(__name__)

MANIFEST_POLL_SECONDS = 1.0  # how often manifest files are checked for changes


class EmbeddedStack:
    """Manifest sync + sweeper + probes. Start it with `start()` (or `with`), stop it with `stop()`."""

    def __init__(self, store: Storage, manifest_dirs: Sequence[Path], settings: SweeperSettings, *,
                 clock: Callable[[], int] | None = None) -> None:
        self.store = store
        # Built first: a missing directory is an InvalidInputError before anything starts.
        self.syncs = [ManifestSync(store, Path(d), default_client_id=store.client_id) for d in manifest_dirs]
        self.sweeper = SweeperService(store, settings, clock=clock)
        self.first_sync: list[SyncResult] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int | None:
        """The bound probe port, once the sweeper serves it (None when probes are off)."""
        return self.sweeper.probes.port if self.sweeper.probes else None

    def start(self) -> EmbeddedStack:
        # One synchronous pass first, so queues exist before the caller publishes to them.
        self.first_sync = [result for sync in self.syncs for result in sync.sync_once()]
        self._threads = [threading.Thread(target=sync.run, args=(self._stop, MANIFEST_POLL_SECONDS),
                                          name=f"ignis-manifests-{i}") for i, sync in enumerate(self.syncs)]
        self._threads.append(threading.Thread(target=self.sweeper.run, args=(self._stop,), name="ignis-sweeper"))
        for thread in self._threads:
            thread.start()
        return self

    def wait_leading(self, timeout: float) -> bool:
        """Block until this process leads the sweeper election (or `timeout` seconds pass)."""
        return self._wait_for(self.sweeper.leading, timeout)

    def wait_probes(self, timeout: float = 10.0) -> int | None:
        """The probe port once the server is up (None if probes are off or it did not come up)."""
        if self.sweeper.settings.probe_port >= 0:
            self._wait_for(lambda: self.port is not None, timeout)
        return self.port

    def _wait_for(self, condition: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not condition():
            if self._stop.is_set() or time.monotonic() >= deadline:
                return condition()
            self._stop.wait(0.05)
        return True

    def wait(self, stop: threading.Event) -> None:
        """Block until `stop` (e.g. set by a signal handler) or until a part stops on its own."""
        while not stop.wait(0.5):
            if self._stop.is_set() or not all(t.is_alive() for t in self._threads):
                log.error("a part of the embedded stack stopped; shutting down")
                return

    def stop(self) -> None:
        """Stop every part; the sweeper releases its lease so another process takes over at once."""
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> EmbeddedStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
