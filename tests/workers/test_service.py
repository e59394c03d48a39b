"""SweeperService in-process (the API `ignis up` embeds): leads, sweeps, shovels, serves probes and
metrics, and releases the lease when stopped."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from ignis_workers.election import LEASE_NAME
from ignis_workers.service import SweeperService, load_sweeper_settings, scaled_clock
from support.polling import http_get, wait_for

from ignis import Ignis, QueueSpec
from ignis.storage import open_store


def get(port: int, path: str) -> tuple[int, str]:
    return http_get(f"http://127.0.0.1:{port}{path}")


def test_service_leads_sweeps_shovels_and_releases(tmp_path: Path):
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(QueueSpec.build(name="orders", handlerType="orders", shards=2, sweepDurationSeconds=300,
                                 shovel={"concurrency": 1, "intervalSeconds": 1}))
    q = client.queue("orders")
    q.publish_many([b"m%d" % i for i in range(10)])
    claimed = {m.id for m in q.fire_many(10)}
    settings = load_sweeper_settings(sweep_interval_seconds=0.2, shovel_tick_seconds=0.1, threads=2,
                                     lease_duration_seconds=3, renew_deadline_seconds=2,
                                     retry_period_seconds=0.2, probe_port=0, probe_host="127.0.0.1")
    service = SweeperService(store, settings, clock=scaled_clock(offset_seconds=400))
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        wait_for(service.leading)
        # swept (fired "400 s ago" by the service's clock), then shovelled back to main
        wait_for(lambda: q.main.pending() == 10 and q.sideline.pending() == 0)
        q.main.invalidate()
        assert {m.id for m in q.fire_many(10)} == claimed
        port = service.probes.port
        assert get(port, "/readyz")[0] == 200
        status, metrics = get(port, "/metrics")
        assert status == 200
        assert "ignis_sweeper_leader 1.0" in metrics
        assert 'ignis_swept_total{magazine="main",queue="orders"} 10.0' in metrics
        assert 'ignis_shovelled_total{magazine="sideline",queue="orders"}' in metrics
        wait_for(lambda: 'ignis_queue_depth{queue="orders"}' in get(port, "/metrics")[1])
    finally:
        stop.set()
        runner.join(20)
    assert not runner.is_alive()
    assert store.get_lease(LEASE_NAME).holder == ""  # released on the way out
    store.close()


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("IGNIS_SWEEPER_SWEEP_INTERVAL_SECONDS", "7")
    monkeypatch.setenv("IGNIS_SWEEPER_LEASE", "kubernetes")
    s = load_sweeper_settings()
    assert (s.sweep_interval_seconds, s.lease, s.threads) == (7.0, "kubernetes", 64)


def test_stale_epoch_makes_the_leader_step_down_and_retake_a_newer_one(tmp_path: Path, caplog):
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    client = Ignis(store)
    client.apply(QueueSpec.build(name="orders", handlerType="orders", shards=1, sweepDurationSeconds=300,
                                 shovel={"enabled": False}))
    q = client.queue("orders")
    settings = load_sweeper_settings(sweep_interval_seconds=0.1, threads=1, lease_duration_seconds=3,
                                     renew_deadline_seconds=2, retry_period_seconds=0.1, probe_port=-1)
    service = SweeperService(store, settings, clock=scaled_clock(offset_seconds=400))
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,))
    runner.start()
    try:
        first = wait_for(lambda: service.leading() and service._epoch)
        intruder = store.next_epoch()  # e.g. `ignis sweep --force`: a newer epoch writes this queue
        store.advance_sweep("orders", "main", intruder, {}, 0)
        q.publish(b"x")
        q.fire()  # work, so the leader's next sweep writes a pointer and meets the newer epoch
        retaken = wait_for(lambda: service.leading() and (service._epoch or 0) > intruder and service._epoch)
        assert retaken > intruder > first
        assert any(getattr(r, "event", None) == "stale_epoch" for r in caplog.records)
        wait_for(lambda: q.sideline.pending() == 1)  # and it sweeps again under the new epoch
        assert store.get_queue("orders").bins["sweepEpoch"] == retaken
    finally:
        stop.set()
        runner.join(20)
    store.close()
