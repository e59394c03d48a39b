"""Shovel: back to main, per-pass budget, dead-lettering past maxDeliveries, redrive, copy failures."""

from __future__ import annotations

from typing import Any

from ignis_workers.shovel import Shovel
from sweeper_helpers import FaultStore

from ignis.errors import StaleEpoch


def shovel_for(store, **kwargs: Any) -> Shovel:
    """A shovel with an epoch of its own, as `ignis sideline shovel` takes one."""
    epoch = store.next_epoch()
    return Shovel(store, epoch_source=lambda: epoch, **kwargs)


def sideline(q, count: int, attempts: int = 1, reason: str = "rejected") -> list[str]:
    envs = []
    for i in range(count):
        env = q.envelope(b"m%d" % i)
        env.attempts = attempts
        envs.append(env.for_transfer(reason, 1))
    q.sideline.load(envs)
    return [e.msg_id for e in envs]


def ids(magazine) -> list[str]:
    return sorted(env.msg_id for _, env in magazine.browse(100_000))


def test_moves_sideline_back_to_main_keeping_attempts_and_history(store, declare):
    q = declare(shards=2, maxDeliveries=5)
    sent = sideline(q, 7, attempts=2)
    report = shovel_for(store).shovel_queue(store.client_id, q.name)
    assert (report.moved, report.dead_lettered, report.error) == (7, 0, None)
    assert q.sideline.pending() == 0
    assert ids(q.sideline) == []
    back = q.main.browse(100)
    assert sorted(e.msg_id for _, e in back) == sorted(sent)
    assert all(e.attempts == 2 and e.reason is None and e.history == [[1, "rejected", 2]] for _, e in back)


def test_budget_bounds_one_pass(store, declare):
    q = declare(shards=3, shovel={"concurrency": 3, "intervalSeconds": 60})
    sideline(q, 50)
    shovel = shovel_for(store, budget=20, batch=7)
    report = shovel.shovel_queue(store.client_id, q.name)
    assert report.moved == 20 and report.budget_exhausted
    assert len(ids(q.main)) == 20 and len(ids(q.sideline)) == 30
    assert shovel.shovel_queue(store.client_id, q.name).moved == 20
    last = shovel.shovel_queue(store.client_id, q.name)
    assert last.moved == 10 and not last.budget_exhausted


def test_past_max_deliveries_goes_to_dead_with_history(store, declare):
    q = declare(maxDeliveries=3)
    tired = sideline(q, 4, attempts=3, reason="exception")
    fresh = sideline(q, 2, attempts=1)
    report = shovel_for(store).shovel_queue(store.client_id, q.name)
    assert (report.moved, report.dead_lettered) == (2, 4)
    assert ids(q.dead) == sorted(tired) and ids(q.main) == sorted(fresh)
    for _, env in q.dead.browse(100):
        assert env.reason == "exception" and env.history == [[1, "exception", 3]] and env.attempts == 3


def test_zero_max_deliveries_means_unlimited(store, declare):
    q = declare(maxDeliveries=0)
    sideline(q, 3, attempts=500)
    assert shovel_for(store).shovel_queue(store.client_id, q.name).moved == 3
    assert q.dead.pending() == 0


def test_a_handler_that_always_fails_ends_in_dead_letters_not_a_spin(store, declare):
    q = declare(shards=2, maxDeliveries=3)
    sent = {r.id for r in q.publish_many([b"m%d" % i for i in range(20)])}
    shovel = shovel_for(store, budget=1000)
    for _ in range(10):
        q.main.invalidate()  # the shovel loaded through its own handle: re-read the shard pointers
        while msgs := q.fire_many(50):
            q.nack(msgs, "rejected")  # the core dead-letters at maxDeliveries on nack
        shovel.shovel_queue(store.client_id, q.name)
    assert set(ids(q.dead)) == sent
    assert q.main.pending() == 0 and q.sideline.pending() == 0


