"""`ignis topic apply/list/describe/delete` and `ignis queue seek`: topics and subscriptions on the command line.

`register` adds them to the app (ignis.cli.app); `state` is how a command reaches the connection."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ignis.cli import render
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.errors import InvalidInputError, InvalidSpecError
from ignis.manifest import load_topic_manifests
from ignis.topics import TopicSpec

OutputOpt = Annotated[OutputFormat, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table for people; json prints one JSON document on stdout and nothing else there.")]
TopicArg = Annotated[str, typer.Argument(metavar="TOPIC", help="topic name", show_default=False)]

topic_app = typer.Typer(help="Declare, inspect and delete topics (publish with `ignis publish --topic`).",
                        no_args_is_help=True)


def register(app: typer.Typer, queue_app: typer.Typer, state: Callable[[typer.Context], Any],
             fail: Callable[[str], Exception]) -> None:
    """Add the topic commands to `app` and `queue seek` to `queue_app`. `fail(message)`: the CLI's one-line error
    that exits 1 (a declined confirmation)."""

    @topic_app.command("apply")
    def topic_apply(
        ctx: typer.Context,
        files: Annotated[list[Path], typer.Option(
            "--file", "-f", show_default=False,
            help="IgnisTopic manifest file, or a directory of *.yaml/*.yml (repeatable)")],
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Create or update topics from IgnisTopic manifests. Every manifest is validated first: if any is
        invalid, nothing is applied."""
        specs: list[TopicSpec] = []
        problems: list[str] = []
        for path in files:
            try:
                loaded = load_topic_manifests(path)
            except InvalidSpecError as exc:
                problems.extend(exc.problems if exc.source is None else [str(exc)])
                continue
            if not loaded:
                problems.append(f"{path}: no IgnisTopic manifest found")
            specs.extend(loaded)
        if len({(s.client_id, s.name) for s in specs}) < len(specs):
            problems.append("a topic is declared more than once across the -f paths")
        if problems:
            raise InvalidSpecError(problems)
        ignis = state(ctx).ignis()
        results = [{"name": s.name, "clientId": s.client_id or ignis.client_id,
                    "action": "created" if ignis.apply(s) else "updated"} for s in specs]
        if output is OutputFormat.JSON:
            emit_json(results)
            return
        for r in results:
            emit_line(f"topic/{r['name']} {r['action']}")

    @topic_app.command("list")
    def topic_list(ctx: typer.Context, output: OutputOpt = OutputFormat.TABLE) -> None:
        """List topics with their shards, retention and subscriptions."""
        ignis = state(ctx).ignis()
        queues = ignis.list_queues(active=None)
        entries = [{"name": t.name, "shards": t.shards, "retentionSeconds": t.retention_seconds,
                    "retentionBytes": t.retention_bytes,
                    "subscriptions": sorted(q.name for q in queues if q.bins.get("subTopic") == t.name)}
                   for t in ignis.list_topics()]
        if output is OutputFormat.JSON:
            emit_json(entries)
        elif not entries:
            emit_line("no topics")
        else:
            render.out.print(render.simple_table(["name", "shards", "retentionSeconds", "retentionBytes",
                                                  "subscriptions"], entries))

    @topic_app.command("describe")
    def topic_describe(ctx: typer.Context, name: TopicArg, output: OutputOpt = OutputFormat.TABLE) -> None:
        """Show a topic's configuration and figures (published, retained messages and bytes, subscriptions)."""
        ignis = state(ctx).ignis()
        topic = ignis.topic(name)
        doc = {"name": name, "clientId": ignis.client_id, "spec": topic.spec.to_manifest()["spec"],
               "stats": topic.stats().as_dict()}
        if output is OutputFormat.JSON:
            emit_json(doc)
        else:
            render.out.print(render.simple_table(["field", "value"], [
                {"field": k, "value": v} for k, v in {**doc["spec"], **doc["stats"]}.items()]))

    @topic_app.command("delete")
    def topic_delete(
        ctx: typer.Context,
        name: TopicArg,
        force: Annotated[bool, typer.Option("--force", help="delete it although subscriptions read it")] = False,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Delete a topic and its messages. Refused while subscriptions read it (they are named), unless --force."""
        ignis = state(ctx).ignis()
        ignis.topic_spec(name)  # an unknown topic fails before the question is asked
        if not yes:
            try:
                confirmed = typer.confirm(f"Delete topic {name!r} with all its messages?", err=True)
            except typer.Abort:
                sys.stderr.write("\n")
                confirmed = False
            if not confirmed:
                raise fail(f"topic {name!r} not deleted: not confirmed (pass --yes to delete without asking)")
        removed = ignis.delete_topic(name, force=force)
        if output is OutputFormat.JSON:
            emit_json({"name": name, "deleted": True, "removedMessages": removed})
        else:
            emit_line(f"topic/{name} deleted ({removed} message record(s) removed)")

    @queue_app.command("seek")
    def queue_seek(
        ctx: typer.Context,
        name: Annotated[str, typer.Argument(metavar="SUBSCRIPTION", help="a queue that subscribes to a topic",
                                            show_default=False)],
        to: Annotated[str, typer.Option(
            "--to", show_default=False,
            help="an ISO-8601 time (2026-11-28T12:00:00Z), epoch milliseconds, earliest or latest")],
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        """Move a subscription to the first message published at or after a time (backwards or forwards): what it
        acked after that point is delivered again."""
        if not to.strip():
            raise InvalidInputError("--to is empty: give a time, epoch milliseconds, earliest or latest")
        positions = state(ctx).ignis().seek(name, int(to) if to.isdigit() else to)
        if output is OutputFormat.JSON:
            emit_json({"name": name, "to": to, "positions": {str(k): v for k, v in positions.items()}})
        else:
            emit_line(f"queue/{name} moved to {to}")

    app.add_typer(topic_app, name="topic")
