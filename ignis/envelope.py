"""The message envelope: what a data record holds besides the payload (DESIGN §3).

Bin names are the ones every backend stores (Aerospike bins, lmdb msgpack map keys); all are at most
15 characters, the Aerospike limit.
"""

from __future__ import annotations

import json
import math
import random
import struct
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

# Bin names of a data record.
PAYLOAD = "payload"
MSG_ID = "msgId"
LOADED_AT = "loadedAt"
FIRE_TS = "fireTS"
ATTEMPTS = "attempts"
HEADERS = "headers"
REASON = "reason"
CODEC = "codec"
PARTITION_KEY = "pkey"
HISTORY = "history"
DUE_AT = "dueAt"  # a delayed message's due time, epoch ms (absent: not delayed)
SUBJECT = "subject"  # a topic message's subject (ignis.subjects; absent: a queue message)

# Payload codecs: how `payload` bytes turn back into the value that was published.
CODEC_BYTES = "bytes"
CODEC_STR = "str"
CODEC_JSON = "json"
CODECS = (CODEC_BYTES, CODEC_STR, CODEC_JSON)
# A record that did not decode as an envelope (written by another tool, or damaged): stored and moved on as
# a readable envelope whose payload is a description of the record as found, with this codec (which nothing
# decodes: it never reaches a handler) and what was wrong in the PROBLEM_HEADER header.
CODEC_UNREADABLE = "unreadable"
STORED_CODECS = (*CODECS, CODEC_UNREADABLE)
PROBLEM_HEADER = "ignis-unreadable"
UNREADABLE_REASON = "unreadable"

HISTORY_LIMIT = 20  # a dead letter keeps its last 20 failures; enough to diagnose, bounded in size


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def due_after(seconds: float, at_ms: int) -> int:
    """The due time (epoch ms) of a message to deliver `seconds` after the moment now_ms() gave as `at_ms`: counted
    from the end of that millisecond (now_ms floors), so it is never due before the whole wait has passed, and
    always after `at_ms`. (Counted from `at_ms` itself, a retry due 0.2 s after a failure came 199.92 ms after the
    start of the attempt that failed: seen.)"""
    return at_ms + 1 + math.ceil(seconds * 1000)


def new_message_id(at_ms: int | None = None) -> str:
    """Time-ordered 128-bit id: 48 bits of epoch ms (now, or `at_ms`) then 80 random bits, as 32 hex
    digits."""
    ms = time.time_ns() // 1_000_000 if at_ms is None else at_ms
    return (ms << 80 | random.getrandbits(80)).to_bytes(16, "big").hex()


def new_message_ids(count: int) -> list[str]:
    """`count` distinct ids for one batch: one time stamp and random base, then consecutive values."""
    if count >= 1 << 31:  # (never in practice: that list would not fit in memory)
        start = now_ms() << 80 | random.getrandbits(79)  # base + i never carries into the time stamp
        return ["%032x" % (start + i) for i in range(count)]
    # The time stamp and 48 random bits, then 31 random bits plus i in the last 32 bits. Those last 8
    # hex digits of every id come from one pack and one hex() call: a third cheaper than formatting
    # each id (this is a visible share of publish_many).
    prefix = "%024x" % (now_ms() << 48 | random.getrandbits(48))
    low = random.getrandbits(31)
    digits = struct.pack(f">{count}I", *range(low, low + count)).hex()
    return [prefix + digits[at:at + 8] for at in range(0, 8 * count, 8)]


