// Errors and handler outcomes.

import { status } from '@grpc/grpc-js';
import type { EnqueueJob } from './client';

/**
 * A failure reported by the broker for one settle (ack, nack, lease
 * extension) or a call. `code` is the gRPC status code, as on grpc-js's
 * ServiceError (compare with the exported `status`).
 */
export class LeaseqError extends Error {
  readonly code: status;
  readonly details: string;

  constructor(code: status, details: string) {
    super(`${code} ${status[code] ?? 'UNKNOWN'}: ${details}`);
    this.name = 'LeaseqError';
    this.code = code;
    this.details = details;
  }
}

/**
 * The lease token is no longer current (FAILED_PRECONDITION): the lease
 * expired, the stream it came from closed, the job was cancelled, or it was
 * already settled. The job is (or was) delivered again elsewhere.
 */
export class LeaseLostError extends LeaseqError {
  constructor(details = 'the lease is no longer current') {
    super(status.FAILED_PRECONDITION, details);
    this.name = 'LeaseLostError';
  }
}

/** The reason a job's AbortSignal aborts when its timeout runs out. */
export class JobTimeoutError extends Error {
  readonly timeoutMs: number;

  constructor(timeoutMs: number) {
    super(`timeout: the handler did not finish within ${timeoutMs} ms`);
    this.name = 'JobTimeoutError';
    this.timeoutMs = timeoutMs;
  }
}

/**
 * The reason a job's AbortSignal aborts when the broker says the job was
 * cancelled (AdminService.CancelJob): the job is gone, and nothing the
 * handler returns afterwards is settled.
 */
export class JobCancelledError extends Error {
  readonly jobId: string;
  readonly reason = 'cancelled';

  constructor(jobId: string) {
    super(`cancelled: job ${jobId} was cancelled (CancelJob)`);
    this.name = 'JobCancelledError';
    this.jobId = jobId;
  }
}

const OUTCOME = Symbol.for('leaseq.outcome');

/**
 * Outcome: fail this attempt and deliver the job again `after` ms from now
 * (absent: the queue's backoff policy; 0: at once). Throw it or return it
 * from a handler.
 */
export class Retry extends Error {
  /** Milliseconds until the next attempt; undefined = the queue's backoff. */
  readonly after: number | undefined;
  /** @internal */
  readonly [OUTCOME] = 'retry';

  constructor(opts: { after?: number; reason?: string } = {}) {
    super(opts.reason ?? 'retry requested by the handler');
    this.name = 'Retry';
    if (opts.after != null && !(Number.isFinite(opts.after) && opts.after >= 0)) {
      throw new RangeError(`Retry: after must be a number of milliseconds >= 0, not ${opts.after}`);
    }
    this.after = opts.after;
  }
}

/**
 * Outcome: give up on the job now and move it to the dead letters with
 * `reason` as its last error. Throw it or return it from a handler.
 */
export class DeadLetter extends Error {
  /** @internal */
  readonly [OUTCOME] = 'dead-letter';

  constructor(reason = 'dead-lettered by the handler') {
    super(reason);
    this.name = 'DeadLetter';
  }
}

/** The feature a broker lists in a stream's first heartbeat when it takes follow-up jobs with an ack. */
export const ACK_ENQUEUE = 'ack.enqueue';

/** @internal The refusal of follow-up jobs by a broker without "ack.enqueue". */
export const NO_ACK_ENQUEUE =
  'ack.enqueue: the broker did not list "ack.enqueue" in its first heartbeat (it predates follow-up jobs): it cannot enqueue follow-up jobs with an ack';

/** A job waited for with `.result()` did not complete: `outcome` says how it ended. */
export class JobFailedError extends Error {
  readonly outcome: { jobId: string; state: string; lastError: string; deadReason: string };

  constructor(outcome: { jobId: string; state: string; lastError: string; deadReason: string }) {
    const what =
      outcome.state === 'dead'
        ? `is dead (${outcome.deadReason}): ${outcome.lastError}`
        : outcome.state === 'cancelled'
          ? 'was cancelled'
          : 'is unknown (no live job and no record)';
    super(`job ${outcome.jobId} ${what}`);
    this.name = 'JobFailedError';
    this.outcome = outcome;
  }
}

/** ... and when it keeps an ack's result (AckRequest.result). */
export const ACK_RESULT = 'ack.result';

/** @internal The refusal of a result by a broker without "ack.result". */
export const NO_ACK_RESULT =
  'ack.result: the broker did not list "ack.result" in its first heartbeat (it predates results): it would ack the job and drop its result';

/** ... and when it takes progress reports (ConsumeRequest.progress, ReportProgress). */
export const PROGRESS = 'progress';

/** @internal The refusal of a progress report by a broker without "progress". */
export const NO_PROGRESS =
  'progress: the broker did not list "progress" in its first heartbeat (it predates progress reports): nothing was sent';

/** Progress.message's limit, in bytes of UTF-8. */
export const MAX_PROGRESS_MESSAGE = 256;

