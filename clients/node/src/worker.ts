// The worker: handlers per queue, concurrency = the stream's credit, a
// timeout per job, leases kept while handlers run, outcomes settled on the
// stream, graceful stop.

import { EventEmitter } from 'node:events';
import { status } from '@grpc/grpc-js';
import type { Client } from './client';
import { Consumer, loggerOf, type Logger, type StreamOptions } from './consumer';
import { asLeaseqError, errorText, JobTimeoutError, LeaseqError, outcomeOf, type Retry } from './errors';
import type { Job } from './job';
import type { Protocol } from './session';
import { startJobSpan } from './tracing';

/** What a handler gets besides the job. */
export interface HandlerContext {
  /**
   * Aborts when the job's timeout runs out (reason: JobTimeoutError; the job
   * is nacked at that moment), when its lease is lost (LeaseLostError), or
   * when the worker's stop grace runs out. A handler should stop then:
   * JavaScript cannot cancel it, and its result no longer counts.
   */
  signal: AbortSignal;
}

/**
 * A job handler. Resolving acks the job, unless it resolves to a Retry or
 * DeadLetter, which settle as such (as they do when thrown). Any other
 * error nacks the job with the error's message (the next attempt's
 * `lastError`), retried after the queue's backoff.
 */
export type Handler = (job: Job, ctx: HandlerContext) => unknown;

export interface HandlerOptions {
  /** This queue's timeout per job in ms (overrides the worker's); null = none. */
  timeoutMs?: number | null;
}

export interface WorkerOptions extends StreamOptions {
  /**
   * Handlers running at once, at most; it is also the stream's credit, so
   * the broker never pushes more unsettled jobs than that. Default 16.
   */
  concurrency?: number;
  /** Alias of concurrency. */
  maxInFlight?: number;
  /** On stop, how long running handlers get to finish. Default 30000. */
  graceMs?: number;
  /** Timeout per job in ms, for every queue without its own; default none. */
  timeoutMs?: number | null;
  /** Handlers by queue name (or call handle()). */
  handlers?: Record<string, Handler>;
}

/** How a job ended, as the worker's 'job' event reports it. */
export type JobOutcome =
  | 'ack' // handler succeeded, acked
  | 'nack' // handler threw: retried with the queue's backoff (or dead-lettered on its last attempt)
  | 'retry' // Retry outcome
  | 'dead-letter' // DeadLetter outcome
  | 'timeout' // the timeout ran out: nacked
  | 'lease-lost' // the lease was lost: not settled by this worker
  | 'abandoned'; // stopped before it ran or before it finished: released when the stream closed

export interface JobEvent {
  job: Job;
  outcome: JobOutcome;
  /** The nack's error text. */
  error?: string;
  /** Nacks: whether the job went to the dead letters. */
  deadLettered?: boolean;
  /** The settle failed other than by a lost lease (after its retries). */
  settleError?: LeaseqError;
  /** From the start of the handler (0 if it never ran). */
  durationMs: number;
}

/** A counting semaphore whose waiters can all be turned away. */
class Slots {
  #free: number;
  #waiters: ((ok: boolean) => void)[] = [];

  constructor(n: number) {
    this.#free = n;
  }