def test_redrive_from_dead_resets_attempts(store, declare):
    q = declare(maxDeliveries=2)
    sideline(q, 3, attempts=2)
    shovel_for(store).shovel_queue(store.client_id, q.name)
    assert q.dead.pending() == 3
    report = shovel_for(store).shovel_queue(store.client_id, q.name, source="dead")
    assert report.moved == 3 and q.dead.pending() == 0
    assert all(env.attempts == 0 for _, env in q.main.browse(10))


def present(store, magazine: str) -> list[str]:
    return sorted(env.msg_id for _, env in store.peek(magazine, 0, 1, 100))


def test_failed_move_puts_the_messages_back_unclaimed(store, declare):
    q = declare()
    sent = sideline(q, 5)
    faulty = FaultStore(store)
    faulty.fail["move"] = 1
    report = shovel_for(faulty).shovel_queue(store.client_id, q.name, concurrency=1)  # one worker: the pass ends
    assert report.error and report.moved == 0
    assert q.main.pending() == 0
    assert ids(q.sideline) == sorted(sent)  # offered again: unclaimed at the sideline's tail
    assert present(store, q.sideline.name) == sorted(sent)  # and only once
    assert shovel_for(store).shovel_queue(store.client_id, q.name).moved == 5


def test_failed_move_and_failed_put_back_delete_nothing(store, declare):
    q = declare()
    sent = sideline(q, 5)
    faulty = FaultStore(store)
    faulty.fail["move"] = 2
    report = shovel_for(faulty).shovel_queue(store.client_id, q.name, concurrency=1)
    assert report.error and report.moved == 0
    assert present(store, q.sideline.name) == sorted(sent)  # claimed, still there for the sideline sweep


def test_failed_redrive_keeps_dead_letters_on_offer(store, declare):
    q = declare()
    q.dead.load([q.envelope(b"d%d" % i).for_transfer("exception", 1) for i in range(3)])
    faulty = FaultStore(store)
    faulty.fail["move"] = 1
    assert shovel_for(faulty).shovel_queue(store.client_id, q.name, source="dead", concurrency=1).error
    assert len(ids(q.dead)) == 3  # browsable and redrivable again, not stranded below the fire pointer
    assert all(env.reason == "exception" for _, env in q.dead.browse(10))
    assert shovel_for(store).shovel_queue(store.client_id, q.name, source="dead").moved == 3


def test_a_paused_shovel_of_an_ex_leader_moves_nothing_after_a_newer_leader_re_homed_it(store, backend, declare,
                                                                                         clock):
    # The old leader's shovel claims sidelined messages and is paused before it moves them; a newer
    # leader's sideline sweep re-homes them; the old shovel resumes. Its moves are fenced in the writes:
    # nothing reaches main, nothing is deleted, each message stays once in the sideline.
    import threading

    from ignis_workers.sweeper import Sweeper
    from sweeper_helpers import PausingStore

    q = declare(shovel={"concurrency": 1, "intervalSeconds": 10})
    sent = sideline(q, 4)
    own = backend.open()
    try:
        paused = PausingStore(own, "move")
        old_epoch = store.next_epoch()
        old = Shovel(paused, epoch_source=lambda: old_epoch)
        reports: list = []

        def run_old() -> None:
            try:
                reports.append(old.shovel_queue(store.client_id, q.name))
            except StaleEpoch as exc:
                reports.append(exc)

        thread = threading.Thread(target=run_old)
        thread.start()
        assert paused.reached.wait(10), "the old shovel never reached its move"
        new_epoch = store.next_epoch()
        clock.advance(301)  # the claims are now older than the sideline's cutoff
        swept = Sweeper(store, epoch_source=lambda: new_epoch, clock=clock, threads=1).sweep_queue(
            store.client_id, q.name)
        assert swept.sideline.moved == 4
        paused.release.set()
        thread.join(30)
    finally:
        own.close()
    assert isinstance(reports[0], StaleEpoch) or reports[0].moved == 0
    assert all(isinstance(r, Exception) or not any(r) for r in paused.outcomes["move"])
    assert ids(q.main) == [] and q.fire() is None  # (on Aerospike its unused target slots are sealed holes)
    assert ids(q.sideline) == sorted(sent)  # each once, re-homed at the sideline's tail
