"""PySpark pipeline over queue data: the `ignis` Spark data source (batch read, write, streaming consume)
and the export / replay / redrive / stats jobs (`ignis pipeline ...`).

    import ignis_pipeline
    ignis_pipeline.register(spark)
    spark.read.format("ignis").option("queue", "orders").load()

Nothing here imports pyspark until it is used, so `ignis --help` works without the `spark` extra.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SPARK_DEFAULT_PYTHON = "python3"  # SparkContext.pythonExec when PYSPARK_PYTHON is not set
# Read by pyspark's worker when an exception ends it (pyspark.util.handle_worker_exception): set, only
# "ExceptionType: message" goes back to Spark, no stack trace.
HIDE_TRACEBACK_ENV = "SPARK_HIDE_TRACEBACK"


def register(spark: Any, *, short_errors: bool = True) -> None:
    """Register the `ignis` format on a SparkSession.

    Spark runs a registered Python data source as a Python function of its own: its interpreter and its
    environment are taken from the session when it is registered, and apply to the source's Python
    processes only (planning on the driver side, the streaming source, the tasks in the executors), not
    to your UDFs. For the `ignis` format:

    * the interpreter is this one, `sys.executable` (it has ignis installed), when nothing else is
      configured (no PYSPARK_PYTHON, no spark.pyspark.python): Spark's default is whatever `python3` comes
      first on PATH, which is not the venv's when the venv is not activated. Set either to choose another
      (e.g. the executors' own path on a cluster);
    * `short_errors`: an error of the source (an unknown queue, a bad option) reaches Spark as its
      message alone, `ignis.errors.QueueNotFound: queue 'x' not found ...`, on the first line of what Spark
      shows, not at the end of a Python stack trace. False keeps the stack traces.

    (The source takes no pushed filters, so the session's `spark.sql.python.filterPushdown.enabled` is
    left as it is: see reader.py.)"""
    from ignis_pipeline.source import IgnisDataSource

    context = spark.sparkContext
    default_python = (context.pythonExec == SPARK_DEFAULT_PYTHON and "PYSPARK_PYTHON" not in os.environ
                      and context.getConf().get("spark.pyspark.python", None) is None)
    python, environment = context.pythonExec, dict(context.environment)
    if default_python:
        context.pythonExec = sys.executable
    if short_errors:
        context.environment[HIDE_TRACEBACK_ENV] = "1"
    try:
        spark.dataSource.register(IgnisDataSource)  # copies pythonExec and environment into its function
    finally:
        context.pythonExec = python
        context.environment.clear()
        context.environment.update(environment)


__all__ = ["register"]
