"""Queue.publish_each (the pipeline's write and replay path) on every backend: per-message ids, codecs,
keys and headers kept; every message checked before any is written."""

from __future__ import annotations

from typing import Any

import pytest

from ignis.errors import InvalidInputError, PayloadTooLarge


def test_publish_each_keeps_every_messages_own_fields(make_queue: Any) -> None:
    q = make_queue("each", shards=4)
    refs = q.publish_each([b"a", b'"s"', b'{"n":1}', b"d"], ids=["id-a", None, "id-c", "id-d"],
                          codecs=["bytes", "json", "json", "bytes"], keys=["k", None, "k", None],
                          headers=[{"h": "1"}, None, None, {"x": "y"}])
    assert [r.id for r in refs][0::2] == ["id-a", "id-c"] and len(refs[1].id) == 32
    assert refs[0].shard == refs[2].shard  # one key, one shard
    got = {m.id: m for m in q.fire_many(10)}
    assert got["id-a"].payload == b"a" and got["id-a"].key == "k" and got["id-a"].headers == {"h": "1"}
    assert got[refs[1].id].payload == "s" and got["id-c"].payload == {"n": 1}
    assert got["id-d"].headers == {"x": "y"} and got["id-d"].key is None


def test_publish_each_columnar_path_keeps_ids(make_queue: Any) -> None:
    q = make_queue("cols", shards=3)
    ids = [f"m-{i}" for i in range(50)]
    refs = q.publish_each([b"p%d" % i for i in range(50)], ids=ids)
    assert [r.id for r in refs] == ids
    assert sorted(m.id for m in q.fire_many(100)) == sorted(ids)


@pytest.mark.parametrize(("kwargs", "error", "text"), [
    ({"payloads": [b"ok", "str"]}, InvalidInputError, "message 1: payload must be bytes"),
    ({"payloads": [b"ok", b"x" * (2 << 20)]}, PayloadTooLarge, "exceeds the maximum"),
    ({"payloads": [b"ok"], "ids": [""]}, InvalidInputError, "message id ''"),
    ({"payloads": [b"ok"], "codecs": ["yaml"]}, InvalidInputError, "codec 'yaml'"),
    ({"payloads": [b"ok"], "keys": ["k" * 300]}, InvalidInputError, "partition key"),
    ({"payloads": [b"ok"], "headers": [{"a": 1}]}, InvalidInputError, "headers must be"),
    ({"payloads": [b"ok", b"ok"], "ids": ["one"]}, InvalidInputError, "ids has 1 entries for 2 payloads"),
])
def test_publish_each_refuses_bad_input_and_writes_nothing(make_queue: Any, kwargs: dict[str, Any],
                                                           error: type[Exception], text: str) -> None:
    q = make_queue("strict", shards=2)
    with pytest.raises(error, match=text):
        q.publish_each(**kwargs)
    assert q.stats().published == 0
