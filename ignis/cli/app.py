"""The `ignis` command: declare queues, publish, consume, look at sidelined messages, run the demo.

Every command is a thin layer over the library (`Ignis`, `Queue`, `Consumer`). Errors never show a
traceback: `run` turns each one into a single line on stderr and an exit code that says what kind of
problem it was (see EXIT_CODES_HELP).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

try:  # typer >= 0.2x vendors click; these exception types are only reachable through its private module
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
except ImportError:  # older typer runs on the click package
    from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef]

from ignis.cli import render
from ignis.cli.browse import register as register_browse_commands
from ignis.cli.plugins import load_plugins
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.cli.topics import register as register_topic_commands
from ignis.cli.topics import topic_app
from ignis.client import Ignis
from ignis.demo import run_demo
from ignis.errors import (
    HoleBudgetExceeded,
    IgnisError,
    InvalidInputError,
    InvalidSpecError,
    MessageNotFound,
    PayloadTooLarge,
    QueueFull,
    QueueInactive,
    QueueNotFound,
    StoreError,
    TopicNotFound,
)
from ignis.manifest import load_manifests
from ignis.queue import NACKED, Message, Queue
from ignis.settings import DEFAULT_STORE, IgnisSettings, load_settings, service_wait
from ignis.spec import QueueSpec
from ignis.subjects import check_subject
from ignis.topics import Topic
from ignis.version import package_version

# ---- exit codes --------------------------------------------------------------------------------------
EXIT_OK = 0
EXIT_ERROR = 1  # anything else (declined confirmation, demo timed out, unexpected failure)
EXIT_USAGE = 2  # bad input: usage, invalid manifest, payload too large, malformed data
EXIT_NOT_FOUND = 3  # unknown or deactivated queue, unknown topic, no message at a reference
EXIT_STORE = 4  # store unreachable, full, or failing
EXIT_QUEUE_FULL = 5  # a bounded queue refused a publish (maxLength / maxBytes, overflow rejectPublish)

EXIT_CODES_HELP = (
    "Exit codes: 0 success · 1 other error · 2 bad input (usage, invalid manifest, malformed data, "
    "payload too large) · 3 not found (queue, deactivated queue, topic, message) · 4 store error (unreachable, full) · "
    "5 queue full (a bounded queue refused a publish: maxLength/maxBytes with overflow rejectPublish). "
    "Every error is one line on stderr; set IGNIS_DEBUG=1 to get a traceback for unexpected ones."
)

PUBLISH_CHUNK = 1000  # messages per publish_many call (one group commit) under --lines
CONSUME_BATCH = 100  # messages claimed per fire call by `consume`
CONSUME_POLL_SECONDS = 0.2  # sleep between polls of an empty queue under --wait


class CliError(Exception):
    """A failure detected by the CLI itself, with the exit code it deserves."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, StoreError):
        return EXIT_STORE
    if isinstance(exc, QueueFull):
        return EXIT_QUEUE_FULL
    if isinstance(exc, QueueNotFound | QueueInactive | TopicNotFound | MessageNotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, InvalidSpecError | InvalidInputError | PayloadTooLarge | UsageError):
        return EXIT_USAGE
    return EXIT_ERROR


# ---- shared state ------------------------------------------------------------------------------------
@dataclass
class State:
    """Global options, and the `Ignis` connection opened on first use (so --help never touches a store)."""

    store: str | None = None
    client_id: str | None = None
    farm_id: str | None = None
    _ignis: Ignis | None = None

    def settings(self) -> IgnisSettings:
        overrides = {k: v for k, v in (("store", self.store), ("client_id", self.client_id),
                                       ("farm_id", self.farm_id)) if v}
        return load_settings(**overrides)

    def ignis(self, service: bool = False) -> Ignis:
        """The connection; a long-running `service` waits for a store that does not answer yet (up to
        IGNIS_CONNECT_WAIT_SECONDS, default SERVICE_CONNECT_WAIT_SECONDS), a one-off command fails at once."""
        if self._ignis is None:
            settings = self.settings()
            self._ignis = Ignis(settings=settings, connect_wait_seconds=service_wait(settings) if service else None)
        return self._ignis

    def close(self) -> None:
        if self._ignis is not None:
            self._ignis.close()
            self._ignis = None


