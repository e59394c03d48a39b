"""Sweeper processes on one store (store lease), on lmdb and on a real Aerospike server when
IGNIS_TEST_AEROSPIKE is set (processes cannot share the in-process emulator): exactly one sweeps at a
time, SIGKILL / SIGTERM hand-over times, a paused leader cannot write a stale pointer, and end-to-end
crash recovery (a killed consumer; producers, consumers and the leader killed together)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ignis_workers.election import LEASE_NAME
from support.aerospike_support import lmdb_or_real_server_url
from support.polling import wait_for

from ignis import Ignis, QueueSpec, TopicSpec
from ignis.storage import open_store
from ignis.storage.base import CURSOR_SWEPT, SWEEP_EPOCH

LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.3
SWEEPER_ENV = {
    "IGNIS_SWEEPER_LEASE_DURATION_SECONDS": str(LEASE_S),
    "IGNIS_SWEEPER_RENEW_DEADLINE_SECONDS": str(RENEW_S),
    "IGNIS_SWEEPER_RETRY_PERIOD_SECONDS": str(RETRY_S),
    "IGNIS_SWEEPER_SWEEP_INTERVAL_SECONDS": "0.2",
    "IGNIS_SWEEPER_SHOVEL_TICK_SECONDS": "0.2",
    "IGNIS_SWEEPER_THREADS": "4",
    # Every claim looks abandoned to these sweepers (sweepDuration is at least 300 s).
    "IGNIS_SWEEPER_CLOCK_OFFSET_SECONDS": "400",
}

pytestmark = pytest.mark.timeout(180)


class Sweepers:
    """Starts `ignis sweeper` processes and reads their JSON logs."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.store = open_store(url)

    def start(self, identity: str) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{identity}.log", "wb")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "ignis.cli.app", "--store", self.url, "sweeper", "--identity", identity,
             "--port", "-1", "--log-format", "json"],
            stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, **SWEEPER_ENV})
        self.procs[identity] = proc
        return proc

    def events(self, identity: str) -> list[dict[str, Any]]:
        out = []
        for line in (self.tmp / f"{identity}.log").read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut by SIGKILL
                out.append(json.loads(line))
        return out

    def holder(self) -> str:
        lease = self.store.get_lease(LEASE_NAME)
        return lease.holder if lease else ""

    def passes(self) -> list[dict[str, Any]]:
        found = [e | {"who": who} for who in self.procs for e in self.events(who) if e.get("event") == "sweep_pass"]
        return sorted(found, key=lambda e: e["started"])

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with_resume(proc)
                proc.kill()
            proc.wait(10)
        self.store.close()


def with_resume(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGCONT)




