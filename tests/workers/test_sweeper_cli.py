"""`ignis sweep`, `ignis sideline shovel`, `ignis sideline redrive` and `ignis sweeper`'s settings
errors, through the installed console script in a subprocess; the sweeping processes' collector settings
in this process (`ignis.cli.app.run`), where they can be read."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ignis_workers.election import LEASE_NAME
from ignis_workers.sweeper import GC_YOUNG_THRESHOLD, tune_collector

from ignis import Ignis, QueueSpec
from ignis.cli.app import run
from ignis.envelope import now_ms
from ignis.storage.base import LeaseRecord

IGNIS = Path(sys.executable).parent / "ignis"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"lmdb://{tmp_path}/store?durability=fast"


def ignis(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IGNIS), "--store", url, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def client(url: str):
    with Ignis(url) as c:
        c.apply(QueueSpec.build(name="orders", handlerType="orders", shards=2, maxDeliveries=2))
        yield c


def test_sweep_moves_abandoned_claims_and_prints_json(url: str, client: Ignis):
    q = client.queue("orders")
    q.publish_many([b"a", b"b", b"c", b"d"])
    q.fire_many(2)  # fresh claims: not abandoned
    assert as_json(ignis(url, "sweep", "orders", "-o", "json"))["main"]["moved"] == 0
    for shard in (0, 1):
        client.store.claim("orders", shard, 10, now_ms() - 3_600_000)  # claimed an hour ago
    doc = as_json(ignis(url, "sweep", "orders", "-o", "json"))
    assert doc["main"]["moved"] == 2 and doc["queue"] == "orders"
    table = ignis(url, "sweep", "orders")
    assert table.returncode == 0 and "main" in table.stdout


@pytest.fixture
def collector():
    """Python's default collector thresholds for the test; the process's own afterwards."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_tune_collector_raises_only_the_young_threshold(collector):
    tune_collector()
    assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
    gc.set_threshold(50_000, 5, 5)  # the host process set a higher one: kept
    tune_collector()
    assert gc.get_threshold() == (50_000, 5, 5)
    gc.set_threshold(0, 10, 10)  # the host process turned collection off: left so
    tune_collector()
    assert gc.get_threshold() == (0, 10, 10)


def test_ignis_sweep_sweeps_with_the_sweeping_collector(url: str, client: Ignis, collector, capsys):
    assert run(["--store", url, "sweep", "orders", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["queue"] == "orders"
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD


def test_sweep_unknown_queue_exits_3(url: str, client: Ignis):
    result = ignis(url, "sweep", "nope")
    assert result.returncode == 3 and result.stderr.startswith("error: queue 'nope' not found")


def test_sweep_refuses_while_a_sweeper_leads_unless_forced(url: str, client: Ignis):
    now = now_ms()
    client.store.replace_lease(LEASE_NAME, LeaseRecord("pod-7", now, now, 60), 0)
    result = ignis(url, "sweep", "orders")
    assert result.returncode == 1 and "pod-7" in result.stderr and "--force" in result.stderr
    assert ignis(url, "sweep", "orders", "--force").returncode == 0


def test_shovel_then_redrive_dead_letters(url: str, client: Ignis):
    q = client.queue("orders")
    tired = q.envelope(b"tired")
    tired.attempts = 2
    q.sideline.load([q.envelope(b"fresh").for_transfer("rejected", 1), tired.for_transfer("rejected", 1)])
    doc = as_json(ignis(url, "sideline", "shovel", "orders", "-o", "json"))
    assert (doc["moved"], doc["dead_lettered"]) == (1, 1)
    text = ignis(url, "sideline", "redrive", "orders", "--from", "dead")
    assert text.returncode == 0 and text.stdout.startswith("moved 1 message(s) from the dead of orders")
    assert q.dead.pending() == 0 and q.main.pending() == 2


def test_sweeper_rejects_bad_settings_with_one_line(url: str):
    result = ignis(url, "sweeper", env={"IGNIS_SWEEPER_THREADS": "0"})
    assert result.returncode == 2
    assert result.stderr.startswith("error: invalid sweeper settings: IGNIS_SWEEPER_THREADS=")


def test_sweeper_kubernetes_lease_without_any_kube_config_is_a_clear_error(url: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """Neither in a cluster nor a kubeconfig: one line naming both places it looked."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "no-such-kubeconfig"
    result = ignis(url, "sweeper", "--lease", "kubernetes", "--port", "-1", env={"KUBECONFIG": str(missing)})
    assert result.returncode == 2
    assert result.stderr.startswith("error: lease=kubernetes: no Kubernetes configuration: not in a cluster")
    assert f"no kubeconfig at {missing}" in result.stderr and result.stderr.count("\n") == 1
