"""The Grafana dashboards "IgnisMQ overview", "IgnisMQ topics" and "IgnisMQ operator" (classic JSON model),
built here and written by generate.py into the chart (and deploy/grafana/); tests compare the committed
files with this output, check every metric name against the code's registries and evaluate every query on
a real Prometheus.

Variables: `datasource` (every panel's datasource), `namespace` (where the IgnisMQ components run:
sweeper and operator series), `queue` (overview), `topic` (topics). Application series (publish, deliver,
ack, handler: scraped from the applications' pods) are selected by queue or topic only: they live in the
applications' namespaces.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SCHEMA_VERSION = 41  # Grafana 12's classic dashboard model; older Grafanas migrate it on load
DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
Q = 'queue=~"$queue"'
T = 'topic=~"$topic"'
RATE = "$__rate_interval"


class Layout:
    """Hands out unique panel ids and grid positions, row by row (a 24-column grid)."""

    def __init__(self) -> None:
        self.next_id = 1
        self.y = 0
        self.x = 0
        self.row_height = 0

    def place(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.newline()
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_height = max(self.row_height, h)
        return pos

    def newline(self) -> None:
        self.y += self.row_height
        self.x = 0
        self.row_height = 0

    def id(self) -> int:
        value = self.next_id
        self.next_id += 1
        return value


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "editorMode": "code", "expr": expr, "legendFormat": legend or "__auto",
                         "range": not instant, "instant": instant, "refId": ref}
    return t


def targets(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def stat(layout: Layout, title: str, expr: str, unit: str = "short", description: str = "", w: int = 3,
         thresholds: list[tuple[float | None, str]] | None = None) -> dict[str, Any]:
    steps = [{"color": color, "value": value} for value, color in (thresholds or [(None, "green")])]
    return {
        "id": layout.id(), "type": "stat", "title": title, "description": description, "datasource": DS,
        "gridPos": layout.place(w, 4), "targets": [target(expr, title)],
        "fieldConfig": {"defaults": {"unit": unit, **({"decimals": 0} if unit == "short" else {}),
                                     "thresholds": {"mode": "absolute", "steps": steps},
                                     "color": {"mode": "thresholds"}}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "textMode": "auto",
                    "orientation": "auto"},
    }


def timeseries(layout: Layout, title: str, queries: list[tuple[str, str]], unit: str = "short",
               description: str = "", w: int = 12, h: int = 8, stack: bool = False) -> dict[str, Any]:
    return {
        "id": layout.id(), "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "gridPos": layout.place(w, h), "targets": targets(*queries),
        "fieldConfig": {"defaults": {"unit": unit, "min": 0, "custom": {
            "drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never", "spanNulls": True,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"}}}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
    }


def table(layout: Layout, title: str, expr: str, description: str = "", w: int = 12, h: int = 6,
          hide: tuple[str, ...] = ("Time",)) -> dict[str, Any]:
    return {
        "id": layout.id(), "type": "table", "title": title, "description": description, "datasource": DS,
        "gridPos": layout.place(w, h), "targets": [dict(target(expr, "", instant=True), format="table")],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [{"id": "organize", "options": {"excludeByName": dict.fromkeys(hide, True)}}],
    }


def row(layout: Layout, title: str, repeat: str | None = None) -> dict[str, Any]:
    layout.newline()
    panel: dict[str, Any] = {"id": layout.id(), "type": "row", "title": title, "collapsed": False, "panels": [],
                             "gridPos": {"h": 1, "w": 24, "x": 0, "y": layout.y}}
    if repeat:
        panel["repeat"] = repeat
    layout.y += 1
    return panel


def query_variable(name: str, label: str, selector: str) -> dict[str, Any]:
    query = f"label_values({selector}, {name})"
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "query": {"query": query, "refId": name}, "definition": query, "refresh": 2, "sort": 1,
            "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
            "hide": 0, "options": [], "regex": ""}


def variables(with_queue: bool = True, with_topic: bool = False) -> list[dict[str, Any]]:
    found = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
         "query": {"query": "label_values(ignis_sweeper_leader, namespace)", "refId": "namespace"},
         "definition": "label_values(ignis_sweeper_leader, namespace)", "refresh": 2, "sort": 1,
         "multi": True, "includeAll": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
         "hide": 0, "options": [], "regex": ""},
    ]
    if with_queue:
        found.append(query_variable("queue", "Queue", f"ignis_queue_depth{{{NS}}}"))
    if with_topic:
        found.append(query_variable("topic", "Topic", f"ignis_topic_retained_messages{{{NS}}}"))
    return found


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]], *, with_queue: bool = True,
              with_topic: bool = False) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["ignismq"], "editable": True,
        "graphTooltip": 1, "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "30s", "timezone": "browser",
        "time": {"from": "now-3h", "to": "now"}, "timepicker": {}, "fiscalYearStartMonth": 0, "liveNow": False,
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "IgnisMQ dashboards", "type": "dashboards", "tags": ["ignismq"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "templating": {"list": variables(with_queue, with_topic)},
        "panels": panels,
    }


# ---- IgnisMQ overview -----------------------------------------------------------------------------
# group_left keeps the info series' labels (identity, version); a plain `on` match would keep only instance.
LEADER = f'ignis_sweeper_info{{{NS}, identity!=""}} * on (instance) group_left () ignis_sweeper_leader{{{NS}}}'


def overview() -> dict[str, Any]:
    lay = Layout()
    panels: list[dict[str, Any]] = [row(lay, "Overview")]
    rates = f"[{RATE}]"
    panels += [
        stat(lay, "Queues", f"count(max by (queue) (ignis_queue_depth{{{NS}, {Q}}}))",
             description="Active queues the sweeper leader reports."),
        stat(lay, "Depth", f"sum(ignis_queue_depth{{{NS}, {Q}}})", description="Unclaimed messages."),
        stat(lay, "In flight", f"sum(ignis_queue_in_flight{{{NS}, {Q}}})",
             description="Delivered, not yet acked or nacked."),
        stat(lay, "Sidelined", f"sum(ignis_queue_sidelined{{{NS}, {Q}}})",
             thresholds=[(None, "green"), (1, "orange")], description="Failed messages waiting for the shovel."),
        stat(lay, "Dead", f"sum(ignis_queue_dead{{{NS}, {Q}}})", thresholds=[(None, "green"), (1, "red")],
             description="Messages that failed maxDeliveries times."),
        stat(lay, "Leader", f"sum(ignis_sweeper_leader{{{NS}}})", thresholds=[(None, "red"), (1, "green")],
             description="Sweeper processes leading (must be 1)."),
        stat(lay, "Oldest waiting", f"max(ignis_queue_oldest_age_seconds{{{NS}, {Q}}})", unit="s",
             description="Age of the oldest message waiting for delivery (since its due time, else its publish); "
                         "empty when none waits."),
        stat(lay, "Oldest in flight", f"max(ignis_queue_oldest_in_flight_seconds{{{NS}, {Q}}})", unit="s",
             description="Age of the oldest delivered, unsettled message."),
        stat(lay, "Publish/s", f"sum(rate(ignis_published_total{{{Q}}}{rates}))", unit="reqps", w=4),
        stat(lay, "Deliver/s", f"sum(rate(ignis_delivered_total{{{Q}}}{rates}))", unit="reqps", w=4),
        stat(lay, "Ack/s", f"sum(rate(ignis_acked_total{{{Q}}}{rates}))", unit="reqps", w=4),
        stat(lay, "Redeliveries/s", f"sum(rate(ignis_redelivered_total{{{Q}}}{rates}))", unit="reqps", w=4,
             description="Deliveries of messages delivered before (after a failure, a sweep or a shovel)."),
        stat(lay, "Sidelined/s", f"sum(rate(ignis_sidelined_total{{{Q}}}{rates}))", unit="reqps", w=4),
        stat(lay, "Dead-lettered/s", f"sum(rate(ignis_dead_lettered_total{{{Q}}}{rates}))", unit="reqps", w=4),
    ]
    lay.newline()
    panels += [
        timeseries(lay, "Messages: depth, in flight, delayed, sidelined, dead", [
            (f"sum(ignis_queue_depth{{{NS}, {Q}}})", "depth"),
            (f"sum(ignis_queue_in_flight{{{NS}, {Q}}})", "in flight"),
            (f"sum(ignis_queue_delayed{{{NS}, {Q}}})", "delayed"),
            (f"sum(ignis_queue_sidelined{{{NS}, {Q}}})", "sidelined"),
            (f"sum(ignis_queue_dead{{{NS}, {Q}}})", "dead")]),
        timeseries(lay, "Message rates", [
            (f"sum(rate(ignis_published_total{{{Q}}}{rates}))", "publish"),
            (f"sum(rate(ignis_delivered_total{{{Q}}}{rates}))", "deliver"),
            (f"sum(rate(ignis_acked_total{{{Q}}}{rates}))", "ack"),
            (f"sum(rate(ignis_redelivered_total{{{Q}}}{rates}))", "redeliver")], unit="reqps"),
    ]

    # Per-queue rows: Grafana repeats the row (and its panels) for every selected queue.
    panels.append(row(lay, "Queue $queue", repeat="queue"))
    one = 'queue="$queue"'
    panels += [
        timeseries(lay, "Depth and in flight", [
            (f"sum(ignis_queue_depth{{{NS}, {one}}})", "depth"),
            (f"sum(ignis_queue_in_flight{{{NS}, {one}}})", "in flight"),
            (f"sum(ignis_queue_sidelined{{{NS}, {one}}})", "sidelined"),
            (f"sum(ignis_queue_dead{{{NS}, {one}}})", "dead")], w=8),
        timeseries(lay, "Publish vs ack", [
            (f"sum(rate(ignis_published_total{{{one}}}{rates}))", "publish"),
            (f"sum(rate(ignis_delivered_total{{{one}}}{rates}))", "deliver"),
            (f"sum(rate(ignis_acked_total{{{one}}}{rates}))", "ack")], unit="reqps", w=8),
        timeseries(lay, "Sidelined and dead-lettered by reason", [
            (f"sum by (reason) (rate(ignis_sidelined_total{{{one}}}{rates}))", "sidelined {{reason}}"),
            (f"sum by (reason) (rate(ignis_dead_lettered_total{{{one}}}{rates}))", "dead {{reason}}")],
            unit="reqps", w=8),
        timeseries(lay, "Handler duration", [
            (f"histogram_quantile(0.5, sum by (le) (rate(ignis_handler_duration_seconds_bucket{{{one}}}{rates})))",
             "p50"),
            (f"histogram_quantile(0.95, sum by (le) (rate(ignis_handler_duration_seconds_bucket{{{one}}}{rates})))",
             "p95"),
            (f"histogram_quantile(0.99, sum by (le) (rate(ignis_handler_duration_seconds_bucket{{{one}}}{rates})))",
             "p99")], unit="s", w=8),
        timeseries(lay, "Batch size", [
            (f"sum(rate(ignis_handler_batch_size_sum{{{one}}}{rates})) / "
             f"sum(rate(ignis_handler_batch_size_count{{{one}}}{rates}))", "mean"),
            (f"histogram_quantile(0.95, sum by (le) (rate(ignis_handler_batch_size_bucket{{{one}}}{rates})))",
             "p95")], w=8, description="Messages per handler call on batching queues."),
        timeseries(lay, "Delivery latency (publish to first delivery)", [
            (f"histogram_quantile(0.5, sum by (le) (rate(ignis_delivery_latency_seconds_bucket{{{one}}}{rates})))",
             "p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(ignis_delivery_latency_seconds_bucket{{{one}}}{rates})))",
             "p99")], unit="s", w=8,
            description="From the publish to the message's first delivery to a consumer (redeliveries not "
                        "counted), measured by the consumers: a backlog, slow consumers or a consumer that does "
                        "not hear of new messages all show here."),
        timeseries(lay, "Oldest in flight vs sweepDuration", [
            (f"max(ignis_queue_oldest_in_flight_seconds{{{NS}, {one}}})", "oldest in flight"),
            (f"max(ignis_queue_sweep_duration_seconds{{{NS}, {one}}})", "sweepDuration")], unit="s", w=8),
        timeseries(lay, "Oldest waiting message", [
            (f"max(ignis_queue_oldest_age_seconds{{{NS}, {one}}})", "oldest waiting")], unit="s", w=8,
            description="How long the oldest message not delivered yet has waited, since its due time (a delayed "
                        "message) or else its publish: what IgnisQueueOldestMessageTooOld compares with the "
                        "chart's monitoring.prometheusRule.thresholds.queueOldestMessageAgeSeconds. A gap: nothing "
                        "waits."),
        timeseries(lay, "Bounded queue: fill and refusals", [
            (f"max(ignis_queue_full_ratio{{{NS}, {one}}})", "full (ratio of the bound)"),
            (f"sum(rate(ignis_publish_rejected_total{{{one}}}{rates}))", "refused/s"),
            (f"sum(rate(ignis_overflow_dropped_total{{{one}}}{rates}))", "dropped (overflow)/s")], w=8,
            description="A bounded queue (maxLength / maxBytes): how full it is (1 = full: a publish is refused with "
                        "QueueFull, or with dropHead the oldest waiting messages go to the dead letters), and the "
                        "publishes refused and messages dropped per second. Empty for an unbounded queue."),
        timeseries(lay, "Delayed messages", [
            (f"sum(ignis_queue_delayed{{{NS}, {one}}})", "delayed (not due yet)"),
            (f"sum(ignis_queue_depth{{{NS}, {one}}})", "depth (due)")], w=8,
            description="Messages published (or retried) for later and not due yet, beside the depth they join "
                        "when due."),
    ]

    panels.append(row(lay, "Sweeper"))
    panels += [
        table(lay, "Sweeper processes (1 = leader)", LEADER, w=8,
              description="Every sweeper process, its candidate identity and version; the leader shows 1.",
              hide=("Time", "__name__", "job")),
        timeseries(lay, "Leader and transitions", [
            (f"sum(ignis_sweeper_leader{{{NS}}})", "leaders"),
            (f'sum by (outcome) (increase(ignis_sweeper_leader_transitions_total{{{NS}}}[{RATE}]))',
             "transitions {{outcome}}")], w=8),
        timeseries(lay, "Swept and shovelled per pass", [
            (f"sum(increase(ignis_swept_total{{{NS}}}[{RATE}])) / "
             f"clamp_min(sum(increase(ignis_sweep_passes_total{{{NS}}}[{RATE}])), 1)", "swept per sweep pass"),
            (f"sum(increase(ignis_shovelled_total{{{NS}}}[{RATE}])) / "
             f"clamp_min(sum(increase(ignis_shovel_passes_total{{{NS}}}[{RATE}])), 1)", "shovelled per shovel pass")],
            w=8),
        timeseries(lay, "Sweep duration", [
            (f"histogram_quantile(0.5, sum by (le) (rate(ignis_sweep_duration_seconds_bucket{{{NS}}}{rates})))",
             "p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(ignis_sweep_duration_seconds_bucket{{{NS}}}{rates})))",
             "p99"),
            (f"time() - max(ignis_sweep_last_pass_timestamp_seconds{{{NS}}})", "since last pass")], unit="s", w=8),
        timeseries(lay, "Sweeper moves", [
            (f"sum by (magazine) (rate(ignis_swept_total{{{NS}, {Q}}}{rates}))", "swept from {{magazine}}"),
            (f"sum by (magazine) (rate(ignis_shovelled_total{{{NS}, {Q}}}{rates}))", "shovelled from {{magazine}}"),
            (f"sum(rate(ignis_sweep_stamped_total{{{NS}, {Q}}}{rates}))", "stamped")], unit="reqps", w=8),
        timeseries(lay, "Sweeper failures", [
            (f"sum by (queue, magazine) (increase(ignis_sweep_failures_total{{{NS}, {Q}}}[{RATE}]))",
             "sweep {{queue}} {{magazine}}"),
            (f"sum by (queue) (increase(ignis_shovel_failures_total{{{NS}, {Q}}}[{RATE}]))", "shovel {{queue}}"),
            (f'sum(increase(ignis_sweep_passes_total{{{NS}, outcome="failed"}}[{RATE}]))', "failed passes")],
            w=8),
    ]

    panels.append(row(lay, "Storage"))
    panels += [
        timeseries(lay, "Storage calls by operation", [
            ("sum by (operation) (rate(ignis_storage_calls_total[$__rate_interval]))", "{{operation}}")],
            unit="reqps", w=8),
        timeseries(lay, "Retries and errors by operation", [
            ("sum by (operation) (rate(ignis_storage_retries_total[$__rate_interval]))", "retries {{operation}}"),
            ("sum by (operation) (rate(ignis_storage_errors_total[$__rate_interval]))", "errors {{operation}}")],
            unit="reqps", w=8),
        timeseries(lay, "Holes skipped and late writes", [
            (f"sum by (queue, magazine) (rate(ignis_holes_skipped_total{{{Q}}}{rates}))",
             "holes {{queue}} {{magazine}}"),
            (f"sum by (queue) (rate(ignis_hole_budget_exhausted_total{{{Q}}}{rates}))",
             "budget exhausted {{queue}}"),
            (f"sum by (queue) (rate(ignis_late_writes_total{{{Q}}}{rates}))", "late writes {{queue}}")],
            unit="reqps", w=8),
    ]
    return dashboard("ignismq-overview", "IgnisMQ overview",
                     "Queues, message rates, the sweeper and the store (IgnisMQ for Python).", panels)


# ---- IgnisMQ topics -------------------------------------------------------------------------------
# The subscriptions of the selected topics: the sweeper leader's info series (1 each), labelled queue and topic.
SUBSCRIPTIONS = f"max by (queue, topic) (ignis_subscription_info{{{NS}, {T}}})"


def per_subscription(by_queue: str) -> str:
    """A per-queue expression (one series per queue) kept for the selected topics' subscriptions, labelled with
    their topic. The info series is the "many" side of the match (group_left), so the result has its labels and
    the value of `by_queue` (1 * x); a queue that is not a subscription has no info series and drops out.
    https://prometheus.io/docs/prometheus/latest/querying/operators/#many-to-one-and-one-to-many-vector-matches"""
    return f"{SUBSCRIPTIONS} * on (queue) group_left () {by_queue}"


