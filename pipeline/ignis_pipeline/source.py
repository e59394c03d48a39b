"""The `ignis` Spark data source (Spark 4's Python Data Source API, `pyspark.sql.datasource`).

    import ignis_pipeline
    ignis_pipeline.register(spark)                      # once per SparkSession
    df = spark.read.format("ignis").option("queue", "orders").load()
    log = spark.read.format("ignis").option("topic", "events").load()   # a topic's retained log

Spark instantiates `IgnisDataSource(options)` wherever it needs it (a Python process on the driver side
for planning, Python workers for tasks). It asks for the schema when a DataFrame is made (`load()`, for a
read and a stream), on the driver side: the options are parsed and the named queues looked up there, so
a bad option or an unknown queue (or topic) fails `load()` itself, before any query. (`DataSource.__init__` "should
not be overridden", says pyspark.sql.datasource: hence the cached property.)
Reading: reader.py; writing: writer.py; streaming: stream.py.
"""

from __future__ import annotations

import functools

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ignis_pipeline import schema, slots
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.stores import open_driver_store


class IgnisDataSource(DataSource):
    """Format `ignis`: batch read (a non-destructive snapshot), batch write (publish), streaming consume."""

    @functools.cached_property
    def parsed(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    @classmethod
    def name(cls) -> str:
        return "ignis"

    def schema(self) -> str:
        self.check()
        return schema.TOPIC_DDL if self.parsed.is_topic else schema.DDL

    def check(self) -> None:
        """The options, and that every named queue or topic exists (QueueNotFound, TopicNotFound otherwise): at
        `load()`."""
        options = self.parsed
        if options.queues or options.topics:
            store = open_driver_store(options)
            try:
                if options.topics:
                    slots.topic_shards(store, options.topics)
                else:
                    slots.queue_shards(store, options.queues)
            finally:
                store.close()

    def reader(self, schema: StructType) -> DataSourceReader:
        from ignis_pipeline.reader import IgnisReader

        return IgnisReader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ignis_pipeline.writer import IgnisWriter, TopicWriter

        if self.parsed.is_topic:
            return TopicWriter(self.parsed, schema, overwrite)
        return IgnisWriter(self.parsed, schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ignis_pipeline.stream import IgnisStreamReader

        return IgnisStreamReader(self.parsed)
