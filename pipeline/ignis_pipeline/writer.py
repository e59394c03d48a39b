"""Batch write of the `ignis` format: `df.write.format("ignis").option("queue", "orders").mode("append").save()`.

Columns: `payload` (binary or string; required), optional `id`, `key`, `headers` (map<string,string>),
`codec` (bytes | str | json: how consumers decode the payload; default bytes for binary, str for string) and
`due_at` (timestamp: a row due later is delivered no sooner, one due already at once). Option `delay`
(seconds) delays every row by that much from when its task writes it (with `due_at`: the later of the two).
The other columns of the read schema (queue, magazine, shard, slot, loaded_at, ...) are ignored, so an
export can be written back as it is; any other column is an error.

With option `topic` (TopicWriter) each row is published to the topic, its subject from a required `subject`
column (a null or bad one fails the task naming its partition and row, nothing of its chunk written); `due_at`
and `delay` are refused (a topic's messages are not delayed), and a topic read's own columns are ignored.

Spark creates the writer on the driver side (`DataSource.writer`), pickles it to every task, and calls
`write(iterator)` once per partition with Arrow record batches (pyspark.sql.datasource.DataSourceArrowWriter);
the returned WriterCommitMessage objects reach `commit` on the driver side when every task succeeded, or
`abort` when one failed. Each task publishes its rows in chunks, one group commit (`Queue.publish_each`)
per chunk, every message of a chunk checked before any is written. Publishing cannot be rolled back: a
failed job leaves what its finished chunks published (at-least-once), which is why ids are kept: a row
without an `id` gets one derived from the write job, the partition and the row, so the rows a retried
task publishes again carry the same ids and consumers can recognise them.
"""

from __future__ import annotations

import logging
import random
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType, TimestampNTZType, TimestampType

from ignis.client import Ignis
from ignis.envelope import CODEC_BYTES, CODEC_STR, due_after, now_ms
from ignis.errors import InvalidInputError
from ignis.subjects import check_subject
from ignis_pipeline import schema
from ignis_pipeline.options import SourceOptions
from ignis_pipeline.stores import open_driver_store, task_store

log = logging.getLogger(__name__)

WRITABLE = {"payload", "id", "key", "headers", "codec", "due_at"}
IGNORED = set(schema.COLUMNS) - WRITABLE


@dataclass
class PublishedMessage(WriterCommitMessage):
    """What one task published: its partition, messages and chunks (one group commit each)."""

    partition: int
    published: int
    chunks: int


def check_schema(df_schema: StructType) -> tuple[bool, list[str]]:
    """(payload is a string column, the optional columns present); a clear error for a missing or
    ill-typed column, before any task runs."""
    fields = {f.name: f.dataType for f in df_schema.fields}
    if "payload" not in fields:
        raise InvalidInputError(f"format 'ignis' needs a column 'payload' (binary or string); the DataFrame has "
                                f"{', '.join(fields) or 'no columns'}")
    if not isinstance(fields["payload"], BinaryType | StringType):
        raise InvalidInputError(f"column payload is {fields['payload'].simpleString()}: it must be binary or string "
                                "(cast it, e.g. to_json(...) for structs)")
    for name in ("id", "key", "codec"):
        if name in fields and not isinstance(fields[name], StringType):
            raise InvalidInputError(f"column {name} is {fields[name].simpleString()}: it must be string")
    if "due_at" in fields and not isinstance(fields["due_at"], TimestampType | TimestampNTZType):
        raise InvalidInputError(f"column due_at is {fields['due_at'].simpleString()}: it must be timestamp")
    headers = fields.get("headers")
    if headers is not None and not (isinstance(headers, MapType) and isinstance(headers.keyType, StringType)
                                    and isinstance(headers.valueType, StringType)):
        raise InvalidInputError(f"column headers is {headers.simpleString()}: it must be map<string,string>")
    unknown = sorted(set(fields) - WRITABLE - IGNORED)
    if unknown:
        raise InvalidInputError(f"unknown column(s) {', '.join(unknown)}: format 'ignis' writes payload, id, key, "
                                "headers, codec and due_at (drop or rename the others)")
    return isinstance(fields["payload"], StringType), [n for n in ("id", "key", "headers", "codec", "due_at")
                                                       if n in fields]


