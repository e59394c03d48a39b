"""The lock-free counter must not lose increments across threads and must scrape like a Counter."""

from __future__ import annotations

import gc
import threading

import pytest
from prometheus_client import REGISTRY, generate_latest

from ignis.metrics import FastCounter, FastHistogram


def test_fast_counter_counts_every_increment_across_threads() -> None:
    counter = FastCounter("ignis_test_fast_counter", "test", ["queue"])
    a, b = counter.labels("a"), counter.labels("b")

    def work() -> None:
        for _ in range(20000):
            a.inc()
            b.inc(2)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert REGISTRY.get_sample_value("ignis_test_fast_counter_total", {"queue": "a"}) == 160000
    assert REGISTRY.get_sample_value("ignis_test_fast_counter_total", {"queue": "b"}) == 320000
    text = generate_latest().decode()
    assert "# TYPE ignis_test_fast_counter_total counter" in text
    assert 'ignis_test_fast_counter_total{queue="a"} 160000.0' in text
    assert counter._cells == []  # the finished threads' cells were folded, their counts kept
    a.inc()
    assert REGISTRY.get_sample_value("ignis_test_fast_counter_total", {"queue": "a"}) == 160001
    REGISTRY.unregister(counter)


def test_fast_counter_ticks_add_to_increments_and_are_never_lost() -> None:
    counter = FastCounter("ignis_test_fast_counter_ticks", "test", ["queue"])
    assert counter.labels("a") is counter.labels("a")  # one child per label set: its ticks are found
    a = counter.labels("a")
    start = threading.Barrier(8)

    def work() -> None:
        tick = counter.labels("a").tick
        start.wait()  # all threads tick at once, so a lost update would show
        for _ in range(50000):
            tick()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.inc(5)
    assert a.ticks() == 400000
    assert REGISTRY.get_sample_value("ignis_test_fast_counter_ticks_total", {"queue": "a"}) == 400005
    assert REGISTRY.get_sample_value("ignis_test_fast_counter_ticks_total", {"queue": "b"}) is None
    REGISTRY.unregister(counter)


def test_fast_counter_rejects_bad_use() -> None:
    counter = FastCounter("ignis_test_fast_counter_bad", "test", ["queue"])
    try:
        import pytest

        with pytest.raises(ValueError, match="takes labels"):
            counter.labels("a", "b")
        with pytest.raises(ValueError, match="only go up"):
            counter.labels("a").inc(-1)
    finally:
        REGISTRY.unregister(counter)


def test_fast_counter_forgets_children_nobody_holds_but_keeps_their_counts() -> None:
    """A process that opens thousands of queues (the operator reads figures of each) must not keep a child
    per queue for ever; a child's ticks outlive it, and a child whose tick is still held stays."""
    counter = FastCounter("ignis_test_fast_counter_children", "test", ["queue"])
    try:
        for i in range(1000):
            child = counter.labels(f"q{i}")
            for _ in range(i % 3):
                child.tick()
        del child
        gc.collect()
        assert len(counter._children) == 0  # no cycle keeps a child: it departs when its holder lets go
        other = counter.labels("other")  # with nobody scraping, what the departed left is folded as labels are made
        assert len(counter._departed) == 0 and len(counter._retired) == 666
        del other
        kept = counter.labels("held")
        held = kept.tick
        gc.collect()
        held()
        held()
        assert REGISTRY.get_sample_value("ignis_test_fast_counter_children_total", {"queue": "held"}) == 2
        assert REGISTRY.get_sample_value("ignis_test_fast_counter_children_total", {"queue": "q2"}) == 2
        assert REGISTRY.get_sample_value("ignis_test_fast_counter_children_total", {"queue": "q0"}) is None
        again = counter.labels("q2")  # a new child of a departed label set adds to what it left
        again.tick()
        held()
        del again
        gc.collect()
        assert REGISTRY.get_sample_value("ignis_test_fast_counter_children_total", {"queue": "q2"}) == 3
        assert REGISTRY.get_sample_value("ignis_test_fast_counter_children_total", {"queue": "held"}) == 3
        total = sum(s.value for m in counter.collect() for s in m.samples)
        assert total == sum(i % 3 for i in range(1000)) + 1 + 3
    finally:
        REGISTRY.unregister(counter)


