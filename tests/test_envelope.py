"""Message ids and payload codecs."""

from __future__ import annotations

import time

import pytest

from ignis.envelope import decode_payload, encode_payload, new_message_id, new_message_ids


def test_ids_are_128_bit_hex_distinct_and_time_ordered() -> None:
    batch = new_message_ids(10_000)
    single = [new_message_id() for _ in range(1000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in batch + single)
    assert len(set(batch + single)) == 11_000
    before = new_message_id()
    time.sleep(0.002)
    after = new_message_ids(1)[0]
    assert before[:12] < after[:12]  # the first 48 bits are the time stamp in ms
    assert batch == sorted(batch)  # a batch's ids are consecutive


@pytest.mark.parametrize("value", [b"\x00\xff", "ünïcode", {"a": [1, None]}, 7, 2.5, False, None, []])
def test_codecs_round_trip(value: object) -> None:
    data, codec = encode_payload(value)
    decoded = decode_payload(data, codec)
    assert decoded == value and type(decoded) is type(value)


def test_unknown_codec_and_unencodable_payloads_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown payload codec 'xml'"):
        decode_payload(b"<a/>", "xml")
    with pytest.raises(TypeError, match="set is not bytes, str or JSON-serialisable"):
        encode_payload({1, 2})
