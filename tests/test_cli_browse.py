"""`ignis queue peek` and `ignis message get` end to end in a subprocess against a fresh lmdb store: what peek shows
a consumer then gets (nothing claimed), a message is found by its reference in any state, -o json is one document,
a reference to nothing is exit 3 and a malformed one exit 2, each one line on stderr."""

from __future__ import annotations

from test_cli import Run, ignis, ok, queue  # noqa: F401  (the fixtures)


def test_peek_then_consume_gets_the_same_messages_and_get_follows_one(ignis: Run, queue: str) -> None:  # noqa: F811
    refs = [ok(ignis("publish", queue, f"m{i}", "--key", f"k{i}")).out.strip() for i in range(5)]
    peeked = ignis("queue", "peek", queue, "-n", "10", "-o", "json").json()
    assert sorted(m["payload"] for m in peeked) == [f"m{i}" for i in range(5)]
    assert {m["state"] for m in peeked} == {"waiting"} and {m["attempts"] for m in peeked} == {0}
    assert len(ignis("queue", "peek", queue, "-n", "2", "-o", "json").json()) == 2
    table = ok(ignis("queue", "peek", queue))
    assert "waiting in rt (5)" in table.out and "m4" in table.out

    one = ignis("message", "get", refs[0], "-o", "json").json()
    assert (one["payload"], one["key"], one["state"], one["ref"]) == ("m0", "k0", "waiting", refs[0].split("#")[0])
    shown = ok(ignis("message", "get", refs[0]))
    assert "m0" in shown.out and "state=waiting" in shown.err

    consumed = ignis("consume", queue, "-n", "10", "-o", "json").json()  # acks what it gets
    assert sorted(m["id"] for m in consumed) == sorted(m["id"] for m in peeked)
    assert {m["attempts"] for m in consumed} == {1}  # the peek counted no attempt
    assert ignis("queue", "peek", queue, "-o", "json").json() == []
    assert "no messages waiting in rt" in ok(ignis("queue", "peek", queue)).out

    gone = ignis("message", "get", refs[0])  # acked
    assert gone.code == 3 and "not found" in gone.error_line() and refs[0].split("#")[0] in gone.error_line()


def test_bad_references_and_queues_are_one_line_with_their_exit_codes(ignis: Run, queue: str) -> None:  # noqa: F811
    for ref in ("rt", "rt/zero/1", "rt/0/0"):
        bad = ignis("message", "get", ref)
        assert bad.code == 2 and "message reference" in bad.error_line(), (ref, bad.err)
    assert ignis("message", "get", "nosuch/0/1").code == 3  # a queue that does not exist
    missing = ignis("message", "get", f"{queue}/0/99")
    assert missing.code == 3 and "no message there" in missing.error_line()
    assert ignis("queue", "peek", "nosuch").code == 3
    assert ignis("queue", "peek", queue, "--shard", "2").code == 2  # rt has shards 0 and 1
    assert ignis("queue", "peek", queue, "-n", "0").code == 2
