#!/usr/bin/env python3
"""Instructions a message, counted: the hot paths of two revisions of IgnisMQ under valgrind's callgrind.

    .venv/bin/python bench/instructions.py cb119dc HEAD --server 127.0.0.1:3000/test
    .venv/bin/python bench/instructions.py HEAD . --store lmdb --rows publish,drain1

The throughput gate (compare.py) times the rows, and on a shared two-core machine a row's rate moves by 20-60 %
from one run to the next: a difference of a few percent between two revisions is then out of its reach. The number
of instructions the same work executes does not move like that (callgrind counts every instruction a process runs,
whatever else the machine does; the same run twice agrees within a fraction of a percent), so this tells a few
percent of extra work apart, and where it went (keep the profiles with --keep, read them with callgrind_annotate).

Each row runs twice a revision, each time in a new process under callgrind: set up only (open the store, declare a
queue, publish what the row drains), then set up and do the row's work. The difference over the messages is the
row's count a message; the setups, and the interpreter's start, cancel out. Rows (one queue of 8 shards, 1 KiB
payloads, as the throughput benchmarks):
  publish       Queue.publish, one message a call
  publish_many  Queue.publish_many, 1,000 a call
  drain1        fire + Message.ack, one consumer
  drain8        fire + Message.ack, eight consumer threads (the prefetch's path)
  batched       fire_many(100) + Queue.ack of the batch, one consumer

What a count is not: a time. Cache misses, lock waits and system calls cost time and no instructions; valgrind runs
one thread at a time, so the eight-thread row counts its work, not its contention; and a `rep stos` counts one
instruction a byte (the Aerospike client clears a 128 KiB pool on every call: 131,000 "instructions" a call, a few
microseconds). A ratio here says how much more work a revision does for the same messages; compare.py says what that
costs on the clock. Needs valgrind (Debian: `apt-get install -y valgrind`). Slow: each run executes about fifty
times slower than natively, so a row counts a few thousand messages (--messages).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROWS = ("publish", "publish_many", "drain1", "drain8", "batched")
PAYLOAD = b"x" * 1024
CONSUMER_THREADS = 8
BATCH = 100
WORK = "_work"  # the subcommand each callgrind run executes (this file, against one revision's library)
CLEANUP = "_cleanup"  # ... and the one that deletes the queue it left, uncounted


# ---- one run (under callgrind, with a revision's library first on PYTHONPATH) ---------------------------------
def work(url: str, row: str, messages: int, phase: str) -> None:
    """Set up `row` (a queue, and what it drains) and, if `phase` is "full", do its work; print the queue's name.
    The queue is deleted by another process (`cleanup`): a deletion purges what the queue holds, which differs
    between the two phases (a publish row's setup holds nothing) and is not the row's work."""
    from ignis import Ignis, QueueSpec

    with Ignis(url) as ignis:
        name = f"ir{uuid.uuid4().hex[:8]}"
        ignis.apply(QueueSpec.build(name=name, handlerType="instructions", shards=8, concurrency=CONSUMER_THREADS))
        queue = ignis.queue(name)
        if row not in ("publish", "publish_many"):
            _publish_many(queue, messages)  # what the row drains
        if phase == "full":
            got = ROW_WORK[row](queue, messages)
            if got != messages:
                raise SystemExit(f"{row}: {got} of {messages} messages")
    print(name)


def cleanup(url: str, name: str) -> None:
    """Delete a queue a counted run left (not counted)."""
    from ignis import Ignis

    with Ignis(url) as ignis:
        ignis.delete_queue(name)


def _publish(queue: Any, messages: int) -> int:
    for _ in range(messages):
        queue.publish(PAYLOAD)
    return messages


def _publish_many(queue: Any, messages: int) -> int:
    for start in range(0, messages, 1000):
        queue.publish_many([PAYLOAD] * min(1000, messages - start))
    return messages


def _drain(queue: Any) -> int:
    got = 0
    while (message := queue.fire()) is not None:
        message.ack()
        got += 1
    return got


def _drain8(queue: Any, _messages: int) -> int:
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(_drain(queue))) for _ in range(CONSUMER_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def _batched(queue: Any, _messages: int) -> int:
    got = 0
    while batch := queue.fire_many(BATCH):
        queue.ack(batch)
        got += len(batch)
    return got


ROW_WORK = {"publish": _publish, "publish_many": _publish_many, "drain1": lambda q, _n: _drain(q),
            "drain8": _drain8, "batched": _batched}


# ---- counting ----------------------------------------------------------------------------------------------
def total_instructions(out_file: Path) -> int:
    """The instructions callgrind counted in a run (every thread's: --separate-threads=no)."""
    for line in out_file.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{out_file}: no instruction total (did callgrind finish?)")


def count(revision: Any, side: str, url: str, row: str, messages: int, phase: str, out_dir: Path) -> int:
    """Instructions of one run of `row` (`phase`: "setup" or "full") against `revision`'s library (`side`: "base"
    or "head", which names its profile)."""
    out_file = out_dir / f"callgrind.{side}.{row}.{phase}"
    env = {**os.environ, "PYTHONPATH": revision.pythonpath, "PYTHONHASHSEED": "0"}  # (same hashes: same probes)
    argv = ["valgrind", "--tool=callgrind", "--cache-sim=no", "--separate-threads=no",
            f"--callgrind-out-file={out_file}", sys.executable, str(Path(__file__).resolve()), WORK, url, row,
            str(messages), phase]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{row} ({phase}) on {revision.label} exited {done.returncode}: {done.stderr[-2000:]}")
    queue = done.stdout.split()[-1]
    subprocess.run([sys.executable, str(Path(__file__).resolve()), CLEANUP, url, queue], capture_output=True,
                   env=env, cwd=tempfile.gettempdir(), timeout=600, check=True)
    return total_instructions(out_file)


def per_message(setup: int, full: int, messages: int) -> float:
    return (full - setup) / messages


def store_url(args: argparse.Namespace, scratch: Path, run: str) -> str:
    """The store a run uses: on lmdb a directory of its own (two revisions' layouts need not agree), on Aerospike the
    server's namespace (each run declares a queue of its own)."""
    if args.store == "lmdb":
        return f"lmdb://{scratch / run}?durability=fast"
    return f"aerospike://{args.server}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", default="HEAD", help="the old revision (default HEAD)")
    parser.add_argument("head", nargs="?", default=".", help="the new revision (default: the working tree)")
    parser.add_argument("--store", choices=("lmdb", "aerospike"), default="aerospike")
    parser.add_argument("--server", help="Aerospike host:port/namespace (--store aerospike)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--messages", type=int, default=3000, help="messages a row (default 3000)")
    parser.add_argument("--keep", type=Path, help="keep the callgrind profiles in this directory")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    args = parser.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(args.rows) - set(ROWS))
    if unknown:
        parser.error(f"unknown row(s) {', '.join(unknown)}: the rows are {', '.join(ROWS)}")
    if args.messages < 100:
        parser.error("--messages must be at least 100 (fewer leaves the setup's noise in the count)")
    if args.store == "aerospike" and not args.server:
        parser.error("--store aerospike needs --server host:port/namespace")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("error: valgrind is not installed (Debian: apt-get install -y valgrind)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from compare import checked_out
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=args.json)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ignis-instructions-") as scratch_name:
        scratch = Path(scratch_name)
        out_dir = args.keep or scratch
        out_dir.mkdir(parents=True, exist_ok=True)
        with checked_out(args.base, scratch) as base, checked_out(args.head, scratch) as head:
            for row in args.rows:
                counts = {}
                for side, revision in (("base", base), ("head", head)):
                    runs = {}
                    for phase in ("setup", "full"):
                        with console.status(f"{row} on {revision.label}: {phase}, under callgrind"):
                            runs[phase] = count(revision, side, store_url(args, scratch, f"{side}-{row}-{phase}"),
                                                row, args.messages, phase, out_dir)
                    counts[side] = per_message(runs["setup"], runs["full"], args.messages)
                rows.append({"row": row, "base": round(counts["base"]), "head": round(counts["head"]),
                             "ratio": counts["head"] / counts["base"]})
                console.print(f"{row}: {counts['base']:,.0f} -> {counts['head']:,.0f} instructions a message "
                              f"({rows[-1]['ratio']:.3f})")
            result = {"store": args.store, "messages": args.messages,
                      "base": {"label": base.label, "commit": base.commit},
                      "head": {"label": head.label, "commit": head.commit}, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"instructions a message, {args.store}: {base.label} ({base.commit}) -> "
                        f"{head.label} ({head.commit})")
    for column in ("row", "old", "new", "new / old"):
        table.add_column(column, justify="left" if column == "row" else "right")
    for r in rows:
        table.add_row(r["row"], f"{r['base']:,}", f"{r['head']:,}", f"{r['ratio']:.3f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == WORK:
        work(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) == 4 and sys.argv[1] == CLEANUP:
        cleanup(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