class IgnisWriter(DataSourceArrowWriter):
    """Created on the driver side: checks everything it can before any task starts."""

    def __init__(self, options: SourceOptions, df_schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidInputError("format 'ignis' only appends: a queue cannot be overwritten (publishing is "
                                    "not undoable); use mode('append')")
        self.options = options
        self.queue = options.single_queue("writing")
        self.string_payload, self.columns = check_schema(df_schema)
        store = open_driver_store(options)
        try:
            queue = Ignis(store).queue(self.queue)  # QueueNotFound / QueueInactive now, not in every task
            if options.delay_seconds is not None:
                queue.delay_seconds(options.delay_seconds)  # longer than the queue's expiry: refused now
        finally:
            store.close()
        # 48 bits of time and 16 random bits: the id prefix of this write job's generated ids.
        self.job_prefix = f"{now_ms():012x}{random.getrandbits(16):04x}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        target = self._target(task_store(self.options))
        pacer = _Pacer(self.options.rate_per_task)
        size = self.options.chunk_size
        if pacer.rate is not None:  # small chunks under a rate cap: a steady flow, not bursts
            size = min(size, max(1, int(pacer.rate / 10)))
        published = chunks = row = 0
        for batch in iterator:
            for start in range(0, batch.num_rows, size):
                chunk = batch.slice(start, size)
                columns = self._columns(chunk, partition, row)
                pacer.wait(chunk.num_rows)
                published += len(target.publish_each(**columns))
                chunks += 1
                row += chunk.num_rows
        return PublishedMessage(partition, published, chunks)

    def _target(self, store: Any) -> Any:
        """What a task publishes to (its publish_each): the queue."""
        return Ignis(store).queue(self.queue)

    def _columns(self, chunk: pa.RecordBatch, partition: int, row: int) -> dict[str, Any]:
        """The chunk as publish_each's columns, with a clear error for the first bad row."""
        payload = chunk.column("payload")
        if payload.null_count:
            bad = row + pc.index(pc.is_null(payload), True).as_py()
            raise InvalidInputError(f"partition {partition} row {bad}: payload is null (nothing of this chunk "
                                    "was written)")
        if self.string_payload:
            payload = pc.cast(payload, pa.binary())  # UTF-8 bytes, as publish encodes a str
        n = chunk.num_rows
        columns: dict[str, Any] = {"payloads": payload.to_pylist()}
        generated = self._ids(partition, row, n)
        if "id" in self.columns:
            given = chunk.column("id").to_pylist()
            columns["ids"] = [new if msg_id is None else msg_id for new, msg_id in zip(generated, given, strict=True)]
        else:
            columns["ids"] = generated
        if "codec" in self.columns:
            default = CODEC_STR if self.string_payload else CODEC_BYTES
            columns["codecs"] = [c or default for c in chunk.column("codec").to_pylist()]
        elif self.string_payload:
            columns["codecs"] = [CODEC_STR] * n
        if "key" in self.columns:
            columns["keys"] = chunk.column("key").to_pylist()
        if "headers" in self.columns:
            columns["headers"] = [None if h is None else dict(h) for h in chunk.column("headers").to_pylist()]
        if "due_at" in self.columns or self.options.delay_seconds is not None:
            columns["due"] = self._due(chunk)
        return columns

    def _due(self, chunk: pa.RecordBatch) -> list[int | None]:
        """Per row, when it is due (epoch ms; None: now): its due_at, or now + the delay option (the later)."""
        n = chunk.num_rows
        given: list[int | None] = [None] * n
        if "due_at" in self.columns:
            column = chunk.column("due_at")  # (Spark hands timestamps over in microseconds)
            per_ms = {"s": 0.001, "ms": 1, "us": 1000, "ns": 1_000_000}[column.type.unit]
            given = [None if v is None else int(v // per_ms) for v in pc.cast(column, pa.int64()).to_pylist()]
        if self.options.delay_seconds is None:
            return given
        later = due_after(self.options.delay_seconds, now_ms())  # (never due before the whole delay)
        return [later if d is None else max(d, later) for d in given]

    def _ids(self, partition: int, row: int, count: int) -> list[str]:
        """Ids of rows row..row+count-1 of this partition: job prefix, partition, row (32 hex digits). The
        row numbers' hex digits come from one pack and one hex() call, as the library's id batches do."""
        prefix = f"{self.job_prefix}{partition & 0xFFFFF:05x}"
        digits = struct.pack(f">{count}Q", *range(row, row + count)).hex()
        return [prefix + digits[at + 5:at + 16] for at in range(0, 16 * count, 16)]

    @property
    def what(self) -> str:
        return f"queue {self.queue!r}"

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, PublishedMessage)]
        log.warning("ignis write: published %d message(s) to %s in %d task(s), %d chunk(s)",
                    sum(m.published for m in done), self.what, len(done), sum(m.chunks for m in done))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, PublishedMessage)]
        log.error("ignis write to %s failed; %d task(s) had finished and published %d message(s), which "
                  "stay published (a rerun publishes them again with the same ids)", self.what, len(done),
                  sum(m.published for m in done))


