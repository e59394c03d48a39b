"""CLI commands of the sweeper, registered on the core `ignis` app by `register(app, groups)` (a plug-in found
through the `ignis.cli` entry point group):

* `ignis sweep QUEUE` — one sweep pass over one queue, prints what moved (`-o json`);
* `ignis sweeper` — the long-running service (leader election, sweep and shovel loops, probes);
* `ignis sideline shovel QUEUE` — one shovel pass now (sideline -> main, dead letters past maxDeliveries);
* `ignis sideline redrive QUEUE --from dead` — move dead letters (or the sideline) back to main.

The root callback's `State` (ctx.obj) gives the store options; errors are the core's types, so the
core's `run` turns them into one line and its exit code. Nothing here imports `ignis.cli.app` at
module level (it loads this module while it is being imported).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ignis.cli import render
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.envelope import now_ms
from ignis.signals import set_on_signals
from ignis_workers import journey, logs
from ignis_workers.election import LEASE_NAME
from ignis_workers.service import SweeperService, load_sweeper_settings
from ignis_workers.shovel import Shovel
from ignis_workers.stack import EmbeddedStack
from ignis_workers.sweeper import Sweeper, SweepReport, tune_collector

log = logging.getLogger(__name__)

OutputOpt = Annotated[OutputFormat, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table for people; json prints one JSON document on stdout and nothing else there.")]
QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="queue name", show_default=False)]


class RedriveSource(StrEnum):
    DEAD = "dead"
    SIDELINE = "sideline"


def _cli_error(message: str, code: int = 1) -> Exception:
    from ignis.cli.app import CliError

    return CliError(message, code)


def _sweep_table(report: SweepReport) -> Table:
    table = Table(title=f"sweep of {report.queue}")
    for column in ("magazine", "examined", "moved", "stamped", "failed shards", "seconds"):
        table.add_column(column, justify="left" if column == "magazine" else "right")
    for kind, m in (("main", report.main), ("sideline", report.sideline)):
        failed = m.error or (", ".join(map(str, m.failed_shards)) if m.failed_shards else "-")
        table.add_row(kind, str(m.examined), str(m.moved), str(m.stamped), failed, f"{m.seconds:.3f}")
    return table


def sweep(
    ctx: typer.Context,
    queue: QueueArg,
    force: Annotated[bool, typer.Option(
        "--force", help="sweep even while a sweeper process leads (it then re-takes a newer epoch)")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Sweep one queue now: messages claimed more than sweepDuration ago and never settled go to the
    sideline (reason `swept`). Prints what moved.

    Refuses while a live `ignis sweeper` holds the lease, unless --force."""
    ignis = ctx.obj.ignis()
    ignis.record(queue)  # QueueNotFound -> exit 3
    store = ignis.store
    lease = store.get_lease(LEASE_NAME)
    if lease is not None and lease.holder and not lease.expired(now_ms()) and not force:
        raise _cli_error(f"sweeper {lease.holder!r} leads and sweeps this store; use --force to sweep now anyway")
    epoch = store.next_epoch()
    tune_collector()
    sweeper = Sweeper(store, epoch_source=lambda: epoch, threads=1)
    try:
        report = sweeper.sweep_queue(store.client_id, queue)
    finally:
        sweeper.close()
    if output is OutputFormat.JSON:
        emit_json(report.as_dict())
    else:
        render.out.print(_sweep_table(report))
    if report.error:
        raise _cli_error(f"sweep of {queue} failed: {report.error}")
    if not report.ok:
        raise _cli_error(f"sweep of {queue} finished with failures (see above); re-run it to retry")


def _shovel(ctx: typer.Context, queue: str, source: str, concurrency: int | None, limit: int,
            output: OutputFormat) -> None:
    ignis = ctx.obj.ignis()
    ignis.record(queue)
    # A move is fenced by an epoch (Storage.move): take a new one, as `ignis sweep` does. A sweeper that
    # leads meanwhile finds its epoch stale, steps down and takes a newer one within seconds.
    epoch = ignis.store.next_epoch()
    report = Shovel(ignis.store, epoch_source=lambda: epoch, budget=limit).shovel_queue(
        ignis.store.client_id, queue, source=source, concurrency=concurrency)  # type: ignore[arg-type]
    if output is OutputFormat.JSON:
        emit_json(report.as_dict())
    else:
        line = f"moved {report.moved} message(s) from the {source} of {queue} back to main"
        if report.dead_lettered:
            line += f", {report.dead_lettered} to dead letters (maxDeliveries used up)"
        if report.budget_exhausted:
            line += f"; stopped at the limit of {limit}, more may remain"
        emit_line(line)
    if report.error:
        raise _cli_error(f"shovel of {queue} failed: {report.error}")


