"""The background helpers of a store handle (ignis.watch's watcher, ignis.delay's mover) stop for good before
the handle closes: a late fire() between their stop and the close starts no new one, since a store call in
flight when the Aerospike client closes crashes the process (seen: consumers exiting with SIGSEGV at SIGTERM in
the fault runs, once delayed messages kept their movers busy)."""

from __future__ import annotations

from pathlib import Path

from ignis import Ignis, QueueSpec
from ignis.delay import _movers, mover_for, stop_mover
from ignis.watch import _watchers, stop_watcher, watcher_for


def test_a_closing_handle_gets_no_new_helper_and_its_old_ones_have_ended(tmp_path: Path) -> None:
    ig = Ignis(f"lmdb://{tmp_path}/store")
    try:
        ig.apply(QueueSpec.build(name="q", handlerType="q", shards=2))
        q = ig.queue("q")
        assert q.fire(timeout=0.05) is None  # a consumer waited: the watcher and the mover run
        store = ig.store
        watcher, mover = _watchers.find(store), _movers.find(store)
        assert watcher is not None and mover is not None and not watcher.stopped and not mover.stopped
        stop_mover(store)  # what close() does first ...
        stop_watcher(store)
        q.main.watch()  # ... and a late fire() meanwhile, before the handle closes
        assert q.fire(timeout=0.05) is None
        assert watcher_for(store) is None and mover_for(store) is None
        assert _watchers.find(store) is watcher and _movers.find(store) is mover  # none made anew
        assert not watcher._thread.is_alive() and not mover._thread.is_alive()
    finally:
        ig.close()


def test_close_stops_both_helpers(tmp_path: Path) -> None:
    ig = Ignis(f"lmdb://{tmp_path}/store")
    ig.apply(QueueSpec.build(name="q", handlerType="q", shards=2))
    ig.queue("q").fire(timeout=0.05)
    store = ig.store
    ig.close()
    threads = [h._thread for h in (_watchers.find(store), _movers.find(store)) if h is not None]
    assert len(threads) == 2 and not any(t.is_alive() for t in threads)


def test_moves_failing_while_the_store_answers_log_one_warning(tmp_path: Path, monkeypatch, caplog) -> None:
    """Queries of the delay index that time out while every other call answers (partitions migrating) are
    one WARNING for the stretch, not one per failure, and not the store's own outage."""
    import logging
    import time

    import ignis.delay as delay
    from ignis.errors import StoreUnavailable
    from ignis.logs import Reachability

    monkeypatch.setattr(delay, "MOVES_HEALTH", Reachability("store (moving delayed messages)",
                                                            logging.getLogger("ignis.store"), settle_seconds=30))
    ig = Ignis(f"lmdb://{tmp_path}/store")
    try:
        ig.apply(QueueSpec.build(name="q", handlerType="q", shards=2))
        q = ig.queue("q")
        q.publish(b"x", delay=0.05)
        calls: list[float] = []
        started = time.monotonic()

        def timing_out_by_turns(*args: object) -> list:  # fails, answers for 1.3 s (nothing due), fails again
            calls.append(time.monotonic() - started)
            if 0.3 < calls[-1] < 1.6:
                return []
            raise StoreUnavailable("aerospike due_delayed: timed out [9] (test)")

        monkeypatch.setattr(ig.store, "due_delayed", timing_out_by_turns)
        with caplog.at_level(logging.DEBUG, logger="ignis.store"):
            q.fire(timeout=2.5)  # the process's mover follows the queue and keeps trying to move
        assert min(calls) < 0.3 and any(0.3 < c < 1.6 for c in calls) and max(calls) > 1.6
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "moving delayed messages" in warnings[0].getMessage()
    finally:
        ig.close()


def test_queue_listings_failing_by_turns_while_the_store_answers_log_one_warning(tmp_path: Path, monkeypatch,
                                                                                    caplog) -> None:
    """A consumer's refresh lists the queues (an index query): while a cluster's partitions migrate such queries
    fail now and then although every other call answers. One WARNING for the stretch, not one per failed refresh
    after a second of answers (which the store's own health, settled after a second, logged)."""
    import logging
    import time

    import ignis.consumer as consumer_module
    from ignis import Consumer
    from ignis.errors import StoreUnavailable
    from ignis.logs import Reachability

    monkeypatch.setattr(consumer_module, "LISTING_HEALTH", Reachability(
        "store (listing queues)", logging.getLogger("ignis.store"), settle_seconds=30))
    ig = Ignis(f"lmdb://{tmp_path}/store")
    try:
        ig.apply(QueueSpec.build(name="q", handlerType="q", shards=1))
        real = ig.list_queues
        calls: list[float] = []
        started = time.monotonic()

        def failing_by_turns(*args: object, **kwargs: object) -> list:  # the 2nd and every 4th after fail
            calls.append(time.monotonic() - started)
            if len(calls) % 4 == 2:
                raise StoreUnavailable("aerospike list_queues: timed out [9] (test)")
            return real(*args, **kwargs)

        monkeypatch.setattr(ig, "list_queues", failing_by_turns)
        consumer = Consumer(ig, refresh_interval=0.6)
        consumer.handler("q")(lambda message: None)
        with caplog.at_level(logging.DEBUG, logger="ignis.store"):
            consumer.start()
            try:
                deadline = time.monotonic() + 10
                while len(calls) < 7 and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                consumer.stop()
        assert len(calls) >= 7, calls  # two failures, the second after three answers 0.6 s apart
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "listing queues" in warnings[0], warnings
        assert not any("reachable again" in r.getMessage() for r in caplog.records), "not settled yet"
    finally:
        ig.close()