@pytest.fixture(params=["lmdb", "aerospike"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from lmdb_or_real_server_url(request.param, tmp_path)


@pytest.fixture
def sweepers(url: str, tmp_path: Path) -> Iterator[Sweepers]:
    s = Sweepers(url, tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def queue(url: str) -> Iterator[Any]:
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="orders", handlerType="orders", shards=4, sweepDurationSeconds=300,
                                     shovel={"enabled": False}))  # swept messages stay in the sideline
        yield ignis.queue("orders")


def abandon(queue: Any, count: int) -> None:
    """Publish and claim `count` messages that nobody will settle (work for whoever leads)."""
    queue.publish_many([b"x"] * count)
    queue.main.invalidate()
    while queue.fire_many(count):
        pass


def assert_one_sweeper_at_a_time(passes: list[dict[str, Any]]) -> None:
    for before, after in itertools.pairwise(passes):
        if before["who"] != after["who"]:
            assert before["ended"] <= after["started"], f"overlapping sweeps: {before} and {after}"
    epochs = [p["epoch"] for p in passes]
    assert epochs == sorted(epochs), f"epochs went backwards: {epochs}"


def test_three_sweepers_one_leads_sigkill_and_sigterm_hand_over(sweepers: Sweepers, queue: Any):
    for who in ("s1", "s2", "s3"):
        sweepers.start(who)
    first = wait_for(lambda: sweepers.holder(), what="a leader")
    abandon(queue, 50)
    wait_for(lambda: queue.sideline.pending() >= 50, what="the leader's sweep")
    time.sleep(1.0)
    assert {p["who"] for p in sweepers.passes()} == {first}  # the standbys never swept

    sweepers.procs[first].kill()  # SIGKILL: no release, the lease must expire
    killed_at = time.monotonic()
    second = wait_for(lambda: (h := sweepers.holder()) not in ("", first) and h, what="a new leader")
    sigkill_handover = time.monotonic() - killed_at
    # The standbys saw the last renewal at most one retry period late, then wait out the lease.
    assert sigkill_handover < LEASE_S + 3 * RETRY_S + 1.0, sigkill_handover
    abandon(queue, 20)
    wait_for(lambda: queue.sideline.pending() >= 70, what="the second leader's sweep")

    sweepers.procs[second].send_signal(signal.SIGTERM)  # releases the lease on the way out
    termed_at = time.monotonic()
    third = wait_for(lambda: (h := sweepers.holder()) not in ("", first, second) and h, what="the last leader")
    sigterm_handover = time.monotonic() - termed_at
    assert sigterm_handover < 2.0, sigterm_handover
    assert sweepers.procs[second].wait(10) == 0
    abandon(queue, 5)
    wait_for(lambda: queue.sideline.pending() >= 75, what="the third leader's sweep")

    passes = sweepers.passes()
    assert next(p["who"] for p in passes if p["moved"]) == first
    assert {p["who"] for p in passes} == {first, second, third}
    assert_one_sweeper_at_a_time(passes)
    lease = sweepers.store.get_lease(LEASE_NAME)
    assert lease.transitions >= 2
    print(f"\nSIGKILL hand-over {sigkill_handover:.2f}s, SIGTERM hand-over {sigterm_handover:.2f}s "
          f"(lease {LEASE_S}s, retry {RETRY_S}s)")


def test_paused_leader_cannot_write_a_stale_pointer(sweepers: Sweepers, queue: Any):
    a = sweepers.start("a")
    wait_for(lambda: sweepers.holder() == "a", what="a to lead")
    abandon(queue, 10)
    wait_for(lambda: queue.sideline.pending() >= 10, what="a's sweep")
    # a's pass ends after its moves (it then stores its epoch with the sweep pointers): pausing a before that
    # left the pass to end after a woke, a pass that began while a led, which the check below then counted.
    wait_for(lambda: any(p["who"] == "a" and p["moved"] for p in sweepers.passes()), what="a's pass to end")
    epoch_a = sweepers.store.get_queue("orders").bins[SWEEP_EPOCH]
    sweepers.start("b")
    a.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: sweepers.holder() == "b", timeout=LEASE_S * 4, what="b to take over")
        abandon(queue, 10)
        wait_for(lambda: queue.sideline.pending() >= 20, what="b's sweep")
        # The pass stores its epoch with the sweep pointers after the moves: read it once b's pass has ended
        # (reading as soon as the sideline count is reached raced that write on a real server).
        wait_for(lambda: any(p["who"] == "b" and p["moved"] for p in sweepers.passes()), what="b's pass to end")
        epoch_b = sweepers.store.get_queue("orders").bins[SWEEP_EPOCH]
        assert epoch_b > epoch_a
        abandon(queue, 10)  # work that a, on waking, would love to sweep with its old epoch
    finally:
        a.send_signal(signal.SIGCONT)
    resumed = time.time()
    wait_for(lambda: any(e.get("event") == "stopped" and e.get("identity") == "a"
                                        for e in sweepers.events("a")), what="a to notice")
    wait_for(lambda: queue.sideline.pending() >= 30, what="the new work swept")
    time.sleep(1.0)
    assert sweepers.holder() == "b"
    assert sweepers.store.get_queue("orders").bins[SWEEP_EPOCH] == epoch_b
    late = [p for p in sweepers.passes() if p["who"] == "a" and p["ended"] > resumed]
    assert late == [], f"the paused leader swept after waking: {late}"
    assert_one_sweeper_at_a_time([p for p in sweepers.passes() if p["ended"] <= resumed or p["who"] == "b"])


VICTIM = """
import sys, time
from ignis import Ignis
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue("e2e")
    msgs = q.fire_many(int(sys.argv[2]))
    q.ack(msgs[::2])
    for m in msgs[::2]:
        print("acked", m.id)
    print("handling", len(msgs), flush=True)
    time.sleep(3600)  # killed here, mid-handle: the other half stays claimed and unsettled
"""


def test_killed_consumer_messages_come_back_through_sweep_and_shovel(sweepers: Sweepers, url: str):
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="e2e", handlerType="e2e", shards=8, sweepDurationSeconds=300,
                                    shovel={"concurrency": 2, "intervalSeconds": 1}, maxDeliveries=0))
        q = ignis.queue("e2e")
        sent: set[str] = set()
        for chunk in range(10):
            sent |= {r.id for r in q.publish_many([f"{chunk}-{i}".encode() for i in range(1000)])}
        assert len(sent) == 10_000
        victim = subprocess.Popen([sys.executable, "-c", VICTIM, url, "3000"], stdout=subprocess.PIPE, text=True)
        delivered: set[str] = set()
        for line in victim.stdout:
            word, value = line.split()
            if word == "handling":
                assert value == "3000"
                break
            delivered.add(value)
        victim.kill()
        victim.wait(10)
        stranded = sent - delivered - {e.msg_id for _, e in q.main.browse(100_000)}
        assert len(delivered) == 1500 and len(stranded) == 1500

        sweepers.start("e2e-sweeper")
        attempts: dict[str, int] = {}
        deadline = time.monotonic() + 90
        while not sent <= delivered and time.monotonic() < deadline:
            msgs = q.fire_many(500)
            if not msgs:
                time.sleep(0.05)
                continue
            q.ack(msgs)
            for m in msgs:
                delivered.add(m.id)
                attempts[m.id] = max(attempts.get(m.id, 0), m.attempts)
        lost = sent - delivered
        assert not lost, f"{len(lost)} message(s) never delivered"
        assert all(attempts[i] >= 2 for i in stranded)  # the killed consumer's claims were redelivered
        assert ignis.record("e2e").bins["sweptCounter"] >= 1500


