// The producer side and the unary calls of leaseq.v1.QueueService, plus
// consume() (an async iterator of jobs).

import type * as grpc from '@grpc/grpc-js';
import { status as grpcStatus } from '@grpc/grpc-js';
import { checkProgress, JobFailedError, LeaseqError, resultBytes } from './errors';
import { Connection, type ConnectionOptions } from './connection';
import { JobStream, type ConsumeOptions } from './consumer';
import { duration, timestamp, toDate, type PbTime } from './proto';
import { Producer } from './produce';
import { Rpc, type NackReq } from './rpc';
import { withTraceContext } from './tracing';

/** A job to enqueue (all fields but the queue optional). */
export interface EnqueueOptions {
  /** Free-form metadata delivered with the job. */
  headers?: Record<string, string>;
  /** Higher is delivered first. Default 0. */
  priority?: number;
  /** Deliver no earlier than this many ms after the enqueue commits. */
  delayMs?: number;
  /** Deliver no earlier than this instant (not with delayMs). */
  runAt?: Date;
  /**
   * While a job with this key is live in the queue (or holds it after
   * completing: uniqueForMs), enqueue returns that job (`duplicate`).
   */
  dedupKey?: string;
  /**
   * Unique for a window: once this job completes (is acked), its dedupKey
   * stays held this many ms (at most 366 days); an enqueue with the key in
   * that time returns this job. A dead-lettered, cancelled or expired job
   * holds nothing. Needs dedupKey.
   */
  uniqueForMs?: number;
  /**
   * 'replace' (debounce): a waiting job (not leased) with the same dedupKey
   * takes this payload, headers, priority and delay (delayMs counts from
   * this enqueue) and keeps its id; the result has `replaced: true`. A
   * leased job is left as it is. Default 'keep'. Needs dedupKey.
   */
  onDuplicate?: 'keep' | 'replace';
  /** Deliveries before the job is dead-lettered; 0 = the queue's default. */
  maxAttempts?: number;
  /** Dead-lettered (reason `expired`) if not done this many ms after the enqueue. */
  ttlMs?: number;
  /**
   * The job's key inside its queue (a customer, an account; at most 256
   * bytes). In a queue with `orderedByKey` the jobs of one key are delivered
   * in enqueue order, at most the queue's `keyConcurrency` at once.
   */
  key?: string;
}

/** A job for enqueueBatch. */
export interface EnqueueJob extends EnqueueOptions {
  queue: string;
  /** Bytes, or a string (sent as UTF-8). */
  payload?: Buffer | Uint8Array | string;
}

export interface EnqueueResult {
  /** UUIDv7. */
  jobId: string;
  /** True when dedupKey matched a live job (or one holding it after completing): jobId is that job's. */
  duplicate: boolean;
  /** True when the waiting job jobId took this enqueue's payload (onDuplicate 'replace'). */
  replaced: boolean;
}

export interface AckResult {
  jobId: string;
  /** The status code the unary Ack would have returned: 0 OK, 9 FAILED_PRECONDITION. */
  code: number;
  message: string;
}

/** Options of Client and AdminClient. */
export interface ClientOptions extends ConnectionOptions {
  /** Deadline of each unary call, in ms. Default: none. */
  callTimeoutMs?: number;
  /**
   * Write the active OpenTelemetry span's `traceparent` / `tracestate` into
   * enqueued jobs' headers (when @opentelemetry/api is installed). Default true.
   */
  propagateTrace?: boolean;
  /** @deprecated Use channelOptions. */
  options?: grpc.ChannelOptions;
}

/** @internal The EnqueueRequest of a job (also a follow-up of an ack). */
export function enqueueRequest(job: EnqueueJob, propagate: boolean): Record<string, unknown> {
  const payload = job.payload;
  const headers = { ...(job.headers ?? {}) };
  const req: Record<string, unknown> = {
    queue: job.queue,
    payload: typeof payload === 'string' ? Buffer.from(payload) : payload == null ? Buffer.alloc(0) : Buffer.from(payload),
    headers: propagate ? withTraceContext(headers) : headers,
    priority: job.priority ?? 0,
    dedupKey: job.dedupKey ?? '',
    maxAttempts: job.maxAttempts ?? 0,
    key: job.key ?? '',
    onDuplicate: job.onDuplicate === 'replace' ? 'ON_DUPLICATE_REPLACE' : 'ON_DUPLICATE_KEEP',
  };
  // Optional messages only when given: absent and zero differ to the broker.
  if (job.delayMs != null) req.delay = duration(job.delayMs);
  if (job.runAt != null) req.runAt = timestamp(job.runAt);
  if (job.ttlMs != null) req.ttl = duration(job.ttlMs);
  if (job.uniqueForMs != null) req.uniqueFor = duration(job.uniqueForMs);
  return req;
}

/**
 * A connection to a leaseq broker. Every method returns a Promise that
 * rejects with grpc-js's ServiceError on failure: `err.code` is the
 * documented status (`status.INVALID_ARGUMENT` naming the field,
 * `FAILED_PRECONDITION` for a stale lease token, `UNAVAILABLE`: retry).
 */
