"""The schema of the `ignis` data source (stable; documented in the README) and the conversion of stored
records into Arrow record batches.

| column | type | meaning |
|---|---|---|
| queue | string | queue name |
| magazine | string | main, sideline or dead |
| shard, slot | int, bigint | where the record is stored |
| id | string | message id |
| payload | binary | payload bytes exactly as published |
| codec | string | bytes, str or json: how `payload` decodes |
| key | string | partition key (null when none) |
| headers | map<string,string> | headers (null when none) |
| loaded_at | timestamp | publish time |
| fired_at | timestamp | last claim time (null if never fired) |
| attempts | int | deliveries so far |
| reason | string | why it left main (sideline and dead) |
| history | array<struct<reason,at,attempt>> | failures so far, oldest first |
| due_at | timestamp | when a delayed (or retried) message became due (null when it was not delayed) |

A topic's retained log (option `topic`) has a table of its own, `TOPIC_DDL`, with Kafka's columns in IgnisMQ's
words (Kafka's: topic, partition, offset, key, value, headers, timestamp):

| column | type | meaning |
|---|---|---|
| topic | string | topic name |
| shard, offset | int, bigint | where the message is stored: its shard and its slot (grows with publish time) |
| subject | string | what the message is about (`sensors/kitchen/temp`) |
| id | string | message id |
| payload | binary | payload bytes exactly as published |
| codec | string | bytes, str or json: how `payload` decodes |
| key | string | partition key (null when none) |
| headers | map<string,string> | headers (null when none) |
| published_at | timestamp | publish time |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ignis.envelope import Envelope

DDL = ("queue string, magazine string, shard int, slot bigint, id string, payload binary, codec string, "
       "key string, headers map<string,string>, loaded_at timestamp, fired_at timestamp, attempts int, "
       "reason string, history array<struct<reason:string,at:timestamp,attempt:int>>, due_at timestamp")

# Spark takes timestamps from Arrow as microseconds in UTC.
_TS = pa.timestamp("us", tz="UTC")
_HISTORY = pa.struct([("reason", pa.string()), ("at", _TS), ("attempt", pa.int32())])
ARROW_SCHEMA = pa.schema([
    ("queue", pa.string()), ("magazine", pa.string()), ("shard", pa.int32()), ("slot", pa.int64()),
    ("id", pa.string()), ("payload", pa.binary()), ("codec", pa.string()), ("key", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())), ("loaded_at", _TS), ("fired_at", _TS),
    ("attempts", pa.int32()), ("reason", pa.string()), ("history", pa.list_(_HISTORY)), ("due_at", _TS),
])
COLUMNS = tuple(ARROW_SCHEMA.names)


TOPIC_DDL = ("topic string, shard int, offset bigint, subject string, id string, payload binary, codec string, "
             "key string, headers map<string,string>, published_at timestamp")
TOPIC_ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("shard", pa.int32()), ("offset", pa.int64()), ("subject", pa.string()),
    ("id", pa.string()), ("payload", pa.binary()), ("codec", pa.string()), ("key", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())), ("published_at", _TS),
])
TOPIC_COLUMNS = tuple(TOPIC_ARROW_SCHEMA.names)


def _history(entries: list[list[Any]] | None) -> list[dict[str, Any]] | None:
    # Stored as [at_ms, reason, attempts] (Envelope.for_transfer).
    if not entries:
        return None
    return [{"reason": reason, "at": at * 1000, "attempt": attempt} for at, reason, attempt in entries]


def _optional(values: list[Any], kind: pa.DataType) -> pa.Array:
    # Most messages have no key, headers, reason or history: an all-null column is built without a
    # conversion pass over the values.
    return pa.nulls(len(values), kind) if values.count(None) == len(values) else pa.array(values, kind)


def to_batch(queue: str, magazine: str, shard: int, records: Sequence[tuple[Any, Envelope]]) -> pa.RecordBatch:
    """One Arrow batch of (SlotRef, Envelope) pairs of one shard of one magazine."""
    envelopes = [env for _, env in records]
    n = len(envelopes)
    columns = [
        pa.array([queue] * n, pa.string()),
        pa.array([magazine] * n, pa.string()),
        pa.array([shard] * n, pa.int32()),
        pa.array([ref[2] for ref, _ in records], pa.int64()),
        pa.array([e.msg_id for e in envelopes], pa.string()),
        pa.array([e.payload for e in envelopes], pa.binary()),
        pa.array([e.codec for e in envelopes], pa.string()),
        _optional([e.key for e in envelopes], pa.string()),
        _optional([None if not e.headers else list(e.headers.items()) for e in envelopes],
                  ARROW_SCHEMA.field("headers").type),
        pa.array([e.loaded_at * 1000 for e in envelopes], _TS),
        pa.array([None if e.fire_ts is None else e.fire_ts * 1000 for e in envelopes], _TS),
        pa.array([e.attempts for e in envelopes], pa.int32()),
        _optional([e.reason for e in envelopes], pa.string()),
        _optional([_history(e.history) for e in envelopes], ARROW_SCHEMA.field("history").type),
        _optional([None if e.due_at is None else e.due_at * 1000 for e in envelopes], _TS),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def in_window(records: list[tuple[Any, Envelope]], since: int | None, until: int | None
              ) -> list[tuple[Any, Envelope]]:
    """The records whose load time is within [since, until] (ms, either bound optional)."""
    if since is None and until is None:
        return records
    low = since if since is not None else -(1 << 62)
    high = until if until is not None else 1 << 62
    return [r for r in records if low <= r[1].loaded_at <= high]


def topic_batch(topic: str, shard: int, records: Sequence[tuple[Any, Envelope]]) -> pa.RecordBatch:
    """One Arrow batch of (SlotRef, Envelope) pairs of one shard of a topic."""
    envelopes = [env for _, env in records]
    n = len(envelopes)
    columns = [
        pa.array([topic] * n, pa.string()),
        pa.array([shard] * n, pa.int32()),
        pa.array([ref[2] for ref, _ in records], pa.int64()),
        pa.array([e.subject for e in envelopes], pa.string()),
        pa.array([e.msg_id for e in envelopes], pa.string()),
        pa.array([e.payload for e in envelopes], pa.binary()),
        pa.array([e.codec for e in envelopes], pa.string()),
        _optional([e.key for e in envelopes], pa.string()),
        _optional([None if not e.headers else list(e.headers.items()) for e in envelopes],
                  TOPIC_ARROW_SCHEMA.field("headers").type),
        pa.array([e.loaded_at * 1000 for e in envelopes], _TS),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=TOPIC_ARROW_SCHEMA)


def in_topic_window(records: list[tuple[Any, Envelope]], starting: int | None, ending: int | None,
                    only: Any = None) -> list[tuple[Any, Envelope]]:
    """The records published in [starting, ending) (ms, either bound optional; Spark's Kafka source's
    startingTimestamp is inclusive, its endingTimestamp exclusive) whose subject `only` (a SubjectFilter, None:
    every subject) selects."""
    if starting is None and ending is None and only is None:
        return records
    low = starting if starting is not None else -(1 << 62)
    high = ending if ending is not None else 1 << 62
    matches = None if only is None or only.matches_all else only.matches
    return [r for r in records if low <= r[1].loaded_at < high and (matches is None or matches(r[1].subject))]