PRODUCER = """
import sys, time
from ignis import Ignis
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue("crash")
    for i in range(int(sys.argv[2])):
        print("published", q.publish(f"{sys.argv[3]}-{i}".encode()).id, flush=True)
        time.sleep(0.001)  # a steady producer, so the kill lands mid-publish on the fast embedded store too
"""

CONSUMER = """
import sys, threading, time
from ignis import Ignis
lock = threading.Lock()
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue("crash")

    def work():
        while True:
            m = q.fire()
            if m is None:
                time.sleep(0.01)
                continue
            time.sleep(0.005)  # handling: a kill now leaves the message claimed and not handled
            with lock:  # handled: said before the ack, so a kill between the two hides no handled message
                print("delivered", m.id, flush=True)
            m.ack()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]  # 4 threads: prefetch at work
    for t in threads:
        t.start()
    time.sleep(3600)
"""


NOWHERE = "nowhere (deleted)"


def locate(store: Any, queue: str, shards: int, ids: set[str]) -> dict[str, str]:
    """Where each message is now: every present record of the queue's magazines, claimed or not."""
    from ignis import names

    where = dict.fromkeys(ids, NOWHERE)
    for magazine in (queue, names.sideline_of(queue), names.dead_of(queue)):
        for shard, p in store.pointers(magazine, shards).items():
            for ref, env in store.peek(magazine, shard, 1, p.load):
                if env.msg_id in where:
                    state = "claimed" if ref.slot <= p.fire else "unclaimed"
                    where[env.msg_id] = f"{ref} {state} fireTS={env.fire_ts} attempts={env.attempts}"
    return where


class Lines:
    """A child process whose stdout lines ("word value") are collected by a reader thread."""

    def __init__(self, script: str, *args: str) -> None:
        # Block-buffered: a child's print(..., flush=True) then reaches the pipe in one write, whole or not at all.
        # Unbuffered (PYTHONUNBUFFERED, set on CI machines) print writes each word and separator apart, and a SIGKILL
        # between two leaves a line cut short ("published <id>" without its subject).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        self.proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)
        self.values: dict[str, list[str]] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if not line.endswith("\n"):  # (a last line the child's death cut: none, written as above)
                continue
            word, _, value = line.strip().partition(" ")
            if value:
                self.values.setdefault(word, []).append(value)

    def count(self, word: str) -> int:
        return len(self.values.get(word, []))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.thread.join(10)


CRASH_SWEEP_S = 300  # the queue's sweepDuration (the least a queue may declare)


