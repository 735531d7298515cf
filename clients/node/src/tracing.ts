// W3C trace context through job headers, when @opentelemetry/api is
// installed (an optional peer dependency): enqueue writes the caller's
// `traceparent` / `tracestate`, and the worker runs each handler in a span
// that is a child of that context. Without the package all of this is a
// no-op. Nothing here appears in the public types, so users without the
// package type-check too.

import type * as OtelApi from '@opentelemetry/api';

type Api = typeof OtelApi;
let api: Api | null | undefined;

function otel(): Api | null {
  if (api === undefined) {
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      api = require('@opentelemetry/api') as Api;
    } catch {
      api = null;
    }
  }
  return api;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/**
 * @internal Adds the active span's trace context to `headers` (a fresh
 * object), leaving keys the caller set alone. The global propagator writes
 * what it is configured for (baggage too, with the SDK's defaults); the W3C
 * fields are written here as well when it has none (the API's default
 * propagator is a no-op until an SDK registers one).
 */
export function withTraceContext(headers: Record<string, string>): Record<string, string> {
  const o = otel();
  if (!o) return headers;
  const active = o.context.active();
  const sc = o.trace.getSpanContext(active);
  const carrier: Record<string, string> = {};
  try {
    o.propagation.inject(active, carrier);
  } catch {
    // a misbehaving propagator must not fail an enqueue
  }
  if (carrier.traceparent === undefined && sc && o.isSpanContextValid(sc)) {
    carrier.traceparent = `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
    const ts = sc.traceState?.serialize();
    if (ts) carrier.tracestate = ts;
  }
  if (Object.keys(carrier).length === 0) return headers;
  return { ...carrier, ...headers };
}

/** @internal The context a job's headers carry (or the root context). */
function extract(o: Api, headers: Record<string, string>): OtelApi.Context {
  let ctx = o.ROOT_CONTEXT;
  try {
    ctx = o.propagation.extract(o.ROOT_CONTEXT, headers);
  } catch {
    ctx = o.ROOT_CONTEXT;
  }
  if (o.trace.getSpanContext(ctx)) return ctx;
  const m = TRACEPARENT.exec(headers.traceparent ?? '');
  if (!m || m[1] === 'ff' || (m[1] === '00' && m[5] !== undefined)) return ctx;
  const sc: OtelApi.SpanContext = {
    traceId: m[2],
    spanId: m[3],
    traceFlags: parseInt(m[4], 16) & 1,
    isRemote: true,
  };
  if (headers.tracestate) {
    try {
      sc.traceState = o.createTraceState(headers.tracestate);
    } catch {
      // a malformed tracestate is dropped, as the W3C spec says
    }
  }
  return o.isSpanContextValid(sc) ? o.trace.setSpanContext(ctx, sc) : ctx;
}

/** @internal What the worker needs to know about a job for its span. */
export interface SpanJob {
  id: string;
  queue: string;
  attempt: number;
  headers: Record<string, string>;
}

/** @internal A handler span: end() once the job is settled. */
export interface JobSpan {
  /** Runs fn with the span active (so spans the handler starts are its children). */
  run<T>(fn: () => T): T;
  fail(message: string): void;
  event(name: string, attributes?: Record<string, string | number | boolean>): void;
  end(outcome: string): void;
}

/** @internal */
export const NOOP_SPAN: JobSpan = {
  run: (fn) => fn(),
  fail: () => {},
  event: () => {},
  end: () => {},
};

let version = '0.0.0';
try {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  version = (require('../../package.json') as { version: string }).version;
} catch {
  // not fatal: only the tracer's version attribute
}

/**
 * @internal Starts `<queue> process` (kind CONSUMER), a child of the
 * context in the job's headers, with the queue, job id and attempt as
 * attributes.
 */
export function startJobSpan(job: SpanJob): JobSpan {
  const o = otel();
  if (!o) return NOOP_SPAN;
  const parent = extract(o, job.headers);
  const tracer = o.trace.getTracer('@leaseq/client', version);
  const span = tracer.startSpan(
    `${job.queue} process`,
    {
      kind: o.SpanKind.CONSUMER,
      attributes: {
        'messaging.system': 'leaseq',
        'messaging.operation.type': 'process',
        'messaging.destination.name': job.queue,
        'messaging.message.id': job.id,
        'leaseq.queue': job.queue,
        'leaseq.job.id': job.id,
        'leaseq.job.attempt': job.attempt,
      },
    },
    parent,
  );
  const ctx = o.trace.setSpan(parent, span);
  return {
    run: (fn) => o.context.with(ctx, fn),
    fail(message) {
      span.setStatus({ code: o.SpanStatusCode.ERROR, message });
    },
    event(name, attributes) {
      span.addEvent(name, attributes);
    },
    end(outcome) {
      span.setAttribute('leaseq.outcome', outcome);
      span.end();
    },
  };
}
