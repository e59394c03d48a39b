"""Alert rules and dashboards without a server: promtool checks and unit-tests the rules (each alert fires
on a bad series and stays quiet on a healthy one), every metric a query names is one the code exports,
every alert links to a runbook section, and the dashboards are loadable Grafana JSON."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import ignis_alerts
import ignis_dashboards
import pytest
import yaml
from chart_support import CHART_DIR, ROOT, exported_metric_names

promql_parser = pytest.importorskip("promql_parser", reason="promql-parser is a test dependency")

RULES = ROOT / "deploy" / "prometheus" / "ignismq-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "ignismq-rules.test.yaml"
RUNBOOK = ROOT / "docs" / "runbook.md"
# Series Prometheus itself adds to every scrape (allowed besides the code's own metrics).
PROMETHEUS_SERIES = {"up"}
# Grafana's built-in variables, replaced by what Grafana would substitute, so the text parses as PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "1h"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is missing: apt-get install prometheus (.ci/run installs it)")
    return path


def metric_names(expr: str) -> set[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    found: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def dashboard_docs() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((CHART_DIR / "dashboards").glob("*.json"))}


def rule_docs() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


# ---- alert rules ------------------------------------------------------------------------------------
def test_promtool_check_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ignis_alerts.ALERTS)} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """Swap every alert's healthy and bad expectations: every test must then fail."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    for case in tests["tests"]:
        check = case["alert_rule_test"][0]
        check["exp_alerts"] = [] if check["exp_alerts"] else [{"exp_labels": {"severity": "none"}}]
    broken = tmp_path / "broken.test.yaml"
    shutil.copy(RULES, tmp_path / RULES.name)
    broken.write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool(), "test", "rules", broken.name], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    missed = [a.name for a in ignis_alerts.ALERTS if f"alertname: {a.name}" not in output]
    assert missed == [], f"swapped expectations did not fail for {missed}"


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for alert in ignis_alerts.ALERTS:
        mine = [t["alert_rule_test"][0] for t in tests if t["alert_rule_test"][0]["alertname"] == alert.name]
        assert sorted(bool(t["exp_alerts"]) for t in mine) == [False, True], alert.name


def test_rules_cover_what_the_issue_asks_and_are_annotated() -> None:
    names = {r["alert"] for r in rule_docs()}
    assert len(names) >= 10
    assert {"IgnisSweeperNoLeader", "IgnisSweeperLeaderFlapping", "IgnisSweepFailing", "IgnisSweepNotRunning",
            "IgnisBacklogGrowingWithoutAcks", "IgnisInFlightOlderThanSweepDuration", "IgnisSidelineGrowing",
            "IgnisDeadLettersArriving", "IgnisStorageErrors", "IgnisStorageRetriesHigh",
            "IgnisOperatorReconcileFailures", "IgnisQueueNotReady", "IgnisHoleBudgetExhausted",
            "IgnisQueueOldestMessageTooOld", "IgnisSubscriptionOldestMessageTooOld",
            "IgnisSubscriptionMessagesExpired"} <= names
    for rule in rule_docs():
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}, rule["alert"]


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_runbook_url_points_at_a_section_of_the_runbook() -> None:
    anchors = {github_anchor(line[3:]) for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    for rule in rule_docs():
        base, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert base == ignis_alerts.RUNBOOK_BASE_URL and base.endswith("docs/runbook.md")
        assert anchor in anchors, f"{rule['alert']}: no section #{anchor} in docs/runbook.md"
    internal = set(re.findall(r"\]\(#([\w-]+)\)", RUNBOOK.read_text()))
    assert internal <= anchors, internal - anchors


# ---- metric names -----------------------------------------------------------------------------------
def all_queries() -> list[tuple[str, str]]:
    queries = [(f"alert {r['alert']}", r["expr"]) for r in rule_docs()]
    for uid, doc in dashboard_docs().items():
        queries += [(f"{uid}: {title}", expr) for title, expr in ignis_dashboards.queries(doc)]
        for variable in doc["templating"]["list"]:
            if variable["type"] == "query":
                inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
                assert inner, variable
                queries.append((f"{uid}: variable {variable['name']}", inner.group(1)))
    return queries


def test_every_query_uses_only_metrics_the_code_exports() -> None:
    exported = exported_metric_names() | PROMETHEUS_SERIES
    used: set[str] = set()
    for where, expr in all_queries():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr}"
        unknown = names - exported
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the code"
        used |= names
    assert len(used) >= 30  # the check saw the real queries


def test_every_queue_gauge_of_the_sweeper_has_a_dashboard_panel() -> None:
    from ignis_workers.metrics import QUEUE_GAUGES

    shown: set[str] = set()
    for doc in dashboard_docs().values():
        for _, expr in ignis_dashboards.queries(doc):
            shown |= metric_names(expr)
    gauges = {gauge._name for gauge in QUEUE_GAUGES}
    assert {"ignis_queue_delayed", "ignis_queue_oldest_age_seconds"} <= gauges
    assert gauges - shown == set()