# On Aerospike a consumer may claim a slot before its producer's write lands and die before it stamps the
# record: the sweeper then finds a claimed record with no fire time, stamps it and moves it one
# sweepDuration later (DESIGN §5: a live claim is never disturbed). That bounds the wait for every message.
@pytest.mark.timeout(CRASH_SWEEP_S + 180)
def test_producers_consumers_and_the_leader_killed_together_strand_nothing(sweepers: Sweepers, url: str):
    """The crash test of issue 10: 5,000 messages; a producer, a consumer and the sweeper leader
    SIGKILLed mid-run, two sweeper processes; every publish that returned is delivered at least once."""
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="crash", handlerType="crash", shards=8, sweepDurationSeconds=CRASH_SWEEP_S,
                                    shovel={"concurrency": 2, "intervalSeconds": 1}, maxDeliveries=0))
        for who in ("s1", "s2"):
            sweepers.start(who)
        leader = wait_for(lambda: sweepers.holder(), what="a leader")
        producers = [Lines(PRODUCER, url, "2500", f"p{i}") for i in range(2)]
        consumers = [Lines(CONSUMER, url) for _ in range(2)]
        children = [*producers, *consumers]
        try:
            wait_for(lambda: producers[0].count("published") >= 500, timeout=60, what="a producer under way")
            producers[0].kill()  # mid-publish
            wait_for(lambda: sum(c.count("delivered") for c in consumers) >= 500, timeout=60,
                     what="consumers under way")
            sweepers.procs[leader].kill()  # mid-sweep: what follows is the next leader's work
            consumers[0].kill()  # mid-consume: its claimed (and prefetched) messages are stranded
            killed_at = time.time()
            wait_for(lambda: producers[1].proc.poll() is not None, timeout=120, what="the other producer")
            published = set(producers[0].values["published"]) | set(producers[1].values["published"])
            assert len(producers[1].values["published"]) == 2500 and 2500 + 500 <= len(published) < 5000
            delivered = lambda: {v for c in consumers for v in c.values.get("delivered", [])}  # noqa: E731
            # The survivors drain the rest, and what the dead consumer held comes back through the new
            # leader's sweep (every claim looks abandoned to these sweepers) and the shovel.
            deadline = time.monotonic() + CRASH_SWEEP_S + 60
            while not published <= delivered() and time.monotonic() < deadline:
                time.sleep(0.5)
            undelivered = published - delivered()
            assert not undelivered, (f"{len(undelivered)} of {len(published)} messages never delivered: "
                                     f"{locate(sweepers.store, 'crash', 8, undelivered)}")
            # The standby took over and sweeps (what it moves depends on what the old leader had already
            # moved before it died: every claim looks abandoned to these sweepers).
            new_leader = wait_for(lambda: (h := sweepers.holder()) not in ("", leader) and h, timeout=LEASE_S * 4,
                                  what="the standby to lead")
            wait_for(lambda: any(p["who"] == new_leader and p["started"] > killed_at for p in sweepers.passes()),
                     what="a sweep by the new leader")
        finally:
            for child in children:
                if child.proc.poll() is None:
                    child.kill()
        print(f"\n{len(published)} published, all delivered; {sum(c.count('delivered') for c in consumers)} "
              f"deliveries (the rest are redeliveries); sweptCounter {ignis.record('crash').bins.get('sweptCounter')}")


DELAYED_PRODUCER = """
import sys, time
from ignis import Ignis
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue("later")
    for i in range(int(sys.argv[2])):
        ref = q.publish(f"{sys.argv[3]}-{i}".encode(), delay=0.5 + (i % 4) * 0.5)
        print("published", f"{ref.id}:{ref.slot}", flush=True)
        time.sleep(0.002)
"""

DELAYED_CONSUMER = """
import sys, threading, time
from ignis import Ignis
from ignis.envelope import now_ms
lock = threading.Lock()
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue("later")

    def work():
        while True:
            m = q.fire(timeout=0.5)
            if m is None:
                continue
            with lock:
                print("delivered", f"{m.id}:{now_ms()}", flush=True)
            m.ack()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(3600)
"""


@pytest.mark.timeout(CRASH_SWEEP_S + 180)
def test_delayed_messages_survive_producer_consumer_and_leader_kills(sweepers: Sweepers, url: str):
    """Issue 28: delayed messages falling due while a producer, a consumer (and its process's mover) and the
    sweeper leader are SIGKILLed: every delayed publish that returned is delivered, none before its time."""
    with Ignis(url) as ignis:
        ignis.apply(QueueSpec.build(name="later", handlerType="later", shards=4, sweepDurationSeconds=CRASH_SWEEP_S,
                                    shovel={"concurrency": 2, "intervalSeconds": 1}, maxDeliveries=0))
        for who in ("d1", "d2"):
            sweepers.start(who)
        leader = wait_for(lambda: sweepers.holder(), what="a leader")
        producers = [Lines(DELAYED_PRODUCER, url, "800", f"p{i}") for i in range(2)]
        consumers = [Lines(DELAYED_CONSUMER, url) for _ in range(2)]
        children = [*producers, *consumers]
        try:
            wait_for(lambda: producers[0].count("published") >= 200, timeout=60, what="a producer under way")
            producers[0].kill()  # mid-publish, with its messages still to fall due
            wait_for(lambda: sum(c.count("delivered") for c in consumers) >= 200, timeout=60,
                     what="consumers under way")
            sweepers.procs[leader].kill()  # mid-move, perhaps: its lease on the due messages must lapse
            consumers[0].kill()  # its mover too
            wait_for(lambda: producers[1].proc.poll() is not None, timeout=120, what="the other producer")
            due = dict(v.split(":") for p in producers for v in p.values.get("published", []))
            assert len(due) >= 800 + 200

            def delivered() -> dict[str, int]:
                out: dict[str, int] = {}
                for c in consumers:
                    for v in c.values.get("delivered", []):
                        msg_id, at = v.split(":")
                        out[msg_id] = min(out.get(msg_id, 1 << 62), int(at))
                return out

            deadline = time.monotonic() + CRASH_SWEEP_S + 60
            while not set(due) <= set(delivered()) and time.monotonic() < deadline:
                time.sleep(0.5)
            got = delivered()
            missing = set(due) - set(got)
            assert not missing, f"{len(missing)} of {len(due)} delayed messages never delivered"
            early = {i: int(due[i]) - got[i] for i in due if got[i] < int(due[i])}
            assert not early, f"{len(early)} delivered before their due time (ms early): {list(early.items())[:5]}"
        finally:
            for child in children:
                if child.proc.poll() is None:
                    child.kill()


