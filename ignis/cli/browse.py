"""`ignis queue peek` and `ignis message get`: look at messages without claiming them (ignis.browse).

`register` adds them to the app (ignis.cli.app); `state` is how a command reaches the connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from ignis.browse import MAX_BROWSE, BrowsedMessage, queue_of_ref
from ignis.cli import render
from ignis.cli.render import OutputFormat, emit_json, emit_line

OutputOpt = Annotated[OutputFormat, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table for people; json prints one JSON document on stdout and nothing else there.")]

message_app = typer.Typer(help="Look at one message by its reference, without claiming it.", no_args_is_help=True)


def browsed_record(m: BrowsedMessage) -> dict[str, Any]:
    """A browsed message as a JSON object: a delivered message's fields plus its state, subject and claim time."""
    return {**render.message_record(m.ref, m.envelope), "state": m.state, "subject": m.subject,
            "fireTs": m.envelope.fire_ts or None}


def browse_table(entries: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("ref", "id", "subject", "key", "attempts", "published", "size", "payload"):
        payload = column == "payload"
        table.add_column(column, justify="right" if column in ("attempts", "size") else "left",
                         overflow="ellipsis", no_wrap=payload, max_width=40 if payload else None)
    for e, text in entries:
        table.add_row(*(Text("-" if v is None else str(v)) for v in (
            e["ref"], e["id"], e["subject"], e["key"], e["attempts"], render.iso_ms(e["loadedAt"]), e["size"], text)))
    return table


def register(app: typer.Typer, queue_app: typer.Typer, state: Callable[[typer.Context], Any]) -> None:
    """Add `queue peek` to `queue_app` and the `message` group to `app`."""

    @queue_app.command("peek")
    def queue_peek(
        ctx: typer.Context,
        queue: Annotated[str, typer.Argument(metavar="QUEUE", help="queue name", show_default=False)],
        count: Annotated[int, typer.Option("--count", "-n", min=1, max=MAX_BROWSE,
                                           help="show at most N messages")] = 10,
        shard: Annotated[int | None, typer.Option("--shard", min=0, help="only this shard's")] = None,
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Show the next messages waiting in QUEUE, oldest first, without claiming them: consumers still get each
        one exactly as before. A subscription shows its topic's messages past its position that its filter
        selects."""
        q = state(ctx).ignis().queue(queue, allow_inactive=True)
        found = q.browse(count, shard)
        if output is OutputFormat.JSON:
            emit_json([browsed_record(m) for m in found])
            return
        if not found:
            emit_line(f"no messages waiting in {q.name}")
            return
        shown = f"first {len(found)} shown" if len(found) == count else f"{len(found)}"
        rows = [(browsed_record(m), render.payload_text(m.envelope)) for m in found]
        render.out.print(browse_table(rows, f"waiting in {q.name} ({shown})"))

    @message_app.command("get")
    def message_get(
        ctx: typer.Context,
        ref: Annotated[str, typer.Argument(metavar="REF", help="the message's reference, MAGAZINE/SHARD/SLOT (as "
                                           "`ignis consume`, `queue peek` and `sideline list` print it)",
                                           show_default=False)],
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Show one message by its reference, without claiming it, with its state: waiting, in flight, sidelined
        or dead. Exit code 3 when there is no message there (never written, acked or expired)."""
        q = state(ctx).ignis().queue(queue_of_ref(ref), allow_inactive=True)
        m = q.read(ref)
        record = browsed_record(m)
        if output is OutputFormat.JSON:
            emit_json(record)
            return
        render.print_message(record, m.envelope)
        details = [f"state={m.state}", f"published={render.iso_ms(m.published_at)}"]
        if m.subject is not None:
            details.append(f"subject={m.subject}")
        if m.envelope.fire_ts:
            details.append(f"claimed={render.iso_ms(m.envelope.fire_ts)}")
        render.err.print("  ".join(details), style="dim")

    app.add_typer(message_app, name="message")
