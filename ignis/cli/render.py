"""Output of the `ignis` CLI: rich tables for people, plain JSON documents for machines.

Every value that comes from the store (payloads, headers, reasons) is wrapped in `Text`, never passed
as a markup string, so a payload containing `[bold]` prints as itself.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ignis.envelope import CODEC_BYTES, CODEC_JSON, Envelope
from ignis.queue import QueueStats
from ignis.spec import QueueSpec
from ignis.storage.base import (
    ACTIVE,
    CREATED_AT,
    SIDELINE_SWEEP,
    SIDELINE_SWEPT,
    SWEEP_EPOCH,
    SWEEP_POINTERS,
    SWEPT_COUNTER,
    QueueRecord,
    SlotRef,
)


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


# highlight=False: rich would otherwise colour numbers and quotes inside payloads. Piped or redirected
# output gets a wide page instead of rich's 80 columns, so tables are not squeezed into ellipses.
out = Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
err = Console(stderr=True, highlight=False)


# ---- JSON ------------------------------------------------------------------------------------------
def emit_json(value: Any) -> None:
    """One JSON document on stdout, UTF-8 whatever the locale (payloads may hold any unicode)."""
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str) + "\n"
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.buffer.flush()


def emit_line(text: str) -> None:
    """A plain line on stdout, exactly as given (no rich wrapping: refs and payloads get piped)."""
    sys.stdout.flush()  # keep order with anything rich wrote through the text layer
    sys.stdout.buffer.write((text + "\n").encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()


# ---- values ----------------------------------------------------------------------------------------
def iso_ms(ms: int | None) -> str:
    """Epoch milliseconds as an ISO 8601 UTC timestamp; '-' for unset (0 or None)."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def payload_json(env: Envelope) -> tuple[str, Any]:
    """(codec, value) for JSON output: str and JSON payloads as themselves, bytes as base64.
    A payload that no longer decodes under its codec is shown as base64 bytes."""
    try:
        value = env.decoded()
    except (ValueError, UnicodeDecodeError):
        return CODEC_BYTES, base64.b64encode(env.payload).decode("ascii")
    if isinstance(value, bytes):
        return CODEC_BYTES, base64.b64encode(value).decode("ascii")
    return env.codec, value


def payload_text(env: Envelope) -> str:
    """The payload for a person: text as is, JSON compact, binary as `base64:...`."""
    codec, value = payload_json(env)
    if codec == CODEC_BYTES:
        return f"base64:{value}"
    if codec == CODEC_JSON:
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def message_record(ref: SlotRef, env: Envelope) -> dict[str, Any]:
    """A delivered or stored message as a JSON object."""
    codec, value = payload_json(env)
    return {
        "ref": str(ref),
        "id": env.msg_id,
        "attempts": env.attempts,
        "key": env.key,
        "headers": dict(env.headers or {}),
        "loadedAt": env.loaded_at,
        "size": len(env.payload),
        "codec": codec,
        "payload": value,
    }


def history_entries(env: Envelope) -> list[dict[str, Any]]:
    """Envelope history items are [at_ms, reason, attempts] lists (ignis.envelope.for_transfer)."""
    entries = []
    for item in env.history or []:
        at, reason, attempts = [*item, None, None, None][:3]
        entries.append({"at": at, "reason": reason, "attempts": attempts})
    return entries


def sideline_record(ref: SlotRef, env: Envelope) -> dict[str, Any]:
    record = message_record(ref, env)
    history = history_entries(env)
    record.update(reason=env.reason, history=history, lastHistory=history[-1] if history else None)
    return record


def history_text(entry: Mapping[str, Any] | None) -> str:
    if not entry:
        return "-"
    return f"{iso_ms(entry.get('at'))} {entry.get('reason')} (attempt {entry.get('attempts')})"


def _cell(value: Any) -> Text:
    if isinstance(value, bool):
        return Text("true" if value else "false")
    return Text("-" if value is None else str(value))


def _flatten(prefix: str, value: Any) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(f"{prefix}.{k}" if prefix else str(k), v)
    else:
        yield prefix, value


# ---- queues ----------------------------------------------------------------------------------------
def runtime_bins(record: QueueRecord) -> dict[str, Any]:
    bins = record.bins
    """The runtime bins (written by the store and the sweeper), typed: active as a bool."""
    return {
        CREATED_AT: record.created_at,
        ACTIVE: record.active,
        SWEEP_POINTERS: dict(bins.get(SWEEP_POINTERS) or {}),
        SIDELINE_SWEEP: dict(bins.get(SIDELINE_SWEEP) or {}),
        SWEPT_COUNTER: bins.get(SWEPT_COUNTER, 0),
        SIDELINE_SWEPT: bins.get(SIDELINE_SWEPT, 0),
        SWEEP_EPOCH: bins.get(SWEEP_EPOCH, 0),
    }