TOPIC_WRITABLE = {"payload", "subject", "id", "key", "headers", "codec"}
TOPIC_IGNORED = set(schema.TOPIC_COLUMNS) - TOPIC_WRITABLE


def check_topic_schema(df_schema: StructType) -> tuple[bool, list[str]]:
    """check_schema for a topic: `subject` (string) is required too, and nothing is delayed (no due_at)."""
    fields = {f.name: f.dataType for f in df_schema.fields}
    if "subject" not in fields:
        raise InvalidInputError(f"writing to a topic needs a column 'subject' (string: what each message is about, "
                                f"e.g. 'sensors/kitchen/temp'); the DataFrame has {', '.join(fields) or 'no columns'}")
    if not isinstance(fields["subject"], StringType):
        raise InvalidInputError(f"column subject is {fields['subject'].simpleString()}: it must be string")
    if "due_at" in fields:
        raise InvalidInputError("column due_at: a topic's messages are not delayed; drop the column (or write to a "
                                "queue)")
    unknown = sorted(set(fields) - TOPIC_WRITABLE - TOPIC_IGNORED)
    if unknown:
        raise InvalidInputError(f"unknown column(s) {', '.join(unknown)}: writing to a topic takes payload, subject, "
                                "id, key, headers and codec (drop or rename the others)")
    # The checks the two have in common, on the columns a queue would take.
    queue_like = StructType([f for f in df_schema.fields if f.name in WRITABLE])
    string_payload, columns = check_schema(queue_like)
    return string_payload, columns


class TopicWriter(IgnisWriter):
    """`df.write.format("ignis").option("topic", "events")`: each row published to the topic, its subject from the
    `subject` column. Created on the driver side, as IgnisWriter: everything it can check is checked there."""

    def __init__(self, options: SourceOptions, df_schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise InvalidInputError("format 'ignis' only appends: a topic cannot be overwritten (publishing is not "
                                    "undoable); use mode('append')")
        self.options = options
        self.queue = options.single_topic("writing")  # (the name the base class's ids and messages use)
        self.string_payload, self.columns = check_topic_schema(df_schema)
        store = open_driver_store(options)
        try:
            Ignis(store).topic(self.queue)  # TopicNotFound now, not in every task
        finally:
            store.close()
        self.job_prefix = f"{now_ms():012x}{random.getrandbits(16):04x}"

    @property
    def what(self) -> str:
        return f"topic {self.queue!r}"

    def _target(self, store: Any) -> Any:
        return Ignis(store).topic(self.queue)

    def _columns(self, chunk: pa.RecordBatch, partition: int, row: int) -> dict[str, Any]:
        """The chunk as Topic.publish_each's columns: the subjects checked first, the first bad one named by its
        row (nothing of the chunk is written then, as for any bad row)."""
        subjects = chunk.column("subject").to_pylist()
        for i, subject in enumerate(subjects):
            if subject is None:
                raise InvalidInputError(f"partition {partition} row {row + i}: column subject is null (nothing of "
                                        "this chunk was written)")
            try:
                check_subject(subject)
            except InvalidInputError as exc:
                raise InvalidInputError(f"partition {partition} row {row + i}: column subject: {exc} (nothing of "
                                        "this chunk was written)") from None
        columns = super()._columns(chunk, partition, row)
        columns["subjects"] = subjects
        return columns


class _Pacer:
    """Holds a task to `rate` messages per second on average (None = no limit)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.started = time.monotonic()
        self.sent = 0

    def wait(self, count: int) -> None:
        if self.rate is None:
            return
        self.sent += count
        ahead = self.sent / self.rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)
