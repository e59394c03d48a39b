"""A store that does not answer is an outage, never an empty queue (issue: Aerospike faults, part 1).

The Aerospike client does not raise from a batch call when the cluster is down: it answers with an
overall result code and failing records (-10 / -15 while it still knows the node), or with no records at
all (result 1, once the node is dropped). The emulator answers the same way (support/aerospike_emulator,
OUTAGE_*), and the same cases run against a real server that is stopped (test_real_server_outages.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.aerospike_emulator import NO_RESPONSE, OUTAGE_NO_NODE, OUTAGE_REFUSED, EmulatedServer

from ignis import Ignis, QueueSpec
from ignis.errors import InvalidInputError, StoreError, StoreUnavailable
from ignis.storage.aerospike import context, errors
from ignis.storage.base import SlotRef

URL = "aerospike://emulator:3000/test?farm=f1&client=c1&retries=0"


@pytest.fixture
def ignis(server: EmulatedServer) -> Iterator[Ignis]:
    client = Ignis(URL)
    client.apply(QueueSpec.build(name="orders", handlerType="orders", shards=2))
    yield client
    server.come_back()
    client.close()


def _read_paths(ignis: Ignis, queue: Any) -> dict[str, Any]:
    return {"fire": queue.fire, "fire_many": lambda: queue.fire_many(10), "pending": queue.main.pending,
            "stats": queue.stats, "peek": lambda: queue.main.browse(10), "ignis.stats": lambda: ignis.stats("orders"),
            "in_flight": lambda: queue.stats(in_flight=True), "sideline": queue.sideline.pending}


@pytest.mark.parametrize("style", [OUTAGE_REFUSED, OUTAGE_NO_NODE])
def test_every_read_path_raises_store_unavailable_while_the_cluster_is_down(server: EmulatedServer, ignis: Ignis,
                                                                            style: str) -> None:
    queue = ignis.queue("orders")
    published = {queue.publish(f"m{i}").id for i in range(3)}
    server.go_down(style)
    for name, call in _read_paths(ignis, ignis.queue("orders")).items():  # a fresh handle: nothing cached
        with pytest.raises(StoreUnavailable):
            call()
            pytest.fail(f"{name} answered while the cluster was down")
    server.come_back()
    assert {m.id for m in ignis.queue("orders").fire_many(10)} == published


def test_failing_records_of_a_batch_read_are_an_outage_not_absent(server: EmulatedServer, ignis: Ignis) -> None:
    queue = ignis.queue("orders")
    queue.publish_many([b"a", b"b", b"c"])
    for call in (queue.main.pending, lambda: queue.main.browse(10), lambda: ignis.store.read(
            [r for r, _ in queue.main.browse(10)])):
        server.fail_records("batch_read", NO_RESPONSE)
        with pytest.raises(StoreUnavailable, match="result code -15"):
            call()
    server.fail_records("batch_read", 12)  # a record-level server error: a store error, still never "absent"
    with pytest.raises(StoreError, match="result code 12"):
        queue.main.pending()
    assert queue.main.pending() == 3


def test_a_claim_whose_stamp_gets_no_answer_keeps_its_slots(server: EmulatedServer, ignis: Ignis) -> None:
    queue = ignis.queue("orders")
    ids = {r.id for r in queue.publish_many([b"a", b"b", b"c", b"d"], key="k")}  # one shard: one claim takes all
    server.fail_records("batch_operate", NO_RESPONSE)  # the stamp of the claimed slots
    with pytest.raises(StoreUnavailable):
        queue.fire_many(4)
    pointers = queue.main.pointers()
    assert sum(p.fire for p in pointers.values()) == 4  # the claim happened: the slots are taken...
    assert queue.main.awaiting() == 4  # ...and this handle still owns them
    got: list[Any] = []
    deadline = time.monotonic() + 5
    while len(got) < 4 and time.monotonic() < deadline:  # re-read as awaited slots are, once due
        time.sleep(queue.main.next_check_in() or 0.001)
        got += queue.fire_many(4)
    assert {m.id for m in got} == ids
    assert [m.attempts for m in got] == [1, 1, 1, 1]  # the failed stamp counted no attempt


def test_a_single_slot_claim_whose_stamp_fails_keeps_its_slot(server: EmulatedServer, ignis: Ignis) -> None:
    from aerospike import exception as ex

    queue = ignis.queue("orders")
    ref = queue.publish(b"only", key="k")
    server.fail_next("operate", ex.NoResponse, after=1)  # the claim passes; its stamp gets no answer
    with pytest.raises(StoreUnavailable):
        queue.fire()
    assert queue.main.awaiting() == 1
    message = None
    deadline = time.monotonic() + 5
    while message is None and time.monotonic() < deadline:
        time.sleep(queue.main.next_check_in() or 0.001)
        message = queue.fire()
    assert message is not None and message.id == ref.id


def test_a_batch_with_no_records_at_all_is_an_outage(server: EmulatedServer, ignis: Ignis) -> None:
    queue = ignis.queue("orders")
    queue.publish_many([b"a", b"b"], key="k")
    server.go_down(OUTAGE_NO_NODE)
    with pytest.raises(StoreUnavailable, match="answered for 0 of 2 record"):
        ignis.store.read([SlotRef(queue.main.name, shard, 1) for shard in range(2)])


def test_errors_of_the_store_are_one_line(server: EmulatedServer, ignis: Ignis) -> None:
    from aerospike import exception as ex

    error = ex.ClientError(-1, "batch failed\nsub-errors:\n  node A: timeout\n  node B: refused", "f", 1, False)
    server.fail_next("get", type(error))
    with pytest.raises(StoreError) as caught:
        ignis.store.get_queue("orders")
    assert "\n" not in str(caught.value)
    mapped = errors.map_error(error, "get", "here")
    assert "\n" not in str(mapped) and "sub-errors: node A: timeout node B: refused" in str(mapped)


def test_error_fields_come_from_the_error_not_from_its_class() -> None:
    """The client sets code, msg and in_doubt as attributes of the error's class before raising (another
    thread's error of the same class may overwrite them); each raised error carries its own as args."""
    from aerospike import exception as ex

    from ignis.storage.aerospike.errors import error_field, is_transient

    ours = ex.TimeoutError(9, "timeout: our call", "f", 1, False)
    saved = {k: ex.TimeoutError.__dict__.get(k) for k in ("msg", "in_doubt", "code")}
    try:
        ex.TimeoutError.msg, ex.TimeoutError.in_doubt = "another call's message", True  # as the client leaves it
        assert error_field(ours, "msg") == "timeout: our call" and error_field(ours, "in_doubt") is False
        assert is_transient(ours, idempotent=False)  # not in doubt: a non-idempotent write may be repeated
        mapped = str(errors.map_error(ours, "put", "here"))
        assert "our call" in mapped and "another call" not in mapped and "may or may not" not in mapped
    finally:
        for key, value in saved.items():
            if value is None:
                if key in ex.TimeoutError.__dict__:
                    delattr(ex.TimeoutError, key)
            else:
                setattr(ex.TimeoutError, key, value)


