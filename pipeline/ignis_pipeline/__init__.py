"""PySpark pipeline over queue data: the `ignis` Spark data source (batch read, write, streaming consume)
and the export / replay / redrive / stats jobs (`ignis pipeline ...`).

    import ignis_pipeline
    ignis_pipeline.register(spark)
    spark.read.format("ignis").option("queue", "orders").load()

Nothing here imports pyspark until it is used, so `ignis --help` works without the `spark` extra.
"""

from __future__ import annotations

from typing import Any

FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: Any) -> None:
    """Register the `ignis` format on a SparkSession, and turn on filter pushdown for Python data sources
    (Spark refuses a reader with pushFilters while `spark.sql.python.filterPushdown.enabled` is false)."""
    from ignis_pipeline.source import IgnisDataSource

    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    spark.dataSource.register(IgnisDataSource)


__all__ = ["register"]