# ---- topics: at least once per subscription (issue 47, part 3) -------------------------------------------------
TOPIC_SHARDS = 4
# Two subscriptions of one topic, and the test's own reading of their MQTT filters: per subject, the subscriptions
# that must get it (some get it in both, some in one, some in neither).
FILTERS = {"orders": "orders/#", "paid": "+/+/paid"}
SUBJECTS = {
    "orders/eu/paid": {"orders", "paid"},
    "orders/us/created": {"orders"},
    "orders": {"orders"},  # `#` matches the parent level too
    "orders/eu/paid/late": {"orders"},  # `+/+/paid` has exactly three levels
    "refunds/eu/paid": {"paid"},
    "refunds/eu/created": set(),
    "audit": set(),
}

TOPIC_PRODUCER = """
import sys, time
from ignis import Ignis
from ignis.envelope import now_ms
subjects = sys.argv[4].split(",")
with Ignis(sys.argv[1]) as ignis:
    topic = ignis.topic(sys.argv[2])
    i = 0
    while i < int(sys.argv[3]):
        subject = subjects[i % len(subjects)]
        if i % 10 == 9:  # now and then a batch: one group commit, one subject
            n = min(5, int(sys.argv[3]) - i)
            refs = topic.publish_many([f"{sys.argv[5]}-{i + k}".encode() for k in range(n)], subject=subject)
        else:
            refs = [topic.publish(f"{sys.argv[5]}-{i}".encode(), subject=subject)]
        at = now_ms()
        for ref in refs:  # said once the publish returned: confirmed
            print("published", ref.id, subject, at, flush=True)
        i += len(refs)
        time.sleep(0.001)  # a steady producer, so the kill lands mid-publish on the fast embedded store too
"""

# A subscription's consumer: says what it got (with the subject the message carries) before handling it, "acking"
# before the ack and "acked" once the ack returned, so a kill between the two leaves the ack in doubt, not unseen.
SUB_CONSUMER = """
import sys, threading, time
from ignis import Ignis
from ignis.envelope import now_ms
lock = threading.Lock()
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue(sys.argv[2])

    def say(*words):
        with lock:
            print(*words, flush=True)

    def work():
        while True:
            m = q.fire()
            if m is None:
                time.sleep(0.01)
                continue
            say("got", m.id, m.envelope.subject, m.attempts)
            time.sleep(0.005)  # handling: a kill now leaves the message claimed and not acked
            say("acking", m.id)
            m.ack()
            say("acked", m.id, now_ms())

    threads = [threading.Thread(target=work, daemon=True) for _ in range(4)]  # 4 threads: prefetch at work
    for t in threads:
        t.start()
    time.sleep(3600)
"""


def subscribe(ignis: Ignis, name: str, topic: str, filter: str, **fields: Any) -> None:
    ignis.apply(QueueSpec.build(name=name, handlerType=name, shards=4, sweepDurationSeconds=CRASH_SWEEP_S,
                                shovel={"concurrency": 2, "intervalSeconds": 1}, maxDeliveries=0,
                                subscribe={"topic": topic, "filter": filter, "start": "earliest"}, **fields))


def first_words(lines: list[Lines], word: str) -> dict[str, list[str]]:
    """Per message id, the rest of each `word` line of these processes (id first on every line)."""
    out: dict[str, list[str]] = {}
    for child in lines:
        for value in child.values.get(word, []):
            msg_id, _, rest = value.partition(" ")
            out.setdefault(msg_id, []).append(rest)
    return out


def locate_subscribed(store: Any, sub: str, topic: str, ids: set[str]) -> dict[str, str]:
    """Where each message is in a subscription: its own magazines (`locate`), or a claim in its cursor."""
    from ignis import names

    where = locate(store, sub, 4, ids)
    cursor = names.cursor_of(sub, topic)
    for shard, p in store.pointers(cursor, TOPIC_SHARDS).items():
        for ref, env in store.peek(cursor, shard, 1, p.fire):
            if env.msg_id in where:
                where[env.msg_id] = f"claim {ref} fireTS={env.fire_ts} attempts={env.attempts}"
    return where


