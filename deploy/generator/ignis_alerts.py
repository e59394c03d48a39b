"""The IgnisMQ alert rules: one source for the chart's PrometheusRule, the plain rules file in
deploy/prometheus/ and the promtool unit tests (each alert fires on a bad series and stays quiet on a
healthy one). Annotations use only `{{ $labels.NAME }}`, so the expected annotations of a unit test
are rendered here the way Prometheus renders them.

Label conventions: component series (sweeper, operator) carry the scrape target's `namespace`;
application series (publish, ack, handler: the PodMonitor) are joined by `queue` only, because they
come from the applications' own namespaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

RUNBOOK_BASE_URL = "https://github.com/ignismq/ignismq/blob/main/docs/runbook.md"
GROUP = "ignismq"


@dataclass(frozen=True)
class Case:
    """promtool input series (series -> values notation), when to evaluate, and the alerts expected
    then (their labels besides alertname and severity); `[]` = none."""

    series: dict[str, str]
    eval_time: str
    expect: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    fires: Case
    quiet: Case

    @property
    def runbook_anchor(self) -> str:
        return self.name.lower()  # GitHub's anchor of the heading "## <name>"

    def rule(self, runbook_base: str = RUNBOOK_BASE_URL) -> dict:
        rule: dict = {"alert": self.name, "expr": self.expr}
        if self.for_ != "0m":
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description,
                               "runbook_url": f"{runbook_base}#{self.runbook_anchor}"}
        return rule


def render(template: str, labels: dict[str, str]) -> str:
    """`{{ $labels.x }}` as Prometheus renders it (a missing label is empty)."""
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


NS = 'namespace="ignis"'

# Thresholds the chart's values set (monitoring.prometheusRule.thresholds): the rules file carries each
# default in a text that helm/ignismq/templates/prometheusrule.yaml replaces with the value (tests/deploy
# render a changed value). The plain rules file in deploy/prometheus/ keeps the defaults.
OLDEST_AGE_DEFAULT_SECONDS = 900
SUBSCRIPTION_OLDEST_AGE_DEFAULT_SECONDS = 900


def oldest_age_expr(threshold_seconds: int = OLDEST_AGE_DEFAULT_SECONDS) -> str:
    # Subscriptions (queues named by ignis_subscription_info) have their own rule and threshold. Without that
    # series (no sweeper leader reporting topics) `unless` removes nothing: every queue is judged here.
    return (f"(max by (queue) (ignis_queue_oldest_age_seconds) unless on (queue) ignis_subscription_info) > "
            f"{threshold_seconds}")


def subscription_oldest_age_expr(threshold_seconds: int = SUBSCRIPTION_OLDEST_AGE_DEFAULT_SECONDS) -> str:
    # The info series is the "many" side (group_left), so the result keeps its labels, queue and topic, and a
    # queue name reported under two topics (two farms) cannot make the match fail; the value is the age (1 * age).
    # https://prometheus.io/docs/prometheus/latest/querying/operators/#many-to-one-and-one-to-many-vector-matches
    return ("max by (queue, topic) (ignis_subscription_info) * on (queue) group_left () "
            f"max by (queue) (ignis_queue_oldest_age_seconds) > {threshold_seconds}")


# values key -> (the expression for a threshold, its default). The chart's template replaces the text of each
# default expression, ending its line, with the one for the value: check_thresholds says it is there once.
THRESHOLDS = {
    "queueOldestMessageAgeSeconds": (oldest_age_expr, OLDEST_AGE_DEFAULT_SECONDS),
    "subscriptionOldestMessageAgeSeconds": (subscription_oldest_age_expr, SUBSCRIPTION_OLDEST_AGE_DEFAULT_SECONDS),
}


def check_thresholds(rules_text: str) -> None:
    """Each threshold's default expression ends exactly one line of the rules text (else the template's replace
    would change nothing, or another rule too)."""
    for key, (expr, default) in THRESHOLDS.items():
        found = rules_text.count(f"{expr(default)}\n")
        if found != 1:
            raise ValueError(f"the rules text holds the default expression of {key} {found} times, not once: "
                             "helm/ignismq/templates/prometheusrule.yaml could not set it")

SWEEPER_A = f'{NS},instance="sweeper-a:9090"'
SWEEPER_B = f'{NS},instance="sweeper-b:9090"'
OPERATOR = f'{NS},instance="operator:9090"'
INFO_A = f'ignis_sweeper_info{{{SWEEPER_A},identity="sweeper-a-1-abcdef",lease="kubernetes",version="0.1.0"}}'
INFO_B = f'ignis_sweeper_info{{{SWEEPER_B},identity="sweeper-b-1-fedcba",lease="kubernetes",version="0.1.0"}}'
INFO_OPERATOR = f"ignis_sweeper_info{{{OPERATOR}}}"  # every ignis process exports the metric, unset
SUB_INFO_BILLING = f'ignis_subscription_info{{{SWEEPER_A},queue="billing",topic="payments"}}'
SUB_INFO_AUDIT = f'ignis_subscription_info{{{SWEEPER_A},queue="audit",topic="payments"}}'

ALERTS: list[Alert] = [
    Alert(
        "IgnisSweeperNoLeader",
        '(sum by (namespace) (ignis_sweeper_leader and on (instance) ignis_sweeper_info{identity!=""}) < 1)'
        ' or absent(ignis_sweeper_info{identity!=""})',
        "2m", "critical",
        "No IgnisMQ sweeper leads in {{ $labels.namespace }}",
        "No sweeper process holds the lease (or no sweeper is scraped at all): abandoned messages are not "
        "re-homed, sidelined ones are not shovelled back, and queue gauges are not refreshed.",
        Case({f"ignis_sweeper_leader{{{SWEEPER_A}}}": "0x15", f"ignis_sweeper_leader{{{SWEEPER_B}}}": "0x15",
              INFO_A: "1x15", INFO_B: "1x15"}, "5m", [{"namespace": "ignis"}]),
        Case({f"ignis_sweeper_leader{{{SWEEPER_A}}}": "1x15", f"ignis_sweeper_leader{{{SWEEPER_B}}}": "0x15",
              f"ignis_sweeper_leader{{{OPERATOR}}}": "0x15", INFO_A: "1x15", INFO_B: "1x15",
              INFO_OPERATOR: "1x15"}, "5m"),
    ),
    Alert(
        "IgnisSweeperLeaderFlapping",
        'sum by (namespace) (increase(ignis_sweeper_leader_transitions_total{outcome="won"}[15m])) > 3',
        "0m", "warning",
        "The IgnisMQ sweeper lease changes hands often in {{ $labels.namespace }}",
        "More than 3 sweeper leadership wins in 15 minutes: leaders lose the lease before renewing it (API "
        "server latency, CPU throttling, pods restarting). Each new leader takes a new epoch and restarts "
        "its sweep.",
        Case({f'ignis_sweeper_leader_transitions_total{{{SWEEPER_A},outcome="won"}}': "0+1x20",
              f'ignis_sweeper_leader_transitions_total{{{SWEEPER_B},outcome="won"}}': "0+1x20"}, "16m",
             [{"namespace": "ignis"}]),
        Case({f'ignis_sweeper_leader_transitions_total{{{SWEEPER_A},outcome="won"}}': "1x20",
              f'ignis_sweeper_leader_transitions_total{{{SWEEPER_B},outcome="lost"}}': "1x20"}, "16m"),
    ),
    Alert(
        "IgnisSweepFailing",
        "sum by (namespace, queue) (increase(ignis_sweep_failures_total[15m])) > 0",
        "5m", "warning",
        "Sweeps of queue {{ $labels.queue }} fail",
        "The leader's sweeps of {{ $labels.queue }} keep failing (on some shard or magazine): abandoned "
        "claims of that queue stay claimed and are not redelivered.",
        Case({f'ignis_sweep_failures_total{{{SWEEPER_A},queue="orders",magazine="main"}}': "0+1x30"}, "20m",
             [{"namespace": "ignis", "queue": "orders"}]),
        Case({f'ignis_sweep_failures_total{{{SWEEPER_A},queue="orders",magazine="main"}}': "0x30"}, "20m"),
    ),
    Alert(
        "IgnisShovelFailing",
        "sum by (namespace, queue) (increase(ignis_shovel_failures_total[30m])) > 0",
        "15m", "warning",
        "Shovel passes of queue {{ $labels.queue }} fail",
        "Sidelined messages of {{ $labels.queue }} are not moved back to the main magazine for "
        "redelivery (nor dead-lettered).",
        Case({f'ignis_shovel_failures_total{{{SWEEPER_A},queue="orders"}}': "0+1x40"}, "30m",
             [{"namespace": "ignis", "queue": "orders"}]),
        Case({f'ignis_shovel_failures_total{{{SWEEPER_A},queue="orders"}}': "2x40"}, "30m"),
    ),
    Alert(
        "IgnisSweepNotRunning",
        "time() - ignis_sweep_last_pass_timestamp_seconds > 3 * ignis_sweep_interval_seconds + 60",
        "5m", "critical",
        "The IgnisMQ sweeper leader has not finished a sweep pass in three intervals",
        "The leader {{ $labels.instance }} holds the lease but its sweep pass is stuck or very slow "
        "(a hung store call, a huge backlog of abandoned claims, too few threads).",
        Case({f"ignis_sweep_last_pass_timestamp_seconds{{{SWEEPER_A}}}": "0x30",
              f"ignis_sweep_interval_seconds{{{SWEEPER_A}}}": "60x30"}, "20m",
             [{"namespace": "ignis", "instance": "sweeper-a:9090"}]),
        Case({f"ignis_sweep_last_pass_timestamp_seconds{{{SWEEPER_A}}}": "0+60x30",
              f"ignis_sweep_interval_seconds{{{SWEEPER_A}}}": "60x30",
              f"ignis_sweep_last_pass_timestamp_seconds{{{SWEEPER_B}}}": " ".join(["NaN"] * 31),  # a standby
              f"ignis_sweep_interval_seconds{{{SWEEPER_B}}}": "60x30"}, "20m"),
    ),
    Alert(
        "IgnisBacklogGrowingWithoutAcks",
        "(sum by (queue) (delta(ignis_queue_depth[15m])) > 0) and on (queue) (sum by (queue) (ignis_queue_depth) > 0)"
        " unless on (queue) (sum by (queue) (rate(ignis_acked_total[15m])) > 0)",
        "15m", "critical",
        "Queue {{ $labels.queue }} grows and nothing is acked",
        "Messages of {{ $labels.queue }} pile up and no consumer has acknowledged any for 15 minutes: "
        "consumers are down, stuck, or failing every message.",
        Case({'ignis_queue_depth{namespace="ignis",queue="orders"}': "0+10x60"}, "40m", [{"queue": "orders"}]),
        Case({'ignis_queue_depth{namespace="ignis",queue="orders"}': "0+10x60",
              'ignis_acked_total{namespace="shop",queue="orders"}': "0+5x60"}, "40m"),
    ),
    Alert(
        "IgnisQueueNearlyFull",
        "max by (queue) (ignis_queue_full_ratio) > 0.9",
        "5m", "warning",
        "Bounded queue {{ $labels.queue }} is over 90% full",
        "{{ $labels.queue }} holds over 90% of its maxLength / maxBytes: at 100% a publish is refused "
        "(overflow rejectPublish: QueueFull) or drops the oldest waiting messages to the dead letters (dropHead). "
        "Consumers are not keeping up, or the bound is too small.",
        Case({'ignis_queue_full_ratio{namespace="ignis",queue="orders"}': "0.5+0.01x60"}, "60m", [{"queue": "orders"}]),
        Case({'ignis_queue_full_ratio{namespace="ignis",queue="orders"}': "0.5x60",
              'ignis_queue_full_ratio{namespace="ignis",queue="events"}': " ".join(["NaN"] * 61)}, "60m"),
    ),
    Alert(
        "IgnisPublishesRejected",
        "sum by (queue) (rate(ignis_publish_rejected_total[5m])) > 0",
        "5m", "warning",
        "Bounded queue {{ $labels.queue }} refuses publishes",
        "{{ $labels.queue }} is full (maxLength / maxBytes, overflow rejectPublish) and has refused publishes "
        "for 5 minutes: their publishers got QueueFull and nothing of those messages was stored.",
        Case({'ignis_publish_rejected_total{namespace="shop",queue="orders"}': "0+3x30"}, "20m",
             [{"queue": "orders"}]),
        Case({'ignis_publish_rejected_total{namespace="shop",queue="orders"}': "7x30"}, "20m"),
    ),
    Alert(
        "IgnisInFlightOlderThanSweepDuration",
        "max by (queue) (ignis_queue_oldest_in_flight_seconds) > on (queue) (max by (queue) "
        "(ignis_queue_sweep_duration_seconds) + 2 * scalar(max(ignis_sweep_interval_seconds)))",
        "10m", "warning",
        "A delivered message of {{ $labels.queue }} is unsettled for longer than its sweepDuration",
        "The oldest in-flight message of {{ $labels.queue }} was claimed longer ago than the queue's "
        "sweepDuration plus two sweep intervals: the sweeper should have re-homed it and has not.",
        Case({'ignis_queue_oldest_in_flight_seconds{namespace="ignis",queue="orders"}': "1500+60x30",
              'ignis_queue_sweep_duration_seconds{namespace="ignis",queue="orders"}': "1200x30",
              f"ignis_sweep_interval_seconds{{{SWEEPER_A}}}": "60x30"}, "20m", [{"queue": "orders"}]),
        Case({'ignis_queue_oldest_in_flight_seconds{namespace="ignis",queue="orders"}': "30x30",
              'ignis_queue_sweep_duration_seconds{namespace="ignis",queue="orders"}': "1200x30",
              f"ignis_sweep_interval_seconds{{{SWEEPER_A}}}": "60x30"}, "20m"),
    ),
    Alert(
        "IgnisQueueOldestMessageTooOld",
        oldest_age_expr(),
        "5m", "warning",
        "The oldest message waiting in {{ $labels.queue }} is older than the alert's threshold",
        "A message of {{ $labels.queue }} has waited longer than the threshold (the chart's "
        f"monitoring.prometheusRule.thresholds.queueOldestMessageAgeSeconds, {OLDEST_AGE_DEFAULT_SECONDS} s unless "
        "set) to be delivered: consumers are down, too few or too slow for the publish rate, or failing every "
        "message they get.",
        # A subscription as far behind is left to IgnisSubscriptionOldestMessageTooOld.
        Case({'ignis_queue_oldest_age_seconds{namespace="ignis",queue="orders"}': "600+60x30",
              'ignis_queue_oldest_age_seconds{namespace="ignis",queue="billing"}': "600+60x30",
              SUB_INFO_BILLING: "1x30"}, "20m",
             [{"queue": "orders"}]),
        # A queue keeping up, and an empty one: NaN (nothing waits) never alerts.
        Case({'ignis_queue_oldest_age_seconds{namespace="ignis",queue="orders"}': "5x30",
              'ignis_queue_oldest_age_seconds{namespace="ignis",queue="audit"}': " ".join(["NaN"] * 31)}, "20m"),
    ),
    Alert(
        "IgnisSubscriptionOldestMessageTooOld",
        subscription_oldest_age_expr(),
        "5m", "warning",
        "Subscription {{ $labels.queue }} of topic {{ $labels.topic }} falls behind",
        "The oldest message of topic {{ $labels.topic }} that subscription {{ $labels.queue }} has not taken yet "
        "is older than the threshold (the chart's monitoring.prometheusRule.thresholds."
        f"subscriptionOldestMessageAgeSeconds, {SUBSCRIPTION_OLDEST_AGE_DEFAULT_SECONDS} s unless set): its "
        "consumers are down, too few or too slow for the topic's publish rate. Once its lag reaches the topic's "
        "retentionSeconds it loses messages (IgnisSubscriptionMessagesExpired).",
        # A plain queue as far behind is IgnisQueueOldestMessageTooOld's.
        Case({'ignis_queue_oldest_age_seconds{namespace="ignis",queue="billing"}': "600+60x30",
              'ignis_queue_oldest_age_seconds{namespace="ignis",queue="orders"}': "600+60x30",
              SUB_INFO_BILLING: "1x30"}, "20m",
             [{"queue": "billing", "topic": "payments"}]),
        # A subscription keeping up, and one with nothing waiting (NaN).
        Case({'ignis_queue_oldest_age_seconds{namespace="ignis",queue="billing"}': "5x30",
              'ignis_queue_oldest_age_seconds{namespace="ignis",queue="audit"}': " ".join(["NaN"] * 31),
              SUB_INFO_BILLING: "1x30", SUB_INFO_AUDIT: "1x30"}, "20m"),
    ),
    Alert(
        "IgnisSubscriptionMessagesExpired",
        # A counter series is exported from its first increment on (FastCounter leaves out zeros), and increase()
        # cannot count a series' first sample: a consumer that loses messages on its first claims (it was down
        # past the retention) shows a new series already above 0. The `unless ... offset` term catches those:
        # series present now and absent 10 minutes ago.
        # https://prometheus.io/docs/practices/instrumentation/#avoid-missing-metrics
        "sum by (queue) (increase(ignis_subscription_expired_total[10m])) > 0 or sum by (queue) "
        "(ignis_subscription_expired_total unless ignis_subscription_expired_total offset 10m) > 0",
        "0m", "critical",
        "Subscription {{ $labels.queue }} lost messages to its topic's retention",
        "Messages of its topic left it (retentionSeconds after their publish, or trimmed to retentionBytes) "
        "before subscription {{ $labels.queue }} took them: they are gone for it, never delivered. Its "
        "consumers are behind by more than the topic keeps.",
        # Counted again and again; and a consumer that started, claimed and found 40 messages gone at once.
        Case({'ignis_subscription_expired_total{namespace="shop",pod="billing-0",queue="billing"}': "0+3x20",
              'ignis_subscription_expired_total{namespace="shop",pod="audit-1",queue="audit"}': "_x10 40x10"},
             "15m", [{"queue": "billing"}, {"queue": "audit"}]),
        # Messages lost long ago: the count stays where it was.
        Case({'ignis_subscription_expired_total{namespace="shop",pod="billing-0",queue="billing"}': "40x30"},
             "20m"),
    ),
    Alert(
        "IgnisSidelineGrowing",
        "(sum by (queue) (delta(ignis_queue_sidelined[30m])) > 0) and on (queue) (sum by (queue) "
        "(ignis_queue_sidelined) > 0)",
        "30m", "warning",
        "The sideline of {{ $labels.queue }} keeps growing",
        "Failed messages of {{ $labels.queue }} accumulate in its sideline faster than the shovel brings "
        "them back: handlers reject or raise on them.",
        Case({'ignis_queue_sidelined{namespace="ignis",queue="orders"}': "0+5x90"}, "70m", [{"queue": "orders"}]),
        Case({'ignis_queue_sidelined{namespace="ignis",queue="orders"}': "50x90"}, "70m"),
    ),
    Alert(
        "IgnisDeadLettersArriving",
        "sum by (queue, reason) (increase(ignis_dead_lettered_total[10m])) > 0",
        "0m", "warning",
        "Messages of {{ $labels.queue }} are dead-lettered ({{ $labels.reason }})",
        "Messages of {{ $labels.queue }} failed maxDeliveries times and went to {{ $labels.queue }}_DEAD "
        "(last reason: {{ $labels.reason }}). They are kept, not retried.",
        Case({'ignis_dead_lettered_total{namespace="shop",queue="orders",reason="exception"}': "0+1x20"}, "15m",
             [{"queue": "orders", "reason": "exception"}]),
        Case({'ignis_dead_lettered_total{namespace="shop",queue="orders",reason="exception"}': "3x20"}, "15m"),
    ),
    Alert(
        "IgnisStorageRetriesHigh",
        "sum by (namespace, operation) (rate(ignis_storage_retries_total[5m])) / sum by (namespace, operation) "
        "(rate(ignis_storage_calls_total[5m])) > 0.05",
        "10m", "warning",
        "Storage calls {{ $labels.operation }} are retried often in {{ $labels.namespace }}",
        "More than 5% of the Aerospike calls {{ $labels.operation }} needed a retry (timeouts, cluster "
        "changes, hot keys): latency grows and an outage may follow.",
        Case({f'ignis_storage_calls_total{{{SWEEPER_A},operation="claim"}}': "0+100x30",
              f'ignis_storage_retries_total{{{SWEEPER_A},operation="claim"}}': "0+20x30"}, "20m",
             [{"namespace": "ignis", "operation": "claim"}]),
        Case({f'ignis_storage_calls_total{{{SWEEPER_A},operation="claim"}}': "0+100x30",
              f'ignis_storage_retries_total{{{SWEEPER_A},operation="claim"}}': "0+1x30"}, "20m"),
    ),
    Alert(
        "IgnisStorageErrors",
        "sum by (namespace, operation) (rate(ignis_storage_errors_total[5m])) > 0",
        "5m", "critical",
        "Storage calls {{ $labels.operation }} fail in {{ $labels.namespace }}",
        "Aerospike calls {{ $labels.operation }} fail even after their retries: the store is unreachable, "
        "overloaded or refusing writes.",
        Case({f'ignis_storage_errors_total{{{SWEEPER_A},operation="get_queue"}}': "0+3x30"}, "20m",
             [{"namespace": "ignis", "operation": "get_queue"}]),
        Case({f'ignis_storage_errors_total{{{SWEEPER_A},operation="get_queue"}}': "2x30"}, "20m"),
    ),
    Alert(
        "IgnisOperatorReconcileFailures",
        'sum by (namespace, result) (rate(ignis_operator_reconciles_total{result!="Synced"}[10m])) > 0',
        "15m", "warning",
        "IgnisQueue reconciles fail with {{ $labels.result }} in {{ $labels.namespace }}",
        "The operator keeps failing to sync IgnisQueue objects into queue records (result "
        "{{ $labels.result }}). `kubectl get iq -A` shows which ones; their Events say why.",
        Case({f'ignis_operator_reconciles_total{{{OPERATOR},result="StoreUnavailable"}}': "0+2x40"}, "30m",
             [{"namespace": "ignis", "result": "StoreUnavailable"}]),
        Case({f'ignis_operator_reconciles_total{{{OPERATOR},result="Synced"}}': "0+5x40",
              f'ignis_operator_reconciles_total{{{OPERATOR},result="StoreUnavailable"}}': "1x40"}, "30m"),
    ),
    Alert(
        "IgnisQueueNotReady",
        'sum by (namespace, state) (ignis_operator_queues{state!="Synced"}) > 0',
        "10m", "warning",
        "IgnisQueues are not Ready ({{ $labels.state }})",
        "Some declared queues have been Ready=False with reason {{ $labels.state }} for 10 minutes: their "
        "records are missing or stale, so producers and consumers may fail with QueueNotFound.",
        Case({f'ignis_operator_queues{{{OPERATOR},state="InvalidSpec"}}': "1x30",
              f'ignis_operator_queues{{{OPERATOR},state="Synced"}}': "4x30"}, "20m",
             [{"namespace": "ignis", "state": "InvalidSpec"}]),
        Case({f'ignis_operator_queues{{{OPERATOR},state="InvalidSpec"}}': "0x30",
              f'ignis_operator_queues{{{OPERATOR},state="Synced"}}': "4x30"}, "20m"),
    ),
    Alert(
        "IgnisStoreRollback",
        "sum by (queue, magazine) (increase(ignis_store_rollbacks_total[15m])) > 0",
        "0m", "critical",
        "The store lost acknowledged writes ({{ $labels.queue }} {{ $labels.magazine }})",
        "A process saw a pointer of {{ $labels.queue }} ({{ $labels.magazine }}) go back: Aerospike lost writes "
        "it had acknowledged (a node crashed before its flush, or a namespace without replication lost a "
        "node). IgnisMQ moved past the lost slots, so none is given twice, but messages published in that "
        "window may be gone.",
        Case({'ignis_store_rollbacks_total{namespace="shop",queue="orders",magazine="main"}': "0 0 1 1 1 1"},
             "5m", [{"queue": "orders", "magazine": "main"}]),
        Case({'ignis_store_rollbacks_total{namespace="shop",queue="orders",magazine="main"}': "0x30"}, "20m"),
    ),
    Alert(
        "IgnisHoleBudgetExhausted",
        "sum by (queue) (increase(ignis_hole_budget_exhausted_total[10m])) > 0",
        "0m", "warning",
        "Consumers of {{ $labels.queue }} gave up after skipping their hole budget",
        "Fire calls on {{ $labels.queue }} skipped IGNIS_HOLE_BUDGET empty slots in a row and returned "
        "nothing: many publishes failed between allocating a slot and writing it, or messages expired "
        "unread.",
        Case({'ignis_hole_budget_exhausted_total{namespace="shop",queue="orders"}': "0+1x20"}, "15m",
             [{"queue": "orders"}]),
        Case({'ignis_hole_budget_exhausted_total{namespace="shop",queue="orders"}': "0x20"}, "15m"),
    ),
]


def rule_groups(runbook_base: str = RUNBOOK_BASE_URL) -> dict:
    """The `groups:` document (a rules file; also a PrometheusRule's spec)."""
    return {"groups": [{"name": GROUP, "rules": [a.rule(runbook_base) for a in ALERTS]}]}


def unit_tests(rules_file: str) -> dict:
    """promtool test rules input: per alert, a firing case and a quiet case."""
    tests = []
    for alert in ALERTS:
        for case in (alert.fires, alert.quiet):
            expected = []
            for labels in case.expect:
                all_labels = {**labels, "severity": alert.severity}
                expected.append({"exp_labels": all_labels, "exp_annotations": {
                    "summary": render(alert.summary, all_labels),
                    "description": render(alert.description, all_labels),
                    "runbook_url": f"{RUNBOOK_BASE_URL}#{alert.runbook_anchor}"}})
            tests.append({
                "name": f"{alert.name} {'fires' if case.expect else 'stays quiet'}",
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
                "alert_rule_test": [{"eval_time": case.eval_time, "alertname": alert.name,
                                     "exp_alerts": expected}],
            })
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}
