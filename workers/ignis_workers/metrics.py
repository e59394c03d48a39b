"""Prometheus metrics of the sweeper (DESIGN §7). Dead letters reuse the core's
`ignis_dead_lettered_total`; everything here is the sweeper's own."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

SWEPT = Counter("ignis_swept", "Abandoned messages re-homed to the sideline by the sweeper",
                ["queue", "magazine"])
SWEEP_EXAMINED = Counter("ignis_sweep_examined", "Slots the sweeper examined", ["queue", "magazine"])
STAMPED = Counter("ignis_sweep_stamped", "Unfired records below the fire pointer stamped by the sweeper "
                  "(stranded writes or claims in progress)", ["queue", "magazine"])
SWEEP_FAILURES = Counter("ignis_sweep_failures", "Sweeps of one queue magazine that failed",
                         ["queue", "magazine"])
SWEEP_DURATION = Histogram("ignis_sweep_duration_seconds", "Duration of one sweep of one queue magazine",
                           ["queue", "magazine"],
                           buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300))
SHOVELLED = Counter("ignis_shovelled", "Messages moved from the sideline (or dead letters) back to main",
                    ["queue", "magazine"])
SHOVEL_FAILURES = Counter("ignis_shovel_failures", "Shovel passes of one queue that failed", ["queue"])
LEADER = Gauge("ignis_sweeper_leader", "1 while this process leads the sweeper election")
LEADER_TRANSITIONS = Counter("ignis_sweeper_leader_transitions", "Times this process won or lost leadership",
                             ["outcome"])
QUEUE_DEPTH = Gauge("ignis_queue_depth", "Unclaimed messages in the main magazine", ["queue"])
QUEUE_IN_FLIGHT = Gauge("ignis_queue_in_flight", "Delivered, unsettled messages", ["queue"])
QUEUE_SIDELINED = Gauge("ignis_queue_sidelined", "Messages waiting in the sideline", ["queue"])
QUEUE_DEAD = Gauge("ignis_queue_dead", "Messages in the dead-letter magazine", ["queue"])
SHOVEL_PASSES = Counter("ignis_shovel_passes", "Shovel passes of one queue (successful or not)", ["queue"])
SWEEP_PASSES = Counter("ignis_sweep_passes", "Sweep passes over every active queue, by outcome (ok: every "
                       "queue swept cleanly; failed: some queue or shard failed)", ["outcome"])
SWEEP_LAST_PASS = Gauge("ignis_sweep_last_pass_timestamp_seconds", "End of the leader's last sweep pass (the "
                        "moment it won the lease until its first pass ends); NaN on standbys")
SWEEP_LAST_PASS.set(float("nan"))  # every process that imports this module exports it: NaN never alerts
SWEEP_INTERVAL = Gauge("ignis_sweep_interval_seconds", "Configured time between sweep passes")
QUEUE_OLDEST_IN_FLIGHT = Gauge("ignis_queue_oldest_in_flight_seconds", "Age of the oldest delivered, unsettled "
                               "message (among the newest claims of each shard; 0 when none)", ["queue"])
QUEUE_DELAYED = Gauge("ignis_queue_delayed", "Messages published (or retried) for later and not due yet: not in "
                      "the depth", ["queue"])
# NaN, not 0, when nothing waits: an empty queue is not one whose oldest message is brand new, and NaN never
# alerts (as ignis_sweep_last_pass_timestamp_seconds on a standby), while the series still says "reported".
QUEUE_OLDEST_AGE = Gauge("ignis_queue_oldest_age_seconds", "Age of the oldest unclaimed, due message in the main "
                         "magazine, since its due time or else its publish (the head of each shard); NaN when "
                         "none waits", ["queue"])
QUEUE_SWEEP_DURATION = Gauge("ignis_queue_sweep_duration_seconds", "The queue's sweepDuration: a claim unsettled "
                             "this long is re-homed by the sweeper", ["queue"])
QUEUE_FULL = Gauge("ignis_queue_full_ratio", "How full a bounded queue (maxLength / maxBytes) is, as a ratio of its "
                   "bound (the fuller of the two; 1 = a publish is refused or drops the oldest); NaN when unbounded",
                   ["queue"])
SWEEPER_INFO = Info("ignis_sweeper", "This sweeper process: version, lease backend, candidate identity")
# Set by the leader each pass; cleared when it stops leading, so only the leader reports them.
QUEUE_GAUGES = (QUEUE_DEPTH, QUEUE_IN_FLIGHT, QUEUE_SIDELINED, QUEUE_DEAD, QUEUE_OLDEST_IN_FLIGHT, QUEUE_SWEEP_DURATION,
                QUEUE_DELAYED, QUEUE_OLDEST_AGE, QUEUE_FULL)
# A topic's figures (ignis_workers.topics), set by the leader each pass like the queues' and cleared with them.
TOPIC_PUBLISHED_MESSAGES = Gauge("ignis_topic_published_messages", "Messages ever published to the topic (its "
                                 "shards' load pointers, as the store counts them)", ["topic"])
TOPIC_RETAINED = Gauge("ignis_topic_retained_messages", "Messages the topic still holds", ["topic"])
TOPIC_RETAINED_BYTES = Gauge("ignis_topic_retained_bytes", "Bytes of payload, id and subject the topic holds "
                             "(estimated from a sample of each shard)", ["topic"])
TOPIC_SUBSCRIPTIONS = Gauge("ignis_topic_subscriptions", "Queues that subscribe to the topic", ["topic"])
TOPIC_OLDEST_AGE = Gauge("ignis_topic_oldest_age_seconds", "Age of the oldest message the topic holds; NaN when it "
                         "holds none", ["topic"])
# Which queues are subscriptions, and of which topic: an info gauge (always 1) that panels and alerts join on
# `queue` to pick the subscriptions among the queue gauges and name their topic (the "info metric" pattern:
# https://prometheus.io/docs/concepts/metric_types/ and OpenMetrics' info type).
SUBSCRIPTION_INFO = Gauge("ignis_subscription_info", "1 for every queue that subscribes to a topic, labelled with the "
                          "topic", ["queue", "topic"])
TOPIC_GAUGES = (TOPIC_PUBLISHED_MESSAGES, TOPIC_RETAINED, TOPIC_RETAINED_BYTES, TOPIC_SUBSCRIPTIONS, TOPIC_OLDEST_AGE,
                SUBSCRIPTION_INFO)
TOPIC_TRIMMED = Counter("ignis_topic_trimmed", "Oldest messages dropped from a topic to keep it within its "
                        "retentionBytes", ["topic"])
