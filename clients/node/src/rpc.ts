// Unary calls of QueueService, and settling outside a Consume stream:
// acks coalesced into AckBatch calls, nacks and lease extensions as unary
// calls, each retried a few times on UNAVAILABLE.

import * as grpc from '@grpc/grpc-js';
import { Connection } from './connection';
import { asLeaseqError, LeaseqError } from './errors';
import { duration, QueueService, toDate, type PbTime } from './proto';

const { status } = grpc;

/** @internal Settling is retried this many times on UNAVAILABLE; after that
 * the lease runs out and the job is redelivered (at-least-once). */
export const SETTLE_TRIES = 5;
/** @internal Deadline of one settle call. */
export const SETTLE_DEADLINE_MS = 10000;
// Acks waiting for an AckBatch call: sent at the end of the current turn of
// the event loop, or at once when this many are waiting.
const ACK_BATCH_MAX = 500;

/**
 * Exponential backoff with jitter: each delay is drawn from [d/2, d), d
 * doubling from initialMs up to maxMs.
 */
export class Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  #nextMs: number;

  constructor(initialMs: number, maxMs: number) {
    this.initialMs = initialMs;
    this.maxMs = maxMs;
    this.#nextMs = initialMs;
  }

  reset(): void {
    this.#nextMs = this.initialMs;
  }

  delay(): number {
    const d = this.#nextMs;
    this.#nextMs = Math.min(this.maxMs, d * 2);
    return d / 2 + Math.random() * (d / 2);
  }
}

/** @internal */
export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** @internal Nack fields as the proto has them (camelCase). */
export interface NackReq {
  jobId: string;
  leaseToken: string;
  error: string;
  deadLetter: boolean;
  retryAfter?: PbTime;
}

interface PendingAck {
  jobId: string;
  leaseToken: string;
  resolve: () => void;
  reject: (e: LeaseqError) => void;
}

type AnyStub = grpc.Client & Record<string, (...args: unknown[]) => unknown>;

/** @internal The QueueService stub of a Connection, with settling. */
export class Rpc {
  readonly conn: Connection;
  readonly stub: AnyStub;
  readonly callTimeoutMs: number | undefined;
  #acks: PendingAck[] = [];
  #ackFlush: NodeJS.Immediate | null = null;
  #ackBatchMissing = false; // the broker answered UNIMPLEMENTED to AckBatch

  constructor(conn: Connection, callTimeoutMs?: number) {
    this.conn = conn;
    this.callTimeoutMs = callTimeoutMs;
    this.stub = new QueueService(conn.target, grpc.credentials.createInsecure(), conn.stubOptions()) as unknown as AnyStub;
  }

  unary<T>(method: string, req: object, deadlineMs = this.callTimeoutMs): Promise<T> {
    return new Promise((resolve, reject) => {
      const opts: grpc.CallOptions = deadlineMs != null ? { deadline: Date.now() + deadlineMs } : {};
      this.stub[method](req, opts, (err: grpc.ServiceError | null, resp: T) => (err ? reject(err) : resolve(resp)));
    });
  }

  // One settle call, retried on UNAVAILABLE; rejects with a LeaseqError
  // (LeaseLostError for FAILED_PRECONDITION).
  async #retrying<T>(call: () => Promise<T>): Promise<T> {
    const backoff = new Backoff(50, 1000);
    for (let i = 1; ; i++) {
      try {
        return await call();
      } catch (e) {
        const err = asLeaseqError(e);
        if (err.code !== status.UNAVAILABLE || i >= SETTLE_TRIES) throw err;
        await sleep(backoff.delay());
      }
    }
  }

  /** Acks through AckBatch (coalesced), or the unary Ack on a broker without it. */
  ack(jobId: string, leaseToken: string): Promise<void> {
    if (this.#ackBatchMissing) {
      return this.#retrying(() => this.unary<object>('Ack', { jobId, leaseToken }, SETTLE_DEADLINE_MS)).then(() => {});
    }
    return new Promise((resolve, reject) => {
      this.#acks.push({ jobId, leaseToken, resolve, reject });
      if (this.#acks.length >= ACK_BATCH_MAX) this.#flushAcks();
      else if (!this.#ackFlush) this.#ackFlush = setImmediate(() => this.#flushAcks());
    });
  }

  #flushAcks(): void {
    if (this.#ackFlush) clearImmediate(this.#ackFlush);
    this.#ackFlush = null;
    const batch = this.#acks.splice(0, this.#acks.length);
    if (batch.length === 0) return;
    const req = { acks: batch.map((a) => ({ jobId: a.jobId, leaseToken: a.leaseToken })) };
    this.#retrying(() => this.unary<{ results: { jobId: string; code: number; message: string }[] }>('AckBatch', req, SETTLE_DEADLINE_MS)).then(
      (resp) => {
        batch.forEach((a, i) => {
          const r = resp.results[i];
          if (!r || r.code === status.OK) a.resolve();
          else a.reject(asLeaseqError({ code: r.code, details: r.message }));
        });
      },
      (err: LeaseqError) => {
        if (err.code === status.UNIMPLEMENTED) {
          // A broker from before AckBatch: one Ack per job from now on.
          this.#ackBatchMissing = true;
          for (const a of batch) this.ack(a.jobId, a.leaseToken).then(a.resolve, a.reject);
          return;
        }
        for (const a of batch) a.reject(err);
      },
    );
  }

  /** A unary Ack with follow-up jobs or a result (AckBatch cannot carry them); the follow-ups' ids. */
  ackWith(jobId: string, leaseToken: string, extra: { enqueue?: object[]; result?: Buffer }): Promise<string[]> {
    return this.#retrying(() => this.unary<{ enqueued?: string[] }>('Ack', { jobId, leaseToken, ...extra }, SETTLE_DEADLINE_MS)).then(
      (r) => r.enqueued ?? [],
    );
  }

  /** ReportProgress (Subscribe's way), retried on UNAVAILABLE. */
  reportProgress(req: { jobId: string; leaseToken: string; fraction: number; message: string }): Promise<void> {
    return this.#retrying(() => this.unary<object>('ReportProgress', req, SETTLE_DEADLINE_MS)).then(() => undefined);
  }

  nack(req: NackReq): Promise<boolean> {
    return this.#retrying(() => this.unary<{ deadLettered: boolean }>('Nack', req, SETTLE_DEADLINE_MS)).then((r) => r.deadLettered);
  }

  extend(jobId: string, leaseToken: string, leaseMs: number): Promise<Date> {
    const req = { jobId, leaseToken, lease: duration(leaseMs) };
    return this.#retrying(() => this.unary<{ leaseExpiresAt: PbTime }>('ExtendLease', req, SETTLE_DEADLINE_MS)).then(
      (r) => toDate(r.leaseExpiresAt) as Date,
    );
  }

  close(): void {
    this.#flushAcks();
  }
}
