"""The probe server answers /metrics, /healthz and /readyz on one port, with the checks' verdicts."""

from __future__ import annotations

from support.polling import http_get

from ignis import metrics  # noqa: F401  (registers the core metrics)
from ignis.probes import ProbeServer


def _get(port: int, path: str) -> tuple[int, str]:
    return http_get(f"http://127.0.0.1:{port}{path}")


def test_metrics_health_and_readiness() -> None:
    state = {"ready": False}
    with ProbeServer("127.0.0.1", 0, ready=lambda: (state["ready"], "store reachable" if state["ready"]
                                                     else "store unreachable: timeout")) as server:
        status, body = _get(server.port, "/metrics")
        assert status == 200 and "ignis_published_total" in body
        assert _get(server.port, "/healthz") == (200, "ok\n")
        assert _get(server.port, "/readyz") == (503, "store unreachable: timeout\n")
        state["ready"] = True
        assert _get(server.port, "/readyz") == (200, "store reachable\n")
        assert _get(server.port, "/nope")[0] == 404


def test_a_check_that_raises_fails_the_probe() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    with ProbeServer("127.0.0.1", 0, live=broken) as server:
        assert _get(server.port, "/healthz") == (503, "RuntimeError: boom\n")
