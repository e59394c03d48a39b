"""A progress line for a Spark job: tasks done of the running stages, polled from the status tracker, on
stderr (stdout stays clean for results); silent when stderr is not a terminal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

POLL_SECONDS = 0.5


@contextmanager
def spark_progress(spark: Any, description: str) -> Iterator[None]:
    console = Console(stderr=True)
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                  TimeElapsedColumn(), console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(description, total=None)

        def poll() -> None:
            while not stop.wait(POLL_SECONDS):
                done = total = 0
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                if total:
                    progress.update(task, completed=done, total=total)

        thread = threading.Thread(target=poll, name="ignis-spark-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2)