def encode_payload(value: Any) -> tuple[bytes, str]:
    """bytes stay bytes; str is UTF-8; anything else is JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), CODEC_BYTES
    if isinstance(value, str):
        return value.encode("utf-8"), CODEC_STR
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"), CODEC_JSON
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"payload of type {type(value).__name__} is not bytes, str or JSON-serialisable: {exc}"
        ) from None


def decode_payload(data: bytes, codec: str) -> Any:
    if codec == CODEC_BYTES:
        return data
    if codec == CODEC_STR:
        return data.decode("utf-8")
    if codec == CODEC_JSON:
        return json.loads(data)
    if codec == CODEC_UNREADABLE:
        raise ValueError("the stored record is not an IgnisMQ message (its ignis-unreadable header says why)")
    raise ValueError(f"unknown payload codec {codec!r}")


_BIN_TYPES: tuple[tuple[str, tuple[type, ...], bool], ...] = (
    # bin, accepted types, required
    (PAYLOAD, (bytes, bytearray), True), (MSG_ID, (str,), True), (LOADED_AT, (int,), True),
    (CODEC, (str,), False), (HEADERS, (dict,), False), (PARTITION_KEY, (str,), False), (FIRE_TS, (int,), False),
    (ATTEMPTS, (int,), False), (REASON, (str,), False), (HISTORY, (list,), False), (DUE_AT, (int,), False),
    (SUBJECT, (str,), False),
)


def envelope_problem(bins: dict[str, Any]) -> str | None:
    """What keeps stored bins from being an envelope (a bin of the wrong type, a missing payload or id, an
    unknown codec, headers that are not strings), or None. (A None value counts as absent: a batch answers
    a read of a missing bin with None.)"""
    for name, types, required in _BIN_TYPES:
        value = bins.get(name)
        if value is None:
            if required:
                return f"bin {name} is missing"
            continue
        if not isinstance(value, types) or isinstance(value, bool):
            return f"bin {name} is {type(value).__name__} {_short(value)}, not {types[0].__name__}"
    if not bins.get(MSG_ID):
        return "bin msgId is empty"
    if bins.get(CODEC) is not None and bins[CODEC] not in STORED_CODECS:
        return f"bin codec is {_short(bins[CODEC])}, not one of {', '.join(CODECS)}"
    headers = bins.get(HEADERS)
    if headers and not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        return "bin headers is not a map of strings"
    return None


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(value: Any) -> Any:
    """A JSON-able picture of a stored value (bytes as text where they are, else hex)."""
    if isinstance(value, bytes | bytearray):
        try:
            return {"bytes": bytes(value).decode("utf-8")}
        except UnicodeDecodeError:
            return {"hex": bytes(value).hex()}
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_describe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)


def unreadable_envelope(problem: str, bins: dict[str, Any], where: str) -> Envelope:
    """The envelope a record that is not one is carried on as (CODEC_UNREADABLE): its payload describes the
    record as found (JSON), its PROBLEM_HEADER says what was wrong; its id, load time, fire time and attempts
    are kept where they were usable (else derived from `where`, the slot, and 0)."""
    def usable(name: str, kind: type) -> Any:
        value = bins.get(name)
        return value if isinstance(value, kind) and not isinstance(value, bool) else None

    payload = json.dumps({"problem": problem, "bins": _describe(dict(bins))}, sort_keys=True).encode()
    return Envelope(payload, usable(MSG_ID, str) or f"unreadable:{where}", usable(LOADED_AT, int) or 0,
                    codec=CODEC_UNREADABLE, headers={PROBLEM_HEADER: problem}, fire_ts=usable(FIRE_TS, int),
                    attempts=usable(ATTEMPTS, int) or 0, reason=UNREADABLE_REASON)


class Envelope:
    """One message as stored. Mutable on purpose: fire stamps it, sideline annotates it."""

    __slots__ = ("attempts", "codec", "due_at", "fire_ts", "headers", "history", "key", "loaded_at", "msg_id",
                 "payload", "reason", "subject", "version")

    def __init__(
        self,
        payload: bytes,
        msg_id: str,
        loaded_at: int,
        codec: str = CODEC_BYTES,
        headers: dict[str, str] | None = None,
        key: str | None = None,
        fire_ts: int | None = None,
        attempts: int = 0,
        reason: str | None = None,
        history: list[list[Any]] | None = None,
        due_at: int | None = None,
        subject: str | None = None,
    ) -> None:
        self.payload = payload
        self.msg_id = msg_id
        self.loaded_at = loaded_at
        self.codec = codec
        self.headers = headers
        self.key = key
        self.fire_ts = fire_ts
        self.attempts = attempts
        self.reason = reason
        self.history = history
        self.due_at = due_at
        self.subject = subject
        # The store's version of the record as claimed (Aerospike: its generation and last-update time), or None:
        # lets an ack check on the record's metadata alone that nobody wrote it since this handle claimed it.
        self.version: Any = None

    def to_bins(self) -> dict[str, Any]:
        bins = self.content_bins()
        bins[ATTEMPTS] = self.attempts
        if self.fire_ts is not None:
            bins[FIRE_TS] = self.fire_ts
        return bins

    def content_bins(self) -> dict[str, Any]:
        """Every bin but the two that fire rewrites (fireTS, attempts); optional bins only when set."""
        bins: dict[str, Any] = {PAYLOAD: self.payload, MSG_ID: self.msg_id, LOADED_AT: self.loaded_at,
                                CODEC: self.codec}
        if self.headers:
            bins[HEADERS] = self.headers
        if self.key is not None:
            bins[PARTITION_KEY] = self.key
        if self.reason is not None:
            bins[REASON] = self.reason
        if self.history:
            bins[HISTORY] = self.history
        if self.due_at is not None:
            bins[DUE_AT] = self.due_at
        if self.subject is not None:
            bins[SUBJECT] = self.subject
        return bins

    @classmethod
    def from_bins(cls, bins: dict[str, Any]) -> Envelope:
        return cls(
            bins.get(PAYLOAD) or b"",
            bins.get(MSG_ID, ""),
            bins.get(LOADED_AT, 0),
            codec=bins.get(CODEC, CODEC_BYTES),
            headers=bins.get(HEADERS),
            key=bins.get(PARTITION_KEY),
            fire_ts=bins.get(FIRE_TS),
            attempts=bins.get(ATTEMPTS, 0),
            reason=bins.get(REASON),
            history=bins.get(HISTORY),
            due_at=bins.get(DUE_AT),
            subject=bins.get(SUBJECT),
        )

    def for_transfer(self, reason: str | None, at_ms: int, attempts: int | None = None) -> Envelope:
        """A copy to load into another magazine: unfired, with the reason and the failure recorded
        (`attempts`: the deliveries to record instead of the envelope's own count)."""
        attempts = self.attempts if attempts is None else attempts
        history = list(self.history or [])
        if reason is not None:
            history.append([at_ms, reason, attempts])
            history = history[-HISTORY_LIMIT:]
        return Envelope(self.payload, self.msg_id, self.loaded_at, codec=self.codec, headers=self.headers,
                        key=self.key, attempts=attempts, reason=reason, history=history or None, due_at=self.due_at,
                        subject=self.subject)

    def decoded(self) -> Any:
        return decode_payload(self.payload, self.codec)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Envelope) and self.to_bins() == other.to_bins()

    def __repr__(self) -> str:
        return (f"Envelope(id={self.msg_id}, {len(self.payload)}B {self.codec}, attempts={self.attempts}, "
                f"fireTS={self.fire_ts}, reason={self.reason})")


