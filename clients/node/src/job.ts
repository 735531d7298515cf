// The job a consumer receives: one delivery under one lease, with the calls
// that settle it.

import { status } from '@grpc/grpc-js';
import { asLeaseqError, errorText, LeaseqError } from './errors';
import { toDate, type PbTime } from './proto';

/** How a nack retries. */
export interface NackOptions {
  /** Milliseconds until the next attempt; absent = the queue's backoff, 0 = at once. */
  retryAfterMs?: number;
  /** Give up now: move the job to the dead letters. */
  deadLetter?: boolean;
}

/** @internal Where a job's settles go: its stream, or unary calls. */
export interface Settler {
  ack(job: Job): Promise<void>;
  nack(job: Job, error: string, opts: NackOptions): Promise<boolean>;
  extend(job: Job, leaseMs: number): Promise<Date>;
}

/** @internal A Delivery as decoded by proto-loader. */
export interface PbDelivery {
  job: {
    id: string;
    queue: string;
    payload: Buffer;
    headers: Record<string, string>;
    priority: number;
    attempt: number;
    enqueuedAt: PbTime | null;
    lastError: string;
  };
  leaseToken: string;
  leaseExpiresAt: PbTime | null;
}

/**
 * One delivery of a job. Settle it exactly once: `ack()`, `nack()`,
 * `retry()` or `deadLetter()`. Each resolves once the broker confirmed it
 * and rejects with a LeaseqError; LeaseLostError (FAILED_PRECONDITION) when
 * the lease was lost meanwhile (the job is or will be delivered again).
 */
export class Job {
  readonly id: string;
  readonly queue: string;
  /** The payload bytes as enqueued. */
  readonly payload: Buffer;
  readonly headers: Readonly<Record<string, string>>;
  readonly priority: number;
  /** 1 on first delivery. */
  readonly attempt: number;
  readonly enqueuedAt: Date | null;
  /** The previous failed attempt's error; '' if none. */
  readonly lastError: string;
  /** Opaque; proves this delivery's lease to Ack / Nack / ExtendLease. */
  readonly leaseToken: string;
  /** By the broker's clock; moved on by every lease extension. */
  leaseExpiresAt: Date | null;
  #settler: Settler;
  #settling: Promise<unknown> | null = null;
  #keeper: NodeJS.Timeout | null = null;

  /** @internal */
  constructor(d: PbDelivery, settler: Settler) {
    this.id = d.job.id;
    this.queue = d.job.queue;
    this.payload = d.job.payload;
    this.headers = Object.freeze({ ...d.job.headers });
    this.priority = d.job.priority;
    this.attempt = d.job.attempt;
    this.enqueuedAt = toDate(d.job.enqueuedAt);
    this.lastError = d.job.lastError;
    this.leaseToken = d.leaseToken;
    this.leaseExpiresAt = toDate(d.leaseExpiresAt);
    this.#settler = settler;
  }

  /** Whether ack/nack/retry/deadLetter was called. */
  get settled(): boolean {
    return this.#settling !== null;
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return this.payload.toString('utf8');
  }

  /** The payload parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text()) as T;
  }

  #settle<T>(run: () => Promise<T>): Promise<T> {
    this._stopKeeping();
    const p = run();
    this.#settling = p;
    return p;
  }

  /** The job is done: the broker removes it. */
  ack(): Promise<void> {
    return this.#settle(() => this.#settler.ack(this));
  }

  /**
   * The attempt failed: the job is retried (after `retryAfterMs`, or the
   * queue's backoff) or, on its last attempt or with `deadLetter`, moved to
   * the dead letters. Resolves to true when it was dead-lettered.
   */
  nack(error: unknown = '', opts: NackOptions = {}): Promise<boolean> {
    return this.#settle(() => this.#settler.nack(this, errorText(error), opts));
  }

  /** Nack to be retried `after` ms from now (absent = the queue's backoff). */
  async retry(opts: { after?: number; reason?: string } = {}): Promise<void> {
    await this.nack(opts.reason ?? 'retry requested', { retryAfterMs: opts.after });
  }

  /** Nack straight to the dead letters, with `reason` as the last error. */
  async deadLetter(reason = 'dead-lettered'): Promise<void> {
    await this.nack(reason, { deadLetter: true });
  }

  /** Keeps the job leased for `leaseMs` more, counted from now. Resolves to the new expiry. */
  async extendLease(leaseMs: number): Promise<Date> {
    const expires = await this.#settler.extend(this, leaseMs);
    this.leaseExpiresAt = expires;
    return expires;
  }

  /**
   * @internal Extends the lease by `leaseMs` every `leaseMs / 2` until the
   * job is settled; `onLost` once the broker says the lease is gone.
   */
  _keepLease(leaseMs: number, onLost: (e: LeaseqError) => void, warn: (msg: string) => void): void {
    if (this.#keeper || this.#settling) return;
    const timer = setInterval(() => {
      this.extendLease(leaseMs).catch((e: unknown) => {
        if (this.#keeper !== timer) return; // settled meanwhile
        const err = asLeaseqError(e);
        if (err.code === status.FAILED_PRECONDITION) {
          this._stopKeeping();
          onLost(err);
        } else {
          warn(`leaseq: job ${this.id}: extending the lease failed (${err.message}); will retry`);
        }
      });
    }, Math.max(250, leaseMs / 2));
    // Counted from the delivery; each extension is a full lease from now, so
    // one lost call still leaves half a lease to try again.
    this.#keeper = timer;
  }

  /** @internal */
  _stopKeeping(): void {
    if (this.#keeper) clearInterval(this.#keeper);
    this.#keeper = null;
  }
}