def test_fast_histogram_observe_many_counts_as_observe_does() -> None:
    """A batch of deliveries observes its latencies in one call: the same buckets and sum as one call each."""
    histogram = FastHistogram("ignis_test_observe_many_seconds", "test", ["way"], buckets=(0.001, 0.01, 0.1, 1))
    values = [0.0, 0.0005, 0.001, 0.002, 0.05, 0.5, 2.0, 7.25]
    for value in values:
        histogram.labels("one").observe(value)
    histogram.labels("many").observe_many(values)
    histogram.labels("many").observe_many([])  # nothing: changes nothing
    samples = {(s.name, s.labels["way"], s.labels.get("le")): s.value
               for family in histogram.collect() for s in family.samples}
    one = {(name, le): v for (name, way, le), v in samples.items() if way == "one"}
    many = {(name, le): v for (name, way, le), v in samples.items() if way == "many"}
    assert one == many and one[("ignis_test_observe_many_seconds_count", None)] == len(values)
    assert one[("ignis_test_observe_many_seconds_bucket", "0.01")] == 4
    REGISTRY.unregister(histogram)


def test_fast_histogram_observe_many_matches_observe_on_random_values() -> None:
    """observe_many sorts and bisects once per bucket: the same counts as observe per value, on values that sit on a
    bound, between bounds and past the last, in any order; a negative one counts as 0."""
    import random

    rng = random.Random(47)
    bounds = (0.0005, 0.001, 0.0025, 0.01, 1, 10)
    histogram = FastHistogram("ignis_test_observe_many_random_seconds", "test", ["way"], buckets=bounds)
    values = [rng.choice((rng.random() * 20, rng.random() * 0.002, rng.choice(bounds), -rng.random()))
              for _ in range(5000)]
    for value in values:
        histogram.labels("one").observe(max(value, 0.0))
    histogram.labels("many").observe_many(values)
    samples = {(s.name, s.labels["way"], s.labels.get("le")): s.value
               for family in histogram.collect() for s in family.samples}
    one = {(name, le): v for (name, way, le), v in samples.items() if way == "one"}
    many = {(name, le): v for (name, way, le), v in samples.items() if way == "many"}
    total = "ignis_test_observe_many_random_seconds_sum", None
    assert many.pop(total) == pytest.approx(one.pop(total))
    assert one == many and one[("ignis_test_observe_many_random_seconds_count", None)] == len(values)
    REGISTRY.unregister(histogram)


def test_fast_histogram_pending_observations_are_in_every_scrape_and_folded_at_the_bound() -> None:
    """A per-message path appends to `pending` and folds at FOLD_AT; a scrape folds the rest first. Nothing is
    counted twice by concurrent folders, nothing lost by appends that land during a fold."""
    from ignis.metrics import FOLD_AT

    histogram = FastHistogram("ignis_test_pending_seconds", "test", ["q"], buckets=(0.001, 1))
    child = histogram.labels("a")

    def count() -> float:
        return next(s.value for f in histogram.collect() for s in f.samples if s.name.endswith("_count"))

    child.pending += [0.0005, 2.0, -0.5]  # a negative one (two hosts' clocks) counts as 0
    assert count() == 3 and child.pending == []
    samples = {(s.name, s.labels.get("le")): s.value for f in histogram.collect() for s in f.samples}
    assert samples[("ignis_test_pending_seconds_bucket", "0.001")] == 2
    assert samples[("ignis_test_pending_seconds_sum", None)] == 2.0005

    def appender() -> None:
        for _ in range(10 * FOLD_AT):
            child.pending.append(0.5)
            if len(child.pending) >= FOLD_AT:
                child.fold()

    threads = [threading.Thread(target=appender) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(child.pending) < FOLD_AT  # bounded by the appenders' folds
    assert count() == 3 + 4 * 10 * FOLD_AT  # every observation once
    REGISTRY.unregister(histogram)
