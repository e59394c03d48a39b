"""`--log-format json` and text logs of the long-running processes, with kopf's per-object records."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ignis_operator.cli import announce

from ignis import QueueSpec, logs
from ignis.storage import open_store
from ignis.version import package_version

IGNIS = Path(sys.executable).parent / "ignis"


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_json_lines_carry_extras_and_the_kopf_object_but_not_kopf_internals() -> None:
    rec = record("queue record created", k8s_ref={"namespace": "shop", "name": "orders", "uid": "u"},
                 settings=object(), k8s_skip=False, event="start", epoch=3)
    doc = json.loads(logs.JsonFormatter().format(rec))
    assert doc["msg"] == "queue record created" and doc["level"] == "info" and doc["logger"] == "kopf.objects"
    assert doc["object"] == "shop/orders" and doc["event"] == "start" and doc["epoch"] == 3
    assert not {"settings", "k8s_ref", "k8s_skip"} & set(doc)
    assert "[shop/orders] queue record created" in logs.TextFormatter().format(rec)


def test_configure_refuses_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="must be text or json"):
        logs.configure("xml")


def test_the_operator_start_up_line_names_version_store_and_namespaces(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    store = open_store(f"lmdb://{tmp_path}/store?durability=fast")
    try:
        announce("kubernetes", store, 9090, namespaces="shop,billing", scanning="off")
    finally:
        store.close()
    (rec,) = [r for r in caplog.records if getattr(r, "event", None) == "start"]
    assert rec.levelno == logging.INFO
    text = rec.getMessage()
    assert f"ignis operator {package_version()} starting (kubernetes)" in text
    assert f"store lmdb://{tmp_path}/store" in text and "namespaces shop,billing" in text and "port 9090" in text
    assert rec.namespaces == "shop,billing"  # type: ignore[attr-defined]


def test_operator_process_logs_json_start_up_and_reconcile_lines(tmp_path: Path) -> None:
    manifests = tmp_path / "queues"
    manifests.mkdir()
    doc = QueueSpec.build(name="orders", handlerType="orders.v1", shards=2).to_manifest()
    (manifests / "orders.yaml").write_text(yaml.safe_dump(doc))
    env = {**os.environ, "IGNIS_STORE": f"lmdb://{tmp_path}/store?durability=fast"}
    proc = subprocess.Popen([str(IGNIS), "operator", "--manifests", str(manifests), "--port", "0",
                             "--log-format", "json"], stderr=subprocess.PIPE, text=True, env=env)
    lines: list[dict] = []
    try:
        deadline = time.monotonic() + 30
        assert proc.stderr is not None
        while time.monotonic() < deadline and not any("created" in d.get("msg", "") for d in lines):
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(json.loads(line))  # every line is one JSON object
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    start = next(d for d in lines if d.get("event") == "start")
    assert start["level"] == "info" and start["version"] == package_version() and start["mode"] == "manifests"
    assert start["store"].startswith("lmdb://") and start["manifests"] == str(manifests)
    created = next(d for d in lines if "created" in d.get("msg", ""))
    assert created["level"] == "info" and "default/orders" in created["msg"]


def test_operator_refuses_an_unknown_log_format(tmp_path: Path) -> None:
    result = subprocess.run([str(IGNIS), "operator", "--manifests", str(tmp_path), "--log-format", "xml"],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "IGNIS_STORE": f"lmdb://{tmp_path}/store"})
    assert result.returncode == 2 and "must be text or json" in result.stderr


def test_a_dependency_that_answers_and_fails_by_turns_is_one_outage(caplog) -> None:
    import logging

    from ignis.logs import Reachability

    now = [100.0]
    health = Reachability("store", logging.getLogger("flappy"), clock=lambda: now[0], settle_seconds=1.0)
    with caplog.at_level(logging.INFO, logger="flappy"):
        for _ in range(5):  # a cluster migrating partitions: a failure, an answer, a failure...
            health.failed("list queues failed")
            now[0] += 0.2
            health.answered()
            now[0] += 0.2
        assert health.down
        health.answered()
        now[0] += 1.1
        health.answered()  # answering for over a second, no failure since: back
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert lines[1][1] == "store reachable again after 3s (5 failed call(s) meanwhile)"
    assert not health.down


def test_a_narrower_dependency_says_nothing_while_the_whole_is_down_and_its_own_outage_after(caplog) -> None:
    """Queue listings (one kind of call) fail with the store in a store outage: that outage's WARNING was said,
    so theirs is not. A listing that fails once the store answers again is an outage of its own, said once."""
    import logging

    from ignis.logs import Reachability

    now = [100.0]
    store = Reachability("store", logging.getLogger("whole"), clock=lambda: now[0], settle_seconds=1.0)
    listing = Reachability("store (listing queues)", logging.getLogger("whole"), clock=lambda: now[0],
                           settle_seconds=30.0, within=store)
    with caplog.at_level(logging.INFO, logger="whole"):
        store.failed("watch failed")
        for _ in range(3):
            listing.failed("list queues failed")  # during the store's outage
            now[0] += 5
        assert not listing.down
        store.answered()
        now[0] += 1.5
        store.answered()  # back
        listing.answered()
        for _ in range(3):  # the store answers; listings fail by turns (an index query while partitions migrate)
            listing.failed("list queues failed")
            now[0] += 2.5
            listing.answered()
            store.answered()
            now[0] += 2.5
        now[0] += 31
        listing.answered()
    lines = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert lines == [("WARNING", "store unreachable"), ("INFO", "store reachable again after 16s (1 failed call(s) "
                                                                 "meanwhile)"),
                     ("WARNING", "store (listing queues) unreachable"),
                     ("INFO", "store (listing queues) reachable again after 46s (3 failed call(s) meanwhile)")], lines
