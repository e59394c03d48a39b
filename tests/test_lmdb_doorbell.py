"""The lmdb doorbell's committing rings (ignis.storage.lmdb.doorbell): who gets which ring, and what a
committing ring leaves for the claim. Two bells on one directory stand for two processes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ignis.activity import activity_for
from ignis.storage.lmdb.doorbell import LISTING_TTL_SECONDS, EnvironmentBell

CLIENT, MAGAZINE = "c1", "orders:main"


@pytest.fixture
def bells(tmp_path: Path) -> Iterator[tuple[EnvironmentBell, EnvironmentBell, str]]:
    location = f"lmdb://{tmp_path}/listener"  # its own activity registry entries, apart from other tests
    publisher = EnvironmentBell(str(tmp_path), f"lmdb://{tmp_path}/publisher")
    listener = EnvironmentBell(str(tmp_path), location)
    listener.subscribe(CLIENT, [MAGAZINE])
    time.sleep(LISTING_TTL_SECONDS * 2)  # the publisher re-reads the listings at most this often
    yield publisher, listener, location
    publisher.close()
    listener.close()


def _marks(location: str, before: int, timeout: float = 2.0) -> tuple[int, ...] | None:
    """The listener's active shards once a ring changed them after `before`, or None if none came."""
    activity = activity_for(location, CLIENT, MAGAZINE)
    deadline = time.monotonic() + timeout
    while activity.changes == before and time.monotonic() < deadline:
        time.sleep(0.005)
    return activity.active if activity.changes != before else None


def test_a_listener_that_takes_committing_rings_gets_one_before_the_commit_and_none_after(
        bells: tuple[EnvironmentBell, EnvironmentBell, str]) -> None:
    publisher, listener, location = bells
    activity = activity_for(location, CLIENT, MAGAZINE)
    before = activity.changes
    publisher.ring_committing(CLIENT, MAGAZINE, [3])
    assert _marks(location, before) == (3,)
    assert listener.take_committing(CLIENT, MAGAZINE, 3)  # the claim of shard 3 waits that commit out
    assert not listener.take_committing(CLIENT, MAGAZINE, 3)  # once
    assert not listener.take_committing(CLIENT, MAGAZINE, 4)
    before = activity.changes
    publisher.ring(CLIENT, MAGAZINE, [3], after_committing=True)
    assert _marks(location, before, timeout=0.3) is None  # it had its ring
    publisher.ring(CLIENT, MAGAZINE, [5])  # a ring with no committing one before it (a move) reaches everyone
    assert _marks(location, before) is not None and 5 in activity.active
    assert not listener.take_committing(CLIENT, MAGAZINE, 5)


def test_a_listener_of_an_earlier_version_is_rung_after_the_commit(
        bells: tuple[EnvironmentBell, EnvironmentBell, str]) -> None:
    publisher, listener, location = bells
    listing = os.path.join(listener.dir, f"{listener.id}.subs")
    with open(listing) as f:
        lines = f.read().split()
    assert "+committing" in lines
    with open(f"{listing}.tmp", "w") as f:  # as an earlier version writes it: the keys only
        f.write("\n".join(line for line in lines if not line.startswith("+")) + "\n")
    os.replace(f"{listing}.tmp", listing)
    time.sleep(LISTING_TTL_SECONDS * 2)
    activity = activity_for(location, CLIENT, MAGAZINE)
    before = activity.changes
    publisher.ring_committing(CLIENT, MAGAZINE, [2])
    assert _marks(location, before, timeout=0.3) is None  # it could not read that ring
    publisher.ring(CLIENT, MAGAZINE, [2], after_committing=True)
    assert _marks(location, before) == (2,)
    assert not listener.take_committing(CLIENT, MAGAZINE, 2)


def test_an_earlier_versions_listener_ignores_a_committing_ring(tmp_path: Path) -> None:
    """What a listener that splits the shards on commas makes of a committing ring: not a ring of ours."""
    publisher = EnvironmentBell(str(tmp_path), "p")
    sent: list[bytes] = []

    class Capture:
        def send(self, data: bytes, _flags: int) -> None:
            sent.append(data)
    publisher._listed_at = time.monotonic() + 60  # no re-listing: the capture is the one listener
    publisher._targets = {f"{CLIENT}/{MAGAZINE}": [("old", Capture(), True)]}  # type: ignore[list-item]
    publisher.ring_committing(CLIENT, MAGAZINE, [1, 2])
    key, _, shards = sent[0].decode().partition("\0")
    assert key == f"{CLIENT}/{MAGAZINE}"
    with pytest.raises(ValueError):
        [int(s) for s in shards.split(",") if s]  # the earlier parser, which then skips it
    publisher.close()


