"""What of kopf's own logging a person reads. The operator writes one line per change itself (created,
updated, drift repaired, deleted, a problem); kopf's bookkeeping is DEBUG:

* kopf's INFO lines ("Handler 'observe' succeeded.", "Deletion is processed: 1 succeeded; 0 failed.",
  "Startup activity has been initiated.") become DEBUG, except the stop line ("Signal SIGTERM is
  received. Operator is stopping.").
* "Handler ... failed temporarily/permanently: ..." become DEBUG: they follow an error the operator raised
  on purpose and has already logged its own line about (a store outage, an invalid spec).
* Every retried API request kopf logs at ERROR ("Request attempt #1/9 failed; will retry: GET ... ->
  ClientConnectorError(...)"), one per attempt and per object, becomes the API server's `Reachability`:
  one WARNING when it stops answering, one INFO when it answers again (the operator's probe notices that),
  the rest DEBUG. So are the tracebacks of event processing cut short by the same outage.
* Requests refused because their namespace is being deleted become DEBUG.

The `kopf` logger stops propagating and gets one handler, the policy, which passes what it lets through
to the root logger's handlers: so every kopf logger is covered, those kopf creates while it runs
included. Installed once per process by `install` (build_registry calls it), removed by
`KopfLogPolicy.remove`.
"""

from __future__ import annotations

import logging
import re

from ignis.logs import Reachability, one_line

# aiohttp's and kopf's names for "the API server did not answer (or cannot serve now)"
_OUTAGE = re.compile(r"\b(ClientConnectorError|ClientOSError|ServerDisconnectedError|ClientConnectionError|"
                     r"ServerTimeoutError|ConnectionTimeoutError|SocketTimeoutError|TimeoutError|"
                     r"ConnectionRefusedError|ConnectionResetError|ClientPayloadError|APIServerError|"
                     r"APITooManyRequestsError|APISessionClosed)\b")
_REQUEST = re.compile(r"^Request attempt #\S+ failed; (?:will retry|escalating|TCP closed|SSL closed)[^:]*: "
                      r"(?P<what>\S+ \S+)(?: -> (?P<error>.*))?$", re.S)
_TERMINATING = "because it is being terminated"
_HANDLER_OUTCOME = re.compile(r"^Handler '[^']+' failed (temporarily|permanently)")
_KEPT_INFO_LOGGERS = {"kopf._core.reactor.running"}  # "Signal SIGTERM is received. Operator is stopping."


class KopfLogPolicy(logging.Handler):
    """The one handler of the `kopf` logger, which no longer propagates: every record of kopf's loggers
    (those kopf creates as it runs included, e.g. `kopf.activities.startup`) passes `allow`, and what it
    lets through goes on to the root logger's handlers as before."""

    def __init__(self, api: Reachability) -> None:
        super().__init__()
        self.api = api

    def emit(self, record: logging.LogRecord) -> None:
        if self.allow(record):
            logging.getLogger().handle(record)

    def allow(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            return record.name in _KEPT_INFO_LOGGERS or self._demote(record)
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        request = _REQUEST.match(message)
        if request is not None:
            if _TERMINATING in message:
                return self._demote(record)
            error = request.group("error") or ""
            if _OUTAGE.search(error) or "TCP closed" in message or "SSL closed" in message:
                self.api.failed(f"{request.group('what')}: {one_line(error)[:300]}")
                return self._demote(record)
            return True
        if _HANDLER_OUTCOME.match(message):
            return self._demote(record)
        if record.exc_info and record.exc_info[1] is not None and _outage_exception(record.exc_info[1]):
            self.api.failed(f"{type(record.exc_info[1]).__name__}: {one_line(record.exc_info[1])[:300]}")
            return self._demote(record)
        return True

    @staticmethod
    def _demote(record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(logging.DEBUG)

    def remove(self) -> None:
        global _POLICY
        kopf_logger = logging.getLogger("kopf")
        kopf_logger.removeHandler(self)
        kopf_logger.propagate = True
        if _POLICY is self:
            _POLICY = None


def _outage_exception(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # the cause chain: kopf wraps aiohttp's errors
        seen.add(id(current))
        if _OUTAGE.search(type(current).__name__):
            return True
        current = current.__cause__ or current.__context__
    return False


_POLICY: KopfLogPolicy | None = None


def install(api: Reachability) -> KopfLogPolicy:
    """Route kopf's records through the policy. Once per process: installing again points the one policy
    at `api` (the last operator built in a process owns the outage lines; tests build several)."""
    global _POLICY
    policy = _POLICY or KopfLogPolicy(api)
    policy.api = api
    kopf_logger = logging.getLogger("kopf")
    if policy not in kopf_logger.handlers:
        kopf_logger.addHandler(policy)
    kopf_logger.propagate = False
    _POLICY = policy
    return policy