def topics() -> dict[str, Any]:
    lay = Layout()
    rates = f"[{RATE}]"
    panels: list[dict[str, Any]] = [row(lay, "Topics")]
    panels += [
        stat(lay, "Topics", f"count(max by (topic) (ignis_topic_retained_messages{{{NS}, {T}}}))", w=4,
             description="Topics the sweeper leader reports."),
        stat(lay, "Publish/s", f"sum(rate(ignis_topic_published_total{{{T}}}{rates}))", unit="reqps", w=4,
             description="Publishes to the topics, counted by the publishing processes (scraped by the PodMonitor)."),
        stat(lay, "Retained messages", f"sum(ignis_topic_retained_messages{{{NS}, {T}}})", w=4),
        stat(lay, "Retained bytes", f"sum(ignis_topic_retained_bytes{{{NS}, {T}}})", unit="bytes", w=4,
             description="Payload, id and subject bytes the topics hold (estimated from a sample of each shard)."),
        stat(lay, "Oldest retained", f"max(ignis_topic_oldest_age_seconds{{{NS}, {T}}})", unit="s", w=4,
             description="Age of the oldest message a topic holds: at most its retentionSeconds."),
        stat(lay, "Subscriptions", f"sum(ignis_topic_subscriptions{{{NS}, {T}}})", w=4),
        stat(lay, "Published (store count)", f"sum(ignis_topic_published_messages{{{NS}, {T}}})", w=4,
             description="Messages ever published to the topics, as the store counts them (every publisher, "
                         "scraped or not)."),
        stat(lay, "Trimmed (24h)", f"sum(increase(ignis_topic_trimmed_total{{{NS}, {T}}}[24h])) or vector(0)", w=4,
             description="Oldest messages the sweeper leader dropped to keep topics within their retentionBytes."),
        stat(lay, "Subscription lag", "sum(" + per_subscription(f"max by (queue) (ignis_queue_depth{{{NS}}})") + ")",
             w=4, description="Messages the subscriptions have not taken yet (their depth; for a filtered "
                              "subscription an upper bound: it counts what its filter will pass over)."),
        stat(lay, "Most behind", "max(" + per_subscription(
            f"max by (queue) (ignis_queue_oldest_age_seconds{{{NS}}})") + ")", unit="s", w=4,
             description="Age of the oldest message a subscription has not taken yet, the worst one."),
        stat(lay, "Lost to retention (1h)", "sum(" + per_subscription(
            "sum by (queue) (increase(ignis_subscription_expired_total[1h]))") + ") or vector(0)", w=4,
             thresholds=[(None, "green"), (1, "red")],
             description="Messages that left their topic before a subscription took them (counted by the "
                         "subscriptions' consumers; increase() misses a consumer's first count, which "
                         "IgnisSubscriptionMessagesExpired does not)."),
        stat(lay, "Leader", f"sum(ignis_sweeper_leader{{{NS}}})", thresholds=[(None, "red"), (1, "green")], w=4,
             description="Sweeper processes leading (must be 1): only the leader reports topics."),
    ]
    lay.newline()
    panels += [
        timeseries(lay, "Publish rate by topic", [
            (f"sum by (topic) (rate(ignis_topic_published_total{{{T}}}{rates}))", "{{topic}}")], unit="reqps",
            description="Publishes per second, counted by the publishing processes."),
        timeseries(lay, "Retained messages by topic", [
            (f"sum by (topic) (ignis_topic_retained_messages{{{NS}, {T}}})", "{{topic}}")]),
        timeseries(lay, "Retained bytes by topic", [
            (f"sum by (topic) (ignis_topic_retained_bytes{{{NS}, {T}}})", "{{topic}}")], unit="bytes", w=8,
            description="Estimated from a sample of each shard; a topic with retentionBytes is trimmed to it once a "
                        "sweep pass."),
        timeseries(lay, "Oldest retained message by topic", [
            (f"max by (topic) (ignis_topic_oldest_age_seconds{{{NS}, {T}}})", "{{topic}}")], unit="s", w=8,
            description="Messages leave a topic retentionSeconds after their publish: a subscription whose oldest "
                        "waiting message comes near this loses messages. A gap: the topic holds nothing."),
        timeseries(lay, "Subscriptions and trims", [
            (f"sum by (topic) (ignis_topic_subscriptions{{{NS}, {T}}})", "subscriptions {{topic}}"),
            (f"sum by (topic) (increase(ignis_topic_trimmed_total{{{NS}, {T}}}[{RATE}]))", "trimmed {{topic}}")],
            w=8, description="Queues that subscribe to each topic, and the oldest messages dropped to keep it within "
                             "its retentionBytes."),
    ]

    panels.append(row(lay, "Subscriptions"))
    legend = "{{queue}} ({{topic}})"
    panels += [
        timeseries(lay, "Lag (depth) by subscription", [
            (per_subscription(f"max by (queue) (ignis_queue_depth{{{NS}}})"), legend)],
            description="Messages of its topic past a subscription's position, plus those waiting in its own main "
                        "(redeliveries): an upper bound for a filtered subscription, which will pass over some."),
        timeseries(lay, "Oldest waiting message by subscription", [
            (per_subscription(f"max by (queue) (ignis_queue_oldest_age_seconds{{{NS}}})"), legend)], unit="s",
            description="Age of the oldest message a subscription has not taken yet: what "
                        "IgnisSubscriptionOldestMessageTooOld compares with the chart's monitoring.prometheusRule."
                        "thresholds.subscriptionOldestMessageAgeSeconds. Past its topic's retentionSeconds "
                        "messages are lost. A gap: nothing waits."),
        timeseries(lay, "Lost to retention by subscription", [
            (per_subscription(f"sum by (queue) (rate(ignis_subscription_expired_total{rates}))"), legend)],
            unit="reqps", w=8,
            description="Messages per second that left their topic before the subscription took them (counted by "
                        "its consumers when they claim past them): IgnisSubscriptionMessagesExpired."),
        timeseries(lay, "Acked by subscription vs published", [
            (per_subscription(f"sum by (queue) (rate(ignis_acked_total{rates}))"), "acked " + legend),
            (f"sum by (topic) (rate(ignis_topic_published_total{{{T}}}{rates}))", "published {{topic}}")],
            unit="reqps", w=8,
            description="A subscription keeps up while its acks match what its filter selects of its topic's "
                        "publishes."),
        timeseries(lay, "In flight, sidelined and dead by subscription", [
            (per_subscription(f"max by (queue) (ignis_queue_in_flight{{{NS}}})"), "in flight " + legend),
            (per_subscription(f"max by (queue) (ignis_queue_sidelined{{{NS}}})"), "sidelined " + legend),
            (per_subscription(f"max by (queue) (ignis_queue_dead{{{NS}}})"), "dead " + legend)], w=8,
            description="A subscription is a queue: its deliveries, failures and dead letters are a queue's (the "
                        "overview dashboard's queue rows show it too, by its name)."),
    ]
    return dashboard("ignismq-topics", "IgnisMQ topics",
                     "Topics (publish rate, retained messages and bytes, oldest age, subscriptions, trims) and their "
                     "subscriptions (lag, oldest waiting message, messages lost to retention).", panels,
                     with_queue=False, with_topic=True)


