"""The lmdb store's byte layout: how every record is packed and unpacked, and nothing else.

Every record value starts with an 8-byte big-endian expire-at (`_HEADER`, epoch ms, 0 = never); queue, system
and delay records then hold a msgpack map of bins, shard meta and hole records three fixed integers (`_META`),
and data records the fixed binary layout of `_DATA`. The keys of the farm-wide system records are here too.
It is a module of its own because it depends on no transaction or environment: the environment's purger, the
transaction context and every concern read and write records through it, and a layout check (tests) imports
it alone. Changing anything here changes the storage format.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping
from typing import Any

import msgpack

from ignis.envelope import (
    ATTEMPTS,
    CODEC_BYTES,
    CODEC_JSON,
    CODEC_STR,
    CODEC_UNREADABLE,
    DUE_AT,
    FIRE_TS,
    HEADERS,
    HISTORY,
    LOADED_AT,
    PARTITION_KEY,
    REASON,
    SUBJECT,
    Envelope,
    NewMessages,
    envelope_problem,
    unreadable_envelope,
)
from ignis.errors import StoreError

_HEADER = struct.Struct(">Q")  # every record starts with its expire-at, epoch ms (0 = never)
_DATA_HEADER = struct.Struct(">QQI")  # data records: expire-at, fireTS, attempts
_META = struct.Struct(">QQQ")  # shard meta records: expire-at, LOAD_POINTER, FIRE_POINTER
# A shard of a queue bounded by bytes (ignis.bounds) carries its LOAD_BYTES after those, in the same record, so a
# bounded publish reads and writes one record, as an unbounded one does (a record of its own cost a fifth of a
# publish: one more B-tree read and write). Readers take the first 24 bytes (`_unpack_meta` is unpack_from);
# every writer of the pointers keeps what follows them (`+ raw[24:]`, b"" on any other shard).
_META_BYTES = struct.Struct(">QQQQ")  # expire-at, LOAD_POINTER, FIRE_POINTER, LOAD_BYTES
# A shard's hole counters (HOLES, HOLES_CLAIMED), in a record of their own beside the meta record
# (`{magazine}_SHARD_{n}_HOLES`, same shape, expire-at 0), so the hot paths keep reading 24 bytes.
_HOLES = _META
_HOLES_SUFFIX = b"_HOLES"
# An ordered queue's shard hold (Storage.claim_held, base.HOLD_UNTIL): `{magazine}_SHARD_{n}_HOLD`, same shape
# (expire-at 0, holdUntil, 0), written in the claim's and the release's own transactions.
_HOLD = _META
_HOLD_SUFFIX = b"_HOLD"
_new_ref = tuple.__new__  # builds SlotRef / Claimed NamedTuples without their slower generated __init__
_PACK = msgpack.Packer(use_bin_type=True).pack
EPOCH_KEY = b"sweeperEpoch"
CLIENTS_KEY = b"clients"
LEASE_PREFIX = b"lease:"


def _unpack(raw: bytes) -> dict[str, Any]:
    return msgpack.unpackb(memoryview(raw)[8:], raw=False)


def _expired(raw: bytes, now: int) -> bool:
    if len(raw) < _HEADER.size:  # damaged: not an IgnisMQ record (read as unreadable), never "expired"
        return False
    expire_at = _HEADER.unpack_from(raw)[0]
    return expire_at != 0 and expire_at <= now


def _record(bins: Mapping[str, Any], expire_at: int = 0) -> bytes:
    return _HEADER.pack(expire_at) + _PACK(bins)


# Data record, format 1. Fixed part: expire-at, fireTS (0 = not fired), attempts — the fields a claim
# rewrites in place, first, at fixed offsets — then format, loadedAt, codec, flags and the id's length;
# then the id, the payload's length and the payload; then, only when the message has any, a msgpack map
# of the optional bins (headers, pkey, reason, history). No bin names are stored per record: the layout
# stays the logical envelope of DESIGN §3 (`raw_record` shows it with its bin names), at about half the
# encoding cost and 60 fewer bytes per message than one msgpack map.
_DATA = struct.Struct(">QQIBQBBH")

# The structs' methods, bound once. CPython 3.11 compiles a method call on a name imported from another module
# (`_META.unpack(raw)` in claims.py) as an attribute load, as for a module (`math.sqrt`), not as a method call: it
# builds a bound method on every call, a visible share of a publish, claim or ack. The other modules call these.
_pack_meta, _unpack_meta = _META.pack, _META.unpack_from


def _load_pointer(raw: bytes | None) -> int:
    """A meta record's load pointer (0 when there is none yet)."""
    return _unpack_meta(raw)[1] if raw is not None else 0


