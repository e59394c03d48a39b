"""The `ignis` Spark data source (Spark 4's Python Data Source API, `pyspark.sql.datasource`).

    import ignis_pipeline
    ignis_pipeline.register(spark)                      # once per SparkSession
    df = spark.read.format("ignis").option("queue", "orders").load()

Spark instantiates `IgnisDataSource(options)` wherever it needs it (a Python process on the driver side
for planning, Python workers for tasks); the options are parsed and checked in `__init__`, so a bad option
fails the query before any task starts. Reading: reader.py; writing: writer.py; streaming: stream.py.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ignis_pipeline import schema
from ignis_pipeline.options import SourceOptions


class IgnisDataSource(DataSource):
    """Format `ignis`: batch read (a non-destructive snapshot), batch write (publish), streaming consume."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "ignis"

    def schema(self) -> str:
        return schema.DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from ignis_pipeline.reader import IgnisReader

        return IgnisReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ignis_pipeline.writer import IgnisWriter

        return IgnisWriter(self.parsed, schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ignis_pipeline.stream import IgnisStreamReader

        return IgnisStreamReader(self.parsed)