def cursor_diagnosis(store: Any, sub: str, topic: str, ids: set[str]) -> str:
    """For a loss's message: where each of `ids` sits in the topic (shard/slot), and per shard the subscription's
    cursor pointers and sweep pointer, so a failure says whether the sweep passed the slot or stopped before it."""
    from ignis import names

    slots: dict[str, str] = {}
    for shard, p in store.pointers(topic, TOPIC_SHARDS).items():
        for ref, env in store.peek(topic, shard, 1, p.load):
            if env.msg_id in ids:
                slots[env.msg_id] = f"{shard}/{ref.slot}"
    record = store.get_queue(sub)
    swept = record.sweep_pointers("cursor") if record is not None else "no queue record"
    cursor = names.cursor_of(sub, topic)
    pointers = {shard: (p.load, p.fire) for shard, p in store.pointers(cursor, TOPIC_SHARDS).items()}
    return f"topic slots {slots}; cursor (load, fire) {pointers}; sweep pointers {swept}"


def misdelivered(consumers: dict[str, list[Lines]], published: dict[str, str]) -> list[tuple[str, str, str]]:
    """(subscription, id, subject) of every delivery a subscription's filter does not select, or whose subject is
    not the one it was published with."""
    wrong = []
    for sub, lines in consumers.items():
        for msg_id, rests in first_words(lines, "got").items():
            for rest in rests:
                subject = rest.split()[0]
                if sub not in SUBJECTS.get(subject, set()) or published.get(msg_id, subject) != subject:
                    wrong.append((sub, msg_id, subject))
    return wrong


