"""Every dashboard query and alert expression on a real Prometheus (Debian's `prometheus`, on loopback)
scraping a running embedded stack: `ignis up --demo --keep-running` publishes, consumes, fails some
messages, sweeps abandoned claims and shovels the sideline back, all in the scraped process. No query
may error, the core panels (depth, publish and ack rates, the sweeper leader) must return data, and
Prometheus evaluates the loaded alert rules without an error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ignis_alerts
import ignis_dashboards
import pytest
import yaml
from chart_support import ROOT
from ignis_workers import journey

pytestmark = pytest.mark.timeout(180)

IGNIS = Path(sys.executable).parent / "ignis"
SCRAPE_NAMESPACE = "ignis-test"
RULES = ROOT / "deploy" / "prometheus" / "ignismq-rules.yaml"
CORE_PANELS = {("ignismq-overview", title) for title in (
    "Depth", "Publish/s", "Ack/s", "Leader", "Message rates", "Sweeper processes (1 = leader)", "Depth and in flight",
    "Publish vs ack")} | {("ignismq-topics", title) for title in (
    # The topic and subscription the fixture declares (its messages never consumed): the leader's figures. (The
    # topic's publisher, the fixture, is not scraped.)
    "Topics", "Retained messages", "Retained bytes", "Subscriptions", "Subscription lag", "Most behind",
    "Retained messages by topic", "Retained bytes by topic", "Oldest retained message by topic",
    "Lag (depth) by subscription", "Oldest waiting message by subscription")}
TOPIC, SUBSCRIPTION, TOPIC_MESSAGES = "live-topic", "live-sub", 25
RATE_WINDOW = "5s"  # what $__rate_interval becomes: a few 1 s scrapes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.25)


class Lines:
    """Collects a process's output lines on a thread, so a full pipe never blocks it."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("prometheus is missing: apt-get install prometheus (.ci/run installs it)")
    return path


def declare_topic(store_url: str) -> None:
    """A topic with one subscription that nobody consumes, in the store `ignis up` then runs on: its sweeper leader
    reports the topic's figures, the subscription's lag and age, and which topic it reads."""
    from ignis import Ignis, QueueSpec, TopicSpec
    from ignis.storage import open_store

    store = open_store(store_url)
    try:
        client = Ignis(store)
        client.apply(TopicSpec.build(name=TOPIC, shards=2))
        client.apply(QueueSpec.build(name=SUBSCRIPTION, handlerType=SUBSCRIPTION,
                                     subscribe={"topic": TOPIC, "start": "earliest"}))
        client.topic(TOPIC).publish_many([b"event-%d" % i for i in range(TOPIC_MESSAGES)], subject="orders/paid")
    finally:
        store.close()