def _state(ctx: typer.Context) -> State:
    state = ctx.find_object(State)
    assert state is not None, "the root callback always installs State"
    return state


# ---- the app -----------------------------------------------------------------------------------------
app = typer.Typer(
    name="ignis",
    help="IgnisMQ: durable, sharded, at-least-once message queues. Declare queues from IgnisQueue "
         "manifests, publish, consume, and inspect failed messages.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # markdown: docstring paragraphs are reflowed to the terminal (rich mode keeps every source newline)
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)
queue_app = typer.Typer(help="Declare, inspect, deactivate and delete queues.", no_args_is_help=True,
                        epilog=EXIT_CODES_HELP, rich_markup_mode="markdown")
sideline_app = typer.Typer(help="Inspect failed messages: the sideline and the dead-letter magazine.",
                           no_args_is_help=True, epilog=EXIT_CODES_HELP, rich_markup_mode="markdown")
app.add_typer(queue_app, name="queue")
app.add_typer(sideline_app, name="sideline")

OutputOpt = Annotated[OutputFormat, typer.Option(
    "--output", "-o", case_sensitive=False,
    help="table for people; json prints one JSON document on stdout and nothing else there.")]
QueueArg = Annotated[str, typer.Argument(metavar="QUEUE", help="queue name", show_default=False)]


def _version(value: bool) -> None:
    if value:
        emit_line(f"ignis {package_version()}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    store: Annotated[str | None, typer.Option(
        "--store", envvar="IGNIS_STORE", show_envvar=True,
        help=f"store URL, e.g. lmdb:///var/lib/ignis?durability=fast [default: {DEFAULT_STORE}]")] = None,
    client_id: Annotated[str | None, typer.Option(
        "--client-id", envvar="IGNIS_CLIENT_ID", show_envvar=True,
        help="owning application; scopes queue and data set names [default: default]")] = None,
    farm_id: Annotated[str | None, typer.Option(
        "--farm-id", envvar="IGNIS_FARM_ID", show_envvar=True,
        help="deployment / datacentre id [default: local]")] = None,
    _show_version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")] = False,
) -> None:
    state = State(store=store, client_id=client_id, farm_id=farm_id)
    ctx.obj = state
    ctx.call_on_close(state.close)


# ---- progress ----------------------------------------------------------------------------------------
@contextmanager
def progress_bar() -> Iterator[Progress]:
    """A progress display on stderr (stdout stays clean for refs and JSON); silent when stderr is
    not a terminal, where a bar would only be noise in a log."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=render.err, transient=False,
                        disable=not render.err.is_terminal)
    with progress:
        yield progress


# ---- queue ---------------------------------------------------------------------------------------------
@queue_app.command("apply")
def queue_apply(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Option(
        "--file", "-f", show_default=False,
        help="IgnisQueue manifest file, or a directory of *.yaml/*.yml (repeatable)")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create or update queues from IgnisQueue manifests.

    Every manifest is validated first: if any is invalid, nothing is applied."""
    specs: list[QueueSpec] = []
    problems: list[str] = []
    for path in files:
        try:
            loaded = load_manifests(path)
        except InvalidSpecError as exc:
            problems.extend(exc.problems if exc.source is None else [str(exc)])
            continue
        if not loaded:
            problems.append(f"{path}: no IgnisQueue manifest found")
        specs.extend(loaded)
    # load_manifests catches duplicates within one path; two -f paths may still declare one queue twice.
    seen: set[tuple[str | None, str]] = set()
    for spec in specs:
        if (spec.client_id, spec.name) in seen:
            problems.append(f"queue {spec.name!r} is declared more than once across the -f paths")
        seen.add((spec.client_id, spec.name))
    if problems:
        raise InvalidSpecError(problems)

    ignis = _state(ctx).ignis()
    results = []
    for spec in specs:
        created = ignis.apply(spec)
        results.append({"name": spec.name, "clientId": spec.client_id or ignis.client_id,
                        "action": "created" if created else "updated"})
    if output is OutputFormat.JSON:
        emit_json(results)
        return
    for r in results:
        scope = f" (clientId {r['clientId']})" if r["clientId"] != ignis.client_id else ""
        emit_line(f"queue/{r['name']} {r['action']}{scope}")