def _fire_pointer(raw: bytes | None) -> int:
    """A meta record's fire pointer (0 when there is none yet)."""
    return _unpack_meta(raw)[2] if raw is not None else 0
_pack_meta_bytes, _unpack_meta_bytes = _META_BYTES.pack, _META_BYTES.unpack
_pack_holes, _unpack_holes = _HOLES.pack, _HOLES.unpack
_pack_hold, _unpack_hold = _HOLD.pack, _HOLD.unpack
_unpack_header = _HEADER.unpack_from
_pack_data_header, _unpack_data_header = _DATA_HEADER.pack, _DATA_HEADER.unpack_from
_unpack_data_head = _DATA.unpack_from
_PAYLOAD_LEN = struct.Struct(">I")
_FORMAT = 1
_HAS_EXTRAS = 1
_CODEC_IDS = {CODEC_BYTES: 0, CODEC_STR: 1, CODEC_JSON: 2, CODEC_UNREADABLE: 3}
_CODEC_NAMES = {v: k for k, v in _CODEC_IDS.items()}


def _pack_data(envelope: Envelope, expire_at: int) -> bytes:
    msg_id = envelope.msg_id.encode()
    payload = envelope.payload
    if not (envelope.headers or envelope.key is not None or envelope.reason is not None or envelope.history
            or envelope.due_at is not None or envelope.subject is not None):
        # The common record: header, id and payload length in one pack call (publish's hot path).
        return _plain_head(len(msg_id)).pack(
            expire_at, envelope.fire_ts or 0, envelope.attempts, _FORMAT, envelope.loaded_at,
            _CODEC_IDS[envelope.codec], 0, len(msg_id), msg_id, len(payload)) + payload
    extras = {name: value for name, value in ((HEADERS, envelope.headers), (PARTITION_KEY, envelope.key),
                                              (REASON, envelope.reason), (HISTORY, envelope.history),
                                              (DUE_AT, envelope.due_at), (SUBJECT, envelope.subject)) if value}
    return b"".join((
        _DATA.pack(expire_at, envelope.fire_ts or 0, envelope.attempts, _FORMAT, envelope.loaded_at,
                   _CODEC_IDS[envelope.codec], _HAS_EXTRAS, len(msg_id)),
        msg_id, _PAYLOAD_LEN.pack(len(payload)), payload, _PACK(extras),
    ))


def _pack_new(batch: NewMessages, expire_at: int) -> list[bytes]:
    """The data records of newly published messages (fireTS 0, attempts 0): the batch's shared
    headers and key are packed once, not per message."""
    ids, payloads, at = batch.ids, batch.payloads, batch.loaded_at
    extras = {name: value for name, value in ((HEADERS, batch.headers), (PARTITION_KEY, batch.key),
                                              (SUBJECT, batch.subject))
              if value is not None and value != {}}
    if batch.codecs is None and not extras and len(set(map(len, ids))) == 1 and "".join(ids).isascii():
        # Generated ids: one length, ASCII, so one struct packs header, id and payload length, and when
        # the payloads have one length too, the payload as well (one allocation per record, not two).
        id_length = len(ids[0])
        if len(set(map(len, payloads))) == 1:
            size = len(payloads[0])
            record = _plain_record(id_length, size).pack
            return [record(expire_at, 0, 0, _FORMAT, at, 0, 0, id_length, msg_id.encode(), size, payload)
                    for msg_id, payload in zip(ids, payloads, strict=True)]
        head = _plain_head(id_length).pack
        return [head(expire_at, 0, 0, _FORMAT, at, 0, 0, id_length, msg_id.encode(), len(payload)) + payload
                for msg_id, payload in zip(ids, payloads, strict=True)]
    tail = _PACK(extras) if extras else b""
    flags = _HAS_EXTRAS if extras else 0
    codecs = batch.codecs or [CODEC_BYTES] * len(ids)
    values = []
    for msg_id, payload, codec in zip(ids, payloads, codecs, strict=True):
        raw_id = msg_id.encode()
        values.append(b"".join((_DATA.pack(expire_at, 0, 0, _FORMAT, at, _CODEC_IDS[codec], flags, len(raw_id)),
                                raw_id, _PAYLOAD_LEN.pack(len(payload)), payload, tail)))
    return values