@pytest.fixture(scope="module")  # one stack for the module's tests: it takes a while to start
def stack(tmp_path_factory: pytest.TempPathFactory, prometheus_binary: str) -> Iterator[dict[str, Any]]:
    tmp_path = tmp_path_factory.mktemp("stack")
    ignis_port, prom_port = free_port(), free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "ignismq", "static_configs": [{
            "targets": [f"127.0.0.1:{ignis_port}"],
            "labels": {"namespace": SCRAPE_NAMESPACE, "pod": "ignis-up-0"}}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    store_url = f"lmdb://{tmp_path}/store?durability=fast"
    declare_topic(store_url)
    prometheus = subprocess.Popen(
        [prometheus_binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
         "--storage.tsdb.retention.time=1h", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    prom_log = Lines(prometheus.stderr)
    env = {**os.environ, "IGNIS_STORE": store_url, "IGNIS_SWEEPER_THREADS": "2"}
    ignis = subprocess.Popen(
        [str(IGNIS), "up", "--demo", "--keep-running", "--messages", "300", "--port", str(ignis_port),
         "--output", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    ignis_out, ignis_err = Lines(ignis.stdout), Lines(ignis.stderr)
    base = f"http://127.0.0.1:{prom_port}"
    try:
        wait_for(lambda: get(f"{base}/api/v1/status/buildinfo"), 30, "prometheus up")
        started = time.time()
        wait_for(lambda: ignis_err.has("running; Ctrl-C") or ignis.poll() is not None, 90, "the demo journey")
        assert ignis.poll() is None, "\n".join(ignis_err.lines[-20:])
        result = json.loads("\n".join(ignis_out.lines))
        assert result["lost"] == 0 and result["finished"]
        time.sleep(4)  # a few more scrapes after the traffic, and rule evaluations
        yield {"base": base, "start": started - 2, "journey": result, "prom_log": prom_log}
    finally:
        stop(ignis)
        stop(prometheus)


def substitute(expr: str) -> str:
    return (expr.replace("$__rate_interval", RATE_WINDOW).replace("$namespace", SCRAPE_NAMESPACE)
            .replace("$queue", journey.QUEUE).replace("$topic", TOPIC))


def query_range(base: str, expr: str, start: float) -> dict[str, Any]:
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}",
                                     "step": "1"})
    try:
        return get(f"{base}/api/v1/query_range?{params}")
    except urllib.error.HTTPError as exc:  # 400/422: the query does not parse or evaluate
        return json.loads(exc.read() or b"{}") or {"status": "error", "error": str(exc)}


def has_data(result: dict[str, Any]) -> bool:
    return any(any(v[1] not in ("NaN",) for v in series["values"]) for series in result["data"]["result"])


def test_every_dashboard_query_and_alert_evaluates_on_prometheus(stack: dict[str, Any]) -> None:
    base, start = stack["base"], stack["start"]
    targets = get(f"{base}/api/v1/targets")["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets

    errors, empty_core, evaluated = [], [], 0
    dashboards = {p.stem: json.loads(p.read_text()) for p in (ROOT / "helm/ignismq/dashboards").glob("*.json")}
    for uid, doc in dashboards.items():
        for title, expr in ignis_dashboards.queries(doc):
            result = query_range(base, substitute(expr), start)
            evaluated += 1
            if result.get("status") != "success":
                errors.append(f"{uid} / {title}: {expr}: {result.get('error')}")
            elif (uid, title) in CORE_PANELS and not has_data(result):
                empty_core.append(f"{uid} / {title}: {expr}")
        for variable in doc["templating"]["list"]:
            if variable["type"] == "query":  # label_values(selector, label): the series API Grafana calls
                selector, label = variable["query"]["query"][len("label_values("):-1].rsplit(",", 1)
                params = urllib.parse.urlencode({"match[]": substitute(selector)})
                values = get(f"{base}/api/v1/label/{label.strip()}/values?{params}")["data"]
                assert values, f"{uid}: variable {variable['name']} has no values"
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            result = query_range(base, rule["expr"], start)
            evaluated += 1
            if result.get("status") != "success":
                errors.append(f"alert {rule['alert']}: {result.get('error')}")
    assert errors == []
    assert empty_core == []
    assert evaluated >= 60

    # The rules file loaded into Prometheus: every rule evaluated, none in error.
    rules = [r for g in get(f"{base}/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(RULES.read_text())["groups"])
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

    # What the journey did is what the metrics say.
    journey_result = stack["journey"]
    published = query_range(base, f'sum(ignis_published_total{{queue="{journey.QUEUE}"}})', start)
    assert max(float(v[1]) for v in published["data"]["result"][0]["values"]) == journey_result["published"]
    leader = query_range(base, ignis_dashboards.LEADER.replace("$namespace", SCRAPE_NAMESPACE), start)
    (series,) = leader["data"]["result"]
    assert series["metric"]["identity"] and float(series["values"][-1][1]) == 1.0


def instant(base: str, expr: str) -> list[dict[str, Any]]:
    reply = get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def test_subscription_panels_and_alerts_pick_the_subscriptions_on_prometheus(stack: dict[str, Any]) -> None:
    """On real scraped series (job, instance, namespace, pod labels and all): the subscription panels name the
    fixture's subscription and its topic and hold its figures, the subscription age rule (threshold 0) selects it
    and the queue age rule (threshold 0) leaves it out."""
    base = stack["base"]
    lag = instant(base, substitute(ignis_dashboards.per_subscription(
        f'max by (queue) (ignis_queue_depth{{namespace=~"{SCRAPE_NAMESPACE}"}})')))
    assert [(s["metric"], float(s["value"][1])) for s in lag] == [
        ({"queue": SUBSCRIPTION, "topic": TOPIC}, TOPIC_MESSAGES)]
    retained = instant(base, f'ignis_topic_retained_messages{{topic="{TOPIC}"}}')
    assert [float(s["value"][1]) for s in retained] == [TOPIC_MESSAGES]
    firing = instant(base, ignis_alerts.subscription_oldest_age_expr(0))
    assert [s["metric"] for s in firing] == [{"queue": SUBSCRIPTION, "topic": TOPIC}]
    queues = {s["metric"]["queue"] for s in instant(base, ignis_alerts.oldest_age_expr(0))}
    assert SUBSCRIPTION not in queues
    assert SUBSCRIPTION in {s["metric"]["queue"] for s in instant(base, "ignis_queue_oldest_age_seconds > 0")}