LimitOpt = Annotated[int, typer.Option("--limit", "-l", min=1, help="move at most N messages")]
ConcurrencyOpt = Annotated[int | None, typer.Option(
    "--concurrency", "-c", min=1, max=50, help="workers [default: the queue's shovel concurrency]")]


def shovel(ctx: typer.Context, queue: QueueArg, concurrency: ConcurrencyOpt = None, limit: LimitOpt = 10_000,
           output: OutputOpt = OutputFormat.TABLE) -> None:
    """Move sidelined messages back to the main magazine now (past maxDeliveries: to dead letters)."""
    _shovel(ctx, queue, "sideline", concurrency, limit, output)


def redrive(
    ctx: typer.Context,
    queue: QueueArg,
    source: Annotated[RedriveSource, typer.Option(
        "--from", case_sensitive=False, help="dead: the dead-letter magazine (attempts reset); sideline")
    ] = RedriveSource.DEAD,
    concurrency: ConcurrencyOpt = None,
    limit: LimitOpt = 10_000,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Move dead letters (or sidelined messages) back to the main magazine for redelivery."""
    _shovel(ctx, queue, source.value, concurrency, limit, output)


def sweeper(
    ctx: typer.Context,
    sweep_interval: Annotated[float | None, typer.Option(
        "--sweep-interval", help="seconds between sweep passes [default: 60]")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="sweep pool size [default: 64]")] = None,
    port: Annotated[int | None, typer.Option(
        "--port", help="/metrics, /healthz, /readyz port; 0 = any free one, -1 = off [default: 9090]")] = None,
    lease: Annotated[str | None, typer.Option(
        "--lease", help="lease backend: store (embedded) or kubernetes [default: store]")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="candidate id [default: host-pid-random]")
                        ] = None,
    log_format: Annotated[str, typer.Option("--log-format", help="text or json (one object per line)")] = "text",
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
) -> None:
    """Run the sweeper service until SIGTERM/SIGINT: leader election (one sweeper leads), a sweep of every
    active queue every sweep interval, each queue's shovel every shovelInterval, and the probes.

    Every setting is also read from IGNIS_SWEEPER_* variables (e.g. IGNIS_SWEEPER_LEASE_DURATION_SECONDS)."""
    if log_format not in ("text", "json"):
        raise _cli_error(f"--log-format {log_format!r}: must be text or json", 2)
    settings = load_sweeper_settings(sweep_interval_seconds=sweep_interval, threads=threads, probe_port=port,
                                     lease=lease, identity=identity)
    logs.configure(log_format, log_level)
    tune_collector()
    store = ctx.obj.ignis(service=True).store
    stop = threading.Event()
    set_on_signals(stop, announce=True)
    SweeperService(store, settings).run(stop)


def _journey_table(doc: dict[str, Any]) -> Table:
    table = Table(title=f"the journey of {doc['published']} messages through {doc['queue']}", title_justify="left",
                  show_header=False)
    table.add_column("what", style="bold")
    table.add_column("count", justify="right")
    for label, key in (("published", "published"),
                       ("taken by a consumer that crashed (never acked)", "abandoned"),
                       ("failed on first delivery (sidelined by the handler)", "firstDeliveryFailed"),
                       ("re-homed by the sweeper (abandoned claims)", "swept"),
                       ("redelivered after a shovel back to main", "redelivered"),
                       ("acked", "acked"),
                       (f"dead-lettered (failed {journey.MAX_DELIVERIES} deliveries)", "deadLettered"),
                       ("duplicate deliveries (at-least-once)", "duplicates"),
                       ("lost", "lost")):
        table.add_row(label, str(doc[key]))
    table.add_row("finished", "yes" if doc["finished"] else "no (timed out)")
    table.add_row("elapsed", f"{doc['elapsedSeconds']:.1f} s")
    return table


def up(
    ctx: typer.Context,
    manifests: Annotated[list[Path] | None, typer.Option(
        "--manifests", "-m", help="directory of IgnisQueue manifests to keep synced (repeatable)")] = None,
    port: Annotated[int | None, typer.Option(
        "--port", help="/metrics, /healthz, /readyz port; 0 = any free one, -1 = off "
                       "[default: 9090, or any free one with --demo]")] = None,
    sweep_interval: Annotated[float | None, typer.Option(
        "--sweep-interval", help="seconds between sweep passes [default: 60, 1 with --demo]")] = None,
    demo: Annotated[bool, typer.Option(
        "--demo", help="run the demo journey on the stack: publish, crash a consumer, fail, sweep, shovel, "
                       "redeliver; then exit")] = False,
    messages: Annotated[int, typer.Option("--messages", "-n", min=10, max=100_000,
                                          help="messages the demo publishes")] = 200,
    keep_running: Annotated[bool, typer.Option(
        "--keep-running", help="with --demo: keep the stack up afterwards (Ctrl-C stops it)")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run the whole system in one process on the configured store (the embedded lmdb default): the
    operator's manifest sync, the sweeper (leader-elected: several `ignis up` on one store are safe) and
    the metrics and health endpoints. Runs until SIGTERM/SIGINT, or with --demo until the demo is done."""
    settings = load_sweeper_settings(
        probe_port=port if port is not None else (0 if demo else 9090),
        sweep_interval_seconds=sweep_interval if sweep_interval is not None else (1.0 if demo else None),
        # One process and one write lock on lmdb: a small pool sweeps faster than 64 threads there.
        threads=2 if (ctx.obj.settings().store.startswith("lmdb:")
                      and "IGNIS_SWEEPER_THREADS" not in os.environ) else None,
        shovel_tick_seconds=0.5 if demo else None,
        clock_offset_seconds=journey.SWEEP_AHEAD_SECONDS if demo else None)
    tune_collector()
    ignis = ctx.obj.ignis(service=True)
    stop = threading.Event()
    set_on_signals(stop)
    with contextlib.ExitStack() as resources:
        dirs = list(manifests or [])
        if demo:
            dirs.append(Path(resources.enter_context(tempfile.TemporaryDirectory(prefix="ignis-up-demo-"))))
        stack = resources.enter_context(EmbeddedStack(ignis.store, dirs, settings))
        bad = [r for r in stack.first_sync if not r.ready]
        for r in bad:
            render.err.print(f"manifest {r.source}: queue {r.name}: {r.reason}: {r.message}", markup=False)
        probe_port = stack.wait_probes()
        synced = (f"{len(stack.first_sync) - len(bad)} queue(s) synced from {len(manifests or [])} manifest dir(s)"
                  + (f" (the demo declares {journey.QUEUE} with a manifest file next)" if demo else ""))
        probes = f"probes on http://localhost:{probe_port}/metrics" if probe_port else "probes off"
        render.err.print(f"ignis up: store {ignis.store.url}; {synced}; {probes}", markup=False, soft_wrap=True)
        if demo:
            if not stack.wait_leading(2 * settings.lease_duration_seconds):
                raise _cli_error("the demo's sweeper did not win the lease: another sweeper leads this store")
            result = _run_journey(ignis, dirs[-1], messages)
            if output is OutputFormat.JSON:
                emit_json(result.as_dict())
            else:
                render.out.print(_journey_table(result.as_dict()))
                render.out.print(f"Next: `ignis sideline list {journey.QUEUE} --dead` shows the dead letters; "
                                 f"`ignis queue describe {journey.QUEUE}` the queue and its sweep pointers.",
                                 markup=False)
            if result.lost or not result.finished:
                raise _cli_error(f"{result.lost} message(s) neither acked nor dead-lettered"
                                 + ("" if result.finished else " when the demo timed out"))
            if not keep_running:
                return
        render.err.print("running; Ctrl-C or SIGTERM stops it", markup=False)
        stack.wait(stop)


def _run_journey(ignis: Any, manifest_dir: Path, messages: int) -> journey.JourneyResult:
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=render.err, disable=not render.err.is_terminal) as progress:
        published = progress.add_task("publishing", total=messages)
        settled = progress.add_task("acked or dead-lettered", total=messages)
        return journey.run_journey(ignis, manifest_dir, messages,
                                   on_published=lambda n: progress.advance(published, n),
                                   on_settled=lambda n: progress.update(settled, completed=n))


def register(app: typer.Typer, groups: Mapping[str, typer.Typer]) -> None:
    """Entry point `ignis.cli` (pyproject.toml): add the sweeper's commands to the core CLI."""
    app.command("up")(up)
    app.command("sweep")(sweep)
    app.command("sweeper")(sweeper)
    groups["sideline"].command("shovel")(shovel)
    groups["sideline"].command("redrive")(redrive)
