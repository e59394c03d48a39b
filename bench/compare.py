#!/usr/bin/env python3
"""The throughput regression gate: two revisions of IgnisMQ, measured alternately on one machine.

    .venv/bin/python bench/compare.py                      # HEAD against the working tree, lmdb rows
    .venv/bin/python bench/compare.py cb119dc HEAD --rounds 5
    .venv/bin/python bench/compare.py main . --suite lmdb,aerospike --server 127.0.0.1:3000/test

Each revision other than `.` (the working tree, uncommitted changes included) is checked out into a temporary
git worktree. The benchmark scripts of THIS checkout (bench/bench_lmdb.py, bench/bench_aerospike.py) then run
against each revision's library (its directories first on PYTHONPATH), the two revisions alternating row by row
(`--pairing row`, the default: a row of one revision, the same row of the other, then the next row, each row
swapping which goes first every round) so that a slow spell of a shared machine hits both runs of a pair, a few
seconds apart. `--pairing suite` runs a whole suite per revision instead, as the first version of this gate did
(its pairs are a suite's length apart: on a machine whose speed drifts by half in a minute, noisier).

Each run of a row is the best of a few in one process (`--repeat` of bench_lmdb.py, `--aerospike-repeat` of
bench_aerospike.py; 3 each by default): another process's burst on a shared machine only ever slows a run. (It does
not undo a machine whose speed drifts for minutes, which slows the best of three as much: docs/benchmarks/
regressions.md, 2026-12-01.)

For every row it prints the median rate of each revision, the ratio new / old (the median of the rounds'
own ratios: a round's two runs of a row are seconds apart) with its spread (the lowest and highest round ratio), and
the noise (the larger of the two revisions' own spread across rounds, max - min over median). A row whose
ratio is below 1 - noise FELL by more than the machine's noise: it is flagged and the exit code is 1.
The per-round figures are also written as pyperf files (base.json, head.json in --out), so
`python -m pyperf compare_to --table base.json head.json` gives pyperf's own view, with its significance test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyperf
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
WORKTREE = "."  # the working tree as it is, uncommitted changes included
PACKAGE_DIRS = (".", "operator", "workers", "pipeline")  # where a revision's importable packages live
SUITES = ("lmdb", "aerospike")
# The rows the gate compares: the publish and drain rows of the throughput benchmarks (not the peers', not
# the raw ceilings': those do not change with IgnisMQ's code).
LMDB_ROWS = "ignis.*"
AEROSPIKE_CONSUMERS = "1,8"


@dataclass
class Revision:
    label: str  # as given (a commit, a branch, or "." for the working tree)
    commit: str  # what it resolved to
    tree: Path

    @property
    def pythonpath(self) -> str:
        return os.pathsep.join(str(self.tree / d) for d in PACKAGE_DIRS)


@dataclass
class Row:
    suite: str
    name: str
    rates: dict[str, list[float]] = field(default_factory=lambda: {"base": [], "head": []})

    def ratios(self) -> list[float]:
        """head / base per round (a round's two runs are seconds apart)."""
        return [h / b for b, h in zip(self.rates["base"], self.rates["head"], strict=False) if b > 0]

    @staticmethod
    def noise_of(values: Sequence[float]) -> float:
        return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0

    def verdict(self) -> dict[str, Any]:
        ratios = self.ratios()
        base, head = self.rates["base"], self.rates["head"]
        if not ratios:
            return {"suite": self.suite, "row": self.name, "ratio": None, "fell": False}
        noise = max(self.noise_of(base), self.noise_of(head))
        ratio = statistics.median(ratios)
        return {"suite": self.suite, "row": self.name, "base_median": statistics.median(base),
                "head_median": statistics.median(head), "base_rates": base, "head_rates": head,
                "ratio": ratio, "ratio_low": min(ratios), "ratio_high": max(ratios), "noise": noise,
                "fell": ratio < 1 - noise}


# ---- revisions ----------------------------------------------------------------------------------------
def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


@contextlib.contextmanager
def checked_out(label: str, scratch: Path) -> Iterator[Revision]:
    """The revision `label` in a temporary worktree (removed afterwards); "." is this working tree itself."""
    if label == WORKTREE:
        dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        yield Revision(label, git("rev-parse", "--short", "HEAD") + dirty, REPO)
        return
    try:
        commit = git("rev-parse", "--verify", "--short", f"{label}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"error: {label!r} is not a revision of {REPO}") from None
    tree = scratch / f"rev-{commit}"
    git("worktree", "add", "--detach", "--force", str(tree), commit)
    try:
        yield Revision(label, commit, tree)
    finally:
        git("worktree", "remove", "--force", str(tree))


# ---- the suites ---------------------------------------------------------------------------------------
def run_json(argv: list[str], revision: Revision, timeout: float) -> dict[str, Any]:
    """Run a benchmark script of this checkout against `revision`'s library; its JSON document."""
    env = {**os.environ, "PYTHONPATH": revision.pythonpath}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=tempfile.gettempdir())  # not the repository: its own ignis/ must not shadow
    # (1: a bench ran but a target of its own failed, and its figures stand; or it crashed, Python's exit status for
    # an uncaught exception too: then it printed no document)
    try:
        if done.returncode in (0, 1):
            return json.loads(done.stdout)
    except ValueError:
        pass
    raise RuntimeError(f"{' '.join(argv[:1])} on {revision.label} exited {done.returncode} without its figures: "
                       f"{done.stderr.strip()[-2000:]}")


# A part of a suite: what one benchmark run measures (all its rows, or one row), by its label; its runner gives
# each row's rate for a revision.
Part = tuple[str, Callable[[Revision], dict[str, float]]]


def lmdb_parts(args: argparse.Namespace) -> list[Part]:
    def part(rows: str) -> Part:
        def run(revision: Revision) -> dict[str, float]:
            doc = run_json([str(BENCH / "bench_lmdb.py"), "--json", "--repeat", str(args.repeat), "--messages",
                            str(args.messages), "--rows", rows], revision, args.timeout)
            out = {}
            for row in doc["rows"]:
                if row["error"]:
                    raise RuntimeError(f"lmdb {row['row']} on {revision.label}: {row['error']}")
                out[row["row"]] = row["msgs_per_s"]
            return out
        return rows, run

    if args.pairing == "suite":
        return [part(args.lmdb_rows)]
    listed = subprocess.run([sys.executable, str(BENCH / "bench_lmdb.py"), "--list-rows", "--rows", args.lmdb_rows],
                            capture_output=True, text=True, timeout=120)
    if listed.returncode != 0:
        raise SystemExit(f"error: --lmdb-rows {args.lmdb_rows!r}: {listed.stderr.strip()}")
    return [part(key) for key in listed.stdout.split()]


def aerospike_parts(args: argparse.Namespace) -> list[Part]:
    if not args.server:
        raise SystemExit("error: --suite aerospike needs --server host:port[/namespace] (or IGNIS_TEST_AEROSPIKE)")

    def part(label: str, argv: list[str], messages: int) -> Part:
        def run(revision: Revision) -> dict[str, float]:
            doc = run_json([str(BENCH / "bench_aerospike.py"), "--json", "--server", args.server, "--rounds",
                            str(args.aerospike_repeat), "--keep", "best", "--messages", str(messages), "--no-raw",
                            *argv], revision, args.timeout)
            out = {}
            for row in doc["rows"]:
                consumers = row["consumers"]
                out[f"publish, {consumers} producers"] = row["publish/s"]
                out[f"drain, {consumers} consumers"] = row["drain/s"]
            return out
        return label, run

    if args.pairing == "suite":
        return [part(f"consumers {args.aerospike_consumers} and batches",
                     ["--consumers", args.aerospike_consumers], args.aerospike_messages)]
    counts = [c.strip() for c in args.aerospike_consumers.split(",") if c.strip()]
    # The batched rows run about ten times faster than the one-consumer rows: the same count of messages would time
    # a third of a second of them, much of it the threads' start and the last stragglers.
    batch_messages = args.aerospike_batch_messages or 5 * args.aerospike_messages
    return [*(part(f"{c} consumers", ["--consumers", c, "--batched", "without"], args.aerospike_messages)
              for c in counts),
            part("batches", ["--batched", "only"], batch_messages)]


def schedule(rounds: int, parts: int) -> Iterator[tuple[int, int, tuple[str, str]]]:
    """(round, part, the two sides in running order): each part's two runs back to back, which goes first swapping
    every round and every part, so neither revision always runs on a warm (or a tired) machine."""
    for round_ in range(rounds):
        for index in range(parts):
            yield round_, index, ("head", "base") if (round_ + index) % 2 == 0 else ("base", "head")


# ---- reporting ----------------------------------------------------------------------------------------
def write_pyperf(rows: list[Row], side: str, path: Path) -> None:
    """One pyperf benchmark per row, one run per round; the value is seconds per message (lower is better)."""
    benchmarks = []
    for row in rows:
        runs = [pyperf.Run([1.0 / rate], metadata={"name": f"{row.suite}: {row.name}", "unit": "second",
                                                   "loops": 1}, collect_metadata=False)
                for rate in row.rates[side] if rate > 0]
        if runs:
            benchmarks.append(pyperf.Benchmark(runs))
    if benchmarks:
        pyperf.BenchmarkSuite(benchmarks).dump(str(path), replace=True)


def print_table(console: Console, base: Revision, head: Revision, verdicts: list[dict[str, Any]], rounds: int) -> None:
    table = Table(title=f"{head.label} ({head.commit}) against {base.label} ({base.commit}), {rounds} rounds, "
                        "alternating", title_justify="left")
    for name, justify in (("suite", "left"), ("row", "left"), ("old msg/s", "right"), ("new msg/s", "right"),
                          ("new / old", "right"), ("round ratios", "right"), ("noise", "right"), ("", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for v in verdicts:
        if v["ratio"] is None:
            table.add_row(v["suite"], v["row"], "", "", "no figure", "", "", "")
            continue
        table.add_row(v["suite"], v["row"], f"{v['base_median']:,.0f}", f"{v['head_median']:,.0f}",
                      f"{v['ratio']:.2f}x", f"{v['ratio_low']:.2f}-{v['ratio_high']:.2f}", f"±{v['noise']:.0%}",
                      "[red]FELL[/]" if v["fell"] else "", style="bold" if v["fell"] else None)
    console.print(table)
    console.print("new / old: median of the rounds' own ratios; noise: the larger revision's spread across rounds "
                  "(max - min over median); FELL: new / old below 1 - noise.")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", default="HEAD", help="the old revision (default HEAD)")
    parser.add_argument("head", nargs="?", default=WORKTREE,
                        help="the new revision (default '.': the working tree, uncommitted changes included)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (at least 3; default 3)")
    parser.add_argument("--suite", default="lmdb", help=f"comma list of {', '.join(SUITES)} (default lmdb)")
    parser.add_argument("--messages", type=int, default=20000, help="messages per lmdb row (default 20000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each lmdb row per round, the best kept (bench_lmdb.py --repeat; default 3)")
    parser.add_argument("--lmdb-rows", default=LMDB_ROWS, help=f"bench_lmdb.py --rows (default {LMDB_ROWS!r})")
    parser.add_argument("--server", default=os.environ.get("IGNIS_TEST_AEROSPIKE"),
                        help="Aerospike host:port[/namespace] for the aerospike suite (default $IGNIS_TEST_AEROSPIKE)")
    parser.add_argument("--aerospike-messages", type=int, default=5000, help="messages per aerospike row (5000)")
    parser.add_argument("--aerospike-batch-messages", type=int, default=None,
                        help="messages of the batched aerospike rows (default 5 x --aerospike-messages)")
    parser.add_argument("--aerospike-repeat", type=int, default=3,
                        help="runs of each aerospike row per round, the best kept (bench_aerospike.py --rounds N "
                             "--keep best; default 3)")
    parser.add_argument("--aerospike-consumers", default=AEROSPIKE_CONSUMERS,
                        help=f"bench_aerospike.py --consumers (default {AEROSPIKE_CONSUMERS})")
    parser.add_argument("--pairing", choices=("row", "suite"), default="row",
                        help="what the revisions alternate by: each row (default), or each suite's whole run")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one benchmark run may take")
    parser.add_argument("--out", type=Path, default=None, help="where to keep the JSON and pyperf files")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.aerospike_repeat < 1:
        parser.error(f"--repeat {args.repeat}, --aerospike-repeat {args.aerospike_repeat}: each at least 1")
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: at least 3 rounds are needed to tell a change from noise")
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown or not suites:
        parser.error(f"--suite {args.suite!r}: each must be one of {', '.join(SUITES)}")
    args.suites = suites
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(stderr=args.json, width=None if sys.stdout.isatty() else 140)
    makers = {"lmdb": lmdb_parts, "aerospike": aerospike_parts}
    parts = [(suite, label, run) for suite in args.suites for label, run in makers[suite](args)]
    with tempfile.TemporaryDirectory(prefix="ignis-compare-") as scratch, \
            checked_out(args.base, Path(scratch)) as base, checked_out(args.head, Path(scratch)) as head:
        rows: dict[tuple[str, str], Row] = {}
        with Progress(console=Console(stderr=True), transient=True) as progress:
            task = progress.add_task("rounds", total=args.rounds * 2 * len(parts))
            revisions = {"base": base, "head": head}
            for round_, index, sides in schedule(args.rounds, len(parts)):
                suite, label, run = parts[index]
                for side in sides:
                    revision = revisions[side]
                    progress.update(task, description=f"round {round_ + 1}/{args.rounds}: {suite} {label} on "
                                                      f"{revision.label}")
                    for name, rate in run(revision).items():
                        rows.setdefault((suite, name), Row(suite, name)).rates[side].append(rate)
                    progress.advance(task)
        verdicts = [row.verdict() for row in rows.values()]
        result = {"base": {"label": base.label, "commit": base.commit},
                  "head": {"label": head.label, "commit": head.commit},
                  "rounds": args.rounds, "rows": verdicts, "fell": [v["row"] for v in verdicts if v["fell"]]}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_pyperf(list(rows.values()), "base", args.out / "base.json")
        write_pyperf(list(rows.values()), "head", args.out / "head.json")
        (args.out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(console, base, head, verdicts, args.rounds)
        if args.out is not None:
            console.print(f"pyperf's view: python -m pyperf compare_to --table {args.out}/base.json "
                          f"{args.out}/head.json")
    return 1 if result["fell"] else 0


if __name__ == "__main__":
    sys.exit(main())
