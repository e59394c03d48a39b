"""Outages of a real Aerospike server (issue: Aerospike faults, parts 1 and 2): the server is stopped
(SIGTERM) while a queue holds messages, and while a consumer process awaits a slot whose write has not
landed. Every read path raises StoreUnavailable meanwhile; the consumer neither spins nor logs per retry;
everything is delivered once the server is back.

Runs with IGNIS_TEST_AEROSPIKE=host:port[/ns] when this machine can stop and restart that node (its
process is here, or IGNIS_TEST_AEROSPIKE_CTL says how: see support/server_control.py), only when asked
(`pytest -m faults`), and only when its namespace keeps its data across a restart (else it skips, saying so)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.aerospike_support import AEROSPIKE_ENV
from support.server_control import Node, parse_hosts, restart_loses_data

from ignis import Ignis, QueueSpec
from ignis.errors import StoreUnavailable

pytestmark = pytest.mark.faults
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    target = os.environ.get(AEROSPIKE_ENV)
    if not target:
        pytest.skip(f"real-server outage tests skipped: set {AEROSPIKE_ENV}=host:port[/namespace]")
    host, port = parse_hosts(target)[0][0]
    found = Node.find(host, port)
    if found is None:
        pytest.skip(f"cannot stop and restart the server at {host}:{port} from here: set IGNIS_TEST_AEROSPIKE_CTL")
    lossy = restart_loses_data(host, port, parse_hosts(target)[1])
    if lossy:
        pytest.skip(lossy)
    yield found


@pytest.fixture
def url(node: Node) -> Iterator[str]:
    run = uuid.uuid4().hex[:8]
    namespace = parse_hosts(os.environ[AEROSPIKE_ENV])[1]
    yield f"aerospike://{node.host}:{node.port}/{namespace}?farm=o{run}&client=o{run}&retries=1&total_timeout_ms=1000"
    if not _serving(node):  # never leave the server down for the tests after this one
        node.start()


def _serving(node: Node) -> bool:
    from support.server_control import port_open

    return port_open(node.host, node.port)


def test_a_stopped_server_is_an_outage_on_every_read_path(node: Node, url: str) -> None:
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="orders", shards=2))
        queue = ignis.queue("orders")
        published = {queue.publish(f"m{i}").id for i in range(3)}
        node.stop()
        try:
            # Right after the stop (the client still knows the node: -10 / -15) and once it dropped it (-8, a
            # batch with no records at all).
            for phase in ("at once", "after the client dropped the node"):
                fresh = ignis.queue("orders")
                calls = {"fire": fresh.fire, "fire_many": lambda q=fresh: q.fire_many(10),
                         "pending": fresh.main.pending, "stats": fresh.stats, "peek": lambda q=fresh: q.main.browse(5),
                         "ignis.stats": lambda: ignis.stats("orders")}
                for name, call in calls.items():
                    with pytest.raises(StoreUnavailable):
                        call()
                        pytest.fail(f"{name} answered {phase} while the server was stopped")
                time.sleep(2.5)
        finally:
            node.start()
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            try:
                got |= {m.id for m in ignis.queue("orders").fire_many(10)}
            except StoreUnavailable:
                time.sleep(0.2)
        assert got == published


def test_a_consumer_waits_out_an_outage_mid_await_quietly(node: Node, url: str) -> None:
    outage_seconds = 10.0
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="quiet", handlerType="quiet", shards=1, concurrency=2))
        child = subprocess.Popen([sys.executable, str(HERE / "support" / "outage_consumer.py"), url, "quiet"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(HERE)})
        acked: list[str] = []
        log_lines: list[tuple[float, str]] = []
        readers = [threading.Thread(target=lambda: [acked.append(line.split()[1]) for line in child.stdout
                                                    if line.startswith("acked ")], daemon=True),
                   threading.Thread(target=lambda: [log_lines.append((time.monotonic(), line.rstrip()))
                                                    for line in child.stderr], daemon=True)]
        for t in readers:
            t.start()
        try:
            queue = ignis.queue("quiet")
            first = queue.publish(b"before").id
            _wait(lambda: first in acked, 30, "the consumer to take the first message")
            # A slot allocated and not written yet (a publish between its increment and its write): the
            # consumer claims it and awaits its record. Then the server stops.
            queue.main.store.reserve(queue.main.name, 0, 1)
            time.sleep(0.5)
            proc = psutil.Process(child.pid)
            stopping_at = time.monotonic()
            node.stop()
            down_at = time.monotonic()
            cpu_before = proc.cpu_times()
            time.sleep(outage_seconds)
            cpu_after = proc.cpu_times()
            up_at = time.monotonic()
            node.start()
            cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
            figure = f"the consumer used {cpu:.3f} CPU-s in a {up_at - down_at:.1f} s outage"
            print(figure)
            assert cpu <= 0.05 * (up_at - down_at), figure
            second = None
            deadline = time.monotonic() + 60
            while second is None and time.monotonic() < deadline:
                try:
                    second = queue.publish(b"after").id
                except StoreUnavailable:
                    time.sleep(0.2)
            _wait(lambda: second in acked, 60, "the consumer to take a message published after the outage")
            # "back" is said once the store has answered for a second (STORE_HEALTH's settle): stopping the
            # consumer sooner would stop it before it could say so.
            _wait(lambda: any("store reachable again" in line for _, line in list(log_lines)), 15,
                  "the consumer to say the store is back")
        finally:
            child.terminate()
            child.wait(30)
        during = [line for at, line in log_lines if stopping_at <= at <= up_at]
        text = [line for _, line in log_lines]
        assert not any("Traceback" in line for line in text), "\n".join(text)
        down = [line for line in text if "store unreachable" in line]
        back = [line for line in text if "store reachable again" in line]
        assert len(down) == 1 and " WARNING " in down[0], text
        assert len(back) == 1 and " INFO " in back[0], text
        print(f"consumer log lines during the outage: {len(during)}; in all: {text}")
        assert during == down, during  # the one WARNING, and nothing per retry


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
