"""Structured logs for the long-running processes (`ignis sweeper`, `ignis operator`): plain text for
people, or one JSON object per line for a log pipeline (`--log-format json`). Fields passed as
`extra={...}` become JSON keys.

kopf's per-object loggers attach `k8s_ref` (the object), `settings` and `k8s_skip` to every record
(kopf/_core/actions/loggers.py, ObjectLogger): the object becomes `"object": "namespace/name"` (a
`[namespace/name]` prefix in text), the other two are kopf internals and are left out.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came from `extra=` and is emitted.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_KOPF_INTERNAL = {"settings", "k8s_skip", "k8s_ref"}

FORMATS = ("text", "json")


def one_line(text: object) -> str:
    """`text` as one log line: newlines and runs of blanks collapsed."""
    return " ".join(str(text).split())


class Reachability:
    """What a process logs about one dependency (the store, the Kubernetes API): one WARNING line when it
    stops answering, one INFO line when it answers again, and nothing for every failure in between (those
    go to DEBUG), however many loops or objects run into the same outage. Thread-safe."""

    def __init__(self, what: str, logger: logging.Logger, *, clock: Any = time.monotonic,
                 settle_seconds: float = 0.0, within: Reachability | None = None) -> None:
        self.what = what
        self._log = logger
        self._clock = clock
        # A narrower dependency (one kind of call) of `within`: while `within` is down, a failure here is that
        # outage's, already said, so it goes to DEBUG and opens no outage of its own.
        self._within = within
        # It is back once it has answered for this long with no failure in between: a dependency that answers
        # and fails by turns (a cluster migrating partitions) is one outage, not a WARNING and an INFO each time.
        self._settle = settle_seconds
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._answering_since: float | None = None
        self._failures = 0  # failed calls since it stopped answering

    @property
    def down(self) -> bool:
        return self._down_since is not None

    @property
    def failures(self) -> int:
        return self._failures

    def failed(self, detail: object) -> bool:
        """A call failed because `what` did not answer. Returns True for the call that logged the WARNING."""
        if self._within is not None and self._within.down and self._down_since is None:
            self._log.debug("%s unreachable (%s is): %s", self.what, self._within.what, one_line(detail))
            return False
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = self._clock()
                self._failures = 0
            self._failures += 1
            self._answering_since = None
        if first:
            self._log.warning("%s unreachable: %s", self.what, one_line(detail),
                              extra={"event": "unreachable", "dependency": self.what})
        else:
            self._log.debug("%s still unreachable: %s", self.what, one_line(detail))
        return first

    def answered(self) -> bool:
        """A call got an answer. Returns True for the call that logged the INFO line (the first after an outage)."""
        if self._down_since is None:  # the common case, without the lock
            return False
        with self._lock:
            if self._down_since is None:
                return False
            now = self._clock()
            if self._settle > 0:
                if self._answering_since is None:
                    self._answering_since = now
                if now - self._answering_since < self._settle:
                    return False
            since, self._down_since, failures = self._down_since, None, self._failures
        seconds = self._clock() - since
        self._log.info("%s reachable again after %.0fs (%d failed call(s) meanwhile)", self.what, seconds, failures,
                       extra={"event": "reachable", "dependency": self.what, "down_seconds": round(seconds, 1),
                              "failures": failures})
        return True


def _object_of(record: logging.LogRecord) -> str | None:
    ref: Any = getattr(record, "k8s_ref", None)
    if not isinstance(ref, dict) or not ref.get("name"):
        return None
    return f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else str(ref["name"])


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        obj = _object_of(record)
        if obj:
            doc["object"] = obj
        doc.update({k: v for k, v in vars(record).items() if k not in _STANDARD and k not in _KOPF_INTERNAL})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        obj = _object_of(record)
        if obj:
            head, sep, message = text.partition(": ")
            text = f"{head}{sep}[{obj}] {message}"
        return text


def configure(fmt: str = "text", level: str = "INFO") -> None:
    """Route the root logger to stderr in the chosen format (replaces earlier handlers)."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: must be text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
