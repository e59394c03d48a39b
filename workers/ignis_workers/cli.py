"""CLI commands of the sweeper, registered on the core `ignis` app by `register(app, sideline_app)`:

* `ignis sweep QUEUE` — one sweep pass over one queue, prints what moved (`-o json`);
* `ignis sweeper` — the long-running service (leader election, sweep and shovel loops, probes);
* `ignis sideline shovel QUEUE` — one shovel pass now (sideline -> main, dead letters past maxDeliveries);
* `ignis sideline redrive QUEUE --from dead` — move dead letters (or the sideline) back to main.

The root callback's `State` (ctx.obj) gives the store options; errors are the core's types, so the
core's `run` turns them into one line and its exit code. Nothing here imports `ignis.cli.app` at
module level (it imports this module).
"""

from __future__ import annotations

import logging
import signal
import threading
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from ignis.cli import render
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.envelope import now_ms
from ignis_workers import logs
from ignis_workers.election import LEASE_NAME
from ignis_workers.service import SweeperService, load_sweeper_settings
from ignis_workers.shovel import Shovel
from ignis_workers.sweeper import Sweeper, SweepReport

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
    report = Shovel(ignis.store, budget=limit).shovel_queue(ignis.store.client_id, queue, source=source,
                                                           concurrency=concurrency)  # type: ignore[arg-type]
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
    store = ctx.obj.ignis().store
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("signal %s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    SweeperService(store, settings).run(stop)


def register(app: typer.Typer, sideline_app: typer.Typer) -> None:
    """Add the sweeper's commands to the core CLI."""
    app.command("sweep")(sweep)
    app.command("sweeper")(sweeper)
    sideline_app.command("shovel")(shovel)
    sideline_app.command("redrive")(redrive)