@functools.lru_cache(maxsize=64)
def _plain_record(id_length: int, payload_length: int) -> struct.Struct:
    """A whole plain record (_plain_head, then the payload) as one struct."""
    return struct.Struct(f"{_plain_head(id_length).format}{payload_length}s")


@functools.cache
def _plain_head(id_length: int) -> struct.Struct:
    """_DATA + the id + _PAYLOAD_LEN as one struct (ids mostly share one length, so this stays tiny)."""
    return struct.Struct(f"{_DATA.format}{id_length}s{_PAYLOAD_LEN.format[1:]}")


# The head of the commonest record (the id a publish generates: 32 hex digits), read in one call by _unpack_data.
_PLAIN_32 = _plain_head(32)
_PLAIN_32_SIZE = _PLAIN_32.size
_unpack_plain_32 = _PLAIN_32.unpack_from


def _unpack_data(raw: bytes, where: object = "?") -> Envelope:
    try:
        if len(raw) >= _PLAIN_32_SIZE:  # the commonest record first, in one unpack (every delivery comes here)
            _, fire_ts, attempts, fmt, loaded_at, codec, flags, id_len, raw_id, length = _unpack_plain_32(raw)
            if id_len == 32 and fmt == _FORMAT and not flags and len(raw) == _PLAIN_32_SIZE + length:
                return Envelope(raw[_PLAIN_32_SIZE:], raw_id.decode(), loaded_at, _CODEC_NAMES[codec], None, None,
                                fire_ts or None, attempts)
        _, fire_ts, attempts, fmt, loaded_at, codec, flags, id_len = _DATA.unpack_from(raw)
        if fmt != _FORMAT:
            raise StoreError(f"data record format {fmt} is not one this version reads ({_FORMAT})")
        at = _DATA.size + id_len
        msg_id = raw[_DATA.size:at].decode()
        end = at + 4 + _PAYLOAD_LEN.unpack_from(raw, at)[0]
        payload = raw[at + 4:end]
        if len(payload) != end - at - 4 or not msg_id:
            raise ValueError("the record is shorter than its lengths say" if msg_id else "its id is empty")
        if flags & _HAS_EXTRAS:
            extras = msgpack.unpackb(raw[end:], raw=False)
            subject = extras.get(SUBJECT)
            if len(extras) == 1 and type(subject) is str:  # a topic's message: its subject only (a claim's path)
                return Envelope(payload, msg_id, loaded_at, _CODEC_NAMES[codec], None, None, fire_ts or None,
                                attempts, subject=subject)
            envelope = Envelope(payload, msg_id, loaded_at, _CODEC_NAMES[codec], extras.get(HEADERS),
                                extras.get(PARTITION_KEY), fire_ts or None, attempts, extras.get(REASON),
                                extras.get(HISTORY), extras.get(DUE_AT), extras.get(SUBJECT))
            problem = envelope_problem(envelope.to_bins())
            if problem is not None:
                raise ValueError(problem)
            return envelope
        return Envelope(payload, msg_id, loaded_at, _CODEC_NAMES[codec], None, None, fire_ts or None, attempts)
    except StoreError:
        raise
    except Exception as exc:  # damaged, or not written by IgnisMQ: carried on as unreadable, never as something else
        problem = f"the record does not decode: {type(exc).__name__}: {exc}"
        bins: dict[str, Any] = {"raw": bytes(raw)}
        if len(raw) >= _DATA.size:
            _, fire_ts, attempts, _, loaded_at, *_ = _DATA.unpack_from(raw)
            bins.update({FIRE_TS: fire_ts or None, ATTEMPTS: attempts, LOADED_AT: loaded_at})
        return unreadable_envelope(problem, bins, where)


def _expire_at(ttl_seconds: int, now: int) -> int:
    return now + ttl_seconds * 1000 if ttl_seconds > 0 else 0