/** @internal Throws a RangeError naming the field for a report the broker would refuse. */
export function checkProgress(fraction: unknown, message: unknown): void {
  if (typeof fraction !== 'number') throw new RangeError(`fraction: a number from 0 to 1 is needed, not ${typeof fraction}`);
  if (!(fraction >= 0 && fraction <= 1)) throw new RangeError(`fraction: must be 0 to 1, not ${fraction}`);
  if (typeof message !== 'string') throw new RangeError(`message: a string is needed, not ${typeof message}`);
  const n = Buffer.byteLength(message, 'utf8');
  if (n > MAX_PROGRESS_MESSAGE) throw new RangeError(`message: is ${n} bytes, the limit is ${MAX_PROGRESS_MESSAGE} bytes`);
  if (message.includes('\0')) throw new RangeError('message: must not contain NUL');
}

/** @internal A result as bytes (a string as UTF-8); null for none or empty. */
export function resultBytes(r: Buffer | Uint8Array | string | undefined | null): Buffer | null {
  if (r == null) return null;
  if (typeof r === 'string') return r.length > 0 ? Buffer.from(r, 'utf8') : null;
  if (!(r instanceof Uint8Array)) throw new TypeError('result: a Buffer, Uint8Array or string is needed');
  return r.length > 0 ? Buffer.from(r.buffer, r.byteOffset, r.byteLength) : null;
}

/**
 * Outcome: ack the job, and say more than "done". Return it from a handler
 * (resolving to anything else is a plain ack).
 *
 * - `new Ack({ enqueue: [...] })`: follow-up jobs (EnqueueJob, as for
 *   client.enqueueBatch), enqueued in the transaction that acks this one:
 *   they exist if and only if the ack committed. A handler that throws
 *   enqueues none. A broker that did not list "ack.enqueue" in its first
 *   heartbeat would drop them: the worker then nacks the job with an error
 *   saying so (stats.followUpsRefused), never acks it without them. Their
 *   ids come in the 'job' event (JobEvent.enqueued).
 * - `Ack.settledInSql()`: the handler settled the job itself, with
 *   `select leaseq.ack($1, $2)` (job.id, job.leaseToken) or leaseq.nack in
 *   the transaction of its effect, and that transaction committed: the
 *   worker sends nothing and frees the slot (outcome 'settled-in-sql'); the
 *   broker gives the stream's credit back when the commit's NOTIFY reaches
 *   it. Follow-ups cannot go with it (insert them in that transaction with
 *   leaseq.enqueue).
 *
 * - `new Ack({ result })`: the job's result (a Buffer, Uint8Array or
 *   string as UTF-8; at most the broker's --max-result-bytes, 64 KiB by
 *   default), kept with its completed record and read back by
 *   client.wait(jobId) and AdminClient.getJob (JobInfo.result). A broker
 *   that did not list "ack.result" would drop it: the worker then nacks the
 *   job with an error saying so (stats.resultsRefused). It goes with
 *   follow-ups too. A Task handler's resolved value (not undefined, not an
 *   Ack) is sent as a JSON result.
 *
 * A middleware must return what next() returned, or the follow-ups and the
 * result are lost.
 */
export class Ack {
  readonly enqueue: readonly EnqueueJob[];
  readonly inSql: boolean;
  /** The result's bytes; null for none. */
  readonly result: Buffer | null;
  /** @internal */
  readonly [OUTCOME] = 'ack';

  constructor(opts: { enqueue?: readonly EnqueueJob[]; result?: Buffer | Uint8Array | string } = {}) {
    this.enqueue = [...(opts.enqueue ?? [])];
    this.inSql = false;
    this.result = resultBytes(opts.result);
  }

  /** The job was acked (or nacked) in SQL by the handler: send nothing. */
  static settledInSql(): Ack {
    const a = new Ack();
    (a as { inSql: boolean }).inSql = true;
    return a;
  }
}

/** @internal An Ack, also across two copies of this package; null for anything else. */
export function ackOf(x: unknown): Ack | null {
  if (x !== null && typeof x === 'object' && (x as Record<symbol, unknown>)[OUTCOME] === 'ack') return x as Ack;
  return null;
}

/** @internal Retry / DeadLetter, also across two copies of this package. */
export function outcomeOf(x: unknown): 'retry' | 'dead-letter' | null {
  if (x !== null && typeof x === 'object') {
    const o = (x as Record<symbol, unknown>)[OUTCOME];
    if (o === 'retry' || o === 'dead-letter') return o;
  }
  return null;
}

/** @internal The error text a nack carries: the message, NULs replaced, at most 16 Ki characters. */
export function errorText(e: unknown): string {
  let text: string;
  if (e instanceof Error) text = e.message || e.name;
  else if (typeof e === 'string') text = e;
  else {
    try {
      text = String(e);
    } catch {
      text = 'handler failed';
    }
  }
  // eslint-disable-next-line no-control-regex
  text = text.replace(/\u0000/g, '\uFFFD');
  return text.length > 16384 ? `${text.slice(0, 16383)}…` : text;
}

/** @internal A grpc-js ServiceError, or one of ours, as a LeaseqError. */
export function asLeaseqError(e: unknown): LeaseqError {
  if (e instanceof LeaseqError) return e;
  const code = (e as { code?: unknown })?.code;
  const details = (e as { details?: unknown })?.details;
  if (typeof code === 'number') {
    const text = typeof details === 'string' ? details : errorText(e);
    return code === status.FAILED_PRECONDITION ? new LeaseLostError(text) : new LeaseqError(code, text);
  }
  return new LeaseqError(status.UNKNOWN, errorText(e));
}
