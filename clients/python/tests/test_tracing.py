"""W3C trace context through a job: enqueue injects the caller's
traceparent/tracestate; the worker's handler span is its child. Checked
with the OpenTelemetry SDK's in-memory exporter."""

import asyncio

import pytest
from util import queue_name, run

from leaseq import AsyncClient, Client, Job, Worker

trace = pytest.importorskip("opentelemetry.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402
from opentelemetry.trace.span import TraceState  # noqa: E402

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans():
    # The global provider can be set once per process.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def test_no_active_span_adds_no_headers(addr, spans):
    q = queue_name()
    with Client(addr) as c:
        c.enqueue(q, b"x", headers={"k": "v"})
        with c.subscribe(q, max_in_flight=1) as sub:
            assert next(iter(sub)).headers == {"k": "v"}


def test_a_trace_follows_the_job_from_enqueue_into_the_handler(addr, spans):
    async def body():
        qa, qb = queue_name(), queue_name()
        tracer = trace.get_tracer("test")
        # A tracestate as a vendor would set it, carried along.
        parent_ctx = trace.set_span_in_context(
            trace.NonRecordingSpan(
                trace.SpanContext(
                    trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0xB7AD6B7169203331, is_remote=True,
                    trace_flags=trace.TraceFlags(1), trace_state=TraceState([("vendor", "v1")]),
                )
            )
        )  # fmt: skip
        async with AsyncClient(addr) as c:
            with tracer.start_as_current_span("produce", context=parent_ctx) as produce:
                ra = await c.enqueue(qa, b"a")
            with tracer.start_as_current_span("produce-sync"):
                with Client(addr) as sync_client:  # the blocking client too, to a plain handler
                    rb = sync_client.enqueue(qb, b"b", headers={"k": "v"})
            produced = {s.name: s for s in spans.get_finished_spans()}
            done: asyncio.Queue = asyncio.Queue()
            w = Worker(addr, lease=5)

            @w.handler(qa)
            async def handle_a(job: Job) -> None:
                with trace.get_tracer("app").start_as_current_span("send email"):
                    pass
                await done.put(job)

            @w.handler(qb)
            def handle_b(job: Job) -> None:  # in a thread: the context goes along
                with trace.get_tracer("app").start_as_current_span("resize image"):
                    pass
                done.put_nowait(job)  # fine: only read after the worker stops

            task = asyncio.ensure_future(w.run_async(handle_signals=False))
            first = await asyncio.wait_for(done.get(), 10)
            while done.qsize() == 0:  # the plain handler's put comes from its thread
                await asyncio.sleep(0.05)
            by_queue = {j.queue: j for j in (first, done.get_nowait())}
            ja, jb = by_queue[qa], by_queue[qb]
            w.stop()
            await task

        ctx = produce.get_span_context()
        assert ja.headers["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"
        assert ja.headers["tracestate"] == "vendor=v1"
        assert jb.headers["k"] == "v" and jb.headers["traceparent"].split("-")[2] == (
            f"{produced['produce-sync'].get_span_context().span_id:016x}"
        )
        got = {s.name: s for s in spans.get_finished_spans()}
        for q, r, producer, inner in ((qa, ra, produce, "send email"), (qb, rb, produced["produce-sync"], "resize image")):
            span = got[f"process {q}"]
            assert span.kind == SpanKind.CONSUMER
            assert span.context.trace_id == producer.get_span_context().trace_id
            assert span.parent.span_id == producer.get_span_context().span_id
            assert span.attributes["messaging.destination.name"] == q
            assert span.attributes["messaging.message.id"] == r.job_id
            assert span.attributes["leaseq.job.attempt"] == 1
            assert span.attributes["leaseq.outcome"] == "ack"
            assert got[inner].parent.span_id == span.context.span_id
        assert got[f"process {qa}"].context.trace_state.get("vendor") == "v1"

    run(body())


def test_a_failed_handler_marks_its_span(addr, spans):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue(q, b"x")
        w = Worker(addr, lease=5)

        @w.handler(q)
        async def handle(job: Job) -> None:
            w.stop()
            raise ValueError("bad input")

        await w.run_async(handle_signals=False)
        (span,) = [s for s in spans.get_finished_spans() if s.name == f"process {q}"]
        assert span.status.status_code == trace.StatusCode.ERROR
        assert span.status.description == "bad input"
        assert span.attributes["leaseq.outcome"] == "nack"
        assert [e.name for e in span.events] == ["exception"]

    run(body())
