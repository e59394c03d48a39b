"""A topic handle: publish messages with a subject, once, whatever the number of subscriptions; and its figures.

A publish writes the message once into the topic's magazine (the store's load, as a queue's publish: one write per
message, an increment shared by many on Aerospike), with its subject; every subscription whose filter selects the
subject gets it through its own cursor (ignis.magazine.cursor). Its records expire `retentionSeconds` after their
publish; with `retentionBytes`, the sweeper's leader also drops the oldest ones once the topic holds more
(ignis.topics.retention).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ignis.envelope import (
    CODEC_BYTES,
    CODECS,
    Envelope,
    NewMessages,
    encode_payload,
    new_message_id,
    new_message_ids,
    now_ms,
)
from ignis.errors import InvalidInputError, PayloadTooLarge
from ignis.magazine import RESERVE_MAX, Magazine
from ignis.metrics import TOPIC_PUBLISHED
from ignis.storage.base import MessageRef, SlotRef, Storage
from ignis.subjects import check_subject
from ignis.topics.spec import TopicSpec

_new_tuple = tuple.__new__
MAX_ID_LENGTH, MAX_KEY_LENGTH = 128, 256
SAMPLE_PER_SHARD = 16  # records per shard, spread over what it retains, whose sizes estimate the retained bytes


@dataclass(frozen=True)
class TopicStats:
    name: str
    shards: int
    published: int  # messages ever published (the shards' load pointers)
    retained: int  # messages the topic still holds
    retained_bytes: int  # their size: the payloads and ids of a sample of each shard's retained records, scaled
    subscriptions: list[str]  # the queues that subscribe to it
    oldest_age_seconds: float | None  # age of the oldest message it retains

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


class Topic:
    """Publish to one topic. Thread-safe; cheap to share."""

    def __init__(self, store: Storage, spec: TopicSpec, *, max_payload_bytes: int = 1 << 20,
                 refresh_seconds: float = 1.0) -> None:
        self.store = store
        self.spec = spec
        self.name = spec.name
        self.max_payload_bytes = max_payload_bytes
        # The topic's magazine: loads only (no one claims from it; subscriptions read it through their cursors).
        self.log = Magazine(store, spec.name, queue=spec.name, kind="main", shards=spec.shards,
                            ttl_seconds=spec.retention_seconds, refresh_seconds=refresh_seconds)
        self._published = TOPIC_PUBLISHED.labels(spec.name)

    def _check(self, id: str | None, key: str | None, headers: Mapping[str, str] | None) -> dict[str, str] | None:
        if id is not None and (not isinstance(id, str) or not id or len(id) > MAX_ID_LENGTH):
            raise InvalidInputError(f"message id {id!r}: must be a non-empty string of at most {MAX_ID_LENGTH} "
                                    "characters")
        if key is not None and (not isinstance(key, str) or len(key) > MAX_KEY_LENGTH):
            raise InvalidInputError(f"partition key {key!r}: must be a string of at most {MAX_KEY_LENGTH} characters")
        if headers is None:
            return None
        if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in headers.items()):
            raise InvalidInputError("headers must be a mapping of str to str")
        return dict(headers) or None

    def _encode(self, payload: Any) -> tuple[bytes, str]:
        data, codec = encode_payload(payload)
        if len(data) > self.max_payload_bytes:
            raise PayloadTooLarge(len(data), self.max_payload_bytes, self.name)
        return data, codec

    def publish(self, payload: Any, *, subject: str, key: str | None = None, headers: Mapping[str, str] | None = None,
                id: str | None = None) -> MessageRef:
        """Store one message with its subject in the topic, durably (per the store's durability mode): every
        subscription whose filter selects the subject delivers it. A `key` keeps per-key order within a shard."""
        check_subject(subject)
        shared = self._check(id, key, headers)
        data, codec = self._encode(payload)
        at = now_ms()
        ref = self.log.publish_envelope(Envelope(data, id or new_message_id(at), at, codec, shared, key,
                                                 subject=subject))
        self._published.tick()
        return ref

    def publish_many(self, payloads: Iterable[Any], *, subject: str, key: str | None = None,
                     headers: Mapping[str, str] | None = None, ids: list[str] | None = None) -> list[MessageRef]:
        """Publish many payloads with one subject in one group commit; every payload is checked before anything
        is written, so a bad one leaves the topic unchanged."""
        check_subject(subject)
        shared = self._check(None, key, headers)
        encoded = [self._encode(p) for p in payloads]
        if not encoded:
            return []
        if ids is not None:
            if len(ids) != len(encoded):
                raise InvalidInputError(f"{len(ids)} ids for {len(encoded)} payloads")
            for msg_id in ids:
                self._check(msg_id, None, None)
        at = now_ms()
        data = [d for d, _ in encoded]
        codecs = None if all(c == "bytes" for _, c in encoded) else [c for _, c in encoded]
        batch = _new_tuple(NewMessages, (data, ids or (new_message_ids(len(data)) if len(data) > 1
                                                        else [new_message_id(at)]),
                                         codecs, at, shared, key, subject))
        refs = self.log.load_new(batch)
        self._published.inc(len(refs))
        return refs

    def publish_each(self, payloads: Sequence[bytes], *, subjects: Sequence[str],
                     ids: Sequence[str | None] | None = None, codecs: Sequence[str] | None = None,
                     keys: Sequence[str | None] | None = None,
                     headers: Sequence[Mapping[str, str] | None] | None = None) -> list[MessageRef]:
        """Publish already-encoded messages, each with its own subject, id, codec, key and headers (a Spark write, a
        replay), in one group commit. Columns are parallel to `payloads`; a None column or entry means "none" (a
        None id: a new one). Every message is checked before anything is written, so a bad one leaves the topic
        unchanged; an error names the message's index."""
        count = len(payloads)
        for name, column in (("subjects", subjects), ("ids", ids), ("codecs", codecs), ("keys", keys),
                             ("headers", headers)):
            if column is not None and len(column) != count:
                raise InvalidInputError(f"publish_each: {name} has {len(column)} entries for {count} payloads")
        at = now_ms()
        missing = count if ids is None else sum(msg_id is None for msg_id in ids)
        generated = iter(new_message_ids(missing) if missing > 1 else [new_message_id(at)] * missing)
        envelopes = []
        for i, data in enumerate(payloads):
            try:
                if type(data) is not bytes:
                    raise InvalidInputError(f"payload must be bytes, not {type(data).__name__}")
                if len(data) > self.max_payload_bytes:
                    raise PayloadTooLarge(len(data), self.max_payload_bytes, self.name)
                check_subject(subjects[i])
                codec = codecs[i] if codecs is not None and codecs[i] is not None else CODEC_BYTES
                if codec not in CODECS:
                    raise InvalidInputError(f"codec {codec!r}: must be one of {', '.join(CODECS)}")
                msg_id = ids[i] if ids is not None else None
                shared = self._check(msg_id, keys[i] if keys is not None else None,
                                     headers[i] if headers is not None else None)
            except PayloadTooLarge:
                raise
            except InvalidInputError as exc:
                raise InvalidInputError(f"message {i}: {exc}") from None
            envelopes.append(Envelope(data, next(generated) if msg_id is None else msg_id, at, codec, shared,
                                      keys[i] if keys is not None else None, subject=subjects[i]))
        if not envelopes:
            return []
        slots = self.log.load(envelopes)  # (placed by key, as a keyed publish: per-key order within a shard)
        self._published.inc(len(slots))
        return [MessageRef(env.msg_id, ref.magazine, ref.shard, ref.slot)
                for env, ref in zip(envelopes, slots, strict=True)]

    # ---- figures ---------------------------------------------------------------------------------------
    def survey(self) -> list[ShardSurvey]:
        """Each shard's retained span and a sample of its records' sizes (what stats() and the byte bound's trim,
        ignis.topics.retention, both need): about log2(retained) + SAMPLE_PER_SHARD reads per shard."""
        pointers = self.store.pointers(self.name, self.spec.shards)
        out = []
        for shard, p in sorted(pointers.items()):
            first = first_retained(self.store, self.name, shard, 1, p.load)
            last = last_written(self.store, self.name, shard, first, p.load)
            span = last - first + 1
            # Spread over the span, the head first (the oldest message's age): sizes may drift over a topic's life.
            n = min(span, SAMPLE_PER_SHARD)
            slots = [first + i * span // n for i in range(n)]  # (distinct: span >= n)
            refs = [SlotRef(self.name, shard, slot) for slot in slots]
            size, sampled, oldest = 0, 0, None
            for ref, envelope in zip(refs, self.store.read(refs) if refs else [], strict=True):
                sampled += 1  # (an empty slot too: the span has them, so bytes per slot stays unbiased)
                if envelope is None:
                    continue
                size += len(envelope.payload) + len(envelope.msg_id) + len(envelope.subject or "")
                if ref.slot == first:
                    oldest = envelope.loaded_at
            out.append(ShardSurvey(shard, first, last, p.load, size, sampled, oldest))
        return out

    def stats(self, subscriptions: list[str] | None = None) -> TopicStats:
        """Published and retained messages, the retained bytes (estimated from a sample), the subscriptions
        (`subscriptions`: as the caller knows them, else looked up) and the oldest retained message's age."""
        survey = self.survey()
        reserved = self.log.reserved()  # slots this handle reserved for its next publishes: no messages yet
        retained = sum(s.retained for s in survey)
        oldest = min((s.oldest_loaded_at for s in survey if s.oldest_loaded_at is not None), default=None)
        if subscriptions is None:
            subscriptions = subscriptions_of(self.store, self.name)
        return TopicStats(self.name, self.spec.shards, sum(s.load for s in survey) - reserved, retained,
                          retained_bytes(survey), sorted(subscriptions),
                          None if oldest is None else max(now_ms() - oldest, 0) / 1000)


@dataclass(frozen=True)
class ShardSurvey:
    """One topic shard as Topic.survey() found it."""

    shard: int
    first: int  # the first slot the shard still holds (last + 1 when none)
    last: int  # the last slot written (publishers' reservations after it, not written yet, left out)
    load: int  # its load pointer: the last slot allocated
    sample_bytes: int  # payload, id and subject bytes of the sampled records
    sampled: int  # slots sampled (spread over first..last; an empty one, reserved or sealed, counts 0 bytes)
    oldest_loaded_at: int | None  # publish time of the record at `first`

    @property
    def retained(self) -> int:
        """Slots from the first held to the last written."""
        return max(self.last - self.first + 1, 0)

    @property
    def bytes_per_slot(self) -> float:
        return self.sample_bytes / self.sampled if self.sampled else 0.0


def retained_bytes(survey: list[ShardSurvey]) -> int:
    """The bytes a topic holds, estimated from each shard's sample: bytes per slot times its slots."""
    return round(sum(s.bytes_per_slot * s.retained for s in survey))


def first_retained(store: Storage, topic: str, shard: int, low: int, high: int) -> int:
    """The first slot in low..high whose record the topic still holds (high + 1 when none): its records leave
    oldest first (by age, or trimmed to its byte bound), so a binary search over slots finds the edge (about log2
    of the span in batch reads). On a two-step store each probe reads a window of slots: the newest may be reserved
    and not written yet (publishers reserve up to RESERVE_MAX ahead), which is no gap of old ones. (When a shard's
    newest slots are all empty, the window cannot tell a reserved tail from gone messages, and takes them as the
    tail; last_written leaves them out of the figures.) An empty slot with messages held within a window on both
    sides of it is a hole among the retained ones (a publisher's stale reservation, sealed), not the gone head."""
    window = RESERVE_MAX + 1 if store.write_grace_ms else 1
    first = low
    while low <= high:
        mid = (low + high) // 2
        refs = [SlotRef(topic, shard, slot) for slot in range(mid, min(mid + window, high + 1))]
        held = next((ref.slot for ref, there in zip(refs, store.held(refs), strict=True) if there), None)
        if held == mid:
            high = mid - 1
        elif held is not None and window > 1 and _held_before(store, topic, shard, max(first, mid - window), mid):
            high = mid - 1  # a hole among retained messages (a sealed reservation), not the gone head: go left
        elif held is not None:  # gone at mid, held a little later: the edge is in between
            low, high = mid + 1, held - 1
            if low > high:
                return held
        elif window > 1 and refs[-1].slot >= high:  # nothing held up to the end: the newest, not written yet
            high = mid - 1
        else:  # a run of gone slots longer than any reservation: old ones
            low = refs[-1].slot + 1
    return low


def _held_before(store: Storage, topic: str, shard: int, start: int, stop: int) -> bool:
    """Whether a slot in start..stop-1 holds a message (one batch read)."""
    refs = [SlotRef(topic, shard, slot) for slot in range(start, stop)]
    return bool(refs) and any(store.held(refs))


def last_written(store: Storage, topic: str, shard: int, first: int, load: int) -> int:
    """The last slot of a shard written, from its load pointer down: on a two-step store publishers may hold the
    newest slots reserved, not written yet (up to RESERVE_MAX each), which are not messages yet. One read of that
    window; when none of it is written, the slot before it."""
    if not store.write_grace_ms or load < first:
        return load
    low = max(first, load - RESERVE_MAX)
    refs = [SlotRef(topic, shard, slot) for slot in range(low, load + 1)]
    return max((ref.slot for ref, there in zip(refs, store.held(refs), strict=True) if there), default=low - 1)


def first_published_at(store: Storage, topic: str, shard: int, low: int, high: int, at_ms: int) -> int:
    """The first slot in low..high holding a message published at or after `at_ms` (high + 1 when none), or an empty
    slot before it: publish times grow with the slot within a shard, and the slots before the first retained one are
    gone. An empty slot among the retained ones (a publisher's sealed reservation) says nothing of the time: the
    search reads on to the next message (up to RESERVE_MAX + 1 slots) and keeps the slots when it finds none, so a
    hole never makes it pass over a message it should keep."""
    low = first_retained(store, topic, shard, low, high)
    while low <= high:
        mid = (low + high) // 2
        envelope = store.read([SlotRef(topic, shard, mid)])[0]
        at = mid
        if envelope is None:
            refs = [SlotRef(topic, shard, slot) for slot in range(mid + 1, min(mid + RESERVE_MAX + 1, high) + 1)]
            envelope, at = next(((e, ref.slot) for ref, e in zip(refs, store.read(refs) if refs else [], strict=True)
                                 if e is not None), (None, mid))
        if envelope is not None and envelope.loaded_at < at_ms:
            low = at + 1  # every message up to `at` is older (and mid..at-1 are empty)
        else:
            high = mid - 1  # mid.. may hold one to keep (or a newer one is there): keep them
    return low


def subscriptions_of(store: Storage, topic: str) -> list[str]:
    """The queues (active or not) that subscribe to `topic`."""
    return [r.name for r in store.list_queues(None) if r.bins.get("subTopic") == topic]


def check_names(store: Storage, name: str, kind: str) -> None:
    """A topic and a queue of one client may not share a name (their records would share keys)."""
    clash = store.get_queue(name) if kind == "topic" else store.get_topic(name)
    if clash is not None:
        other = "queue" if kind == "topic" else "topic"
        raise InvalidInputError(f"{kind} {name!r}: a {other} of client {store.client_id!r} has that name; "
                                f"a topic and a queue may not share one")


__all__ = ["ShardSurvey", "Topic", "TopicStats", "check_names", "first_published_at", "first_retained",
           "last_written", "retained_bytes", "subscriptions_of"]
