"""Prometheus metrics of the core library (DESIGN §7): base units, counters end in `_total`,
bounded labels only (queue, magazine, reason, outcome, operation)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PUBLISHED = Counter("ignis_published", "Messages published", ["queue"])
DELIVERED = Counter("ignis_delivered", "Messages fired to a consumer", ["queue"])
ACKED = Counter("ignis_acked", "Messages acknowledged (deleted after success)", ["queue"])
SIDELINED = Counter("ignis_sidelined", "Messages moved to the sideline, by reason", ["queue", "reason"])
DEAD_LETTERED = Counter("ignis_dead_lettered", "Messages moved to the dead-letter magazine", ["queue", "reason"])
IGNORED = Counter("ignis_ignored", "Messages deleted because the handler raised an ignorable exception",
                  ["queue"])
SIDELINE_REFUSED = Counter("ignis_sideline_refused",
                           "Failed messages left in place because the copy to the sideline failed", ["queue"])
HOLES_SKIPPED = Counter("ignis_holes_skipped", "Claimed slots with no record (failed or expired writes)",
                        ["queue", "magazine"])
HOLE_BUDGET_EXHAUSTED = Counter("ignis_hole_budget_exhausted",
                                "Fire calls that gave up after skipping their hole budget", ["queue"])
FIRE_CLAIMS = Counter("ignis_fire_claims", "Claim attempts by outcome (won, drained)", ["queue", "outcome"])
STORAGE_CALLS = Counter("ignis_storage_calls", "Storage round trips by operation", ["operation"])
STORAGE_RETRIES = Counter("ignis_storage_retries", "Storage retries by operation", ["operation"])
HANDLER_DURATION = Histogram("ignis_handler_duration_seconds", "Handler call duration",
                             ["queue", "outcome"])
BATCH_SIZE = Histogram("ignis_handler_batch_size", "Messages per handler call on batching queues", ["queue"],
                       buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 20000, 200000))
