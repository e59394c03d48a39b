"""Budgets of the hot paths, counted, never timed: the guard that keeps a throughput regression from passing unseen.

Speed is measured in bench/ (bench/compare.py runs two revisions alternately); a test that timed it would flake
on a shared machine. What a slowdown is made of can be counted exactly instead:

* the Python function calls, the calls into C and the bytecodes run of one `publish`, one `fire` + `ack`, and one
  `fire_many(100)` + `ack` on lmdb, counted with sys.setprofile and sys.settrace (f_trace_opcodes) in the calling
  thread. The median of many ops:
  the rare op that also refreshes the active shards or re-reads the doorbell's listing is left out;
* the store calls per message on the Aerospike emulator, counted by the store itself (ignis_storage_calls), with
  the clock the publish reservations size themselves by (ignis.magazine.reservations) made a fixed step per
  look, so the count does not depend on how fast this machine runs.

Each budget is a little above the figure the code has today (in the comment beside it). A thread hand-off, a
new lock, one more helper call or one more store read on a hot path fails here; a change that makes a path
leaner should lower its budget.
"""

from __future__ import annotations

import ast
import importlib
import random
import statistics
import struct
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from support.aerospike_emulator import EmulatedServer

from ignis import Ignis, Queue, QueueSpec
from ignis.magazine import bounded, loads, reservations
from ignis.storage.aerospike import context

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = b"x" * 256
# (python calls, C calls, bytecodes) of one op, median of many; today's figures in the comments. The release before
# the hot-path trims of 2026-11-29 (closures per claim and per load, bound methods built per call, the tracing check
# a call) ran 381 / 925 / 38651 bytecodes (fast) and 1040 / 1605 / 31955 (fsync): over these budgets but fsync's
# fire + ack, whose count in the calling thread varies with the group commit's timing as much as that.
LMDB_BUDGETS: dict[str, dict[str, tuple[int, int, int]]] = {
    "fast": {  # bench/bench_lmdb.py's setting
        "publish": (9, 27, 370),  # 7, 24, 350
        "fire+ack": (22, 45, 890),  # 19, 42, 869
        "fire_many(100)+ack": (700, 1710, 37000),  # 440-680, 1554-1569, 34365-35541 (the shards a fire finds vary)
    },
    "fsync": {  # the default
        "publish": (48, 46, 1035),  # 43, 41, 1022
        "fire+ack": (63, 73, 1660),  # 56, 66-68, 1524-1606: with when the group commit's thread takes the write
        "fire_many(100)+ack": (870, 1105, 30500),  # 590-830, 997-1019, 27910-28430
    },
}
# Store calls per message on the emulator (publish, fire + ack); today's figures in the comments.
EMULATOR_BUDGETS = {
    "publish": 1.1,  # 1.03: an increment reserves the next publishes' slots, each a write
    "fire+ack": 3.1,  # 3.032: a claim, its stamp, an ack (and a claim of a shard just drained, now and then)
    "fire_many(100)+ack": 0.14,  # 0.127: a claim and a stamp per shard's run, one ack per batch
}