def queue_entry(record: QueueRecord, spec: QueueSpec | None, problem: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": record.name, "active": record.active, "createdAt": record.created_at}
    if spec is not None:
        entry["spec"] = spec.to_manifest()["spec"]
    else:
        entry["error"] = problem
    return entry


def queue_list_table(entries: list[dict[str, Any]]) -> Table:
    table = Table(title="queues", title_justify="left")
    for column in ("name", "active", "handlerType", "shards", "concurrency", "maxDeliveries", "batching",
                   "created"):
        table.add_column(column, justify="right" if column in ("shards", "concurrency", "maxDeliveries")
                         else "left")
    for e in entries:
        spec = e.get("spec")
        if spec is None:
            table.add_row(_cell(e["name"]), _cell("yes" if e["active"] else "no"),
                          Text(f"invalid stored config: {e.get('error')}", style="red"), "", "", "", "",
                          _cell(iso_ms(e["createdAt"])))
            continue
        batching = spec.get("batching")
        table.add_row(
            _cell(e["name"]), _cell("yes" if e["active"] else "no"), _cell(spec["handlerType"]),
            _cell(spec["shards"]), _cell(spec["concurrency"]), _cell(spec["maxDeliveries"]),
            _cell(f"{batching['maxBatchSize']} / {batching['maxWaitSeconds']}s" if batching else "off"),
            _cell(iso_ms(e["createdAt"])),
        )
    return table


def describe_table(doc: Mapping[str, Any]) -> Table:
    table = Table(title=f"queue {doc['name']}", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key, value in _flatten("", doc["spec"]):
        table.add_row(_cell(key), _cell(value))
    table.add_row(_cell("effectiveHandlerTimeoutSeconds"), _cell(f"{doc['effectiveHandlerTimeoutSeconds']:g}"))
    table.add_section()
    runtime = doc["runtime"]
    for key, value in runtime.items():
        if key == CREATED_AT:
            value = iso_ms(value)
        elif isinstance(value, Mapping):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        table.add_row(_cell(key), _cell(value))
    table.add_section()
    for key, value in doc["stats"].items():
        if key not in ("name", "shards"):
            table.add_row(_cell(key), _cell(value))
    return table


def simple_table(columns: list[str], rows: list[Mapping[str, Any]]) -> Table:
    """A table of `rows` (mappings) by `columns`, each cell as `_cell` shows it."""
    table = Table(box=None, header_style="bold")
    for name in columns:
        table.add_column(name)
    for row in rows:
        table.add_row(*(_cell(row.get(name)) for name in columns))
    return table


def age_text(seconds: float | None) -> str:
    """An age for a person: 0.4s, 42.0s, 3m05s, 2h07m, 3d04h; "-" for None (nothing waits)."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def stats_table(stats: list[QueueStats], title: str = "queue stats") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    columns = ("shards", "published", "consumed", "depth", "in_flight", "delayed", "sidelined", "dead")
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    table.add_column("oldest age", justify="right")  # of the oldest message waiting in main
    for s in stats:
        table.add_row(_cell(s.name), *(_cell(getattr(s, c)) for c in columns), Text(age_text(s.oldest_age_seconds)))
    return table


# ---- messages --------------------------------------------------------------------------------------
def print_message(record: Mapping[str, Any], env: Envelope) -> None:
    """A delivered message: one header line, then the payload indented (stream-friendly, unlike a table
    that can only be printed once complete)."""
    header = Text()
    header.append(record["ref"], style="bold cyan")
    header.append(f"  id={record['id']}  attempts={record['attempts']}")
    if record["key"] is not None:
        header.append(f"  key={record['key']}")
    if record["headers"]:
        header.append("  headers={" + ", ".join(f"{k}={v}" for k, v in record["headers"].items()) + "}")
    header.append(f"  {record['codec']}, {record['size']} B", style="dim")
    out.print(header)
    emit_line(payload_text(env))


def sideline_table(entries: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("ref", "id", "reason", "attempts", "loadedAt", "size", "last history"):
        table.add_column(column, justify="right" if column in ("attempts", "size") else "left")
    for e in entries:
        table.add_row(_cell(e["ref"]), _cell(e["id"]), _cell(e["reason"]), _cell(e["attempts"]),
                      _cell(iso_ms(e["loadedAt"])), _cell(e["size"]), _cell(history_text(e["lastHistory"])))
    return table


# ---- demo ------------------------------------------------------------------------------------------
def demo_tables(doc: Mapping[str, Any]) -> list[Table]:
    summary = Table(title="demo summary", title_justify="left", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("count", justify="right")
    summary.add_row("published", _cell(doc["published"]))
    summary.add_row("delivered", _cell(doc["delivered"]))
    summary.add_row("acked", _cell(doc["acked"]))
    summary.add_row("sidelined", _cell(doc["sidelined"]))
    for reason, n in sorted(doc["sidelinedByReason"].items()):
        summary.add_row(Text(f"  reason {reason}"), _cell(n))
    summary.add_row("dead-lettered", _cell(doc["deadLettered"]))
    summary.add_row("drained", _cell("yes" if doc["drained"] else "no (timed out)"))
    summary.add_row("elapsed", _cell(f"{doc['elapsedSeconds']:.2f} s"))

    first = Table(title=f"first {len(doc['firstSidelined'])} sidelined messages", title_justify="left")
    for column in ("n", "ref", "id", "reason", "attempts"):
        first.add_column(column, justify="right" if column in ("n", "attempts") else "left")
    for m in doc["firstSidelined"]:
        first.add_row(_cell(m["n"]), _cell(m["ref"]), _cell(m["id"]), _cell(m["reason"]), _cell(m["attempts"]))

    stats = QueueStats(**doc["stats"])
    tables = [summary, first] if doc["firstSidelined"] else [summary]
    return [*tables, stats_table([stats], title="final queue stats")]
