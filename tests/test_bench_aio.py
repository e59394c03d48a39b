"""bench/bench_aio.py runs end to end on lmdb (briefly) and writes what its docs read: a measurement per
concurrency asked, and both APIs' e2e percentiles. Its figures are not checked here: speed targets live in
the benchmark, on a quiet machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_aio_measures_each_concurrency_and_both_apis(tmp_path: Path) -> None:
    out = tmp_path / "aio.json"
    done = subprocess.run([sys.executable, "bench/bench_aio.py", "--concurrency", "1,3", "--seconds", "0.3",
                           "--rounds", "1", "--rate", "100", "--consumers", "2", "--warmup", "0", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    [lmdb] = json.loads(out.read_text())
    assert lmdb["store"] == "lmdb"
    assert [p["concurrency"] for p in lmdb["publish"]] == [1, 3]
    for p in lmdb["publish"]:
        assert p["sync_publish_per_s"] > 0 and p["async_publish_per_s"] > 0
        assert p["async_over_sync"] == round(p["async_over_sync"], 3) > 0
    for api in ("sync_e2e_ms", "async_e2e_ms"):
        assert 0 < lmdb[api]["p50"] <= lmdb[api]["p99"]
    assert "async/sync" in done.stdout and "e2e latency" in done.stdout


def test_bench_aio_refuses_a_bad_concurrency_list() -> None:
    done = subprocess.run([sys.executable, "bench/bench_aio.py", "--concurrency", "8,0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "'8,0': expected positive integers separated by commas" in done.stderr
