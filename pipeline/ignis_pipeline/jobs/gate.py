"""The shared shape of replay and redrive: select rows, then publish (or move) them, with `--canary N`
first publishing the first N in a stable order and stopping unless the canary passes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ignis.client import Ignis
from ignis.errors import IgnisError
from ignis_pipeline.jobs.canary import CanaryReport, CanaryWatch

ORDER = ["queue", "magazine", "shard", "slot"]  # a stable order of exported or stored messages


class CanaryFailed(IgnisError):
    """The canary's messages were not acked enough: the job stopped before the rest."""

    def __init__(self, report: CanaryReport) -> None:
        self.report = report
        super().__init__(f"stopped after the canary: {report.describe()} (at least 95% must be acked); nothing "
                         "else was published")


def rate_options(df: Any, rate: float | None, parallelism: int) -> dict[str, str]:
    """--rate N across all tasks as a per-task cap: at most min(partitions, parallelism) tasks run at once."""
    if rate is None:
        return {}
    at_once = max(1, min(df.rdd.getNumPartitions(), parallelism))
    return {"maxMessagesPerSecondPerTask": str(rate / at_once)}


def open_target(store: dict[str, str]) -> Ignis:
    return Ignis(store["store"], farm_id=store["farmId"], client_id=store["clientId"], purge_interval=0)


def gated(rows: Any, store: dict[str, str], queue: str, *, canary: int | None, canary_timeout: float,
          publish: Callable[[Any, str], int]) -> dict[str, Any]:
    """`publish(df, description) -> messages` over `rows`, behind the canary when asked for."""
    if not canary:
        return {"published": publish(rows, f"publishing to {queue}"), "canary": None}
    rows = rows.cache()
    head = rows.orderBy(*ORDER).limit(canary).cache()
    rest = rows.join(head.select(*ORDER), on=ORDER, how="left_anti")
    ids = [r.id for r in head.select("id").collect()]
    with open_target(store) as ignis:
        watch = CanaryWatch(ignis.store, queue, ignis.queue(queue, allow_inactive=True).spec.shards)
        published = publish(head, f"canary: publishing {len(ids)} to {queue}")
        report = watch.wait(ids, canary_timeout)
    if not report.passed:
        raise CanaryFailed(report)
    published += publish(rest, f"publishing the rest to {queue}")
    return {"published": published, "canary": report.as_dict()}
