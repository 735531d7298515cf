'use strict';
// The unary calls of leaseq.v1.QueueService, and the job shape handlers see.
//
// The service definition is loaded from queue.proto at runtime with
// @grpc/proto-loader: no code generation step and no protoc binary, and the
// proto stays the one source of truth (see README.md).

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// A published package carries proto/ (copied by `npm pack`'s prepack); in the
// repository the client reads the repository's own proto/.
function protoDir() {
  const packaged = path.join(__dirname, '..', 'proto');
  if (fs.existsSync(path.join(packaged, 'leaseq', 'v1', 'queue.proto'))) return packaged;
  return path.join(__dirname, '..', '..', '..', 'proto');
}

const definition = protoLoader.loadSync('leaseq/v1/queue.proto', {
  includeDirs: [protoDir()],
  keepCase: false, // camelCase fields: jobId, leaseToken, maxInFlight
  longs: String, // int64 seconds of Duration/Timestamp; converted below
  enums: String,
  defaults: true,
  oneofs: true, // SubscribeResponse.kind is 'delivery' or 'heartbeat'
});
const QueueService = grpc.loadPackageDefinition(definition).leaseq.v1.QueueService;

/** A protobuf Duration from milliseconds. */
function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`duration: ${ms} is not a length of time in ms`);
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

function timestamp(date) {
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: (ms - seconds * 1000) * 1e6 };
}

function toDate(ts) {
  return ts ? new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6)) : null;
}

/** The job a handler receives: one delivery under one lease. */
function jobFromDelivery(d) {
  return {
    id: d.job.id,
    queue: d.job.queue,
    payload: d.job.payload, // Buffer
    headers: { ...d.job.headers },
    priority: d.job.priority,
    attempt: d.job.attempt, // 1 on first delivery
    enqueuedAt: toDate(d.job.enqueuedAt),
    lastError: d.job.lastError, // '' if no previous failure
    leaseToken: d.leaseToken,
    leaseExpiresAt: toDate(d.leaseExpiresAt), // by the broker's clock
  };
}

/**
 * An EnqueueRequest from a plain object:
 * { queue, payload (Buffer|string), headers, priority, delayMs, runAt (Date),
 *   dedupKey, maxAttempts, ttlMs }.
 */
function enqueueRequest(job) {
  const req = {
    queue: job.queue,
    payload: typeof job.payload === 'string' ? Buffer.from(job.payload) : job.payload ?? Buffer.alloc(0),
    headers: job.headers ?? {},
    priority: job.priority ?? 0,
    dedupKey: job.dedupKey ?? '',
    maxAttempts: job.maxAttempts ?? 0,
  };
  // Optional messages only when given: absent and zero differ to the broker.
  if (job.delayMs != null) req.delay = duration(job.delayMs);
  if (job.runAt != null) req.runAt = timestamp(job.runAt);
  if (job.ttlMs != null) req.ttl = duration(job.ttlMs);
  return req;
}

// gRPC's own reconnect backoff grows to 120 s, and while a channel waits in it
// every call fails at once: a worker would sit idle for minutes after a broker
// restart. Capped at the Worker's default backoffMaxMs instead.
const CHANNEL_DEFAULTS = { 'grpc.max_reconnect_backoff_ms': 10000 };

/**
 * A connection to a leaseq broker. Every method returns a Promise that
 * rejects with grpc-js's ServiceError on failure: `err.code` is the
 * documented status (grpc.status.INVALID_ARGUMENT naming the field,
 * FAILED_PRECONDITION for a stale lease token, UNAVAILABLE: retry).
 */
class Client {
  /**
   * @param {string} address host:port
   * @param {{credentials?: grpc.ChannelCredentials, options?: object}} [opts]
   *   plaintext by default, like the broker; channel options for grpc-js.
   */
  constructor(address, { credentials = grpc.credentials.createInsecure(), options = {} } = {}) {
    this.stub = new QueueService(address, credentials, { ...CHANNEL_DEFAULTS, ...options });
  }

  #unary(method, req) {
    return new Promise((resolve, reject) => {
      this.stub[method](req, (err, resp) => (err ? reject(err) : resolve(resp)));
    });
  }

  /** Adds one job; resolves once committed: { jobId, duplicate }. */
  async enqueue(queue, payload = Buffer.alloc(0), fields = {}) {
    const resp = await this.#unary('Enqueue', enqueueRequest({ ...fields, queue, payload }));
    return { jobId: resp.jobId, duplicate: resp.duplicate };
  }

  /** Adds all jobs atomically (all or none); results in the same order. */
  async enqueueBatch(jobs) {
    const resp = await this.#unary('EnqueueBatch', { jobs: jobs.map(enqueueRequest) });
    return resp.results.map((r) => ({ jobId: r.jobId, duplicate: r.duplicate }));
  }

  async ack(jobId, leaseToken) {
    await this.#unary('Ack', { jobId, leaseToken });
  }

  /**
   * Fails the job; resolves to true when it went to the dead letters.
   * retryAfterMs: absent = the queue's backoff, 0 = at once.
   */
  async nack(jobId, leaseToken, error = '', { retryAfterMs, deadLetter = false } = {}) {
    const req = { jobId, leaseToken, error, deadLetter };
    if (retryAfterMs != null) req.retryAfter = duration(retryAfterMs);
    const resp = await this.#unary('Nack', req);
    return resp.deadLettered;
  }

  /** Keeps the job for leaseMs more from now; resolves to the new expiry. */
  async extendLease(jobId, leaseToken, leaseMs) {
    const resp = await this.#unary('ExtendLease', { jobId, leaseToken, lease: duration(leaseMs) });
    return toDate(resp.leaseExpiresAt);
  }

  /**
   * The raw Subscribe stream (grpc-js ClientReadableStream of
   * SubscribeResponse). Most programs want Worker, which adds reconnects,
   * lease extension and settling. call.cancel() closes the stream, which
   * releases its unsettled jobs.
   */
  subscribe(queues, { consumer = '', maxInFlight = 0, leaseMs } = {}) {
    const req = { queues, consumer, maxInFlight };
    if (leaseMs != null) req.lease = duration(leaseMs);
    return this.stub.Subscribe(req);
  }

  close() {
    this.stub.close();
  }
}

module.exports = { Client, duration, jobFromDelivery, enqueueRequest, protoDir };
