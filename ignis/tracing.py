"""OpenTelemetry tracing (the optional extra `ignis[otel]`), after the semantic conventions for messaging.

Only `opentelemetry-api` is used. Without it installed, or with no TracerProvider configured (the API's
default proxy, or a no-op provider), every hook here returns at once: no span, no header, no context
object; the cost is one provider lookup per publish or handler call (bench/bench_tracing.py).

Spans
- `send {queue}` (PRODUCER) around `Queue.publish`, `publish_many` and `publish_each`. One span per call:
  a batch call is one span with `messaging.batch.message_count`, and every message of it carries that
  span's context. The context goes into the message headers through the global propagator (W3C
  `traceparent` and `tracestate` by default). The caller's headers win: a message whose headers already
  hold a `traceparent` (set by the caller, or kept by a pipeline replay) keeps them as they are, and gets
  no other trace header either (a `tracestate` or baggage of another trace would not match it).
- `process {queue}` (CONSUMER) around a push consumer's handler call and around `with message.process():`.
  * One message: the span's PARENT is the context the message carries (its send span), and the span also
    LINKS to it. The parent puts producer and consumer in one trace, which is what a trace viewer shows
    best; the link is what the conventions require of every process span, so tools that follow links
    see single and batch processing alike. A message without a trace context: the span's parent is the
    current context (for `message.process()`, the caller's span, if any).
  * A batch (a batch handler): the span's parent is the current context (none in a push consumer: a new
    trace), and it LINKS to each distinct context its messages carry, each link with the message id. The
    messages come from many traces, and a span has one parent: links are the only faithful shape, as the
    conventions recommend for batch processing.
  * The handler runs with the process span current, so spans it starts are its children.
  * Failure: a handler that raises, times out, is never run (saturated) or returns False (rejected) ends
    its span with status ERROR and `error.type` (the exception's class name, or `rejected`).
- Attributes: messaging.system = ignismq, messaging.destination.name, messaging.operation.type (send,
  process), messaging.operation.name (publish, publish_many, publish_each, process), messaging.message.id
  (single messages), messaging.destination.partition.id (the shard, when every message of the call is in
  one; none for a delayed message: its shard is chosen when it falls due), messaging.batch.message_count
  (batch calls only, as the conventions say), error.type on failure. No `receive` or `settle` spans: a
  fire or an ack is one store call, traced if the store's own client is instrumented.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ignis import names
from ignis.version import package_version

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the extra is not installed: tracing is off
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from ignis.envelope import Envelope
    from ignis.storage.base import MessageRef, SlotRef

F = TypeVar("F", bound=Callable[..., Any])


# What the spans read of a queue and of a message: an `ignis.queue.Queue` and an `ignis.queue.Message` (described
# here rather than imported, as ignis.queue traces through this module).
class TracedQueue(Protocol):
    @property
    def name(self) -> str: ...


class TracedMessage(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def envelope(self) -> Envelope: ...

    @property
    def ref(self) -> SlotRef: ...

SYSTEM = "ignismq"
TRACEPARENT = "traceparent"
SCOPE = "ignis"

_provider: TracerProvider | None = None  # set_tracer_provider(): one of ignis's own instead of the global one
_cached: tuple[Any, Tracer] | None = None  # (provider, its tracer): get_tracer builds a new object each call
# The API's global provider, read directly: get_tracer_provider() looks os.environ up first, which costs ~2 us
# per call with no provider set (an exception raised and caught inside os.environ), as much as a lean publish.
# With OTEL_PYTHON_TRACER_PROVIDER set, only get_tracer_provider() loads that provider.
_GLOBAL_SLOT = _trace is not None and hasattr(_trace, "_TRACER_PROVIDER") and \
    "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
# Whether only the API's global provider may trace (read directly, no provider of ignis's own): a send is then
# untraced while `api._TRACER_PROVIDER is None`. traced_send's first check; Queue.publish makes it itself, inline, to
# call its wrapper only when it may trace (a call is a visible share of a lean publish).
GLOBAL_ONLY = _GLOBAL_SLOT
api = _trace
_ABSENT: Any = object()  # no payload(s) given by position
_sending: ContextVar[bool] = ContextVar("ignis_sending", default=False)  # a publish inside a traced publish


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace ignis with `provider` instead of the global one (None: the global one again)."""
    global _provider, GLOBAL_ONLY
    _provider = provider
    GLOBAL_ONLY = _GLOBAL_SLOT and provider is None


def tracer() -> Tracer | None:
    """The tracer to use, or None when no span would be recorded or propagated (tracing is off)."""
    if _trace is None:
        return None
    provider = _provider or (_trace._TRACER_PROVIDER if _GLOBAL_SLOT else _trace.get_tracer_provider())
    if provider is None:  # none set: the API's proxy, which records nothing
        return None
    global _cached
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    # The API's defaults record nothing; skipping them keeps an untraced process's hot paths as they were.
    if isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
        return None
    cached = _cached = (provider, provider.get_tracer(SCOPE, package_version()))
    return cached[1]


def _attributes(queue: TracedQueue, operation: str, name: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue.name,
            "messaging.operation.type": operation, "messaging.operation.name": name}


def _error(span: Span, error: BaseException | str) -> None:
    kind = error if isinstance(error, str) else type(error).__qualname__
    span.set_attribute("error.type", kind)
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, kind if isinstance(error, str) else str(error)))
    if not isinstance(error, str):
        span.record_exception(error)