def test_a_claim_whose_answer_was_lost_is_found_and_delivered_by_its_claimer(server: EmulatedServer,
                                                                             ignis: Ignis) -> None:
    from aerospike import exception as ex

    queue = ignis.queue("orders")
    ids = {r.id for r in queue.publish_many([b"a", b"b", b"c"], key="k")}
    queue.main.pointers()  # the handle knows the shard has work
    # The claim is applied, then its answer is lost (a node died after applying it): in doubt.
    server.fail_next("operate", ex.TimeoutError, apply_first=True)
    with pytest.raises(StoreUnavailable):
        queue.fire_many(3)
    assert sum(p.fire for p in queue.main.pointers().values()) == 3  # the slots were taken...
    assert queue.main.awaiting() == 1  # ...by a claim this handle will resolve
    got = queue.fire_many(3)  # resolves it first: the slots are its own
    assert {m.id for m in got} == ids and [m.attempts for m in got] == [1, 1, 1]


def test_a_single_slot_claim_whose_answer_was_lost_is_found_too(server: EmulatedServer, ignis: Ignis) -> None:
    from aerospike import exception as ex

    queue = ignis.queue("orders")
    ref = queue.publish(b"one", key="k")
    queue.main.pointers()
    server.fail_next("operate", ex.TimeoutError, apply_first=True)
    with pytest.raises(StoreUnavailable):
        queue.fire()
    message = queue.fire()
    assert message is not None and message.id == ref.id


def test_a_claim_whose_answer_was_lost_and_was_not_applied_claims_afresh(server: EmulatedServer,
                                                                         ignis: Ignis) -> None:
    from aerospike import exception as ex

    queue = ignis.queue("orders")
    ids = {r.id for r in queue.publish_many([b"a", b"b"], key="k")}
    queue.main.pointers()
    server.fail_next("operate", ex.TimeoutError)  # lost before it reached the server (in doubt for the client)
    with pytest.raises(StoreUnavailable):
        queue.fire_many(2)
    assert {m.id for m in queue.fire_many(2)} == ids


