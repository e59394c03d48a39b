"""OpenTelemetry tracing (ignis.tracing): send and process spans, their attributes, the trace context in
the message headers, parent and links, failures; and nothing at all when no SDK is configured."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ignis import Consumer, Ignis, QueueSpec, tracing
from ignis.envelope import now_ms
from ignis.errors import PayloadTooLarge

FOREIGN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a traceparent from elsewhere


@pytest.fixture
def ignis(tmp_path: Path) -> Iterator[Ignis]:
    with Ignis(f"lmdb://{tmp_path}/store?durability=fast") as client:
        yield client


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)  # not the global one: that can be set once per process
    yield exporter
    tracing.set_tracer_provider(None)
    provider.shutdown()


def declare(ignis: Ignis, **fields: Any):
    fields.setdefault("name", "orders")
    fields.setdefault("handlerType", "orders")
    fields.setdefault("shards", 4)
    ignis.apply(QueueSpec.build(**fields))
    return ignis.queue(fields["name"])


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def drain(q) -> list:
    messages = q.fire_many(100)
    q.ack(messages)
    return messages


# ---- no SDK ----------------------------------------------------------------------------------------
def test_without_an_sdk_nothing_is_traced_and_no_header_added(ignis: Ignis) -> None:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a global TracerProvider was set in this process")
    assert tracing.tracer() is None
    q = declare(ignis)
    q.publish(b"plain")
    q.publish({"n": 1}, headers={"a": "b"})
    q.publish_many([b"x", b"y"])
    q.publish_each([b"z"], headers=[{"c": "d"}])
    headers = sorted((m.headers for m in drain(q)), key=str)
    assert headers == sorted([{}, {"a": "b"}, {}, {}, {"c": "d"}], key=str)
    q.publish(b"again")
    with q.fire().process() as m:  # process() works untraced too, and acks
        assert m.headers == {}
    assert q.stats().depth == 0 and q.fire() is None


# ---- send --------------------------------------------------------------------------------------------
def test_publish_is_a_producer_span_whose_context_the_message_carries(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    app = trace.get_tracer("app", tracer_provider=exporter_provider(exporter))
    with app.start_as_current_span("request") as request:
        ref = q.publish({"order": 1}, key="customer-7", headers={"mine": "kept"})
    (send,) = spans(exporter, "send orders")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {
        "messaging.system": "ignismq", "messaging.destination.name": "orders",
        "messaging.operation.type": "send", "messaging.operation.name": "publish",
        "messaging.message.id": ref.id, "messaging.destination.partition.id": str(ref.shard)}
    (message,) = drain(q)
    assert message.headers == {"mine": "kept", "traceparent": traceparent_of(send)}


def test_a_traceparent_set_by_the_caller_is_not_overwritten(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    token = context.attach(baggage.set_baggage("user", "7"))  # the propagator adds a baggage header
    try:
        q.publish(b"x", headers={"traceparent": FOREIGN})
        q.publish(b"y")  # lean path (bytes, no options): gets headers once traced
    finally:
        context.detach(token)
    assert len(spans(exporter, "send orders")) == 2
    foreign, own = sorted(drain(q), key=lambda m: m.data)
    assert foreign.headers == {"traceparent": FOREIGN}  # no header of ignis's trace beside the caller's
    assert own.headers == {"traceparent": traceparent_of(spans(exporter, "send orders")[1]), "baggage": "user=7"}


def test_publish_many_is_one_span_and_every_message_carries_it(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    q.publish_many((n for n in range(5)), headers={"batch": "1"})  # a generator: counted, read once
    (send,) = spans(exporter, "send orders")
    assert send.attributes["messaging.batch.message_count"] == 5
    assert send.attributes["messaging.operation.name"] == "publish_many"
    assert "messaging.message.id" not in send.attributes
    assert "messaging.destination.partition.id" not in send.attributes  # 5 messages over 4 shards
    messages = drain(q)
    assert sorted(m.payload for m in messages) == [0, 1, 2, 3, 4]
    assert all(m.headers == {"batch": "1", "traceparent": traceparent_of(send)} for m in messages)


def test_publish_each_keeps_a_replayed_traceparent(ignis: Ignis, exporter) -> None:
    """A pipeline replay publishes exported headers with publish_each (by keyword, as the writer does):
    the original trace context stays; messages without one get the call's span."""
    q = declare(ignis)
    q.publish_each(payloads=[b"a", b"b", b"c"], ids=["a", "b", "c"],
                   headers=[{"traceparent": FOREIGN}, None, {"x": "y"}])
    (send,) = spans(exporter, "send orders")
    assert send.attributes["messaging.batch.message_count"] == 3
    assert send.attributes["messaging.operation.name"] == "publish_each"
    by_id = {m.id: m.headers for m in drain(q)}
    mine = traceparent_of(send)
    assert by_id == {"a": {"traceparent": FOREIGN}, "b": {"traceparent": mine}, "c": {"x": "y", "traceparent": mine}}