def test_every_topic_metric_has_a_dashboard_panel() -> None:
    """The leader's topic gauges (ignis_subscription_info among them), the publishers' and the trim counters, and
    what subscriptions lose to retention: each shown on the topics dashboard."""
    from ignis_workers.metrics import TOPIC_GAUGES

    shown: set[str] = set()
    for _, expr in ignis_dashboards.queries(dashboard_docs()["ignismq-topics"]):
        shown |= metric_names(expr)
    wanted = {gauge._name for gauge in TOPIC_GAUGES} | {
        "ignis_topic_published_total", "ignis_topic_trimmed_total", "ignis_subscription_expired_total"}
    assert {"ignis_subscription_info", "ignis_topic_retained_bytes", "ignis_topic_oldest_age_seconds"} <= wanted
    assert wanted - shown == set()


def test_subscription_panels_select_subscriptions_by_their_info_series() -> None:
    """Every query of the Subscriptions row that reads a queue series keeps only the selected topics'
    subscriptions: it is joined with ignis_subscription_info filtered by the topic variable."""
    doc = dashboard_docs()["ignismq-topics"]
    panels = doc["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Subscriptions")
    checked = 0
    for panel in panels[start + 1:]:
        assert panel["type"] != "row"
        for t in panel["targets"]:
            names = metric_names(t["expr"])
            if names & {"ignis_queue_depth", "ignis_queue_oldest_age_seconds", "ignis_subscription_expired_total",
                        "ignis_acked_total", "ignis_queue_in_flight"}:
                assert "ignis_subscription_info" in names and 'topic=~"$topic"' in t["expr"], t["expr"]
                assert "group_left ()" in t["expr"], t["expr"]
                checked += 1
    assert checked >= 5


def test_the_metric_check_catches_a_misspelt_name() -> None:
    assert metric_names('sum(rate(ignis_publishd_total{queue=~"$queue"}[$__rate_interval]))') == {
        "ignis_publishd_total"}
    assert "ignis_publishd_total" not in exported_metric_names()


# ---- dashboards -------------------------------------------------------------------------------------
def test_dashboards_are_loadable_grafana_json() -> None:
    docs = dashboard_docs()
    assert {d["title"] for d in docs.values()} == {"IgnisMQ overview", "IgnisMQ topics", "IgnisMQ operator"}
    for uid, doc in docs.items():
        assert doc["uid"] == uid and doc["schemaVersion"] >= 39
        panels = list(ignis_dashboards.all_panels(doc))
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), f"{uid}: duplicate panel ids"
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert "namespace" in variables
        for panel in panels:
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
    overview = docs["ignismq-overview"]
    assert "queue" in {v["name"] for v in overview["templating"]["list"]}
    rows = [p["title"] for p in overview["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Queue $queue", "Sweeper", "Storage"]
    assert next(p for p in overview["panels"] if p["title"] == "Queue $queue")["repeat"] == "queue"
    titles = {p["title"] for p in ignis_dashboards.all_panels(overview)}
    assert {"Queues", "Depth", "In flight", "Sidelined", "Dead", "Publish/s", "Deliver/s", "Ack/s",
            "Redeliveries/s", "Handler duration", "Batch size", "Sweep duration", "Storage calls by operation",
            "Holes skipped and late writes", "Oldest waiting", "Oldest waiting message", "Delayed messages"} <= titles
    topics = docs["ignismq-topics"]
    assert [v["name"] for v in topics["templating"]["list"]] == ["datasource", "namespace", "topic"]
    assert [p["title"] for p in topics["panels"] if p["type"] == "row"] == ["Topics", "Subscriptions"]
    topic_titles = {p["title"] for p in ignis_dashboards.all_panels(topics)}
    assert {"Publish rate by topic", "Retained messages by topic", "Retained bytes by topic",
            "Oldest retained message by topic", "Subscriptions and trims", "Lag (depth) by subscription",
            "Oldest waiting message by subscription", "Lost to retention by subscription"} <= topic_titles
    operator_titles = {p["title"] for p in ignis_dashboards.all_panels(docs["ignismq-operator"])}
    assert {"Reconciles by result", "Reconcile duration", "Queues by state", "Drift repairs"} <= operator_titles


def test_panels_do_not_overlap() -> None:
    for uid, doc in dashboard_docs().items():
        cells: dict[tuple[int, int], str] = {}
        for panel in ignis_dashboards.all_panels(doc):
            pos = panel["gridPos"]
            for y in range(pos["y"], pos["y"] + pos["h"]):
                for x in range(pos["x"], pos["x"] + pos["w"]):
                    assert (x, y) not in cells, f"{uid}: {panel['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = panel["title"]
