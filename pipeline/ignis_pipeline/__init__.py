"""PySpark pipeline over queue data: the `ignis` Spark data source (batch read, write, streaming consume)
and the export / replay / redrive / stats jobs (`ignis pipeline ...`).

    import ignis_pipeline
    ignis_pipeline.register(spark)
    spark.read.format("ignis").option("queue", "orders").load()

Nothing here imports pyspark until it is used, so `ignis --help` works without the `spark` extra.
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `ignis` format on a SparkSession. (The source takes no pushed filters, so the session's
    `spark.sql.python.filterPushdown.enabled` is left as it is: see reader.py.)"""
    from ignis_pipeline.source import IgnisDataSource

    spark.dataSource.register(IgnisDataSource)


__all__ = ["register"]
