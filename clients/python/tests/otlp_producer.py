"""The producer of tests/traces.rs (run by it, not by pytest): enqueues one
job inside a span, exports the span over OTLP/gRPC, and prints its ids.

Environment: LEASEQ_ADDR, QUEUE, OTLP_ENDPOINT (http://host:port). Needs the
OpenTelemetry SDK and exporter (clients/setup.sh traces)."""

import json
import os

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from leaseq import Client

provider = TracerProvider(resource=Resource.create({"service.name": "python-producer"}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP_ENDPOINT"], insecure=True)))
trace.set_tracer_provider(provider)

with trace.get_tracer("shop").start_as_current_span("checkout") as span:
    with Client(os.environ["LEASEQ_ADDR"]) as client:
        sent = client.enqueue(os.environ["QUEUE"], b"receipt 42")  # headers get this span's traceparent
    ids = span.get_span_context()
provider.shutdown()  # exports the span before exiting
print(json.dumps({"trace_id": format(ids.trace_id, "032x"), "span_id": format(ids.span_id, "016x"), "job_id": sent.job_id}))