export class Client {
  /** @internal */
  readonly _rpc: Rpc;
  /** @internal */
  readonly _conn: Connection;
  readonly #propagate: boolean;
  readonly #producer: Producer;

  /**
   * @param address `host:port` (plaintext, or TLS when `tls` is given),
   *   `http://host:port`, or `https://host:port` (TLS: the CA of `tls`,
   *   else the system's roots). Default: LEASEQ_ADDR, else
   *   `127.0.0.1:50051`; LEASEQ_TOKEN and the TLS variables fill `token`
   *   and `tls` likewise.
   */
  constructor(address?: string | null, opts: ClientOptions = {}) {
    const channelOptions = { ...opts.options, ...opts.channelOptions };
    this._conn = new Connection(address, { ...opts, channelOptions });
    this._rpc = new Rpc(this._conn, opts.callTimeoutMs);
    this.#propagate = opts.propagateTrace ?? true;
    this.#producer = new Producer(this._rpc);
  }

  /**
   * Adds one job; resolves once it is committed. The jobs go as messages
   * on one Produce stream (opened by the first enqueue, half-closed after
   * 200 ms without one awaited); a unary Enqueue each against a broker
   * without it. A rejection with UNAVAILABLE (the stream broke) leaves the
   * job enqueued or not, as for any call whose answer was lost: give it a
   * dedupKey to send it again safely.
   */
  async enqueue(queue: string, payload: Buffer | Uint8Array | string = Buffer.alloc(0), opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    const resp = await this.#producer.enqueue(enqueueRequest({ ...opts, queue, payload }, this.#propagate), this._rpc.callTimeoutMs);
    return { jobId: resp.jobId, duplicate: resp.duplicate, replaced: resp.replaced };
  }