# ---- IgnisMQ operator -----------------------------------------------------------------------------
def operator() -> dict[str, Any]:
    lay = Layout()
    rates = f"[{RATE}]"
    panels: list[dict[str, Any]] = [row(lay, "Operator")]
    panels += [
        stat(lay, "Queues declared", f"sum(ignis_operator_queues{{{NS}}})", w=4),
        stat(lay, "Ready", f'sum(ignis_operator_queues{{{NS}, state="Synced"}})', w=4),
        stat(lay, "Not Ready", f'sum(ignis_operator_queues{{{NS}, state!="Synced"}}) or vector(0)', w=4,
             thresholds=[(None, "green"), (1, "red")]),
        stat(lay, "Reconciles/s", f"sum(rate(ignis_operator_reconciles_total{{{NS}}}{rates}))", unit="reqps", w=4),
        stat(lay, "Failed reconciles/s", f'sum(rate(ignis_operator_reconciles_total{{{NS}, result!="Synced"}}'
             f"{rates})) or vector(0)", unit="reqps", w=4, thresholds=[(None, "green"), (0.001, "orange")]),
        stat(lay, "Drift repairs (24h)", f"sum(increase(ignis_operator_drift_repairs_total{{{NS}}}[24h]))", w=4,
             thresholds=[(None, "green"), (1, "orange")]),
    ]
    lay.newline()
    panels += [
        timeseries(lay, "Reconciles by result", [
            (f"sum by (result) (rate(ignis_operator_reconciles_total{{{NS}}}{rates}))", "{{result}}")],
            unit="reqps", stack=True),
        timeseries(lay, "Reconcile duration", [
            (f"histogram_quantile(0.5, sum by (le) (rate(ignis_operator_reconcile_duration_seconds_bucket{{{NS}}}"
             f"{rates})))", "p50"),
            (f"histogram_quantile(0.99, sum by (le) (rate(ignis_operator_reconcile_duration_seconds_bucket{{{NS}}}"
             f"{rates})))", "p99"),
            (f"sum(rate(ignis_operator_reconcile_duration_seconds_sum{{{NS}}}{rates})) / "
             f"sum(rate(ignis_operator_reconcile_duration_seconds_count{{{NS}}}{rates}))", "mean")], unit="s"),
        timeseries(lay, "Queues by state", [
            (f"sum by (state) (ignis_operator_queues{{{NS}}})", "{{state}}")], stack=True),
        timeseries(lay, "Drift repairs", [
            (f"sum(increase(ignis_operator_drift_repairs_total{{{NS}}}{rates}))", "repairs")],
            description="Queue records restored or reverted by the periodic resync (someone deleted or edited "
                        "them behind the operator's back)."),
    ]
    return dashboard("ignismq-operator", "IgnisMQ operator",
                     "The IgnisQueue operator: reconciles, their duration, queues by state, drift repairs.",
                     panels, with_queue=False)


DASHBOARDS = {"ignismq-overview": overview, "ignismq-topics": topics, "ignismq-operator": operator}


def all_panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every panel target."""
    for panel in all_panels(doc):
        for t in panel.get("targets", []):
            yield panel["title"], t["expr"]
