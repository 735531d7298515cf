"""Traces that follow a job (pip install 'leaseq[otel]' and an OTel SDK)."""

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from leaseq import Client, Job, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")

with tracer.start_as_current_span("checkout"):
    with Client(addr) as client:
        client.enqueue(queue, b"receipt")  # headers get this span's traceparent

worker = Worker(addr)


@worker.handler(queue)
def send_receipt(job: Job) -> None:
    # Runs inside a "process <queue>" span, a child of "checkout".
    span = trace.get_current_span()
    print("trace", format(span.get_span_context().trace_id, "032x"), "from", job.headers["traceparent"])
    worker.stop()


worker.run()