def test_a_subscriptions_listener_is_rung_after_the_commit_of_its_topic(tmp_path: Path) -> None:
    """A cursor claims in its own environment, reading the topic without the store's write lock, so it cannot wait a
    commit out: its process lists the topic with the after-commit mark and gets no committing ring for it, while the
    same process's queues still get theirs."""
    from ignis.storage.lmdb.doorbell import LmdbDoorbell

    location = f"lmdb://{tmp_path}/subscriber"
    publisher = EnvironmentBell(str(tmp_path), f"lmdb://{tmp_path}/publisher")
    listener = EnvironmentBell(str(tmp_path), location)
    try:
        LmdbDoorbell(listener, CLIENT).subscribe(["audit_FROM_orders", MAGAZINE])
        with open(os.path.join(listener.dir, f"{listener.id}.subs")) as f:
            assert set(f.read().split()) == {"+committing", f"={CLIENT}/orders", f"{CLIENT}/{MAGAZINE}"}
        time.sleep(LISTING_TTL_SECONDS * 2)
        topic = activity_for(location, CLIENT, "orders")
        before = topic.changes
        publisher.ring_committing(CLIENT, "orders", [1])
        deadline = time.monotonic() + 0.3
        while topic.changes == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert topic.changes == before  # no committing ring for the topic
        publisher.ring(CLIENT, "orders", [1], after_committing=True)
        deadline = time.monotonic() + 2
        while topic.changes == before and time.monotonic() < deadline:
            time.sleep(0.005)
        assert topic.active == (1,)
        assert not listener.take_committing(CLIENT, "orders", 1)
        queue = activity_for(location, CLIENT, MAGAZINE)
        before = queue.changes
        publisher.ring_committing(CLIENT, MAGAZINE, [2])
        assert _marks(location, before) == (2,)  # the queue's listener takes committing rings as before
    finally:
        publisher.close()
        listener.close()


def test_a_ring_a_full_listener_queue_refused_is_sent_again_once_it_has_room(tmp_path: Path) -> None:
    # Linux queues at most net.unix.max_dgram_qlen datagrams (10 by default) on a Unix datagram socket: a listener
    # busy for a moment refuses the rings after those. Dropped, the messages they rang for waited for the watcher's
    # safety poll (17-24 s, measured); owed, they arrive once the listener reads.
    import socket

    publisher = EnvironmentBell(str(tmp_path), f"lmdb://{tmp_path}/publisher")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # a listener that does not read (yet)
    try:
        listener.bind(os.path.join(publisher.dir, "busy-1.sock"))
        with open(os.path.join(publisher.dir, "busy-1.subs"), "w") as f:
            f.write(f"+committing\n{CLIENT}/{MAGAZINE}\n")
        time.sleep(LISTING_TTL_SECONDS * 2)
        for shard in range(40):  # more than any queue holds (its length limit, or its buffer)
            publisher.ring(CLIENT, MAGAZINE, (shard,), committing=shard % 2 == 0)
        listener.settimeout(1.0)
        got: dict[int, set[bool]] = {}
        deadline = time.monotonic() + 5
        while len(got) < 40 and time.monotonic() < deadline:
            try:
                data = listener.recv(4096)
            except TimeoutError:
                break
            key, _, rest = data.decode().partition("\0")
            shards, _, flag = rest.partition("\0")
            assert key == f"{CLIENT}/{MAGAZINE}"
            for shard in shards.split(","):
                got.setdefault(int(shard), set()).add(flag == "committing")
        assert sorted(got) == list(range(40)), f"rings lost: {sorted(set(range(40)) - set(got))}"
        assert all(flags == {shard % 2 == 0} for shard, flags in got.items())  # sent again as they were
    finally:
        publisher.close()
        listener.close()