  acquire(): Promise<boolean> {
    if (this.#free > 0) {
      this.#free -= 1;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  release(): void {
    const next = this.#waiters.shift();
    if (next) next(true); // the slot passes straight to the next waiter
    else this.#free += 1;
  }

  turnAway(): void {
    for (const w of this.#waiters.splice(0, this.#waiters.length)) w(false);
  }
}

interface Route {
  handler: Handler;
  timeoutMs: number | null;
}

export interface Worker {
  on(event: 'job', listener: (e: JobEvent) => void): this;
  once(event: 'job', listener: (e: JobEvent) => void): this;
  off(event: 'job', listener: (e: JobEvent) => void): this;
  emit(event: 'job', e: JobEvent): boolean;
}

/**
 * Handlers at once, and the stream's credit, unless `concurrency` says
 * otherwise: 16 in every leaseq SDK (Rust, Python, Go too). It is the
 * credit a bare Subscribe gets by default, and handlers mostly wait on
 * I/O, where one at a time leaves the worker idle at every round trip. A
 * handler that must not run beside itself asks for `concurrency: 1`.
 */
export const DEFAULT_CONCURRENCY = 16;

/**
 * Runs a handler for every job of its queue.
 *
 *     const worker = new Worker(client, { concurrency: 8, timeoutMs: 60000 });
 *     worker.handle('emails', async (job, { signal }) => { ... });
 *     worker.stopOnSignals();           // SIGTERM / SIGINT: graceful stop
 *     await worker.run();
 *
 * Emits 'job' (JobEvent) after each job.
 */
export class Worker extends EventEmitter {
  readonly concurrency: number;
  readonly graceMs: number;
  readonly leaseMs: number;
  #client: Client;
  #routes = new Map<string, Route>();
  #defaultTimeoutMs: number | null;
  #streamOpts: StreamOptions;
  #log: Required<Logger>;
  #slots: Slots;
  #consumer: Consumer | null = null;
  #tasks = new Set<Promise<void>>();
  #aborts = new Set<AbortController>();
  #stopping = false;
  #signalStop: () => void = () => {};
  #stopped: Promise<void>;
  #run: Promise<void> | null = null;
  #cleanups = new Set<() => void>();

  constructor(client: Client, opts?: WorkerOptions);
  /** One handler for every queue of `queues`. */
  constructor(client: Client, queues: string[], handler: Handler, opts?: WorkerOptions);
  constructor(client: Client, a?: WorkerOptions | string[], b?: Handler, c?: WorkerOptions) {
    super();
    const opts: WorkerOptions = (Array.isArray(a) ? c : a) ?? {};
    const { concurrency, maxInFlight, graceMs = 30000, timeoutMs = null, handlers, ...streamOpts } = opts;
    const n = concurrency ?? maxInFlight ?? DEFAULT_CONCURRENCY;
    if (!(Number.isInteger(n) && n >= 1)) throw new RangeError(`concurrency: must be an integer of at least 1, not ${n}`);
    this.#client = client;
    this.concurrency = n;
    this.graceMs = graceMs;
    this.leaseMs = streamOpts.leaseMs ?? 30000;
    this.#defaultTimeoutMs = timeoutMs;
    this.#streamOpts = streamOpts;
    this.#log = loggerOf(streamOpts.log);
    // Bounds running handlers to `concurrency`. Credit alone would not: after
    // a reconnect the new stream has full credit while handlers of the old
    // stream (whose jobs the broker already released) may still be running.
    // Deliveries wait here, their leases kept meanwhile.
    this.#slots = new Slots(n);
    this.#stopped = new Promise((resolve) => (this.#signalStop = resolve));
    if (Array.isArray(a)) {
      if (typeof b !== 'function') throw new TypeError('handler: expected a function');
      for (const q of a) this.handle(q, b);
    }
    for (const [q, h] of Object.entries(handlers ?? {})) this.handle(q, h);
  }

  /** Registers the handler of `queue` (before run()). */
  handle(queue: string, handler: Handler, opts: HandlerOptions = {}): this {
    if (this.#run) throw new Error('handle(): the worker is already running');
    if (typeof handler !== 'function') throw new TypeError('handler: expected a function');
    this.#routes.set(queue, {
      handler,
      timeoutMs: opts.timeoutMs !== undefined ? opts.timeoutMs : this.#defaultTimeoutMs,
    });
    return this;
  }

  /** The current stream's protocol: 'consume' (settles on the stream) or 'subscribe'. */
  get protocol(): Protocol | null {
    return this.#consumer?.protocol ?? null;
  }

  /** Handlers running now. */
  get running(): number {
    return this.#aborts.size;
  }

  /**
   * Works until stop(); resolves once running handlers finished (or the
   * grace ran out), their jobs were settled and the stream was closed.
   * Rejects with the stream's error for statuses retrying cannot fix
   * (FATAL_CODES: a bad queue name, a refused token, ...).
   */
  run(): Promise<void> {
    if (this.#run) throw new Error('run(): the worker is already running');
    if (this.#routes.size === 0) throw new TypeError('run(): no handler registered (worker.handle(queue, handler))');
    const consumer = new Consumer(
      this.#client._rpc,
      { ...this.#streamOpts, queues: [...this.#routes.keys()], maxInFlight: this.concurrency },
      (job) => this.#track(job),
    );
    this.#consumer = consumer;
    this.#run = (async () => {
      try {
        await this.#work(consumer);
      } finally {
        for (const cleanup of [...this.#cleanups]) cleanup();
      }
    })();
    return this.#run;
  }

  async #work(consumer: Consumer): Promise<void> {
    const consuming = consumer.run();
    let fatal: unknown = null;
    await Promise.race([consuming.catch((e) => (fatal = e)), this.#stopped]);
    this.#stopping = true;
    consumer.stop(); // no new jobs; the stream stays open for the settles
    await this.#finishJobs();
    await consumer.close(); // half-close: unsettled jobs are released
    await consuming.catch((e) => (fatal ??= e));
    if (fatal) throw fatal;
  }

  /**
   * Graceful stop: take no new jobs, let running handlers finish within
   * graceMs and settle, then half-close the stream. Resolves when run() has
   * finished. Safe to call more than once.
   */
  stop(): Promise<void> {
    this.#stopping = true;
    this.#slots.turnAway();
    this.#signalStop();
    return this.#run ? this.#run.then(() => {}, () => {}) : Promise.resolve();
  }

  /**
   * stop() on the first of these signals (default SIGTERM and SIGINT).
   * Returns a function that removes the listeners.
   */
  stopOnSignals(signals: NodeJS.Signals[] = ['SIGTERM', 'SIGINT']): () => void {
    const onSignal = () => void this.stop();
    for (const s of signals) process.once(s, onSignal);
    const remove = () => {
      for (const s of signals) process.removeListener(s, onSignal);
      this.#cleanups.delete(remove);
    };
    this.#cleanups.add(remove); // removed when run() ends
    return remove;
  }

  #track(job: Job): void {
    const task = this.#job(job);
    this.#tasks.add(task);
    void task.finally(() => this.#tasks.delete(task));
  }

  // Waits up to the grace for job tasks, then aborts the rest.
  async #finishJobs(): Promise<void> {
    if (this.#tasks.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'late'>((resolve) => (timer = setTimeout(resolve, this.graceMs, 'late')));
    const outcome = await Promise.race([Promise.allSettled([...this.#tasks]), late]);
    clearTimeout(timer);
    if (outcome === 'late') {
      this.#log.warn(`leaseq worker: ${this.#aborts.size} handler(s) still running after the ${this.graceMs} ms grace; abandoned`);
      for (const c of this.#aborts) c.abort(new Error('worker stop grace ran out'));
      await Promise.allSettled([...this.#tasks]);
    }
  }

  #emit(e: JobEvent): void {
    try {
      this.emit('job', e);
    } catch (err) {
      this.#log.warn(`leaseq worker: a 'job' listener threw: ${errorText(err)}`);
    }
  }

  async #job(job: Job): Promise<void> {
    const route = this.#routes.get(job.queue);
    const controller = new AbortController();
    const { signal } = controller;
    job._keepLease(
      this.leaseMs,
      (err) => {
        this.#log.debug(`leaseq worker: job ${job.id}: lease lost; it will be redelivered`);
        controller.abort(err);
      },
      (m) => this.#log.warn(m),
    );
    if (!(await this.#slots.acquire())) {
      // Stopped before it ran: released when the stream closes.
      job._stopKeeping();
      this.#emit({ job, outcome: 'abandoned', durationMs: 0 });
      return;
    }
    if (this.#stopping || signal.aborted || !route) {
      this.#slots.release();
      job._stopKeeping();
      if (!route) {
        // Cannot happen: the stream asks only for routed queues.
        await job.nack(`no handler for queue ${job.queue}`).catch(() => {});
      }
      this.#emit({ job, outcome: signal.aborted ? 'lease-lost' : 'abandoned', durationMs: 0 });
      return;
    }
    this.#aborts.add(controller);
    const started = Date.now();
    const span = startJobSpan(job);
    let timer: NodeJS.Timeout | undefined;
    if (route.timeoutMs != null) {
      const ms = route.timeoutMs;
      timer = setTimeout(() => controller.abort(new JobTimeoutError(ms)), ms);
    }
    type Result = { kind: 'ok'; value: unknown } | { kind: 'error'; error: unknown } | { kind: 'aborted'; reason: unknown };
    const aborted = new Promise<Result>((resolve) => {
      if (signal.aborted) resolve({ kind: 'aborted', reason: signal.reason });
      else signal.addEventListener('abort', () => resolve({ kind: 'aborted', reason: signal.reason }), { once: true });
    });
    let result: Result;
    try {
      const handled = span.run(() =>
        new Promise<unknown>((resolve) => resolve(route.handler(job, { signal }))).then(
          (value): Result => ({ kind: 'ok', value }),
          (error): Result => ({ kind: 'error', error }),
        ),
      );
      result = await Promise.race([handled, aborted]);
    } finally {
      clearTimeout(timer);
      this.#aborts.delete(controller);
      // Also after a timeout, when a handler ignoring its signal may still
      // run: its job is settled and its credit back, so its slot goes too.
      this.#slots.release();
    }
    const durationMs = Date.now() - started;

    let outcome: JobOutcome;
    let error: string | undefined;
    let opts: { retryAfterMs?: number; deadLetter?: boolean } = {};
    if (result.kind === 'aborted') {
      const reason = result.reason;
      job._stopKeeping();
      if (!(reason instanceof JobTimeoutError)) {
        // Lease lost, or the stop grace ran out: not ours to settle.
        const lost = asLeaseqError(reason).code === status.FAILED_PRECONDITION;
        span.fail(errorText(reason));
        span.end(lost ? 'lease-lost' : 'abandoned');
        this.#emit({ job, outcome: lost ? 'lease-lost' : 'abandoned', durationMs });
        return;
      }
      outcome = 'timeout';
      error = reason.message;
    } else {
      const value = result.kind === 'ok' ? result.value : result.error;
      const kind = outcomeOf(value);
      if (kind === 'retry') {
        outcome = 'retry';
        error = errorText(value);
        opts = { retryAfterMs: (value as Retry).after };
      } else if (kind === 'dead-letter') {
        outcome = 'dead-letter';
        error = errorText(value);
        opts = { deadLetter: true };
      } else if (result.kind === 'ok') {
        outcome = 'ack';
      } else {
        outcome = 'nack';
        error = errorText(result.error);
      }
    }
    if (error !== undefined) span.fail(error);
    const event: JobEvent = { job, outcome, durationMs };
    try {
      if (outcome === 'ack') await job.ack();
      else {
        event.error = error;
        event.deadLettered = await job.nack(error, opts);
      }
    } catch (e) {
      const err = asLeaseqError(e);
      if (err.code === status.FAILED_PRECONDITION) {
        // The lease was lost (expired, cancelled, or the stream closed): the
        // job is or will be redelivered. Nothing to report.
        this.#log.debug(`leaseq worker: job ${job.id}: lease lost before its ${outcome} was settled`);
        event.outcome = 'lease-lost';
      } else {
        this.#log.warn(`leaseq worker: job ${job.id}: settling failed (${err.message}); it will be redelivered`);
        event.settleError = err;
      }
    }
    span.end(event.outcome);
    this.#emit(event);
  }
}