def test_a_store_that_answers_late_is_waited_for_with_one_warning(server: EmulatedServer,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A service started before its Aerospike (or on a machine too busy to connect in time) waits for it."""
    attempts = []
    connect = server.client

    def counted(config: dict[str, Any]) -> Any:
        attempts.append(time.monotonic())
        return connect(config)

    monkeypatch.setattr(context, "client_factory", counted)
    server.go_down()
    threading.Timer(0.5, server.come_back).start()
    with caplog.at_level("DEBUG", logger="ignis.store"), Ignis(URL, connect_wait_seconds=30) as ignis:
        ignis.apply(QueueSpec.build(name="late", handlerType="late"))
        assert ignis.queue("late").publish(b"x").id
    assert len(attempts) >= 2, attempts  # it failed at least once before the server came back
    warnings = [r for r in caplog.records if r.name == "ignis.store" and r.levelname == "WARNING"]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage(), [r.getMessage() for r in warnings]


def test_opening_an_unreachable_store_gives_up_when_the_wait_is_over(server: EmulatedServer) -> None:
    server.go_down()
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="connect"):
        Ignis(URL)  # no wait by default: a one-off command fails at once
    with pytest.raises(StoreUnavailable, match="connect"):
        Ignis(URL, connect_wait_seconds=0.4)
    assert time.monotonic() - started >= 0.4


def test_bad_input_is_not_waited_for(server: EmulatedServer) -> None:
    server.go_down()
    with pytest.raises(InvalidInputError, match="nonsense"):
        Ignis("aerospike://emulator:3000/test?nonsense=1", connect_wait_seconds=30)
    with pytest.raises(StoreUnavailable, match="/proc/nope"):  # lmdb opens or not: never waited for
        Ignis("lmdb:///proc/nope/store", connect_wait_seconds=30)


# ---- a subscription's claims through an outage (issue 47; found in the 3-node fault run) ----------------------------
def _subscription(ignis: Ignis) -> Any:
    from ignis import TopicSpec

    ignis.apply(TopicSpec.build(name="feed", shards=1))
    ignis.apply(QueueSpec.build(name="sub", handlerType="sub", shards=1, subscribe={"topic": "feed",
                                                                                   "start": "earliest"}))
    ignis.topic("feed").publish_many([b"a", b"b", b"c"], subject="s")
    return ignis.queue("sub")


def test_a_subscription_claim_cut_after_its_cursor_moved_keeps_its_messages(server: EmulatedServer,
                                                                            ignis: Ignis) -> None:
    """The cursor moved over the slots, then the read of the topic's records failed: the slots stay this handle's
    (awaited) and are delivered once the store answers, not left for the sweeper a sweepDuration away."""
    q = _subscription(ignis)
    topics = ignis.store._topics  # type: ignore[attr-defined]
    claim_slots = topics._claim_slots
    calls = []

    def cut_once(*args: Any, **kwargs: Any) -> Any:  # the first read of the topic's records after the move fails
        calls.append(args)
        if len(calls) == 1:
            server.fail_records("batch_read", NO_RESPONSE, times=1)
        return claim_slots(*args, **kwargs)

    topics._claim_slots = cut_once
    with pytest.raises(StoreUnavailable):
        q.fire_many(3)
    assert q.cursor.pointers()[0].fire == 3  # the move landed: no other claim of this subscription gets them
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got += q.fire_many(3, timeout=1)
    assert sorted(m.payload for m in got) == [b"a", b"b", b"c"]
    assert all(m.attempts == 1 for m in got)


def test_a_subscription_claim_whose_answer_was_lost_keeps_its_messages(server: EmulatedServer, ignis: Ignis) -> None:
    """The cursor's move applied, its answer lost: the next fire finds out which slots it took (its token in the
    cursor's record) and delivers them."""
    q = _subscription(ignis)
    q.cursor.pointers()
    server.fail_next("operate", errors_module_timeout(), apply_first=True)
    with pytest.raises(StoreUnavailable, match="may or may not have been applied"):
        q.fire_many(3)
    assert q.cursor.pointers()[0].fire == 3
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got += q.fire_many(3, timeout=1)
    assert sorted(m.payload for m in got) == [b"a", b"b", b"c"]


def errors_module_timeout() -> type[Exception]:
    from aerospike import exception as ex

    return ex.TimeoutError