def test_publish_each_with_delayed_rows_is_one_span(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    # publish_each publishes the part due now through itself: still one span
    q.publish_each([b"now", b"later"], due=[None, now_ms() + 3_600_000])
    (send,) = spans(exporter, "send orders")
    assert send.attributes["messaging.batch.message_count"] == 2
    (now,) = drain(q)
    assert now.headers == {"traceparent": traceparent_of(send)}


def test_a_failed_publish_sets_error_type(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    with pytest.raises(PayloadTooLarge):
        q.publish(b"x" * (q.max_payload_bytes + 1))
    (send,) = spans(exporter, "send orders")
    assert send.attributes["error.type"] == "PayloadTooLarge"
    assert send.status.status_code is StatusCode.ERROR
    assert q.stats().published == 0


# ---- process: push consumer ------------------------------------------------------------------------
def exporter_provider(exporter: InMemorySpanExporter) -> TracerProvider:
    return tracing._provider  # type: ignore[return-value]  # the fixture's provider


def run_handler(ignis: Ignis, q, fn=None, batch=None) -> Consumer:
    consumer = Consumer(ignis)
    consumer.register(q.spec.handler_type, fn, batch=batch)
    consumer.run_once(q, consumer._handlers[q.spec.handler_type])
    consumer.stop(timeout=5)
    return consumer


def test_single_handler_span_is_a_child_of_the_send_span_and_links_to_it(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    ref = q.publish({"n": 1})
    app = trace.get_tracer("app", tracer_provider=exporter_provider(exporter))
    seen: list[Any] = []

    def handle(message) -> None:
        with app.start_as_current_span("inside") as inside:  # the handler's own spans: children of process
            seen.append(inside.get_span_context())

    assert run_handler(ignis, q, handle).outcomes == {"acked": 1}
    (send,) = spans(exporter, "send orders")
    (process,) = spans(exporter, "process orders")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id
    assert process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert process.links[0].attributes["messaging.message.id"] == ref.id
    assert dict(process.attributes) == {
        "messaging.system": "ignismq", "messaging.destination.name": "orders",
        "messaging.operation.type": "process", "messaging.operation.name": "process",
        "messaging.message.id": ref.id, "messaging.destination.partition.id": str(ref.shard)}
    assert process.status.status_code is StatusCode.UNSET
    (inside,) = spans(exporter, "inside")
    assert inside.parent.span_id == process.context.span_id and seen == [inside.context]


@pytest.mark.parametrize(("outcome", "error_type"), [("raise", "RuntimeError"), ("reject", "rejected")])
def test_a_failed_handler_sets_error_type(ignis: Ignis, exporter, outcome: str, error_type: str) -> None:
    q = declare(ignis)
    q.publish(b"x")

    def handle(message):
        if outcome == "raise":
            raise RuntimeError("boom")
        return False

    assert run_handler(ignis, q, handle).outcomes == {"sidelined": 1}
    (process,) = spans(exporter, "process orders")
    assert process.attributes["error.type"] == error_type
    assert process.status.status_code is StatusCode.ERROR
    assert [e.name for e in process.events] == (["exception"] if outcome == "raise" else [])


def test_batch_handler_span_links_to_every_message_and_starts_its_own_trace(ignis: Ignis, exporter) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 3, "maxWaitSeconds": 1})
    refs = [q.publish(n) for n in range(3)]  # three send spans, three traces
    batches: list[int] = []
    assert run_handler(ignis, q, batch=lambda ms: batches.append(len(ms))).outcomes == {"acked": 3}
    assert batches == [3]
    sends = spans(exporter, "send orders")
    (process,) = spans(exporter, "process orders")
    assert process.parent is None and process.context.trace_id not in {s.context.trace_id for s in sends}
    assert {(link.context.trace_id, link.context.span_id) for link in process.links} == {
        (s.context.trace_id, s.context.span_id) for s in sends}
    assert sorted(link.attributes["messaging.message.id"] for link in process.links) == sorted(r.id for r in refs)
    assert process.attributes["messaging.batch.message_count"] == 3
    assert process.attributes["messaging.destination.partition.id"] == "0"
    assert "messaging.message.id" not in process.attributes


def test_a_failed_batch_handler_sets_error_type(ignis: Ignis, exporter) -> None:
    q = declare(ignis, shards=1, batching={"maxBatchSize": 2, "maxWaitSeconds": 1})
    q.publish_many([1, 2])  # one send span: both messages carry the same context, one link
    (send,) = spans(exporter, "send orders")

    def handle(messages):
        raise ValueError("bad batch")

    assert run_handler(ignis, q, batch=handle).outcomes == {"sidelined": 2}
    (process,) = spans(exporter, "process orders")
    assert process.attributes["error.type"] == "ValueError"
    assert process.status.status_code is StatusCode.ERROR
    assert [link.context.span_id for link in process.links] == [send.context.span_id]


# ---- process: the pull API's message.process() -------------------------------------------------------
def test_message_process_acks_and_traces(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    q.publish(b"x")
    message = q.fire()
    with message.process() as m:
        assert trace.get_current_span().name == "process orders"  # current inside the block
        assert m is message
    assert message.settled and q.stats().depth == 0
    (send,) = spans(exporter, "send orders")
    (process,) = spans(exporter, "process orders")
    assert process.parent.span_id == send.context.span_id
    assert process.status.status_code is StatusCode.UNSET


def test_message_process_nacks_on_an_exception(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    q.publish(b"x")
    message = q.fire()
    with pytest.raises(KeyError), message.process():
        raise KeyError("nope")
    assert message.settled
    assert [e.reason for _, e in q.sideline.browse(10)] == ["exception"]
    (process,) = spans(exporter, "process orders")
    assert process.attributes["error.type"] == "KeyError"
    assert process.status.status_code is StatusCode.ERROR


def test_message_process_leaves_a_message_settled_inside_alone(ignis: Ignis, exporter) -> None:
    q = declare(ignis)
    q.publish(b"x")
    message = q.fire()
    with message.process():
        message.nack("later")
    assert [e.reason for _, e in q.sideline.browse(10)] == ["later"]


def test_the_docs_tracing_example_runs(tmp_path: Path) -> None:
    """The example of docs/python/tracing.md. In a child process: it sets the global TracerProvider, which a
    process can do once."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "python" / "tracing.md").read_text()
    code = text.split("# Tracing", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("IGNIS_STORE", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"name": "send orders"' in done.stdout and '"name": "process orders"' in done.stdout
    assert "00-" in done.stdout.splitlines()[0]  # the traceparent the block printed


def test_async_publish_process_and_push_handler_are_traced(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    import asyncio

    from ignis.aio import AsyncConsumer, AsyncIgnis

    async def main() -> None:
        async with AsyncIgnis(f"lmdb://{tmp_path}/async?durability=fast") as ig:
            await ig.apply(QueueSpec.build(name="atrace", handlerType="atrace", shards=1))
            q = ig.queue("atrace")
            await q.publish(b"one")
            m = await q.fire()
            async with m.process():
                pass
            await q.publish(b"no")
            consumer = AsyncConsumer(ig, queues=["atrace"], grace=1)

            @consumer.handler("atrace")
            async def handle(message: Any) -> bool:
                return False

            task = asyncio.create_task(consumer.run())
            while not consumer.outcomes:
                await asyncio.sleep(0.02)
            consumer.stop()
            await task

    asyncio.run(main())
    sends, processes = spans(exporter, "send atrace"), spans(exporter, "process atrace")
    assert len(sends) == 2 and len(processes) == 2
    for send, process in zip(sends, processes, strict=True):
        assert process.parent is not None and process.parent.span_id == send.context.span_id
        assert process.kind == SpanKind.CONSUMER and process.context.trace_id == send.context.trace_id
    assert processes[0].status.status_code != StatusCode.ERROR
    assert processes[1].status.status_code == StatusCode.ERROR and processes[1].attributes["error.type"] == "rejected"
