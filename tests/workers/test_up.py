"""`ignis up`: the embedded stack (manifest sync + sweeper + probes) and its demo journey."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ignis_workers import journey
from ignis_workers.election import LEASE_NAME
from ignis_workers.service import load_sweeper_settings
from ignis_workers.stack import EmbeddedStack
from support.polling import http_get, wait_for

from ignis import Ignis, QueueSpec
from ignis.errors import InvalidInputError

IGNIS = Path(sys.executable).parent / "ignis"



def write_manifest(directory: Path, name: str, **spec: object) -> None:
    manifest = QueueSpec.build(name=name, handlerType=name, **spec).to_manifest()
    (directory / f"{name}.yaml").write_text(yaml.safe_dump(manifest), encoding="utf-8")


def settings(**overrides: object):
    return load_sweeper_settings(probe_port=0, sweep_interval_seconds=0.2, lease_duration_seconds=3,
                                 renew_deadline_seconds=2, retry_period_seconds=0.2, **overrides)


def test_stack_syncs_manifests_on_change_sweeps_and_serves_probes(tmp_path: Path) -> None:
    manifests = tmp_path / "queues"
    manifests.mkdir()
    write_manifest(manifests, "orders", shards=2)
    with Ignis(f"lmdb://{tmp_path}/store?durability=fast") as ignis:
        with EmbeddedStack(ignis.store, [manifests], settings()) as stack:
            assert [(r.name, r.ready) for r in stack.first_sync] == [("orders", True)]
            assert ignis.spec("orders").shards == 2
            assert stack.wait_leading(10)
            port = stack.wait_probes()
            assert "ignis_sweeper_leader 1.0" in http_get(f"http://127.0.0.1:{port}/metrics")[1]

            write_manifest(manifests, "orders", shards=4)  # an edit is picked up without a restart
            write_manifest(manifests, "events")
            assert wait_for(lambda: ignis.store.get_queue("events") is not None
                              and ignis.spec("orders").shards == 4)
        # Stopping released the lease: the next sweeper does not wait out the lease duration.
        lease = ignis.store.get_lease(LEASE_NAME)
        assert lease is not None and lease.holder == ""


def test_stack_refuses_a_missing_manifest_directory(tmp_path: Path) -> None:
    with Ignis(f"lmdb://{tmp_path}/store") as ignis, pytest.raises(InvalidInputError, match="does not exist"):
        EmbeddedStack(ignis.store, [tmp_path / "nope"], settings())


def test_two_stacks_on_one_store_one_leads(tmp_path: Path) -> None:
    url = f"lmdb://{tmp_path}/store?durability=fast"
    with (Ignis(url) as a, Ignis(url) as b, EmbeddedStack(a.store, [], settings()) as first,
          EmbeddedStack(b.store, [], settings()) as second):
        assert wait_for(lambda: first.sweeper.leading() or second.sweeper.leading())
        time.sleep(1.0)  # several renewals: still exactly one leader
        assert first.sweeper.leading() != second.sweeper.leading()


def test_planned_verdicts_cover_every_path() -> None:
    verdicts = {n: [journey.planned(n, attempt) for attempt in (1, 2, 3)] for n in range(100)}
    assert verdicts[7] == [False, True, True]  # rejected once, then delivered
    assert verdicts[13] == [None, True, True]  # raises once, then delivered
    assert verdicts[49] == [False, False, False]  # dead-lettered after maxDeliveries
    assert verdicts[0] == [True, True, True]


def test_up_demo_loses_nothing(tmp_path: Path) -> None:
    """The README's main job: every message is acked or dead-lettered, the crashed consumer's messages
    come back through sweep + shovel, and the numbers follow from the planned verdicts."""
    result = subprocess.run([str(IGNIS), "up", "--demo", "-n", "200", "-o", "json"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["finished"] and doc["lost"] == 0
    assert doc["abandoned"] == journey.ABANDONED and doc["swept"] >= journey.ABANDONED
    dead = [n for n in range(200) if journey.planned(n, 1) is False and journey.planned(n, 9) is False]
    assert doc["deadLettered"] == len(dead) == 4
    assert doc["acked"] == 200 - len(dead)
    assert doc["stats"]["depth"] == 0 and doc["stats"]["sidelined"] == 0 and doc["stats"]["in_flight"] == 0


def test_up_runs_until_sigterm_and_releases_the_lease(tmp_path: Path) -> None:
    manifests = tmp_path / "queues"
    manifests.mkdir()
    write_manifest(manifests, "orders")
    url = f"lmdb://{tmp_path}/store?durability=fast"
    proc = subprocess.Popen([str(IGNIS), "--store", url, "up", "-m", str(manifests), "--port", "0"],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "IGNIS_SWEEPER_RETRY_PERIOD_SECONDS": "0.2"})
    try:
        line = proc.stderr.readline()
        assert "1 queue(s) synced" in line and "/metrics" in line, line
        with Ignis(url) as ignis:
            assert wait_for(lambda: (ignis.store.get_lease(LEASE_NAME) or _NoLease).holder != "")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
            assert ignis.store.get_lease(LEASE_NAME).holder == ""
            assert ignis.spec("orders").handler_type == "orders"
    finally:
        proc.kill()
        proc.wait()


class _NoLease:
    holder = ""
