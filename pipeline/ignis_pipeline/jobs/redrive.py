"""`ignis pipeline redrive QUEUE --from dead|sideline [--where SQL]`: move the matching dead letters or
sidelined messages back to main, ids kept, attempts reset, each moved exactly once.

The rows are selected by Spark over a snapshot (the `ignis` format); the move happens in the tasks, per
chunk, with the library's fenced copy-then-delete (`Magazine.move_in` -> `Storage.move`): a record is
moved only if it is still in its slot with the fire time it was read with, so a record that the shovel
(or another redrive) claimed or moved meanwhile is left alone and counted as `gone`. Each chunk takes a
fresh sweeper epoch, as `ignis sideline redrive` does; a leading sweeper then re-takes a newer one, and
a chunk whose epoch went stale is retried with a new epoch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from itertools import islice
from typing import Any

from ignis.client import Ignis
from ignis.envelope import now_ms
from ignis.errors import InvalidInputError, StaleEpoch
from ignis.storage.base import SlotRef
from ignis_pipeline.jobs.export import read_queues
from ignis_pipeline.jobs.gate import gated
from ignis_pipeline.jobs.progress import spark_progress
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.session import check_store_reachable
from ignis_pipeline.slots import magazine_name
from ignis_pipeline.stores import task_store

SOURCES = ("dead", "sideline")
CHUNK = 1_000
EPOCH_RETRIES = 5


def mover(options: dict[str, str], queue: str, source: str, rate_per_task: float | None) -> Any:
    """The per-partition function of the move (picklable: it carries options, not connections)."""
    parsed = SourceOptions.parse({**options, "queue": queue})

    def move(rows: Iterator[Any]) -> Iterator[tuple[int, int]]:
        store = task_store(parsed)
        q = Ignis(store).queue(queue, allow_inactive=True)
        magazine = magazine_name(queue, source)
        started, done = time.monotonic(), 0
        moved = gone = 0
        # (Rows, not Arrow batches: mapInArrow would need pandas; a redrive moves few enough rows.)
        for chunk in batched(iter(rows), CHUNK):
            refs = [SlotRef(magazine, row.shard, row.slot) for row in chunk]
            if rate_per_task:
                done += len(refs)
                time.sleep(max(0.0, done / rate_per_task - (time.monotonic() - started)))
            n = _move_chunk(store, q, refs)
            moved += n
            gone += len(refs) - n
        yield moved, gone

    return move


def batched(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(islice(items, size)):
        yield chunk


def _move_chunk(store: Any, queue: Any, refs: list[SlotRef]) -> int:
    envelopes = store.read(refs)  # as they are now: the move is conditional on this fire time
    at = now_ms()
    moves = []
    for ref, env in zip(refs, envelopes, strict=True):
        if env is None:
            continue  # moved or expired since the snapshot
        copy = env.for_transfer(None, at)
        copy.attempts = 0  # a person asked for a fresh start
        moves.append((ref, env.fire_ts, copy))
    if not moves:
        return 0
    for attempt in range(EPOCH_RETRIES):
        try:
            return sum(queue.main.move_in(store.next_epoch(), moves))
        except StaleEpoch:
            if attempt == EPOCH_RETRIES - 1:
                raise
    return 0


def redrive(spark: Any, store: dict[str, str], queue: str, source: str, *, where: str | None = None,
            rate: float | None = None, canary: int | None = None, canary_timeout: float = 300.0) -> dict[str, Any]:
    if source not in SOURCES:
        raise InvalidInputError(f"--from {source!r}: must be dead or sideline")
    check_store_reachable(spark, store["store"])
    rows = read_queues(spark, store, [queue], source)
    if where:
        rows = rows.where(where)
    totals = {"gone": 0}

    def publish(df: Any, description: str) -> int:
        refs = df.select("shard", "slot").rdd
        at_once = max(1, min(refs.getNumPartitions(), spark.sparkContext.defaultParallelism))
        fn = mover(store, queue, source, rate / at_once if rate else None)
        with spark_progress(spark, description):
            counts = refs.mapPartitions(fn).collect()
        totals["gone"] += sum(gone for _, gone in counts)
        return sum(moved for moved, _ in counts)

    outcome = gated(rows, store, queue, canary=canary, canary_timeout=canary_timeout, publish=publish)
    return {"queue": queue, "from": source, "moved": outcome["published"], "gone": totals["gone"],
            "canary": outcome["canary"]}


if __name__ == "__main__":  # spark-submit .../jobs/redrive.py QUEUE --from dead --where "reason = 'timeout'"
    from ignis_pipeline.runner import run_job

    sys.exit(run_job("redrive", sys.argv[1:]))
