// The job a consumer receives: one delivery under one lease, with the calls
// that settle it.

import { status } from '@grpc/grpc-js';
import { status as grpcStatus } from '@grpc/grpc-js';
import { enqueueRequest, type EnqueueJob } from './client';
import {
  ACK_ENQUEUE, ACK_RESULT, asLeaseqError, checkProgress, errorText, LeaseqError, NO_ACK_ENQUEUE, NO_ACK_RESULT, NO_PROGRESS, PROGRESS, resultBytes,
} from './errors';
import { toDate, type PbTime } from './proto';
import { DueSet } from './timers';

/** How a nack retries. */
export interface NackOptions {
  /** Milliseconds until the next attempt; absent = the queue's backoff, 0 = at once. */
  retryAfterMs?: number;
  /** Give up now: move the job to the dead letters. */
  deadLetter?: boolean;
}

/**
 * @internal Told how one settle ended: a callback pair instead of a
 * promise, so the worker's path needs none per job.
 */
export interface SettleWaiter {
  /** deadLettered: nacks; expires: extends (null otherwise); enqueued: an ack's follow-ups' ids. */
  settleOk(deadLettered: boolean, expires: Date | null, enqueued?: readonly string[]): void;
  settleFailed(err: LeaseqError): void;
}

/**
 * @internal What an ack carries besides the job: follow-up jobs'
 * EnqueueRequests (only when supports("ack.enqueue")) and a result (only
 * when supports("ack.result")).
 */
export interface AckExtra {
  enqueue?: object[];
  result?: Buffer;
}

/** @internal Where a job's settles go: its stream, or unary calls. */
export interface Settler {
  ack(job: Job, w: SettleWaiter, extra?: AckExtra | null): void;
  /** A progress report (only when supports("progress")); coalesced on a Consume stream. */
  progress(job: Job, fraction: number, message: string): void;
  /** Whether the stream's broker listed `feature` in its first heartbeat. */
  supports(feature: string): boolean;
  nack(job: Job, error: string, opts: NackOptions, w: SettleWaiter): void;
  extend(job: Job, leaseMs: number, w: SettleWaiter): void;
}

// The public methods' waiter: a promise's resolve and reject.
type SettlePick<T> = (deadLettered: boolean, expires: Date | null, enqueued: readonly string[]) => T;

class PromiseWaiter<T> implements SettleWaiter {
  #resolve: (v: T) => void;
  #reject: (e: LeaseqError) => void;
  #pick: SettlePick<T>;

  constructor(resolve: (v: T) => void, reject: (e: LeaseqError) => void, pick: SettlePick<T>) {
    this.#resolve = resolve;
    this.#reject = reject;
    this.#pick = pick;
  }

  settleOk(deadLettered: boolean, expires: Date | null, enqueued?: readonly string[]): void {
    this.#resolve(this.#pick(deadLettered, expires, enqueued ?? []));
  }

  settleFailed(err: LeaseqError): void {
    this.#reject(err);
  }
}

const pickEnqueued = (_dl: boolean, _e: Date | null, enqueued: readonly string[]): string[] => [...enqueued];
const pickDeadLettered = (deadLettered: boolean): boolean => deadLettered;

/**
 * @internal Keeps the leases of a stream's unsettled jobs: each is
 * extended by leaseMs every leaseMs / 2 (at least 250 ms), counted from its
 * delivery, until it is settled; one timer for all of them (DueSet).
 */
export class LeaseKeeper {
  readonly leaseMs: number;
  #due: DueSet<Job>;
  #onLost: (job: Job, err: LeaseqError) => void;
  #warn: (msg: string) => void;

  constructor(leaseMs: number, onLost: (job: Job, err: LeaseqError) => void, warn: (msg: string) => void) {
    this.leaseMs = leaseMs;
    this.#onLost = onLost;
    this.#warn = warn;
    this.#due = new DueSet(Math.max(250, leaseMs / 2), (job) => this.#extend(job));
  }

  get size(): number {
    return this.#due.size;
  }

  add(job: Job): void {
    if (job.settled) return;
    job._keeper = this;
    this.#due.add(job);
  }

  delete(job: Job): void {
    this.#due.delete(job);
  }

