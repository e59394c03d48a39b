"""The oldest waiting message's age (ignis.waiting) over a store that counts its reads: the head of each
shard decides, holes and fresh claims are stepped over within the rounds, empty shards cost nothing."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from ignis.envelope import Envelope
from ignis.storage.base import ShardPointers, SlotRef
from ignis.waiting import HEAD_ROUNDS, age_seconds, oldest_waiting_since, waiting_since

MAG = "orders"


class Records:
    """Storage.read over a dict of slot -> record; every batch it answers is kept, in order."""

    def __init__(self, records: dict[tuple[int, int], Any]) -> None:
        self.records = records
        self.batches: list[list[tuple[int, int]]] = []

    def read(self, refs: Sequence[SlotRef]) -> list[Any]:
        assert all(r.magazine == MAG for r in refs)
        self.batches.append([(r.shard, r.slot) for r in refs])
        return [self.records.get((r.shard, r.slot)) for r in refs]


def env(loaded_at: int, fire_ts: int | None = None) -> Envelope:
    return Envelope(b"x", f"id-{loaded_at}", loaded_at, fire_ts=fire_ts)


def oldest(store: Records, pointers: dict[int, ShardPointers], **kwargs: Any) -> int | None:
    return oldest_waiting_since(store, MAG, pointers, **kwargs)  # type: ignore[arg-type]


def test_nothing_unclaimed_reads_nothing() -> None:
    store = Records({(0, 5): env(1000)})
    assert oldest(store, {}) is None
    assert oldest(store, {0: ShardPointers(load=5, fire=5), 1: ShardPointers()}) is None
    assert store.batches == []


def test_one_batch_of_each_non_empty_shards_head_gives_the_earliest() -> None:
    store = Records({(0, 4): env(3000), (0, 5): env(1000),  # a later slot's older time is not the head's
                     (1, 8): env(2000), (2, 1): env(9000)})
    pointers = {0: ShardPointers(load=5, fire=3), 1: ShardPointers(load=9, fire=7), 2: ShardPointers(load=1),
                3: ShardPointers(load=2, fire=2)}
    assert oldest(store, pointers) == 2000
    assert store.batches == [[(0, 4), (1, 8), (2, 1)]]


def test_holes_at_the_head_are_stepped_over_in_growing_rounds() -> None:
    store = Records({(0, 1): env(5000), (1, 3): env(4000), (1, 4): env(100), (2, 50): env(10)})
    pointers = {0: ShardPointers(load=3), 1: ShardPointers(load=50), 2: ShardPointers(load=60, fire=10)}
    assert oldest(store, pointers) == 4000  # shard 1's head is slot 3 (slot 4 is not looked at as the head)
    assert store.batches == [[(0, 1), (1, 1), (2, 11)], [(1, 2), (1, 3), (1, 4), (2, 12), (2, 13), (2, 14)],
                             [(2, s) for s in range(15, 15 + HEAD_ROUNDS[2])]]
    # A head further out than the rounds reach gives no figure: shard 2's slot 50 was never read; within them
    # it is found.
    assert oldest(Records({(2, 50): env(10)}), {2: pointers[2]}) is None
    assert oldest(Records({(2, 44): env(10)}), {2: pointers[2]}) == 10


def test_rounds_never_read_past_the_load_pointer() -> None:
    store = Records({})
    assert oldest(store, {0: ShardPointers(load=3, fire=1)}) is None
    assert store.batches == [[(0, 2)], [(0, 3)]]


def test_a_claim_that_landed_after_the_pointer_read_and_an_unreadable_record_are_not_waiting() -> None:
    store = Records({(0, 1): env(1000, fire_ts=1500), (0, 2): env(0), (0, 3): env(2000)})
    assert oldest(store, {0: ShardPointers(load=3)}) == 2000


def test_a_due_time_counts_instead_of_the_publish_time() -> None:
    delayed = SimpleNamespace(loaded_at=1000, due_at=61_000, fire_ts=None)  # published for a minute later
    store = Records({(0, 1): delayed, (1, 1): env(30_000)})
    assert oldest(store, {0: ShardPointers(load=1), 1: ShardPointers(load=1)}) == 30_000
    assert waiting_since(delayed) == 61_000  # type: ignore[arg-type]
    assert waiting_since(SimpleNamespace(loaded_at=1000, due_at=None)) == 1000  # type: ignore[arg-type]
    assert waiting_since(env(1000)) == 1000  # an Envelope without due_at at all: never delayed


@pytest.mark.parametrize(("since", "now", "age"), [(None, 5000, None), (1000, 3500, 2.5), (1000, 1001, 0.001),
                                                   (9000, 5000, 0.0)])
def test_age_seconds(since: int | None, now: int, age: float | None) -> None:
    assert age_seconds(since, now) == age