@queue_app.command("list")
def queue_list(
    ctx: typer.Context,
    all_queues: Annotated[bool, typer.Option("--all", "-a", help="include deactivated queues")] = False,
    inactive: Annotated[bool, typer.Option("--inactive", help="only deactivated queues")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List queues (active ones unless --all or --inactive)."""
    if all_queues and inactive:
        raise InvalidInputError("--all and --inactive are mutually exclusive")
    active: bool | None = None if all_queues else not inactive
    ignis = _state(ctx).ignis()
    entries = []
    for record in ignis.list_queues(active=active):
        # One corrupt record must not hide every other queue: show it with its problem.
        try:
            spec, problem = QueueSpec.from_bins(record.name, record.bins, ignis.client_id), None
        except InvalidSpecError as exc:
            spec, problem = None, str(exc)
        entries.append(render.queue_entry(record, spec, problem))
    if output is OutputFormat.JSON:
        emit_json(entries)
    elif not entries:
        emit_line("no queues" + ("" if active is None else " (active)" if active else " (inactive)"))
    else:
        render.out.print(render.queue_list_table(entries))


@queue_app.command("describe")
def queue_describe(ctx: typer.Context, name: QueueArg, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Show a queue's configuration, runtime bins (createdAt, active, sweep pointers) and stats."""
    ignis = _state(ctx).ignis()
    record = ignis.record(name)
    spec = QueueSpec.from_bins(name, record.bins, ignis.client_id)
    doc = {
        "name": name,
        "clientId": ignis.client_id,
        "active": record.active,
        "createdAt": record.created_at,
        "spec": spec.to_manifest()["spec"],
        "effectiveHandlerTimeoutSeconds": spec.effective_handler_timeout_seconds,
        "runtime": render.runtime_bins(record),
        "stats": ignis.stats(name, in_flight=True).as_dict(),
    }
    if output is OutputFormat.JSON:
        emit_json(doc)
    else:
        render.out.print(render.describe_table(doc))


@queue_app.command("delete")
def queue_delete(
    ctx: typer.Context,
    name: QueueArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Delete a queue: its messages, sideline, dead letters and record."""
    ignis = _state(ctx).ignis()
    ignis.record(name)  # an unknown queue fails before the question is asked
    if not yes:
        try:
            confirmed = typer.confirm(f"Delete queue {name!r} with all its messages, sideline and dead letters?",
                                      err=True)
        except typer.Abort:
            sys.stderr.write("\n")  # end the prompt line, so the error gets a line of its own
            confirmed = False  # no answer (stdin closed, Ctrl-C) is not a yes
        if not confirmed:
            raise CliError(f"queue {name!r} not deleted: not confirmed (pass --yes to delete without asking)")
    removed = ignis.delete_queue(name)
    if output is OutputFormat.JSON:
        emit_json({"name": name, "deleted": True, "removedMessages": removed})
    else:
        emit_line(f"queue/{name} deleted ({removed} message record(s) removed)")


@queue_app.command("deactivate")
def queue_deactivate(ctx: typer.Context, name: QueueArg) -> None:
    """Mark a queue inactive: consumers stop and publish is refused.

    Re-apply its manifest to reactivate it."""
    _state(ctx).ignis().deactivate(name)
    emit_line(f"queue/{name} deactivated")


# ---- publish -------------------------------------------------------------------------------------------
def _parse_headers(items: Sequence[str] | None) -> dict[str, str] | None:
    headers: dict[str, str] = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidInputError(f"--header {item!r}: expected KEY=VALUE")
        headers[k] = v
    return headers or None


def _to_payload(value: bytes | str, mode: str, what: str) -> Any:
    """Turn raw input into the value to publish: bytes, str, or a parsed JSON value."""
    if mode == "bytes":
        # surrogateescape gives back the exact bytes of a non-UTF-8 command-line argument.
        return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else value
        text.encode("utf-8")  # a command-line argument may carry undecodable bytes as surrogates
    except UnicodeError:
        raise InvalidInputError(f"{what} is not valid UTF-8 text (use --bytes to publish raw bytes)") from None
    if mode == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column "
                                    f"{exc.colno}") from None
    return text


def _split_lines(raw: bytes) -> Iterator[tuple[int, bytes]]:
    """(line number, line) without its line ending; blank lines are skipped. Only \\n (and \\r\\n) end a
    line: str.splitlines would also split on U+2028 and friends, breaking unicode payloads."""
    for number, line in enumerate(raw.split(b"\n"), start=1):
        line = line.removesuffix(b"\r")
        if line.strip():
            yield number, line


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"cannot read {path}: {exc.strerror or exc}") from None


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds of a duration such as `30s`, `1.5m`, `1h30m`, `250ms`, or a bare number of seconds."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    parts = _DURATION_PART.findall(value)
    if not value or not parts or "".join(n + u for n, u in parts) != value:
        raise InvalidInputError(f"duration {text!r}: use a number of seconds or units ms, s, m, h, d (e.g. 30s, 1h30m)")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


class TopicTarget:
    """A topic as `publish` uses a queue: every message with the one subject; no delay (a topic's messages are
    every subscription's at once)."""

    def __init__(self, topic: Topic, subject: str) -> None:
        check_subject(subject)  # (a bad one fails before stdin is read)
        self.topic, self.subject, self.name = topic, subject, topic.name

    def envelope(self, payload: Any, *, key: str | None = None, headers: dict[str, str] | None = None) -> Any:
        self.topic._check(None, key, headers)
        return self.topic._encode(payload)

    def publish(self, payload: Any, *, id: str | None, key: str | None, headers: dict[str, str] | None,
                delay: float | None) -> Any:
        return self.topic.publish(payload, subject=self.subject, key=key, headers=headers, id=id)

    def publish_many(self, payloads: list[Any], *, key: str | None, headers: dict[str, str] | None,
                     delay: float | None) -> Any:
        return self.topic.publish_many(payloads, subject=self.subject, key=key, headers=headers)


def _publish_lines(q: Queue | TopicTarget, payloads: list[tuple[int, Any]], source: str, key: str | None,
                   headers: dict[str, str] | None, delay: float | None = None) -> list[Any]:
    # Validate every line before writing any, so a bad line 90 000 does not leave 89 999 published.
    for number, payload in payloads:
        try:
            q.envelope(payload, key=key, headers=headers)
        except (PayloadTooLarge, InvalidInputError) as exc:
            raise InvalidInputError(f"{source} line {number}: {exc}") from None
    refs: list[Any] = []
    values = [p for _, p in payloads]
    with progress_bar() as progress:
        task = progress.add_task(f"publishing to {q.name}", total=len(values))
        for start in range(0, len(values), PUBLISH_CHUNK):
            chunk = values[start:start + PUBLISH_CHUNK]
            try:
                refs.extend(q.publish_many(chunk, key=key, headers=headers, delay=delay))
            except QueueFull as exc:  # a bounded queue: say which lines went in, and stop there
                first = payloads[start + exc.refused[0]][0]
                raise QueueFull(q.name, f"{exc.why}; {len(refs) + len(exc.published)} of {len(values)} lines of "
                                f"{source} were published, line {first} was the first refused",
                                exc.refused, exc.results) from None
            progress.advance(task, len(chunk))
    return refs


@app.command()
def publish(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(
        metavar="[QUEUE]", show_default=False, help="the queue (omit it with --topic)")] = None,
    data: Annotated[str | None, typer.Argument(
        metavar="[DATA|-]", show_default=False,
        help="the payload; '-' reads it from stdin (kept byte for byte, trailing newline included)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="parse the input as JSON and publish the value")] = False,
    as_bytes: Annotated[bool, typer.Option("--bytes", help="publish the input as raw bytes")] = False,
    as_text: Annotated[bool, typer.Option(
        "--text", help="publish the input as a UTF-8 string (the default, except for a whole --file)")] = False,
    file: Annotated[Path | None, typer.Option(
        "--file", "-f", show_default=False,
        help="read the input from a file (published as raw bytes unless --json, --text or --lines)")] = None,
    lines: Annotated[bool, typer.Option(
        "--lines", help="publish each line of stdin or --file as its own message (blank lines skipped)")] = False,
    key: Annotated[str | None, typer.Option(
        "--key", "-k", show_default=False, help="partition key: one key always lands on one shard")] = None,
    msg_id: Annotated[str | None, typer.Option(
        "--id", show_default=False, help="message id (default: a new time-ordered id)")] = None,
    header: Annotated[list[str] | None, typer.Option(
        "--header", "-H", show_default=False, help="header KEY=VALUE (repeatable)")] = None,
    delay: Annotated[str | None, typer.Option(
        "--delay", "-d", show_default=False,
        help="deliver no sooner than this from now: 30s, 5m, 1h30m, 250ms or seconds (at most the queue's "
             "messageExpirySeconds)")] = None,
    topic: Annotated[str | None, typer.Option(
        "--topic", "-t", show_default=False, help="publish to this topic instead of a queue (with --subject)")] = None,
    subject: Annotated[str | None, typer.Option(
        "--subject", "-s", show_default=False, help="the message's subject, for --topic: e.g. sensors/kitchen/temp")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Publish a message (or one per line with --lines) to a queue, or with --topic and --subject to a topic, and
    print its reference.

    References read QUEUE/SHARD/SLOT#ID (a delayed message: QUEUE_DELAYED/0/DUE-MS#ID; a topic's: TOPIC/SHARD/
    SLOT#ID). DATA is published as a string unless --json or --bytes."""
    if topic is not None:
        if data is not None and queue is not None:
            raise InvalidInputError("give a QUEUE or --topic, not both")
        data, queue = data if data is not None else queue, None
        if subject is None:
            raise InvalidInputError("--topic needs --subject: the subject subscriptions filter on")
        if delay is not None:
            raise InvalidInputError("--delay is for queues: a topic keeps its messages for every subscription now")
    elif subject is not None:
        raise InvalidInputError("--subject is for --topic: a queue's messages have no subject")
    elif queue is None:
        raise InvalidInputError("missing QUEUE: name the queue to publish to (or use --topic)")
    modes = [m for m, on in (("json", as_json), ("bytes", as_bytes), ("str", as_text)) if on]
    if len(modes) > 1:
        raise InvalidInputError("--json, --bytes and --text are mutually exclusive")
    if file is not None and data is not None:
        raise InvalidInputError("give DATA or --file, not both")
    if file is None and data is None:
        raise InvalidInputError("nothing to publish: give DATA, '-' to read stdin, or --file PATH")
    if lines and file is None and data != "-":
        raise InvalidInputError("--lines reads stdin ('-') or --file PATH, not a DATA argument")
    if lines and msg_id is not None:
        raise InvalidInputError("--id names a single message; it cannot be combined with --lines")
    headers = _parse_headers(header)
    mode = modes[0] if modes else ("bytes" if file is not None and not lines else "str")

    if topic is not None:  # (an unknown topic fails before stdin is read)
        target: Any = TopicTarget(_state(ctx).ignis().topic(topic), subject)  # type: ignore[arg-type]
        seconds = None
    else:
        target = q = _state(ctx).ignis().queue(queue)  # type: ignore[arg-type]  # (unknown: fails before stdin)
        seconds = q.delay_seconds(parse_duration(delay)) if delay is not None else None  # (a bad one too)
    if file is not None:
        raw: bytes | str = _read_file(file)
        source = str(file)
    elif data == "-":
        raw, source = sys.stdin.buffer.read(), "stdin"
    else:
        raw, source = data or "", "DATA"

    if lines:
        assert isinstance(raw, bytes)
        payloads = [(n, _to_payload(line, mode, f"{source} line {n}")) for n, line in _split_lines(raw)]
        refs = _publish_lines(target, payloads, source, key, headers, seconds)
    else:
        refs = [target.publish(_to_payload(raw, mode, source), id=msg_id, key=key, headers=headers, delay=seconds)]

    if output is OutputFormat.JSON:
        emit_json({"topic" if topic else "queue": target.name, "published": len(refs),
                   "messages": [{"id": r.id, "ref": str(r.ref)} for r in refs]})
        return
    for r in refs:
        emit_line(str(r))
    if lines:
        render.err.print(f"published {len(refs)} message(s) to {target.name}")


# ---- consume -------------------------------------------------------------------------------------------
@app.command()
def consume(
    ctx: typer.Context,
    queue: QueueArg,
    max_messages: Annotated[int | None, typer.Option(
        "--max", "-n", min=1, show_default=False, help="stop after N messages [default: all available]")] = None,
    wait: Annotated[float, typer.Option(
        "--wait", "-w", min=0, help="when the queue is empty, keep polling until SECONDS pass without a message")
    ] = 0.0,
    nack: Annotated[bool, typer.Option(
        "--nack", help="nack instead of ack: move the messages to the sideline (dead letters past "
                       "maxDeliveries)")] = False,
    reason: Annotated[str | None, typer.Option(
        "--reason", show_default=False, help=f"nack reason (implies --nack) [default: {NACKED}]")] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Pull messages, print them, and ack them (or --nack them).

    In table mode each batch is printed, then settled. With -o json the messages are settled only after
    the JSON document is written: if the command dies first, they are redelivered once the sweeper
    re-homes them (at-least-once, never lost)."""
    nack = nack or reason is not None
    nack_reason = reason or NACKED
    q = _state(ctx).ignis().queue(queue, allow_inactive=True)  # draining a deactivated queue is allowed
    counts = {"acked": 0, "sidelined": 0, "deadLettered": 0, "refused": 0}

    def settle(batch: list[Message]) -> None:
        if not batch:
            return
        if not nack:
            q.ack(batch)
            counts["acked"] += len(batch)
            return
        moved = q.nack(batch, nack_reason)
        counts["sidelined"] += moved.sidelined
        counts["deadLettered"] += moved.dead_lettered
        counts["refused"] += moved.refused

    held: list[Message] = []  # json mode: claimed, printed at the end, then settled
    total = 0
    idle_until = time.monotonic() + wait
    try:
        while max_messages is None or total < max_messages:
            want = CONSUME_BATCH if max_messages is None else min(CONSUME_BATCH, max_messages - total)
            try:
                batch = q.fire_many(want)
            except HoleBudgetExceeded:
                continue  # the fire pointer moved past the holes; data may follow
            if not batch:
                remaining = idle_until - time.monotonic()
                if remaining <= 0:
                    break
                time.sleep(min(CONSUME_POLL_SECONDS, remaining))
                continue
            total += len(batch)
            idle_until = time.monotonic() + wait
            if output is OutputFormat.JSON:
                held.extend(batch)
                continue
            for m in batch:
                render.print_message(render.message_record(m.ref, m.envelope), m.envelope)
            settle(batch)
    except KeyboardInterrupt:
        pass  # stop polling; what was claimed is still printed and settled below
    if output is OutputFormat.JSON:
        emit_json([render.message_record(m.ref, m.envelope) for m in held])
        settle(held)
        return
    if nack:
        summary = (f"nacked {total} message(s) with reason {nack_reason!r}: {counts['sidelined']} sidelined, "
                   f"{counts['deadLettered']} dead-lettered")
        if counts["refused"]:
            summary += f", {counts['refused']} kept in {q.name} (sideline copy failed)"
    else:
        summary = f"acked {counts['acked']} message(s)"
    render.err.print(summary if total else f"no messages in {q.name}")


# ---- sideline ------------------------------------------------------------------------------------------
@sideline_app.command("list")
def sideline_list(
    ctx: typer.Context,
    queue: QueueArg,
    dead: Annotated[bool, typer.Option("--dead", help="show the dead-letter magazine instead")] = False,
    limit: Annotated[int, typer.Option("--limit", "-l", min=1, help="show at most N messages")] = 50,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List sidelined (or dead-lettered) messages without moving them."""
    q = _state(ctx).ignis().queue(queue, allow_inactive=True)
    magazine = q.dead if dead else q.sideline
    entries = [render.sideline_record(ref, env) for ref, env in magazine.browse(limit)]
    if output is OutputFormat.JSON:
        emit_json(entries)
        return
    what = "dead letters" if dead else "sideline"
    if not entries:
        emit_line(f"no messages in the {what} of {q.name}")
        return
    shown = f"first {len(entries)} shown" if len(entries) == limit else f"{len(entries)}"
    render.out.print(render.sideline_table(entries, f"{what} of {q.name} ({shown})"))


# ---- stats ---------------------------------------------------------------------------------------------
@app.command()
def stats(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Argument(
        metavar="[QUEUE]", show_default=False, help="one queue [default: every queue, active or not]")] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Message counts per queue: published, consumed, depth, in flight, delayed, sidelined, dead, and the
    age of the oldest message waiting in main (oldest_age_seconds; null when none waits).

    With QUEUE, -o json prints one object; without, a list of every queue."""
    ignis = _state(ctx).ignis()
    names = [queue] if queue is not None else [r.name for r in ignis.list_queues(active=None)]
    results = [ignis.stats(name, in_flight=True) for name in names]
    if output is OutputFormat.JSON:
        emit_json(results[0].as_dict() if queue is not None else [s.as_dict() for s in results])
    else:
        render.out.print(render.stats_table(results))


# ---- demo ----------------------------------------------------------------------------------------------
@app.command()
def demo(
    ctx: typer.Context,
    messages: Annotated[int, typer.Option(
        "--messages", "-n", min=1, max=1_000_000, help="how many messages to publish")] = 200,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Run IgnisMQ end to end: publish, consume with deliberate failures, and report.

    Declares the queue `demo` on the configured store (recreated on every run), publishes N JSON
    messages, consumes them with a handler that acks most, rejects some and raises on some, then shows
    what was acked and sidelined, and why."""
    ignis = _state(ctx).ignis()
    with progress_bar() as progress:
        published = progress.add_task("publishing", total=messages)
        handled = progress.add_task("consuming", total=messages)
        result = run_demo(ignis, messages, on_published=lambda n: progress.advance(published, n),
                          on_handled=lambda: progress.advance(handled))
    doc = result.as_dict()
    if output is OutputFormat.JSON:
        emit_json(doc)
    else:
        for table in render.demo_tables(doc):
            render.out.print(table)
        render.out.print("Next: `ignis sideline list demo` shows every sidelined message; "
                         "`ignis queue describe demo` the queue itself.", markup=False)
    if not result.drained:
        raise CliError(f"the demo queue was not drained within the time limit ({doc['stats']['depth']} left)")


# ---- plug-ins ------------------------------------------------------------------------------------------
# `ignis operator`, `ignis up|sweep|sweeper`, `ignis sideline shovel|redrive` and `ignis pipeline` come from
# the operator/, workers/ and pipeline/ parts through entry points: the core imports none of them.
register_topic_commands(app, queue_app, _state, CliError)
register_browse_commands(app, queue_app, _state)
load_plugins(app, {"queue": queue_app, "sideline": sideline_app, "topic": topic_app})


# ---- entry point ---------------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip()) or "unknown error"


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"error: {_one_line(message)}\n")
    sys.stderr.flush()
    return code


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error becomes one line on stderr."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="ignis", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        # `ignis` or `ignis queue` alone: typer has printed the help already (rich), or gives it as text.
        if exc.format_message().strip():
            sys.stderr.write(exc.format_message() + "\n")
        return EXIT_USAGE
    except UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return _fail(exc.format_message() + hint, EXIT_USAGE)
    except ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except typer.Abort:
        return _fail("aborted", EXIT_ERROR)
    except (IgnisError, CliError) as exc:
        return _fail(str(exc), exit_code_for(exc))
    except BrokenPipeError:
        # Reader went away (`ignis consume q | head`): silence the flush at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("IGNIS_DEBUG"):
            raise
        return _fail(f"unexpected {type(exc).__name__}: {exc} (set IGNIS_DEBUG=1 for a traceback)", EXIT_ERROR)
    return rv if isinstance(rv, int) else EXIT_OK


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point (`ignis`)."""
    logging.basicConfig(level=logging.WARNING, format="ignis: %(levelname)s: %(name)s: %(message)s")
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
