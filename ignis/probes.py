"""One HTTP port per long-running process: `/metrics` (Prometheus text format), `/healthz` (liveness)
and `/readyz` (readiness). Used by the operator, the sweeper and `ignis up`.

prometheus_client's own server only serves metrics; Kubernetes probes need the other two paths, and
one port keeps the pod spec and the chart simple.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# A check returns (ok, detail); the detail is the response body, so `curl /readyz` says why.
Check = Callable[[], tuple[bool, str]]


def always_ok() -> tuple[bool, str]:
    return True, "ok"


class ProbeServer:
    """Serves /metrics, /healthz and /readyz on a daemon thread.

    >>> server = ProbeServer(port=0, ready=lambda: (store_reachable(), "store")).start()
    >>> server.port      # the bound port (0 asks the OS for a free one)
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 9090, *, live: Check = always_ok,
                 ready: Check = always_ok, registry: CollectorRegistry = REGISTRY) -> None:
        self._checks = {"/healthz": live, "/readyz": ready}
        self._registry = registry
        self._httpd = ThreadingHTTPServer((host, port), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> ProbeServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ignis-probes", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ProbeServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._reply(200, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                elif path in server._checks:
                    try:
                        ok, detail = server._checks[path]()
                    except Exception as exc:  # a check that raises is a failing check, not a crash
                        ok, detail = False, f"{type(exc).__name__}: {exc}"
                    self._reply(200 if ok else 503, (detail + "\n").encode(), "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found: try /metrics, /healthz or /readyz\n", "text/plain")

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: object) -> None:  # probes every few seconds: debug only
                log.debug("probe %s", fmt % args)

        return Handler