@pytest.mark.timeout(CRASH_SWEEP_S + 180)
@pytest.mark.parametrize("url", ["lmdb", "lmdb-defaults", "aerospike"], indirect=True)
def test_topic_producers_consumers_of_two_subscriptions_and_the_leader_killed_together(sweepers: Sweepers, url: str):
    """Issue 47: a topic of 4 shards, two subscriptions with different filters, 4,000 publishes over 7 subjects;
    a producer, a consumer of each subscription and the sweeper leader SIGKILLed mid-run, two sweepers. Every
    publish that returned is acked at least once by every subscription whose filter selects its subject, and no
    subscription is ever handed a message its filter does not select."""
    with Ignis(url) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=TOPIC_SHARDS, retentionSeconds=3600))
        for sub, pattern in FILTERS.items():
            subscribe(ignis, sub, "feed", pattern)
        for who in ("t1", "t2"):
            sweepers.start(who)
        leader = wait_for(lambda: sweepers.holder(), what="a leader")
        subjects = ",".join(SUBJECTS)
        producers = [Lines(TOPIC_PRODUCER, url, "feed", "2000", subjects, f"p{i}") for i in range(2)]
        consumers = {sub: [Lines(SUB_CONSUMER, url, sub) for _ in range(2)] for sub in FILTERS}
        children = [*producers, *(c for lines in consumers.values() for c in lines)]
        killed = [lines[0] for lines in consumers.values()]
        try:
            wait_for(lambda: producers[0].count("published") >= 400, timeout=60, what="a producer under way")
            producers[0].kill()  # mid-publish
            wait_for(lambda: all(sum(c.count("acked") for c in lines) >= 300 for lines in consumers.values()),
                     timeout=60, what="the consumers of both subscriptions under way")
            sweepers.procs[leader].kill()  # mid-sweep: what follows is the next leader's work
            for victim in killed:  # mid-consume: their claimed (and prefetched) messages are stranded
                victim.kill()
            killed_at = time.time()
            wait_for(lambda: producers[1].proc.poll() is not None, timeout=120, what="the other producer")
            published = {msg_id: rests[0].split()[0] for msg_id, rests in first_words(producers, "published").items()}
            assert producers[1].count("published") == 2000 and 2000 + 400 <= len(published) < 4000
            expected = {sub: {i for i, subject in published.items() if sub in SUBJECTS[subject]} for sub in FILTERS}
            # An ack the kill cut between its call and its line: in doubt, settled below by what the store holds.
            in_doubt = {sub: set(first_words([lines[0]], "acking")) - set(first_words([lines[0]], "acked"))
                        for sub, lines in consumers.items()}
            assert all(len(ids) <= 4 for ids in in_doubt.values()), in_doubt  # one per consumer thread at most

            def unacked() -> dict[str, set[str]]:
                return {sub: expected[sub] - set(first_words(consumers[sub], "acked")) for sub in FILTERS}

            def where_unacked() -> dict[str, dict[str, str]]:
                return {sub: locate_subscribed(sweepers.store, sub, "feed", missing)
                        for sub, missing in unacked().items()}

            def only_landed_acks_left() -> bool:
                # An ack in doubt landed if its message is nowhere in the subscription any more (a sweep copies
                # before it deletes): claimed or copied, it would be delivered, and acked, again.
                if any(missing - in_doubt[sub] for sub, missing in unacked().items()):
                    return False
                return all(w == NOWHERE for found in where_unacked().values() for w in found.values())

            # The survivors drain the rest, and what the dead consumers held comes back through the new leader's
            # sweep of each subscription's claims (every claim looks abandoned to these sweepers) and the shovel.
            deadline = time.monotonic() + CRASH_SWEEP_S + 60
            while not only_landed_acks_left() and time.monotonic() < deadline:
                time.sleep(0.5)
            for sub, found in where_unacked().items():
                lost = {i: w for i, w in found.items() if i not in in_doubt[sub] or w != NOWHERE}
                assert not lost, (f"{len(lost)} of {len(expected[sub])} messages of {FILTERS[sub]!r} never acked by "
                                  f"subscription {sub}: {lost}; "
                                  f"{cursor_diagnosis(sweepers.store, sub, 'feed', set(lost))}")
            wrong = misdelivered(consumers, published)
            assert not wrong, f"{len(wrong)} deliveries a subscription's filter does not select: {wrong[:10]}"
            # What a killed consumer got and did not ack comes back, through the sweep: a survivor gets it at a later
            # attempt than the victim did. Waited for: the victim's delivery may have been a second copy of a message
            # a survivor had already acked (these sweepers' clocks run ahead, so a sweep copies claims consumers still
            # work on), and "every message acked" above does not wait for that copy to come back.
            stranded_in = {sub: (set(first_words([lines[0]], "got")) - set(first_words([lines[0]], "acking")))
                           & expected[sub] for sub, lines in consumers.items()}

            def not_back() -> dict[str, dict[str, tuple[list[int], list[int]]]]:
                """Per subscription, each stranded message no survivor got at a later attempt: (the victim's
                attempts, the survivors')."""
                late: dict[str, dict[str, tuple[list[int], list[int]]]] = {}
                for sub, lines in consumers.items():
                    theirs, later = first_words([lines[0]], "got"), first_words(lines[1:], "got")
                    for i in stranded_in[sub]:
                        victim = [int(r.split()[1]) for r in theirs[i]]
                        again = [int(r.split()[1]) for r in later.get(i, [])]
                        if not any(a > max(victim) for a in again):
                            late.setdefault(sub, {})[i] = (victim, again)
                return late

            back_later = not_back()  # (for the summary: stranded copies that came back after every message's ack)
            while not_back() and time.monotonic() < deadline:
                time.sleep(0.5)
            late = not_back()
            where = {sub: locate_subscribed(sweepers.store, sub, "feed", set(ids)) for sub, ids in late.items()}
            assert not late, f"stranded, never got again (victim's attempts, survivors'): {late}; where: {where}"
            # The standby took over and sweeps, the subscriptions' claims among them.
            new_leader = wait_for(lambda: (h := sweepers.holder()) not in ("", leader) and h, timeout=LEASE_S * 4,
                                  what="the standby to lead")
            wait_for(lambda: any(p["who"] == new_leader and p["started"] > killed_at for p in sweepers.passes()),
                     what="a sweep by the new leader")
            swept = {sub: ignis.record(sub).bins.get(CURSOR_SWEPT, 0) for sub in FILTERS}
            # Swept: the claims of every subscription whose killed consumer held a message it had not acked. A victim
            # that was between messages at the kill held none (on Aerospike, whose consumers keep up since their
            # wake-up fixes, often both): test_a_subscription_whose_consumer_died_holding_claims_never_delays_another
            # kills one that holds claims for certain, and counts them swept.
            assert all(swept[sub] for sub in FILTERS if stranded_in[sub]), (swept, stranded_in)
        finally:
            for child in children:
                if child.proc.poll() is None:
                    child.kill()
        stats = {sub: ignis.queue(sub).stats() for sub in FILTERS}
        print(f"\n{len(published)} published; " + "; ".join(
            f"{sub} ({FILTERS[sub]}): {len(expected[sub])} expected, all acked, "
            f"{sum(c.count('acked') for c in consumers[sub])} acks, claims swept {swept[sub]} "
            f"({len(stranded_in[sub])} stranded by the kill, {len(back_later.get(sub, {}))} back after the last ack: "
            f"{back_later.get(sub, {})}), "
            f"in doubt {len(in_doubt[sub])}, expired {stats[sub].expired}" for sub in FILTERS))


HOLDER = """
import sys, time
from ignis import Ignis
with Ignis(sys.argv[1]) as ignis:
    q = ignis.queue(sys.argv[2])
    held = 0
    while held < int(sys.argv[3]):
        msgs = q.fire_many(50)
        if not msgs:
            time.sleep(0.01)
            continue
        for m in msgs:
            print("holding", m.id, flush=True)
        held += len(msgs)
    time.sleep(2.5)  # past Aerospike's claim_write_delay_ms (1 s): its claim records written, as this test holds
    print("held", held, flush=True)
    time.sleep(3600)  # killed here, holding every claim: nothing it took is settled
"""

