"""W3C trace context through job headers, when OpenTelemetry is installed
(``pip install 'leaseq[otel]'``); without it both functions do nothing."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Mapping, Tuple

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # the optional extra is not installed
    trace = None  # type: ignore[assignment]
    _PROPAGATOR = None

TRACER_NAME = "leaseq"

# The providers that record nothing: the API's default (a proxy until an SDK
# sets one) and the explicit no-op one.
_INACTIVE: Tuple[type, ...] = ()
if trace is not None:
    _INACTIVE = tuple(
        c for c in (getattr(trace, "ProxyTracerProvider", None), getattr(trace, "NoOpTracerProvider", None)) if c
    )


def available() -> bool:
    return _PROPAGATOR is not None


def recording() -> bool:
    """Whether a tracer provider that records spans is set (an SDK's). With
    none, a handler span records nothing: the worker then starts one only
    for a job that carries a ``traceparent``, whose context the no-op
    tracer still passes on to the handler's outgoing calls."""
    if _PROPAGATOR is None:
        return False
    return not isinstance(trace.get_tracer_provider(), _INACTIVE)


def inject() -> Dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the caller's active span, or
    nothing when there is none."""
    if _PROPAGATOR is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: Dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


@contextlib.contextmanager
def handler_span(queue: str, job_id: str, attempt: int, headers: Mapping[str, str]) -> Iterator[Any]:
    """A CONSUMER span around a handler, the child of the trace context in the
    job's headers (a new trace if it has none), current while it runs."""
    if _PROPAGATOR is None:
        yield None
        return
    parent = _PROPAGATOR.extract(dict(headers))
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"process {queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "leaseq",
            "messaging.operation": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "leaseq.job.attempt": attempt,
        },
        # The worker records the outcome itself (a Retry is not a crash).
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def mark_failed(span: Any, error: str, exc: BaseException | None = None) -> None:
    if span is None:
        return
    if exc is not None:
        span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error))


def set_attribute(span: Any, key: str, value: Any) -> None:
    if span is not None:
        span.set_attribute(key, value)
