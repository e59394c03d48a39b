"""bench/bench_topics.py: its alternation (what makes two rates comparable on a noisy machine) and a short run of
the phases that need no server, on lmdb. Its figures are not checked here: speed targets live in the benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_topics import alternate  # noqa: E402


def test_alternate_reverses_the_order_every_turn_and_sums_each_steps_figures() -> None:
    calls: list[str] = []

    def step(name: str, count: int, seconds: float):  # type: ignore[no-untyped-def]
        def run() -> tuple[int, float]:
            calls.append(name)
            return count, seconds
        return run

    got = alternate({"a": step("a", 3, 0.5), "b": step("b", 2, 0.25), "c": step("c", 1, 1.0)}, turns=3)
    assert calls == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    assert got == {"a": (9, 1.5), "b": (6, 0.75), "c": (3, 3.0)}


def test_alternate_runs_each_step_until_it_has_what_is_wanted_then_leaves_it_out() -> None:
    left: dict[str, int] = {}
    calls: list[str] = []

    def take(name: str, size: int):  # type: ignore[no-untyped-def]
        def run() -> tuple[int, float]:
            calls.append(name)
            n = min(size, left[name])
            left[name] -= n
            return n, 0.1
        return run

    left.update(fast=25, slow=25)
    got = alternate({"fast": take("fast", 25), "slow": take("slow", 10)}, wanted=25)
    assert calls == ["fast", "slow", "slow", "slow"]  # (fast had its 25 in one step: left out after it)
    assert got == {"fast": (25, 0.1), "slow": (25, pytest.approx(0.3))}
    # A step that moves nothing before it has what is wanted is a failure, never a silent short count.
    left.update(fast=25, slow=10)
    with pytest.raises(SystemExit, match="slow: no message after 10 of 25"):
        alternate({"fast": take("fast", 25), "slow": take("slow", 10)}, wanted=25)
    # One figure per step (what each still had to drain after its warm-up).
    left.update(fast=20, slow=30)
    calls.clear()
    got = alternate({"fast": take("fast", 25), "slow": take("slow", 10)}, wanted={"fast": 20, "slow": 30})
    assert calls == ["fast", "slow", "slow", "slow"]
    assert got == {"fast": (20, 0.1), "slow": (30, pytest.approx(0.3))}


def test_a_short_run_of_the_publish_drain_and_replay_phases_on_lmdb(tmp_path: Path) -> None:
    out = tmp_path / "topics.json"
    done = subprocess.run(
        [sys.executable, "bench/bench_topics.py", "--phases", "publish,drain,replay", "--amqp",
         "amqp://nobody@127.0.0.1:1/%2F", "--seconds", "0.2", "--rounds", "2", "--publishers", "2", "--backlog",
         "3000", "--drain-rounds", "1", "--drain-threads", "2", "--replay", "4000", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())["results"]
    [publish] = results["publish"]
    assert publish["system"] == "ignis-lmdb" and publish["rate_1"] > 0 and publish["rate_10"] > 0
    assert publish["ratio_10_vs_1"] == pytest.approx(publish["rate_10"] / publish["rate_1"])
    [drain] = results["drain"]
    assert drain["backlog"] == 3000 and len(drain["ratios"]) == 3
    assert drain["slowest_ratio"] == pytest.approx(min(drain["ratios"]), abs=5e-4)
    assert set(drain["rates"]) == {"queue", "sub0", "sub1", "sub2"}
    [replay] = results["replay"]
    assert replay["retained"] == 4000 and replay["at_time_depth"] == replay["expected_at_time_depth"] == 2000
    assert replay["replay_drain"] > 0 and replay["live_drain"] > 0
    assert "RabbitMQ not measured" in done.stdout and "targets (issue 47)" in done.stdout
