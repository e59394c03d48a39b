"""The publish half of a queue handle (`Queue.publish`, `publish_many`, `publish_each`, delayed publishes): options
checked and payloads encoded before anything is written, one group commit per call where the store can, delayed
messages kept apart until due (ignis.delay), and the `send` span when tracing is on (ignis.tracing). A mixin of
`Queue` (ignis.queue), which holds the state it uses."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ignis import names, tracing
from ignis.delay import wake_mover
from ignis.envelope import (
    CODEC_BYTES,
    CODECS,
    Envelope,
    NewMessages,
    due_after,
    encode_payload,
    new_message_id,
    new_message_ids,
    now_ms,
)
from ignis.errors import InvalidInputError, PayloadTooLarge, QueueFull
from ignis.metrics import DELAYED_PUBLISHED
from ignis.spec import QueueSpec
from ignis.storage.base import MessageRef, Storage

if TYPE_CHECKING:
    from ignis.magazine import Magazine

MAX_ID_LENGTH = 128
MAX_KEY_LENGTH = 256
_new_tuple = tuple.__new__  # builds NewMessages without the NamedTuple's slower generated __init__
_time_ns = time.time_ns


class QueuePublishing:
    """Publishes into a queue (a mixin of Queue)."""

    # Set by Queue.__init__.
    store: Storage
    spec: QueueSpec
    name: str
    max_payload_bytes: int
    main: Magazine
    _published: Any
    _published_tick: Any

    def _check_options(self, id: str | None, key: str | None, headers: Mapping[str, str] | None
                       ) -> dict[str, str] | None:
        if id is not None and (not isinstance(id, str) or not id or len(id) > MAX_ID_LENGTH):
            raise InvalidInputError(f"message id {id!r}: must be a non-empty string of at most "
                                    f"{MAX_ID_LENGTH} characters")
        if key is not None and (not isinstance(key, str) or len(key) > MAX_KEY_LENGTH):
            raise InvalidInputError(f"partition key {key!r}: must be a string of at most {MAX_KEY_LENGTH} "
                                    "characters")
        if headers is None:
            return None
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise InvalidInputError("headers must be a mapping of str to str")
        return dict(headers) or None

    def _encode(self, payload: Any) -> tuple[bytes, str]:
        data, codec = encode_payload(payload)
        if len(data) > self.max_payload_bytes:
            raise PayloadTooLarge(len(data), self.max_payload_bytes, self.name)
        return data, codec

    def envelope(self, payload: Any, *, id: str | None = None, key: str | None = None,
                 headers: Mapping[str, str] | None = None) -> Envelope:
        """Validate and wrap one payload (no I/O)."""
        headers = self._check_options(id, key, headers)
        data, codec = self._encode(payload)
        return Envelope(data, id or new_message_id(), now_ms(), codec=codec, headers=headers, key=key)

    def delay_seconds(self, delay: float | timedelta) -> float:
        """`delay` (seconds or a timedelta) as seconds. Raises InvalidInputError for one that is negative, not a
        number, or longer than the queue's messageExpirySeconds (the message would expire before it is due)."""
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
                or seconds < 0:
            raise InvalidInputError(f"delay {delay!r}: must be a number of seconds >= 0 or a timedelta")
        expiry = self.spec.message_expiry_seconds
        if expiry > 0 and seconds > expiry:
            raise InvalidInputError(f"delay {seconds:g} s is longer than queue {self.name}'s messageExpirySeconds "
                                    f"{expiry}: the message would expire before it is due")
        return float(seconds)

    def due_at(self, delay: float | timedelta | None, at: int | None = None) -> int | None:
        """The due time (epoch ms) of a message published at `at` (now) with `delay`; None for no delay."""
        if delay is None:
            return None
        seconds = self.delay_seconds(delay)
        return None if seconds == 0 else due_after(seconds, now_ms() if at is None else at)

    def _publish_delayed(self, envelopes: list[Envelope], due: int | None = None) -> list[MessageRef]:
        """Store messages for later (ignis.delay), each due at `due` or its own due_at; their refs name the
        `{queue}_DELAYED` records, slot = the due time."""
        if due is not None:
            for env in envelopes:
                env.due_at = due
        self.store.load_delayed(self.name, envelopes, self.spec.message_expiry_seconds)
        self._published.inc(len(envelopes))
        DELAYED_PUBLISHED.labels(self.name).inc(len(envelopes))
        self.main.ring()  # an idle watcher elsewhere reads the beacon; this process's mover looks now
        wake_mover(self.store)
        magazine = self.name + names.DELAYED_SUFFIX
        return [MessageRef(env.msg_id, magazine, 0, env.due_at or 0) for env in envelopes]

    def publish(self, payload: Any, *, id: str | None = None, key: str | None = None,
                headers: Mapping[str, str] | None = None, delay: float | timedelta | None = None) -> MessageRef:
        """Store one message durably (per the store's durability mode) and return its reference.
        A given `key` always maps to the same shard, which keeps per-key order within the shard.
        `delay` (seconds, or a timedelta): not delivered before then (README "Delayed delivery")."""
        # The tracing wrapper (_publish_traced) only where a span may be recorded, this method being its inside:
        # untraced, a lean publish skips a wrapper's frame (tracing.GLOBAL_ONLY: see there).
        if not (tracing.GLOBAL_ONLY and tracing.api._TRACER_PROVIDER is None) and not tracing.sending_now():
            return self._publish_traced(payload, id=id, key=key, headers=headers, delay=delay)
        at = _time_ns() // 1_000_000  # (now_ms(), inlined)
        if delay is not None:
            due = self.due_at(delay, at)
            if due is not None:
                return self._publish_delayed([self.envelope(payload, id=id, key=key, headers=headers)], due)[0]
        if id is None and key is None and headers is None and type(payload) is bytes:  # the common case, lean
            if len(payload) > self.max_payload_bytes:
                raise PayloadTooLarge(len(payload), self.max_payload_bytes, self.name)
            msg_id = new_message_id(at)
            ref = self.main.publish_one(payload, msg_id, at)
        else:
            shared_headers = self._check_options(id, key, headers)
            data, codec = self._encode(payload)
            msg_id = id or new_message_id(at)
            ref = self.main.load_new(_new_tuple(NewMessages, ((data,), (msg_id,), (codec,), at, shared_headers,
                                                              key, None)))[0]
        self._published_tick()
        return ref

    _publish_traced = tracing.traced_send(publish)

    def publish_plain(self, payloads: list[bytes]) -> list[MessageRef]:
        """Many publishes of plain bytes with no id, key, headers or delay, each its own message as `publish`
        stores it, in one store call where the backend can (ignis.aio gathers its concurrent publishes into
        this). The caller checked each payload's size; not traced (the async API traces per publish)."""
        refs = self.main.publish_plain(payloads, new_message_ids(len(payloads)), now_ms())
        self._published.inc(len(refs))
        return refs

    @tracing.traced_send
    def publish_many(self, payloads: Iterable[Any], *, key: str | None = None,
                     headers: Mapping[str, str] | None = None,
                     delay: float | timedelta | None = None) -> list[MessageRef]:
        """Publish many payloads in one group commit. Every payload is validated before anything is
        written, so a bad one leaves the queue unchanged; on lmdb the whole call is one transaction.
        `delay`: as publish's, for all of them."""
        due = self.due_at(delay)
        if due is not None:
            envelopes = [self.envelope(p, key=key, headers=headers) for p in payloads]
            return self._publish_delayed(envelopes, due) if envelopes else []
        shared_headers = self._check_options(None, key, headers)
        limit = self.max_payload_bytes
        data = payloads if type(payloads) is list else list(payloads)
        codecs: list[str] | None = None
        # (map/set/max: C-level loops; a generator would run a Python frame per message)
        if data and (set(map(type, data)) != {bytes} or max(map(len, data)) > limit):  # not all plain bytes
            encoded = [self._encode(p) for p in data]
            data = [d for d, _ in encoded]
            codecs = [c for _, c in encoded]
        if not data:
            return []
        try:
            refs = self.main.load_new(_new_tuple(NewMessages, (data, new_message_ids(len(data)), codecs, now_ms(),
                                                               shared_headers, key, None)))
        except QueueFull as exc:  # a bounded queue stored some of them (exc.results says which)
            self._published.inc(len(exc.published))
            raise
        self._published.inc(len(refs))
        return refs

    @tracing.traced_send
    def publish_each(self, payloads: Sequence[bytes], *, ids: Sequence[str | None] | None = None,
                     codecs: Sequence[str] | None = None, keys: Sequence[str | None] | None = None,
                     headers: Sequence[Mapping[str, str] | None] | None = None,
                     due: Sequence[int | None] | None = None) -> list[MessageRef]:
        """Publish already-encoded messages, each with its own id, codec, partition key and headers (a
        replay of exported messages, a Spark write), in one group commit. Columns are parallel to
        `payloads`; a None column or entry means "none" (a None id: a new one). `due` (epoch ms): a message
        due later than now is delayed until then (one more store call for those), one due already is published
        now. Every message is checked before anything is written, so a bad one leaves the queue unchanged."""
        count = len(payloads)
        if due is not None and any(d is not None and d > now_ms() for d in due):
            return self._publish_each_due(payloads, ids, codecs, keys, headers, due)
        for name, column in (("ids", ids), ("codecs", codecs), ("keys", keys), ("headers", headers)):
            if column is not None and len(column) != count:
                raise InvalidInputError(f"publish_each: {name} has {len(column)} entries for {count} payloads")
        limit = self.max_payload_bytes
        # C-level checks of the whole batch (map/set/max); the per-message loop only names the bad one.
        if payloads and (set(map(type, payloads)) != {bytes} or max(map(len, payloads)) > limit):
            for i, data in enumerate(payloads):
                if type(data) is not bytes:
                    raise InvalidInputError(f"message {i}: payload must be bytes, not {type(data).__name__}")
                if len(data) > limit:
                    raise PayloadTooLarge(len(data), limit, self.name)
        if codecs is not None and not set(codecs) <= set(CODECS):
            bad = sorted(set(codecs) - set(CODECS), key=str)
            raise InvalidInputError(f"codec {bad[0]!r}: must be one of {', '.join(CODECS)}")
        if ids is not None:
            lengths = set(map(len, ids)) if set(map(type, ids)) == {str} else {0}
            if min(lengths, default=1) < 1 or max(lengths, default=1) > MAX_ID_LENGTH:
                for msg_id in ids:
                    if msg_id is not None:
                        self._check_options(msg_id, None, None)
                generated = iter(new_message_ids(sum(msg_id is None for msg_id in ids)))
                ids = [next(generated) if msg_id is None else msg_id for msg_id in ids]
        if not count:
            return []
        at = now_ms()
        if not any(keys or ()) and not any(headers or ()):
            # Nothing per message but id and codec: the columnar publish path (as publish_many).
            try:
                refs = self.main.load_new(_new_tuple(NewMessages, (payloads, ids or new_message_ids(count), codecs,
                                                                   at, None, None, None)))
            except QueueFull as exc:  # a bounded queue stored some of them (exc.results says which)
                self._published.inc(len(exc.published))
                raise
        else:  # per-message keys or headers: one envelope each, placed by key, one group commit
            all_ids = ids or new_message_ids(count)
            envelopes = [Envelope(data, all_ids[i], at, codec=codecs[i] if codecs else CODEC_BYTES,
                                  headers=self._check_options(None, keys[i] if keys else None,
                                                              headers[i] if headers else None),
                                  key=keys[i] if keys else None)
                         for i, data in enumerate(payloads)]
            try:
                slots = self.main.load_published(envelopes)
            except QueueFull as exc:  # a bounded queue stored some of them: their refs, as below
                exc.results = [None if ref is None else MessageRef(env.msg_id, ref.magazine, ref.shard, ref.slot)
                               for env, ref in zip(envelopes, exc.results, strict=True)]
                self._published.inc(len(exc.published))
                raise
            refs = [MessageRef(env.msg_id, ref.magazine, ref.shard, ref.slot)
                    for env, ref in zip(envelopes, slots, strict=True)]
        self._published.inc(len(refs))
        return refs

    def _publish_each_due(self, payloads: Sequence[bytes], ids: Sequence[str | None] | None,
                          codecs: Sequence[str] | None, keys: Sequence[str | None] | None,
                          headers: Sequence[Mapping[str, str] | None] | None,
                          due: Sequence[int | None]) -> list[MessageRef]:
        """publish_each of a batch in which some messages are due later: those are stored as delayed ones."""
        if len(due) != len(payloads):
            raise InvalidInputError(f"publish_each: due has {len(due)} entries for {len(payloads)} payloads")
        at = now_ms()
        later = [i for i, d in enumerate(due) if d is not None and d > at]
        for i in later:
            self.delay_seconds((due[i] - at) / 1000)  # (beyond the expiry: refused before anything is written)
        delayed_rows = set(later)
        now_rows = [i for i in range(len(payloads)) if i not in delayed_rows]

        def pick(column: Sequence[Any] | None, rows: list[int]) -> list[Any] | None:
            return None if column is None else [column[i] for i in rows]

        refs: dict[int, MessageRef] = {}
        envelopes = []
        for i in later:  # checked as publish_each checks, through its own path for one row
            env = self.envelope(payloads[i], id=ids[i] if ids else None, key=keys[i] if keys else None,
                                headers=headers[i] if headers else None)
            env.codec = codecs[i] if codecs else CODEC_BYTES
            if env.codec not in CODECS:
                raise InvalidInputError(f"codec {env.codec!r}: must be one of {', '.join(CODECS)}")
            env.due_at = due[i]
            envelopes.append(env)
        if now_rows:
            done = self.publish_each([payloads[i] for i in now_rows], ids=pick(ids, now_rows),
                                     codecs=pick(codecs, now_rows), keys=pick(keys, now_rows),
                                     headers=pick(headers, now_rows))
            refs.update(zip(now_rows, done, strict=True))
        refs.update(zip(later, self._publish_delayed(envelopes), strict=True))
        return [refs[i] for i in range(len(payloads))]