class EnvelopeFields:
    """A message's fields, read from its `envelope`: what a delivered message (ignis.queue.Message) and a browsed
    one (ignis.browse.BrowsedMessage) share."""

    __slots__ = ()
    envelope: Envelope

    @property
    def id(self) -> str:
        return self.envelope.msg_id

    @property
    def data(self) -> bytes:
        """The payload bytes exactly as published."""
        return self.envelope.payload

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.envelope.headers or {})

    @property
    def key(self) -> str | None:
        return self.envelope.key

    @property
    def subject(self) -> str | None:
        """The subject it was published with to a topic (a subscription's message; None for a queue's own)."""
        return self.envelope.subject

    @property
    def attempts(self) -> int:
        """Deliveries so far."""
        return self.envelope.attempts


class NewMessages(NamedTuple):
    """Messages being published by one call, column by column: one load time, and the call's shared
    headers and partition key. A publish_many of thousands builds no per-message object before the
    store writes it (an Envelope each would cost a third of the whole publish). Build it with
    `tuple.__new__(NewMessages, (...))` on a hot path: the generated __init__ is slower."""

    payloads: Sequence[bytes]
    ids: Sequence[str]
    codecs: Sequence[str] | None  # None: every payload is bytes
    loaded_at: int
    headers: dict[str, str] | None = None
    key: str | None = None
    subject: str | None = None  # a topic publish's subject (every message of the call has it)

    def envelope(self, index: int) -> Envelope:
        """Message `index` as an Envelope (for backends that write one record object per message)."""
        codec = CODEC_BYTES if self.codecs is None else self.codecs[index]
        return Envelope(self.payloads[index], self.ids[index], self.loaded_at, codec, self.headers, self.key,
                        subject=self.subject)
