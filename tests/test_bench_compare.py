"""bench/compare.py, the throughput gate: it checks two revisions out into temporary worktrees, runs the lmdb rows
of each alternately, and writes each row's ratio, spread and verdict (JSON and pyperf files). Its figures are not
checked here (speed lives in bench/, on a quiet machine); its arithmetic is, on made-up rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import compare  # noqa: E402  (bench/ is not a package)


def test_a_row_fell_only_when_its_ratio_is_below_the_noise() -> None:
    steady = compare.Row("lmdb", "publish", {"base": [100.0, 102.0, 101.0], "head": [80.0, 81.0, 82.0]})
    verdict = steady.verdict()
    assert verdict["ratio"] == pytest.approx(81 / 101, rel=0.02) and verdict["fell"]
    assert verdict["noise"] == pytest.approx(max(2 / 101, 2 / 81))  # the larger revision's spread
    noisy = compare.Row("lmdb", "publish", {"base": [100.0, 50.0, 100.0], "head": [80.0, 81.0, 82.0]})
    assert not noisy.verdict()["fell"]  # a spread of 50 % hides a 20 % fall: more rounds, a quieter machine
    faster = compare.Row("lmdb", "drain", {"base": [100.0, 101.0, 99.0], "head": [130.0, 128.0, 131.0]})
    assert faster.verdict()["ratio"] > 1 and not faster.verdict()["fell"]


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the repository's git history")
def test_the_gate_compares_two_revisions_in_worktrees_and_leaves_none_behind(tmp_path: Path) -> None:
    before = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    done = subprocess.run([sys.executable, "bench/compare.py", "HEAD", ".", "--rounds", "3", "--repeat", "1",
                           "--messages", "300", "--lmdb-rows", "ignis.publish,ignis.drain.1", "--json",
                           "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr  # 1: a row fell (this machine's noise decides at 300 messages)
    result = json.loads(done.stdout)
    assert result["rounds"] == 3 and result["base"]["label"] == "HEAD" and result["head"]["label"] == "."
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {"publish", "fire + message.ack, 1 consumer"}
    for row in rows.values():
        assert len(row["base_rates"]) == len(row["head_rates"]) == 3
        assert row["ratio_low"] <= row["ratio"] <= row["ratio_high"] and row["noise"] >= 0
    assert (done.returncode == 1) == bool(result["fell"])
    assert json.loads((tmp_path / "compare.json").read_text()) == result
    pyperf = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", "--table", str(tmp_path / "base.json"),
                             str(tmp_path / "head.json")], capture_output=True, text=True, timeout=60)
    assert pyperf.returncode == 0 and "lmdb: publish" in pyperf.stdout
    after = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert after == before  # the temporary worktree is gone


def test_the_gate_refuses_fewer_than_three_rounds_and_an_unknown_revision() -> None:
    done = subprocess.run([sys.executable, "bench/compare.py", "--rounds", "2"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "at least 3 rounds" in done.stderr
    done = subprocess.run([sys.executable, "bench/compare.py", "no-such-revision-xyz", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "'no-such-revision-xyz' is not a revision" in done.stderr


def test_the_revisions_alternate_row_by_row_and_swap_who_goes_first() -> None:
    assert list(compare.schedule(2, 3)) == [
        (0, 0, ("head", "base")), (0, 1, ("base", "head")), (0, 2, ("head", "base")),
        (1, 0, ("base", "head")), (1, 1, ("head", "base")), (1, 2, ("base", "head")),
    ]
    # One part (--pairing suite): the revisions swap every round, as before.
    assert [sides for _, _, sides in compare.schedule(3, 1)] == [("head", "base"), ("base", "head"), ("head", "base")]


def test_each_row_is_its_own_part_unless_a_suite_is_paired_whole() -> None:
    by_row = compare.parse_args(["--lmdb-rows", "ignis.publish*,ignis.drain.8"])
    assert [label for label, _ in compare.lmdb_parts(by_row)] == ["ignis.publish", "ignis.publish_many",
                                                                  "ignis.drain.8"]
    whole = compare.parse_args(["--lmdb-rows", "ignis.publish*", "--pairing", "suite"])
    assert [label for label, _ in compare.lmdb_parts(whole)] == ["ignis.publish*"]
    with pytest.raises(SystemExit, match="matches no row"):
        compare.lmdb_parts(compare.parse_args(["--lmdb-rows", "no.such.row"]))
    server = compare.parse_args(["--suite", "aerospike", "--server", "127.0.0.1:1", "--aerospike-consumers", "1,8"])
    assert [label for label, _ in compare.aerospike_parts(server)] == ["1 consumers", "8 consumers", "batches"]


def test_the_batched_aerospike_rows_drain_five_times_the_messages_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """They run ten times faster than the one-consumer rows: the same count would time a third of a second."""
    seen: dict[str, str] = {}

    def fake_run_json(argv: list[str], revision: object, timeout: float) -> dict[str, object]:
        seen[argv[-1]] = argv[argv.index("--messages") + 1]
        return {"rows": []}

    monkeypatch.setattr(compare, "run_json", fake_run_json)
    for argv, batched in (([], "100000"), (["--aerospike-batch-messages", "30000"], "30000")):
        seen.clear()
        args = compare.parse_args(["--suite", "aerospike", "--server", "127.0.0.1:1", "--aerospike-messages",
                                   "20000", *argv])
        for _, run in compare.aerospike_parts(args):
            run(None)  # type: ignore[arg-type]
        assert seen == {"without": "20000", "only": batched}


def test_each_aerospike_row_is_the_best_of_its_repeats_a_round(monkeypatch: pytest.MonkeyPatch) -> None:
    repeats: set[tuple[str, str]] = set()

    def fake_run_json(argv: list[str], revision: object, timeout: float) -> dict[str, object]:
        repeats.add((argv[argv.index("--rounds") + 1], argv[argv.index("--keep") + 1]))
        return {"rows": []}

    monkeypatch.setattr(compare, "run_json", fake_run_json)
    for argv, expected in (([], ("3", "best")), (["--aerospike-repeat", "1"], ("1", "best"))):
        repeats.clear()
        args = compare.parse_args(["--suite", "aerospike", "--server", "127.0.0.1:1", *argv])
        for _, run in compare.aerospike_parts(args):
            run(None)  # type: ignore[arg-type]
        assert repeats == {expected}  # (by default the best of three runs a round, as the lmdb rows)
    with pytest.raises(SystemExit):
        compare.parse_args(["--suite", "aerospike", "--server", "127.0.0.1:1", "--aerospike-repeat", "0"])


def test_the_aerospike_bench_keeps_the_best_rate_of_its_rounds_when_told_and_the_median_of_the_rest() -> None:
    import bench_aerospike

    rounds = [{"publish/s": 900.0, "drain/s": 300.0, "publish calls/msg": 1.0},
              {"publish/s": 1000.0, "drain/s": 200.0, "publish calls/msg": 1.2},
              {"publish/s": 500.0, "drain/s": 250.0, "publish calls/msg": 1.1}]
    assert bench_aerospike.summarize(rounds, "best") == {"publish/s": 1000.0, "drain/s": 300.0,
                                                         "publish calls/msg": pytest.approx(1.1)}
    assert bench_aerospike.summarize(rounds) == {"publish/s": 900.0, "drain/s": 250.0,
                                                 "publish calls/msg": pytest.approx(1.1)}


def test_the_aerospike_bench_runs_the_batched_row_with_without_or_alone() -> None:
    def consumers(*argv: str) -> list[str]:
        done = subprocess.run([sys.executable, "bench/bench_aerospike.py", "--emulator", "--messages", "200", "--json",
                               *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return [row["consumers"] for row in json.loads(done.stdout)["rows"]]

    assert consumers("--consumers", "1") == ["1", "8 (batches)"]
    assert consumers("--consumers", "1", "--batched", "without") == ["1"]
    assert consumers("--batched", "only") == ["8 (batches)"]