def _with_context(carrier: dict[str, str], headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """`headers` plus the trace headers in `carrier`, unless the caller set a traceparent (kept as it is)."""
    if not carrier or (headers and TRACEPARENT in headers):
        return headers
    return {**carrier, **headers} if headers else carrier


def _shard(refs: Sequence[MessageRef]) -> int | None:
    """The one shard all `refs` are in, else None (a delayed message has no shard yet)."""
    if any(ref.magazine.endswith(names.DELAYED_SUFFIX) for ref in refs):
        return None
    shards = {ref.shard for ref in refs}
    return shards.pop() if len(shards) == 1 else None


# ---- send ------------------------------------------------------------------------------------------
def sending_now() -> bool:
    """Whether this call runs inside a traced send (whose span covers it)."""
    return _sending.get()


def traced_send(method: F) -> F:
    """Wrap Queue.publish, publish_many or publish_each in a `send {queue}` span (a no-op when tracing is
    off). Their payload(s) come first (by position or by name), every other argument by keyword."""
    operation = method.__name__
    single = operation == "publish"
    first = "payload" if single else "payloads"

    @functools.wraps(method)
    def send(queue: TracedQueue, payloads: Any = _ABSENT, /, **options: Any) -> Any:
        # The untraced case costs ~0.2 us a call (a lean publish: ~10-20 us): checked inline, and no `*args` or
        # empty `**options` passed on (forwarding those cost ~0.5 us more).
        if (GLOBAL_ONLY and _trace._TRACER_PROVIDER is None) or (tracer_ := tracer()) is None \
                or _sending.get():  # off, or a publish_each calling itself (one span per call)
            if payloads is _ABSENT:
                return method(queue, **options)
            return method(queue, payloads, **options) if options else method(queue, payloads)
        if payloads is _ABSENT:
            payloads = options.pop(first)
        if not single and type(payloads) is not list:
            payloads = list(payloads)  # counted below, and an iterator is read once
        attributes = _attributes(queue, "send", operation)
        if not single:
            attributes["messaging.batch.message_count"] = len(payloads)
        with tracer_.start_as_current_span(f"send {queue.name}", kind=_trace.SpanKind.PRODUCER,
                                           attributes=attributes, record_exception=False,
                                           set_status_on_exception=False) as span:
            carrier: dict[str, str] = {}
            _propagate.inject(carrier)  # (an unsampled span is injected too: its flags say so downstream)
            headers = options.get("headers")
            if operation == "publish_each":
                if headers is None:
                    headers = [None] * len(payloads)
                options["headers"] = [_with_context(carrier, h) for h in headers]
            else:
                options["headers"] = _with_context(carrier, headers)
            token = _sending.set(True)
            try:
                result = method(queue, payloads, **options)
            except BaseException as exc:
                _error(span, exc)
                raise
            finally:
                _sending.reset(token)
            refs = [result] if single else result
            if single:
                span.set_attribute("messaging.message.id", result.id)
            shard = _shard(refs)
            if shard is not None:
                span.set_attribute("messaging.destination.partition.id", str(shard))
            return result

    return send  # type: ignore[return-value]


# ---- process ---------------------------------------------------------------------------------------
def start_process(queue: TracedQueue, messages: Sequence[TracedMessage], batch: bool) -> Span | None:
    """Start a `process {queue}` span for a handler call (None when tracing is off); end it with
    end_process. `batch`: a batch handler's call (links only), else one message (parent and link)."""
    tracer_ = tracer()
    if tracer_ is None:
        return None
    attributes = _attributes(queue, "process", "process")
    links = []
    seen = set()
    parent = None
    for message in messages:
        headers = message.envelope.headers
        if not headers or TRACEPARENT not in headers:
            continue
        extracted = _propagate.extract(headers)
        created = _trace.get_current_span(extracted).get_span_context()
        if created.is_valid and (created.trace_id, created.span_id) not in seen:
            seen.add((created.trace_id, created.span_id))
            links.append(_trace.Link(created, {"messaging.message.id": message.id}))
            if not batch:
                parent = extracted
    if batch:
        attributes["messaging.batch.message_count"] = len(messages)
    else:
        attributes["messaging.message.id"] = messages[0].id
    shards = {m.ref.shard for m in messages}
    if len(shards) == 1:
        attributes["messaging.destination.partition.id"] = str(shards.pop())
    return tracer_.start_span(f"process {queue.name}", context=parent, kind=_trace.SpanKind.CONSUMER,
                              attributes=attributes, links=links)


def end_process(span: Span, error: BaseException | str | None = None) -> None:
    """End a process span; `error`: the exception the call failed with, or a failed outcome's name."""
    if error is not None:
        _error(span, error)
    span.end()


def end_outcome(span: Span, outcome: str) -> None:
    """Mark a process span failed by a handler's outcome (e.g. `rejected`) before it ends."""
    _error(span, outcome)


def within(span: Span, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`fn` run with `span` current (the handler runs on a pool thread, which does not inherit the context)."""
    ctx = _trace.set_span_in_context(span)

    def run(arg: Any) -> Any:
        token = _context.attach(ctx)
        try:
            return fn(arg)
        finally:
            _context.detach(token)

    return run


@contextmanager
def processing(queue: TracedQueue, messages: Sequence[TracedMessage], batch: bool = False) -> Iterator[Span | None]:
    """A process span around a `with` block, current inside it (for Message.process); None when off."""
    span = start_process(queue, messages, batch)
    if span is None:
        yield None
        return
    try:
        with _trace.use_span(span, record_exception=False, set_status_on_exception=False):
            yield span
    except BaseException as exc:
        end_process(span, exc)
        raise
    end_process(span)
