"""End-to-end tests of the `ignis` console script: each call runs the installed entry point in a
subprocess against a fresh lmdb store, exactly as a user or a script would."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

IGNIS = Path(sys.executable).parent / "ignis"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "queues"

UNICODE = "héllo wörld ✓ 🚀 [bold]not markup[/bold] \u2028 after a line separator"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, f"exit {self.code}: {self.err}"
        return json.loads(self.out)  # fails if stdout holds anything besides the one document

    def error_line(self) -> str:
        """The single stderr line of a failed command (and nothing on stdout)."""
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
        assert lines[0].startswith("error: "), lines[0]
        assert self.out == "", f"stdout should be empty on error, got {self.out!r}"
        return lines[0]


Run = Callable[..., Result]


@pytest.fixture
def ignis(tmp_path: Path) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IGNIS_")}
    env.update(IGNIS_STORE=f"lmdb://{tmp_path}/store?durability=fast", PYTHONUTF8="1", COLUMNS="200")

    def run(*args: str, stdin: str | bytes | None = None, **extra_env: str) -> Result:
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        proc = subprocess.run([str(IGNIS), *args], input=data if data is not None else b"",
                              capture_output=True, env={**env, **extra_env}, timeout=60)
        return Result(proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8"))

    return run


def ok(result: Result) -> Result:
    assert result.code == 0, f"exit {result.code}: {result.err}"
    return result


def manifest(name: str, **spec: Any) -> str:
    fields = {"handlerType": f"{name}.v1", "shards": 2, **spec}
    body = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in fields.items())
    return f"apiVersion: ignismq.io/v1alpha1\nkind: IgnisQueue\nmetadata:\n  name: {name}\nspec:\n{body}\n"


@pytest.fixture
def queue(ignis: Run, tmp_path: Path) -> str:
    """A declared 2-shard queue `rt` with maxDeliveries 5."""
    path = tmp_path / "rt.yaml"
    path.write_text(manifest("rt", maxDeliveries=5))
    assert ok(ignis("queue", "apply", "-f", str(path))).out == "queue/rt created\n"
    return "rt"


# ---- queue apply / list / describe / stats -----------------------------------------------------------
def test_apply_directory_then_list_describe_and_stats(ignis: Run) -> None:
    first = ok(ignis("queue", "apply", "-f", str(EXAMPLES)))
    assert first.out.splitlines() == ["queue/audit created", "queue/events created", "queue/orders created"]
    again = ok(ignis("queue", "apply", "-f", str(EXAMPLES), "-o", "json"))
    assert [(r["name"], r["action"]) for r in again.json()] == [
        ("audit", "updated"), ("events", "updated"), ("orders", "updated")]

    listed = {q["name"]: q for q in ignis("queue", "list", "-o", "json").json()}
    assert sorted(listed) == ["audit", "events", "orders"]
    assert all(q["active"] is True and q["createdAt"] > 0 for q in listed.values())
    assert listed["orders"]["spec"]["shards"] == 16
    assert listed["orders"]["spec"]["maxDeliveries"] == 5
    assert listed["events"]["spec"]["batching"] == {"maxBatchSize": 500, "maxWaitSeconds": 2}
    assert listed["audit"]["spec"]["shovel"]["enabled"] is False

    orders = ignis("queue", "describe", "orders", "-o", "json").json()
    assert orders["name"] == "orders" and orders["active"] is True
    assert orders["spec"]["handlerType"] == "orders.v1"
    assert orders["spec"]["sweepDurationSeconds"] == 600
    assert orders["spec"]["shovel"] == {"enabled": True, "concurrency": 2, "intervalSeconds": 300}
    assert orders["effectiveHandlerTimeoutSeconds"] == 120
    assert orders["runtime"]["createdAt"] == listed["orders"]["createdAt"]  # kept across re-apply
    assert orders["runtime"]["sweepPointers"] == {}
    assert orders["stats"] == {"name": "orders", "shards": 16, "published": 0, "consumed": 0, "depth": 0,
                               "sidelined": 0, "dead": 0, "in_flight": 0, "delayed": 0,
                               "oldest_age_seconds": None}

    stats = ignis("stats", "-o", "json").json()
    assert [(s["name"], s["shards"]) for s in stats] == [("audit", 8), ("events", 32), ("orders", 16)]

    ok(ignis("queue", "deactivate", "audit"))
    assert [q["name"] for q in ignis("queue", "list", "-o", "json").json()] == ["events", "orders"]
    assert [q["name"] for q in ignis("queue", "list", "--inactive", "-o", "json").json()] == ["audit"]
    assert len(ignis("queue", "list", "--all", "-o", "json").json()) == 3


def test_invalid_manifest_is_one_line_exit_2_and_nothing_applied(ignis: Run, tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    (folder / "a-good.yaml").write_text(manifest("good"))
    (folder / "b-bad.yaml").write_text(manifest("bad", shards=0, concurrency=500))

    result = ignis("queue", "apply", "-f", str(folder))
    assert result.code == 2
    line = result.error_line()
    assert "b-bad.yaml" in line and "shards=0" in line and "concurrency=500" in line
    assert "good" not in line.replace("a-good", "")  # only the bad manifest is blamed

    # Across several -f paths too: the valid file is not applied when another path is invalid.
    split = ignis("queue", "apply", "-f", str(folder / "a-good.yaml"), "-f", str(folder / "b-bad.yaml"))
    assert split.code == 2 and "shards=0" in split.error_line()

    assert ignis("queue", "list", "--all", "-o", "json").json() == []


# ---- publish / consume ---------------------------------------------------------------------------------
def test_publish_every_input_form_and_consume_round_trips(ignis: Run, queue: str, tmp_path: Path) -> None:
    binary = b"\x00\xff\x80raw\n"
    (tmp_path / "blob.bin").write_bytes(binary)

    one = ok(ignis("publish", queue, UNICODE)).out.strip()
    assert one.startswith(f"{queue}/") and "#" in one
    ok(ignis("publish", queue, "--json", '{"a": [1, 2.5, null, true], "ü": "ß ✓"}',
             "--key", "k1", "-H", "a=b", "-H", "c=d=e", "--id", "order-42"))
    ok(ignis("publish", queue, "-", stdin="line one\nlíne two ✓\n"))
    lines = ok(ignis("publish", queue, "-", "--lines", "-o", "json", stdin=f"日本語\n\n{{\"x\": 1}}\r\n{UNICODE}"))
    assert lines.json()["published"] == 3 and len(lines.json()["messages"]) == 3
    ok(ignis("publish", queue, "-", "--lines", "--json", stdin='{"n": 1}\n[2]\n"three ✓"\n'))
    ok(ignis("publish", queue, "--file", str(tmp_path / "blob.bin")))

    got = ignis("consume", queue, "-o", "json").json()
    payloads = sorted(json.dumps([m["codec"], m["payload"]], ensure_ascii=False) for m in got)
    expected = [
        ["str", UNICODE],
        ["json", {"a": [1, 2.5, None, True], "ü": "ß ✓"}],
        ["str", "line one\nlíne two ✓\n"],  # stdin without --lines is kept byte for byte
        ["str", "日本語"], ["str", '{"x": 1}'], ["str", UNICODE],  # --lines: no blank line, no \r, U+2028 kept
        # A JSON document that is a string is published as that str (the core picks the codec by type).
        ["json", {"n": 1}], ["json", [2]], ["str", "three ✓"],
        ["bytes", base64.b64encode(binary).decode()],
    ]
    assert payloads == sorted(json.dumps(e, ensure_ascii=False) for e in expected)
    keyed = next(m for m in got if m["id"] == "order-42")
    assert keyed["key"] == "k1" and keyed["headers"] == {"a": "b", "c": "d=e"} and keyed["attempts"] == 1

    assert ignis("consume", queue, "-o", "json").json() == []  # everything was acked
    stats = ignis("stats", queue, "-o", "json").json()
    assert (stats["published"], stats["consumed"], stats["depth"], stats["sidelined"]) == (10, 10, 0, 0)
    # Acked means deleted: a claimed but unsettled message would still be a record that delete removes.
    assert ignis("queue", "delete", queue, "--yes", "-o", "json").json()["removedMessages"] == 0


def test_consume_max_and_nack_then_sideline_list_shows_reason(ignis: Run, queue: str) -> None:
    for i in range(3):
        ok(ignis("publish", queue, f"m{i}"))
    first = ignis("consume", queue, "--max", "1", "--reason", "bad-input", "-o", "json").json()
    assert len(first) == 1
    rest = ok(ignis("consume", queue, "--max", "1", "--nack"))
    assert rest.out.count(f"{queue}/") == 1 and "1 sidelined" in rest.err

    sidelined = {m["id"]: m for m in ignis("sideline", "list", queue, "-o", "json").json()}
    assert len(sidelined) == 2
    assert sidelined[first[0]["id"]]["reason"] == "bad-input"
    assert sidelined[first[0]["id"]]["payload"] == first[0]["payload"]
    assert sidelined[first[0]["id"]]["lastHistory"]["reason"] == "bad-input"
    assert sorted(m["reason"] for m in sidelined.values()) == ["bad-input", "nacked"]
    assert all(m["attempts"] == 1 and m["ref"].startswith(f"{queue}_SIDELINE/") for m in sidelined.values())

    table = ok(ignis("sideline", "list", queue)).out
    assert "bad-input" in table and first[0]["id"] in table
    assert ignis("sideline", "list", queue, "--dead", "-o", "json").json() == []
    assert len(ignis("sideline", "list", queue, "--limit", "1", "-o", "json").json()) == 1
    stats = ignis("stats", queue, "-o", "json").json()
    assert (stats["depth"], stats["sidelined"], stats["dead"]) == (1, 2, 0)


def test_stats_show_delayed_and_the_oldest_waiting_age(ignis: Run, queue: str) -> None:
    ok(ignis("publish", queue, "old"))
    time.sleep(1.2)
    ok(ignis("publish", queue, "new"))
    stats = ignis("stats", queue, "-o", "json").json()
    assert stats["delayed"] == 0 and 1.2 <= stats["oldest_age_seconds"] < 60
    table = ok(ignis("stats", queue)).out
    header = next(line for line in table.splitlines() if "queue" in line and "depth" in line)
    assert "delayed" in header and "oldest age" in header
    row = next(line for line in table.splitlines() if line.strip("│┃ ").startswith(queue))
    assert re.search(r"│\s+\d+\.\ds\s+│$", row), row  # e.g. "1.4s" in the last column
    assert len(ignis("consume", queue, "-o", "json").json()) == 2  # delivered and acked: nothing waits
    assert ignis("stats", queue, "-o", "json").json()["oldest_age_seconds"] is None
    everything = ignis("stats", "-o", "json").json()
    assert [(s["name"], s["oldest_age_seconds"]) for s in everything] == [(queue, None)]
    row = next(line for line in ok(ignis("stats")).out.splitlines() if line.strip("│┃ ").startswith(queue))
    assert re.search(r"│\s+-\s+│$", row), row


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (0.04, "0.0s"), (42.25, "42.2s"), (59.99, "60.0s"),
                                               (60, "1m00s"), (185.9, "3m05s"), (7620, "2h07m"),
                                               (3 * 86400 + 4 * 3600 + 59, "3d04h")])
def test_age_text(seconds: float | None, text: str) -> None:
    from ignis.cli.render import age_text

    assert age_text(seconds) == text


# ---- errors --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("publish", "nope", "x"),
    ("consume", "nope"),
    ("queue", "describe", "nope"),
    ("sideline", "list", "nope"),
    ("queue", "delete", "nope", "--yes"),
])
def test_unknown_queue_exits_3_with_one_line(ignis: Run, args: tuple[str, ...]) -> None:
    result = ignis(*args)
    assert result.code == 3
    assert "queue 'nope' not found" in result.error_line()


def test_unreachable_store_exits_4(ignis: Run) -> None:
    result = ignis("--store", "lmdb:///proc/nope/store", "queue", "list")
    assert result.code == 4
    assert "/proc/nope/store" in result.error_line()
    from_env = ignis("stats", IGNIS_STORE="lmdb:///proc/nope/store")
    assert from_env.code == 4 and "cannot open" in from_env.error_line()


def test_payload_too_large_is_refused_and_nothing_is_written(ignis: Run, queue: str) -> None:
    big = ignis("publish", queue, "12345678901", IGNIS_MAX_PAYLOAD_BYTES="10")
    assert big.code == 2
    assert "11 bytes exceeds the maximum of 10 bytes" in big.error_line()
    # --lines validates every line first: the small line before the big one is not published either.
    many = ignis("publish", queue, "-", "--lines", stdin="small\n12345678901\n", IGNIS_MAX_PAYLOAD_BYTES="10")
    assert many.code == 2 and "stdin line 2" in many.error_line()
    assert ignis("stats", queue, "-o", "json").json()["published"] == 0


@pytest.mark.parametrize(("args", "needle"), [
    (("consume", "rt", "--max", "0"), "--max"),
    (("queue", "list", "-o", "xml"), "xml"),
    (("publish", "rt", "--json", "{bad"), "not valid JSON"),
    (("publish", "rt", "-H", "novalue", "x"), "KEY=VALUE"),
    (("queue", "apply", "-f", "/no/such/path"), "/no/such/path"),
])
def test_bad_usage_and_input_exit_2_with_one_line(ignis: Run, queue: str, args: tuple[str, ...],
                                                  needle: str) -> None:
    result = ignis(*args)
    assert result.code == 2
    assert needle in result.error_line()


def test_a_full_bounded_queue_exits_5_with_one_line_and_writes_nothing(ignis: Run, tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(manifest("small", maxLength=3), encoding="utf-8")
    ok(ignis("queue", "apply", "-f", str(path)))
    for payload in ("a", "b", "c"):
        ok(ignis("publish", "small", payload))
    full = ignis("publish", "small", "d")
    assert full.code == 5
    assert "queue 'small' is full (maxLength 3" in full.error_line()
    lines = ignis("publish", "small", "-", "--lines", stdin="e\nf\n")
    assert lines.code == 5 and "0 of 2 lines of stdin were published, line 1 was the first refused" in \
        lines.error_line()
    stats = ignis("stats", "small", "-o", "json").json()
    assert stats["published"] == 3 and stats["depth"] == 3 and stats["full_percent"] == 100


def test_help_documents_exit_codes(ignis: Run) -> None:
    text = " ".join(ok(ignis("--help")).out.split())
    assert "Exit codes" in text and "4 store error" in text and "5 queue full" in text
    assert "3 not found (queue, deactivated queue, topic, message)" in text


# ---- delete --------------------------------------------------------------------------------------------
def test_queue_delete_asks_then_removes_messages_and_record(ignis: Run, queue: str) -> None:
    ok(ignis("publish", queue, "a"))
    ok(ignis("publish", queue, "b"))
    ok(ignis("consume", queue, "--max", "1", "--nack"))  # one in main, one in the sideline

    declined = ignis("queue", "delete", queue, stdin="n\n")
    assert declined.code == 1 and "not deleted" in declined.err.strip().splitlines()[-1]
    assert ignis("stats", queue, "-o", "json").json()["depth"] == 1

    deleted = ignis("queue", "delete", queue, "--yes", "-o", "json").json()
    assert deleted == {"name": queue, "deleted": True, "removedMessages": 2}
    assert ignis("queue", "list", "--all", "-o", "json").json() == []
    assert ignis("queue", "describe", queue).code == 3


# ---- demo ----------------------------------------------------------------------------------------------
def test_demo_json_reports_acks_and_sidelined_and_is_repeatable(ignis: Run) -> None:
    for _ in range(2):  # the second run starts from a purged queue: same counts, not doubled
        report = ignis("demo", "--messages", "60", "-o", "json").json()
        assert report["published"] == 60 and report["drained"] is True
        assert report["acked"] > 0 and report["sidelined"] > 0
        assert report["acked"] + report["sidelined"] == 60
        # n % 10 == 7 is rejected (6 of 60), n % 25 == 13 raises (13 and 38).
        assert report["sidelinedByReason"] == {"rejected": 6, "exception": 2}
        assert [m["n"] for m in report["firstSidelined"]] == [7, 13, 17, 27, 37]
        assert report["stats"]["published"] == 60 and report["stats"]["depth"] == 0
        assert report["stats"]["sidelined"] == 8


def test_publish_with_a_delay_waits_and_a_bad_delay_is_one_line(ignis: Run, queue: str) -> None:
    ref = ok(ignis("publish", queue, "later", "--delay", "1.5s")).out.strip()
    assert ref.startswith(f"{queue}_DELAYED/0/")
    lines = ok(ignis("publish", queue, "-", "--lines", "-d", "1m", "-o", "json", stdin="a\nb\n")).json()
    assert lines["published"] == 2
    assert ignis("consume", queue, "-o", "json").json() == []  # not due
    got = ignis("consume", queue, "--wait", "3", "--max", "1", "-o", "json").json()
    assert [m["payload"] for m in got] == ["later"]
    for bad, words in (("soon", "duration 'soon': use a number of seconds or units"),
                       ("-5", "delay -5.0: must be a number of seconds >= 0"),
                       ("400d", "longer than queue")):
        result = ignis("publish", queue, "x", "--delay", bad)
        assert result.code == 2 and words in result.error_line(), result.err