  /** The kept job of this delivery, if any (a scan: cancels are rare). */
  find(jobId: string, leaseToken: string): Job | undefined {
    return this.#due.find((j) => j.id === jobId && j.leaseToken === leaseToken);
  }

  /** Stops keeping every job (the stream or worker ended). */
  clear(): void {
    this.#due.clear();
  }

  // Each extension is a full lease from now, so one lost call still leaves
  // half a lease to try again.
  #extend(job: Job): void {
    this.#due.add(job); // due again in half a lease
    job.extendLease(this.leaseMs).catch((e: unknown) => {
      if (!this.#due.has(job)) return; // settled meanwhile
      const err = asLeaseqError(e);
      if (err.code === status.FAILED_PRECONDITION) {
        this.#due.delete(job);
        this.#onLost(job, err);
      } else {
        this.#warn(`leaseq: job ${job.id}: extending the lease failed (${err.message}); will retry`);
      }
    });
  }
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
    key: string;
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
export class Job<T = unknown> {
  readonly id: string;
  readonly queue: string;
  /** The payload bytes as enqueued. */
  readonly payload: Buffer;
  readonly headers: Readonly<Record<string, string>>;
  readonly priority: number;
  /** 1 on first delivery. */
  readonly attempt: number;
  /** The previous failed attempt's error; '' if none. */
  readonly lastError: string;
  /** The job's key inside its queue (EnqueueOptions.key); '' if none. */
  readonly key: string;
  /** Opaque; proves this delivery's lease to Ack / Nack / ExtendLease. */
  readonly leaseToken: string;
  #settler: Settler;
  #settled = false;
  #cancelled = false;
  // The two times as decoded, made Dates when first read: most handlers
  // read neither.
  #enqueuedAt: PbTime | null | Date;
  #leaseExpiresAt: PbTime | null | Date;
  /** @internal The keeper of this job's lease, if any. */
  _keeper: LeaseKeeper | null = null;

  /** @internal */
  constructor(d: PbDelivery, settler: Settler) {
    const j = d.job;
    this.id = j.id;
    this.queue = j.queue;
    this.payload = j.payload;
    // The decoded map is this job's own object: frozen, not copied.
    this.headers = Object.freeze(j.headers);
    this.priority = j.priority;
    this.attempt = j.attempt;
    this.#enqueuedAt = j.enqueuedAt;
    this.lastError = j.lastError;
    // '' from a broker that predates keys (proto-loader's defaults).
    this.key = j.key ?? '';
    this.leaseToken = d.leaseToken;
    this.#leaseExpiresAt = d.leaseExpiresAt;
    this.#settler = settler;
  }