  /** Adds all jobs atomically (all or none); results in the same order. */
  async enqueueBatch(jobs: EnqueueJob[]): Promise<EnqueueResult[]> {
    const resp = await this._rpc.unary<{ results: EnqueueResult[] }>('EnqueueBatch', {
      jobs: jobs.map((j) => enqueueRequest(j, this.#propagate)),
    });
    return resp.results.map((r) => ({ jobId: r.jobId, duplicate: r.duplicate, replaced: r.replaced }));
  }

  /**
   * Consumes `queues` as an async iterator of jobs, settled with
   * `job.ack()` / `job.nack()` / `job.retry()` / `job.deadLetter()`, which
   * travel on the stream (the Consume RPC; Subscribe plus AckBatch on a
   * broker without it). See JobStream.
   */
  consume(opts: ConsumeOptions): JobStream {
    return new JobStream(this._rpc, opts);
  }

  /**
   * Acks the job. `enqueue`: follow-up jobs, inserted in the ack's
   * transaction (they exist if and only if the ack committed; only a
   * broker that lists "ack.enqueue" takes them, an older one drops them);
   * resolves to their ids, in order. `result`: the job's result (see Ack;
   * only a broker that lists "ack.result" keeps it).
   */
  async ack(
    jobId: string,
    leaseToken: string,
    opts: { enqueue?: readonly EnqueueJob[]; result?: Buffer | Uint8Array | string } = {},
  ): Promise<string[]> {
    const enqueue = (opts.enqueue ?? []).map((j) => enqueueRequest(j, this.#propagate));
    const req: Record<string, unknown> = { jobId, leaseToken, enqueue };
    const result = resultBytes(opts.result);
    if (result) req.result = result;
    const resp = await this._rpc.unary<{ enqueued?: string[] }>('Ack', req);
    return resp.enqueued ?? [];
  }

  /**
   * Says how far a held job is (ReportProgress; a Worker's job.progress()
   * coalesces reports on its Consume stream instead): `fraction` 0 to 1,
   * `message` at most 256 bytes (a RangeError naming the field, nothing
   * sent). Rejects with FAILED_PRECONDITION when the lease token is not
   * current, UNIMPLEMENTED from a broker that predates progress.
   */
  async reportProgress(jobId: string, leaseToken: string, fraction: number, message = ''): Promise<void> {
    checkProgress(fraction, message);
    await this._rpc.unary<object>('ReportProgress', { jobId, leaseToken, fraction, message });
  }

  /**
   * Waits for the job to end (WaitJob: no polling) and resolves to how it
   * ended: completed with its result, dead, cancelled or unknown (see
   * WaitResult); at once for a job that already ended. `timeoutMs`: more
   * than 0, at most an hour (the default); past it the promise rejects with
   * DEADLINE_EXCEEDED. Needs the enqueue or consume permission on the
   * job's queue.
   */
  wait(jobId: string, timeoutMs = 3_600_000): Promise<WaitResult> {
    const req = { jobId, timeout: duration(timeoutMs) };
    return new Promise((resolve, reject) => {
      // The broker ends the stream at `timeoutMs`; the call's own deadline
      // a little later only guards against a broker that went silent.
      const call = this._rpc.stub.WaitJob(req, { deadline: Date.now() + timeoutMs + 10_000 }) as grpc.ClientReadableStream<PbWaitResponse>;
      let done = false;
      call.on('data', (r: PbWaitResponse) => {
        const state = WAIT_FINAL[r.state];
        if (done || !state) return;
        done = true;
        resolve(new WaitResult(r.jobId, state, r.result ?? Buffer.alloc(0), r.lastError, r.deadReason, toDate(r.finishedAt)));
      });
      call.on('error', (e) => {
        if (!done) reject(e);
        done = true;
      });
      call.on('end', () => {
        if (!done) reject(new LeaseqError(grpcStatus.UNAVAILABLE, `wait: the stream ended without the outcome of job ${jobId}`));
        done = true;
      });
    });
  }

  /** Acks many jobs in one call; each succeeds or fails on its own. */
  async ackBatch(acks: { jobId: string; leaseToken: string }[]): Promise<AckResult[]> {
    const resp = await this._rpc.unary<{ results: AckResult[] }>('AckBatch', {
      acks: acks.map((a) => ({ jobId: a.jobId, leaseToken: a.leaseToken })),
    });
    return resp.results.map((r) => ({ jobId: r.jobId, code: r.code, message: r.message }));
  }

  /**
   * Fails the job; resolves to true when it went to the dead letters.
   * retryAfterMs: absent = the queue's backoff, 0 = at once.
   */
  async nack(jobId: string, leaseToken: string, error = '', opts: { retryAfterMs?: number; deadLetter?: boolean } = {}): Promise<boolean> {
    const req: NackReq = { jobId, leaseToken, error, deadLetter: !!opts.deadLetter };
    if (opts.retryAfterMs != null) req.retryAfter = duration(opts.retryAfterMs);
    const resp = await this._rpc.unary<{ deadLettered: boolean }>('Nack', req);
    return resp.deadLettered;
  }

  /** Keeps the job for leaseMs more from now; resolves to the new expiry. */
  async extendLease(jobId: string, leaseToken: string, leaseMs: number): Promise<Date> {
    const resp = await this._rpc.unary<{ leaseExpiresAt: PbTime }>('ExtendLease', { jobId, leaseToken, lease: duration(leaseMs) });
    return toDate(resp.leaseExpiresAt) as Date;
  }

  /**
   * The raw Subscribe stream (grpc-js ClientReadableStream of
   * SubscribeResponse, camelCase fields, `kind` 'delivery', 'deliveries',
   * 'heartbeat' or 'cancelled': `{ jobId, leaseToken }` of a job this
   * stream holds that AdminService.CancelJob deleted; settle nothing).
   * Most programs want consume() or Worker. call.cancel() closes the stream,
   * which releases its unsettled jobs.
   */
  subscribe(queues: string[], opts: { consumer?: string; maxInFlight?: number; leaseMs?: number } = {}): grpc.ClientReadableStream<any> {
    const req: Record<string, unknown> = { queues, consumer: opts.consumer ?? '', maxInFlight: opts.maxInFlight ?? 0 };
    if (opts.leaseMs != null) req.lease = duration(opts.leaseMs);
    return this._rpc.stub.Subscribe(req) as grpc.ClientReadableStream<any>;
  }

  /** Closes the channel (after sending acks still waiting to be batched). */
  close(): void {
    this.#producer.close();
    this._rpc.close(); // starts the AckBatch call, which the close lets finish
    this._conn.close();
  }
}

interface PbWaitResponse {
  jobId: string;
  state: string;
  result: Buffer | null;
  lastError: string;
  deadReason: string;
  finishedAt: PbTime | null;
}

const WAIT_FINAL: Record<string, WaitResult['state'] | undefined> = {
  WAIT_STATE_COMPLETED: 'completed',
  WAIT_STATE_DEAD: 'dead',
  WAIT_STATE_CANCELLED: 'cancelled',
  WAIT_STATE_UNKNOWN: 'unknown',
};

/**
 * How a job ended (client.wait): `completed` (acked; `result` is its ack's
 * result, empty when it had none), `dead` (in the dead letters:
 * `lastError`, `deadReason` max_attempts / nacked / expired), `cancelled`
 * (deleted by CancelJob) or `unknown` (neither live nor recorded: acked
 * without a result in a queue that keeps no completed records, purged,
 * expired, or never enqueued).
 */
export class WaitResult {
  constructor(
    readonly jobId: string,
    readonly state: 'completed' | 'dead' | 'cancelled' | 'unknown',
    readonly result: Buffer,
    readonly lastError: string,
    readonly deadReason: string,
    /** When it ended (database time); null for `unknown`. */
    readonly finishedAt: Date | null,
  ) {}

  get completed(): boolean {
    return this.state === 'completed';
  }

  /** The result parsed as JSON; undefined for an empty result. */
  json<U = unknown>(): U | undefined {
    return this.result.length === 0 ? undefined : (JSON.parse(this.result.toString('utf8')) as U);
  }

  /** The result parsed as JSON, or a JobFailedError when the job did not complete. */
  value<U = unknown>(): U | undefined {
    if (!this.completed) throw new JobFailedError(this);
    return this.json<U>();
  }
}