def calls_of(op: Callable[[], Any]) -> tuple[int, int, int]:
    """(Python function calls, calls into C, bytecodes run) of `op` in this thread. The bytecodes see what the calls
    do not: a closure built per call (its cells), a check or an attribute load added to a function's body."""
    counts = {"call": 0, "c_call": 0}

    def profile(_frame: Any, event: str, _arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        op()
    finally:
        sys.setprofile(None)
    opcodes = 0

    def trace(frame: types.FrameType, event: str, _arg: Any) -> Any:
        nonlocal opcodes
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            opcodes += 1
        return trace

    sys.settrace(trace)
    try:
        op()
    finally:
        sys.settrace(None)
    return counts["call"], counts["c_call"], opcodes


def median_calls(op: Callable[[], Any], times: int) -> tuple[float, float, float]:
    counted = [calls_of(op) for _ in range(times)]
    return tuple(statistics.median(c[i] for c in counted) for i in range(3))  # type: ignore[return-value]


@pytest.fixture(params=["fast", "fsync"])
def lmdb_queue(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[tuple[str, Queue]]:
    with Ignis(f"lmdb://{tmp_path}?durability={request.param}") as ignis:
        ignis.apply(QueueSpec.build(name="budget", handlerType="budget", shards=32))
        yield request.param, ignis.queue("budget")


def test_the_lmdb_hot_paths_stay_within_their_call_budgets(lmdb_queue: tuple[str, Queue]) -> None:
    durability, q = lmdb_queue
    measured = {"publish": median_calls(lambda: q.publish(PAYLOAD), 51)}
    q.publish_many([PAYLOAD] * 3000)

    def fire_and_ack() -> None:
        message = q.fire()
        assert message is not None
        message.ack()

    def fire_many_and_ack() -> None:
        messages = q.fire_many(100)
        assert len(messages) == 100
        q.ack(messages)

    measured["fire+ack"] = median_calls(fire_and_ack, 51)
    measured["fire_many(100)+ack"] = median_calls(fire_many_and_ack, 11)
    over = {path: (got, LMDB_BUDGETS[durability][path]) for path, got in measured.items()
            if any(g > b for g, b in zip(got, LMDB_BUDGETS[durability][path], strict=True))}
    assert not over, f"durability={durability}: (python calls, C calls, bytecodes) over budget, (measured, " \
                     f"budget): {over}"


class SteppingClock:
    """time.monotonic for the publish path's reservations: a fixed step per look, whatever this machine's speed
    (and however long it has been up)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


def storage_calls() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "ignis_storage_calls" for s in m.samples)


def test_the_store_calls_per_message_on_the_emulator_stay_within_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "client_factory", EmulatedServer().client)
    random.seed(44)  # the shards publishes and fires pick: a claim on a shard drained meanwhile is a call too
    # 20 µs between looks: a fast publisher, as in bench_aerospike.py (the reservation then covers the next ones).
    # One clock for every module of the publish path: a reservation's time is taken in loads (or bounded) and
    # compared in reservations, so a real clock in one of them made every reservation look stale on a machine up
    # for less than the stepping clock's start (1,000 s): each publish then sealed and reserved again.
    clock = types.SimpleNamespace(monotonic=SteppingClock(20e-6).monotonic)
    for module in (reservations, loads, bounded):
        monkeypatch.setattr(module, "time", clock)
    n = 1000
    with Ignis("aerospike://emulator:3000/test?farm=budget&client=budget") as ignis:
        ignis.apply(QueueSpec.build(name="one", handlerType="budget", shards=32))
        q = ignis.queue("one")
        before = storage_calls()
        for _ in range(n):
            q.publish(PAYLOAD)
        measured = {"publish": (storage_calls() - before) / n}
        # The fires drain a queue publish_many filled: no reservation left to seal (a timer's calls) meanwhile.
        ignis.apply(QueueSpec.build(name="singles", handlerType="budget", shards=32))
        q = ignis.queue("singles")
        q.publish_many([PAYLOAD] * n)
        before = storage_calls()
        for _ in range(n):
            message = q.fire()
            assert message is not None
            message.ack()
        measured["fire+ack"] = (storage_calls() - before) / n
        ignis.apply(QueueSpec.build(name="batches", handlerType="budget", shards=32))
        batches = ignis.queue("batches")
        batches.publish_many([PAYLOAD] * n)
        before = storage_calls()
        delivered = 0
        while messages := batches.fire_many(100):
            batches.ack(messages)
            delivered += len(messages)
        assert delivered == n
        measured["fire_many(100)+ack"] = (storage_calls() - before) / n
    over = {path: (round(got, 3), EMULATOR_BUDGETS[path]) for path, got in measured.items()
            if got > EMULATOR_BUDGETS[path]}
    assert not over, f"store calls per message over budget, (measured, budget): {over}"


# ---- a cost the counts above do not see ---------------------------------------------------------------------
def imported_struct_calls(path: Path) -> list[str]:
    """`NAME.method(...)` calls in a module where NAME is a struct.Struct imported from another module. CPython 3.11
    compiles a method call on an imported name as an attribute load (it takes the name for a module), not as a
    method call: a bound method is built on every call. Such a module binds the methods once, at import
    (ignis.storage.lmdb.records: `_pack_meta`, `_unpack_meta`, ...), and calls those."""
    tree = ast.parse(path.read_text())
    structs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                continue
            structs |= {alias.asname or alias.name for alias in node.names
                        if isinstance(getattr(module, alias.name, None), struct.Struct)}
    return [f"{path.name}:{node.lineno}: {node.func.value.id}.{node.func.attr}()" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in structs]


def test_no_method_is_called_on_an_imported_struct() -> None:
    found = [call for path in sorted((ROOT / "ignis").rglob("*.py")) for call in imported_struct_calls(path)]
    assert not found, f"call the struct's method bound once instead (see imported_struct_calls): {found}"


def test_a_method_call_on_an_imported_struct_is_found(tmp_path: Path) -> None:
    module = tmp_path / "hot.py"
    module.write_text("from ignis.storage.lmdb.records import _META, _unpack_meta\n"
                      "def load(raw):\n    return _META.unpack(raw), _unpack_meta(raw)\n")
    assert imported_struct_calls(module) == ["hot.py:3: _META.unpack()"]