LIVE_BOUND_S = 5.0  # publish to ack, for the subscription whose consumers live (a shared 2-core machine: generous)


@pytest.mark.timeout(240)
def test_a_subscription_whose_consumer_died_holding_claims_never_delays_another(tmp_path: Path, url: str):
    """Issue 47: a consumer of subscription `orders` SIGKILLed holding 300 claims, with no sweeper running (its
    claims stay stranded for as long as the test looks): subscription `paid` of the same topic still acks every
    message within LIVE_BOUND_S of its publish, and drains, while `orders`' stranded messages wait. A sweeper
    then brings those back to `orders`, whose every message is then acked too."""
    with Ignis(url) as ignis:
        ignis.apply(TopicSpec.build(name="feed", shards=TOPIC_SHARDS, retentionSeconds=3600))
        for sub, pattern in FILTERS.items():
            subscribe(ignis, sub, "feed", pattern)
        topic = ignis.topic("feed")
        # Published before anyone claims (no write of it still on its way when the holder dies), all of them
        # `orders`' and half of them `paid`'s.
        early = {r.id: "orders/eu/paid" for r in topic.publish_many([b"e"] * 300, subject="orders/eu/paid")}
        early |= {r.id: "orders/us/created" for r in topic.publish_many([b"e"] * 300, subject="orders/us/created")}
        live = [Lines(SUB_CONSUMER, url, "paid")]
        holder = Lines(HOLDER, url, "orders", "300")
        children = [*live, holder]
        try:
            wait_for(lambda: holder.count("held"), timeout=60, what="the holder's claims")
            holder.kill()
            held = set(holder.values["holding"])
            assert len(held) >= 300
            killed_at_ms = int(time.time() * 1000)
            producer = Lines(TOPIC_PRODUCER, url, "feed", "1500", ",".join(SUBJECTS), "p")
            children.append(producer)
            wait_for(lambda: producer.proc.poll() is not None, timeout=120, what="the producer")
            publishes = {i: r[0].split() for i, r in first_words([producer], "published").items()}
            published = early | {i: subject for i, (subject, _) in publishes.items()}
            assert len(publishes) == 1500
            expected = {sub: {i for i, subject in published.items() if sub in SUBJECTS[subject]} for sub in FILTERS}

            def acked(lines: list[Lines]) -> dict[str, int]:
                return {i: min(int(r) for r in rests) for i, rests in first_words(lines, "acked").items()}

            wait_for(lambda: expected["paid"] <= set(acked(live)), timeout=60, what="`paid` to ack everything")
            latency = sorted(acked(live)[i] - int(at) for i, (subject, at) in publishes.items()
                             if "paid" in SUBJECTS[subject])
            # Meanwhile `orders` got none of what the holder took: every one is still its stranded claim.
            where = locate_subscribed(ignis.store, "orders", "feed", held)
            assert all(w.startswith("claim ") and "attempts=1" in w for w in where.values()), where
            assert latency[-1] <= LIVE_BOUND_S * 1000, \
                f"`paid` slowed by `orders`' dead consumer: p50 {latency[len(latency) // 2]} ms, max {latency[-1]} ms"
            assert not misdelivered({"paid": live}, published)

            # A sweeper (every claim looks abandoned to it) and a consumer of `orders`: its stranded claims come
            # back through the sweep and the shovel, and it acks everything too.
            sweepers = Sweepers(url, tmp_path)
            try:
                sweepers.start("late")
                mended = [Lines(SUB_CONSUMER, url, "orders")]
                children += mended
                wait_for(lambda: expected["orders"] <= set(acked(mended)), timeout=120,
                         what="`orders` to ack everything once swept")
                attempts = {i: max(int(r.split()[1]) for r in rests) for i, rests in first_words(mended, "got").items()}
                assert all(attempts[i] >= 2 for i in held), "a stranded claim was delivered without a sweep"
                assert not misdelivered({"orders": mended}, published)
                assert ignis.record("orders").bins.get(CURSOR_SWEPT, 0) >= len(held)
            finally:
                sweepers.stop_all()
        finally:
            for child in children:
                if child.proc.poll() is None:
                    child.kill()
        print(f"\n`paid` publish-to-ack while `orders` held {len(held)} stranded claims: p50 "
              f"{latency[len(latency) // 2]} ms, p99 {latency[len(latency) * 99 // 100]} ms, max {latency[-1]} ms "
              f"({len(latency)} messages after the kill at {killed_at_ms})")