  get enqueuedAt(): Date | null {
    const t = this.#enqueuedAt;
    return t === null || t instanceof Date ? t : (this.#enqueuedAt = toDate(t));
  }

  /** By the broker's clock; moved on by every lease extension. */
  get leaseExpiresAt(): Date | null {
    const t = this.#leaseExpiresAt;
    return t === null || t instanceof Date ? t : (this.#leaseExpiresAt = toDate(t));
  }

  set leaseExpiresAt(d: Date | null) {
    this.#leaseExpiresAt = d;
  }

  /** Whether ack/nack/retry/deadLetter was called. */
  get settled(): boolean {
    return this.#settled;
  }

  /**
   * Whether the broker said this job was cancelled (AdminService.CancelJob)
   * while its lease was current: it is gone, and a settle of it is refused
   * (LeaseLostError). Set by the stream that delivered it, when it keeps the
   * job's lease (consume()'s autoExtend, or a Worker).
   */
  get cancelled(): boolean {
    return this.#cancelled;
  }

  /** @internal The broker cancelled it: no more lease extensions. */
  _cancel(): void {
    this.#cancelled = true;
    this._stopKeeping();
  }

  /** The payload as UTF-8 text. */
  text(): string {
    return this.payload.toString('utf8');
  }

  /** The payload parsed as JSON (typed as the job's T, or as asked). */
  json<U = T>(): U {
    return JSON.parse(this.text()) as U;
  }

  /** @internal ack() without a promise: `w` is told how it ended. */
  _ack(w: SettleWaiter, extra: AckExtra | null = null): void {
    this._stopKeeping();
    this.#settled = true;
    this.#settler.ack(this, w, extra);
  }

  /**
   * Says how far the handler is (advice, read back by AdminClient.getJob:
   * progress, progressMessage): `fraction` 0 to 1, `message` at most 256
   * bytes of UTF-8 without NUL (a RangeError naming the field otherwise,
   * nothing sent). Returns at once: on a Consume stream the report goes
   * with the stream's next write and only the latest per job is kept
   * until then (the broker writes a stream's at most once a second); on
   * Subscribe, a ReportProgress call, one at a time per job with the
   * latest waiting. Throws a LeaseqError UNIMPLEMENTED, nothing sent, when
   * the broker did not list "progress" in its first heartbeat; does
   * nothing once the job is settled.
   */
  progress(fraction: number, message = ''): void {
    checkProgress(fraction, message);
    if (!this._supports(PROGRESS)) throw new LeaseqError(grpcStatus.UNIMPLEMENTED, NO_PROGRESS);
    if (this.#settled || this.#cancelled) return;
    this.#settler.progress(this, fraction, message);
  }

  /** @internal Whether this job's stream can carry `feature` (e.g. "ack.enqueue"). */
  _supports(feature: string): boolean {
    return this.#settler.supports(feature);
  }

  /** @internal The handler settled it in SQL: nothing to send, no more extensions. */
  _settledElsewhere(): void {
    this._stopKeeping();
    this.#settled = true;
  }

  /** @internal nack() without a promise. */
  _nack(error: string, opts: NackOptions, w: SettleWaiter): void {
    this._stopKeeping();
    this.#settled = true;
    this.#settler.nack(this, error, opts, w);
  }

  /**
   * The job is done: the broker removes it. `enqueue`: follow-up jobs,
   * inserted in the ack's transaction (they exist if and only if the ack
   * committed); resolves to their ids, in order. Follow-ups reject with
   * UNIMPLEMENTED, nothing sent and the job still held, when the broker did
   * not list "ack.enqueue" in the stream's first heartbeat (an older broker
   * would ack and drop them). `result`: the job's result (see Ack),
   * likewise refused without "ack.result".
   */
  ack(opts: { enqueue?: readonly EnqueueJob[]; result?: Buffer | Uint8Array | string } = {}): Promise<string[]> {
    const jobs = opts.enqueue ?? [];
    if (jobs.length > 0 && !this._supports(ACK_ENQUEUE)) {
      return Promise.reject(new LeaseqError(grpcStatus.UNIMPLEMENTED, NO_ACK_ENQUEUE));
    }
    const result = resultBytes(opts.result);
    if (result && !this._supports(ACK_RESULT)) {
      return Promise.reject(new LeaseqError(grpcStatus.UNIMPLEMENTED, NO_ACK_RESULT));
    }
    const extra: AckExtra | null = jobs.length > 0 || result ? {} : null;
    if (extra && jobs.length > 0) extra.enqueue = jobs.map((j) => enqueueRequest(j, true));
    if (extra && result) extra.result = result;
    return new Promise((resolve, reject) => this._ack(new PromiseWaiter(resolve, reject, pickEnqueued), extra));
  }

  /**
   * The attempt failed: the job is retried (after `retryAfterMs`, or the
   * queue's backoff) or, on its last attempt or with `deadLetter`, moved to
   * the dead letters. Resolves to true when it was dead-lettered.
   */
  nack(error: unknown = '', opts: NackOptions = {}): Promise<boolean> {
    const text = errorText(error);
    return new Promise((resolve, reject) => this._nack(text, opts, new PromiseWaiter(resolve, reject, pickDeadLettered)));
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
  extendLease(leaseMs: number): Promise<Date> {
    return new Promise<Date>((resolve, reject) =>
      this.#settler.extend(this, leaseMs, new PromiseWaiter(resolve, reject, (_dl, expires) => expires ?? new Date(Date.now() + leaseMs))),
    ).then((expires) => {
      this.leaseExpiresAt = expires;
      return expires;
    });
  }

  /** @internal Stops extending the lease (settled, or the stream ended). */
  _stopKeeping(): void {
    if (this._keeper) this._keeper.delete(this);
  }
}
