"""bench/bench_memory.py runs end to end on lmdb with tiny backlogs and writes what its docs read: each role's
peak RSS and private peak at each size, the ratios, and what each role did. Its figures are not checked here
(memory targets live in the benchmark, at 10,000 and 1,000,000 messages); that every role did its work is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_memory_measures_every_role_at_each_size(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    done = subprocess.run([sys.executable, "bench/bench_memory.py", "--sizes", "200,600", "--consume", "50",
                           "--seconds", "0.2", "--passes", "1", "--timeout", "120", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    [lmdb] = json.loads(out.read_text())["results"]
    assert lmdb["store"] == "lmdb" and [s["size"] for s in lmdb["sizes"]] == [200, 600]
    roles = {"stats", "operator", "consumer", "sweeper"}
    for size in lmdb["sizes"]:
        assert set(size["roles"]) == roles
        for role, got in size["roles"].items():
            assert got["ok"], (size["size"], role, got)
            assert got["exit"] == 0 and 0 < got["peak_anon_kib"] <= got["peak_kib"], (role, got)
    [large] = [s for s in lmdb["sizes"] if s["size"] == 600]
    assert large["abandoned"] == 120 and large["roles"]["stats"]["did"] == "depth 480, in flight 120"
    assert large["roles"]["sweeper"]["did"].startswith("swept 120 ")
    for ratios in (lmdb["ratios"], lmdb["private_ratios"]):
        assert set(ratios) == roles and all(r > 0 for r in ratios.values())
    assert "peak RSS" in done.stdout and "sweeper" in done.stdout


def test_bench_memory_refuses_a_single_size_and_an_unknown_role() -> None:
    done = subprocess.run([sys.executable, "bench/bench_memory.py", "--sizes", "1000"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "expected two or more positive integers" in done.stderr
    done = subprocess.run([sys.executable, "bench/bench_memory.py", "--roles", "stats,broker"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "choose among" in done.stderr
