// The worker: handlers per queue, `concurrency` of them at once on a
// stream whose credit is `prefetch` (at least that), a timeout per job,
// leases kept while jobs wait or run, outcomes settled on the stream,
// graceful stop.

import { EventEmitter } from 'node:events';
import { status } from '@grpc/grpc-js';
import type { Client } from './client';
import { Consumer, loggerOf, type Logger, type StreamOptions } from './consumer';
import { enqueueRequest } from './client';
import { ACK_ENQUEUE, ACK_RESULT, Ack, ackOf, asLeaseqError, errorText, JobCancelledError, JobTimeoutError, LeaseqError, outcomeOf, type Retry } from './errors';
import { LeaseKeeper, type AckExtra, type Job, type NackOptions, type SettleWaiter } from './job';
import type { Cancelled, Protocol } from './session';
import type { Task } from './task';
import { DueSet } from './timers';
import { NOOP_SPAN, startJobSpan, type JobSpan } from './tracing';

/** What a handler gets besides the job. */
export interface HandlerContext {
  /**
   * Aborts when the job's timeout runs out (reason: JobTimeoutError; the job
   * is nacked at that moment), when its lease is lost (LeaseLostError),
   * when the broker says the job was cancelled (JobCancelledError: the job
   * is gone, nothing is settled), or when the worker's stop grace runs out.
   * A handler should stop then: JavaScript cannot cancel it, and its result
   * no longer counts.
   */
  signal: AbortSignal;
}

/**
 * A job handler. Resolving acks the job, unless it resolves to a Retry or
 * DeadLetter, which settle as such (as they do when thrown), or to an Ack
 * (follow-up jobs with the ack, or `Ack.settledInSql()`). Any other error
 * nacks the job with the error's message (the next attempt's `lastError`),
 * retried after the queue's backoff.
 */
export type Handler<T = unknown> = (job: Job<T>, ctx: HandlerContext) => unknown;

/**
 * Runs around every handler of a worker (worker.use): logging, metrics, an
 * error policy. Call `next()` to run the handler (and the middleware after
 * this one) and return (or await) its result; what the middleware returns
 * or throws is the job's outcome, as a handler's is.
 */
export type Middleware = (job: Job, ctx: HandlerContext, next: () => unknown) => unknown;

export interface HandlerOptions {
  /** This queue's timeout per job in ms (overrides the worker's); null = none. */
  timeoutMs?: number | null;
}

export interface WorkerOptions extends StreamOptions {
  /** Handlers running at once, at most. Default 16 (DEFAULT_CONCURRENCY). */
  concurrency?: number;
  /** Alias of concurrency, from before `prefetch` (concurrency wins when both are given). */
  maxInFlight?: number;
  /**
   * The stream's credit: jobs delivered and not yet settled, at most; an
   * integer of at least `concurrency`. Default: `concurrency`. Jobs
   * delivered beyond the running handlers wait in the worker for a slot,
   * their leases kept; a larger prefetch hides the round trip between a
   * handler's ack and the next delivery (RabbitMQ's prefetch beside a
   * consumer's concurrency). The broker refuses more than its limit
   * (10000) per stream.
   */
  prefetch?: number;
  /** On stop, how long running handlers get to finish. Default 30000. */
  graceMs?: number;
  /** Timeout per job in ms, for every queue without its own; default none. */
  timeoutMs?: number | null;
  /** Handlers by queue name (or call handle()). */
  handlers?: Record<string, Handler>;
  /**
   * Burst mode: work what is waiting, then stop. run() resolves once the
   * stream is up and no job was delivered or running for burstIdleMs.
   */
  burst?: boolean;
  /** Burst mode: how long without work means the queues are drained. Default 500. */
  burstIdleMs?: number;
}

/** How a job ended, as the worker's 'job' event reports it. */
export type JobOutcome =
  | 'ack' // handler succeeded, acked
  | 'nack' // handler threw: retried with the queue's backoff (or dead-lettered on its last attempt)
  | 'retry' // Retry outcome
  | 'dead-letter' // DeadLetter outcome
  | 'timeout' // the timeout ran out: nacked
  | 'lease-lost' // the lease was lost: not settled by this worker
  | 'cancelled' // the job was cancelled (CancelJob): its handler aborted or never started, nothing settled
  | 'settled-in-sql' // the handler acked (or nacked) it in SQL (Ack.settledInSql()): nothing sent
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
  /** An ack with follow-up jobs (Ack): their ids, in order. */
  enqueued?: string[];
  /** From the start of the handler (0 if it never ran). */
  durationMs: number;
}

/**
 * Counts of a worker's jobs since it was built (Worker.stats, a snapshot).
 * Each job counts once by how it ended, as its 'job' event reports it
 * (acked ... settleFailed); timedOut and deadLettered count beside that.
 */
export interface WorkerStats {
  /** Jobs delivered to this worker (started or not). */
  delivered: number;
  /** Acks the broker confirmed. */
  acked: number;
  /** Nacks the broker confirmed: handler errors, Retry, DeadLetter, timeouts. */
  nacked: number;
  /** Of those, the jobs moved to the dead letters. */
  deadLettered: number;
  /** Handlers whose timeout ran out (their jobs nacked). */
  timedOut: number;
  /** Jobs whose lease was lost (an extension or a settle refused). */
  leaseLost: number;
  /** Jobs the broker said were cancelled (CancelJob): aborted or never started, not settled. */
  cancelled: number;
  /** Jobs left unsettled by a stop (released when the stream closed). */
  abandoned: number;
  /** Settles that failed other than by a lost lease. */
  settleFailed: number;
  /** Follow-up jobs (Ack) enqueued with their jobs' acks. */
  followUps: number;
  /** Jobs nacked instead of acked with follow-ups: the broker did not list "ack.enqueue" (or the handler also settled in SQL). */
  followUpsRefused: number;
  /** Jobs nacked instead of acked with a result: the broker did not list "ack.result". */
  resultsRefused: number;
  /** Jobs their handlers settled in SQL (Ack.settledInSql()): nothing sent. */
  settledInSql: number;
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
 * Handlers at once, and the stream's credit, unless `concurrency` (and
 * `prefetch`) say otherwise: 16 in every leaseq SDK (Rust, Python, Go
 * too). It is the credit a bare Subscribe gets by default, and handlers
 * mostly wait on I/O, where one at a time leaves the worker idle at every
 * round trip. A handler that must not run beside itself asks for
 * `concurrency: 1`.
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
  /** The stream's credit: at least `concurrency`. */
  readonly prefetch: number;
  readonly graceMs: number;
  readonly leaseMs: number;
  #client: Client;
  #routes = new Map<string, Route>();
  #defaultTimeoutMs: number | null;
  #streamOpts: StreamOptions;
  #log: Required<Logger>;
  #consumer: Consumer | null = null;
  // Handlers at once, at most `concurrency`. Credit alone would not bound
  // them: it is `prefetch`, which may be larger, and after a reconnect the
  // new stream has full credit while handlers of the old stream (whose
  // jobs the broker already released) may still be running. Deliveries
  // wait in #waiting, their leases kept meanwhile.
  #free: number;
  #waiting: JobRun[] = [];
  #pumping = false;
  // Handlers running now (for the stop grace's abort).
  #running = new Set<JobRun>();
  // Jobs taken and not finished (waiting, running or settling): what a
  // stop waits for.
  #live = 0;
  #idle: (() => void) | null = null;
  // One timer for every job's lease, one per timeout length for the
  // handlers' timeouts: no timer per job.
  #keeper: LeaseKeeper;
  #timeouts = new Map<number, DueSet<JobRun>>();
  #stopping = false;
  #signalStop: () => void = () => {};
  #stopped: Promise<void>;
  #run: Promise<void> | null = null;
  #cleanups = new Set<() => void>();
  #middleware: Middleware[] = [];
  #burstIdleMs: number | null;
  #lastWorkAt = 0;
  // Cancels that found no waiting or running job (see #cancelled).
  #cancelledKeys = new Set<string>();
  #stats: WorkerStats = {
    delivered: 0, acked: 0, nacked: 0, deadLettered: 0, timedOut: 0, leaseLost: 0, cancelled: 0, abandoned: 0, settleFailed: 0,
    followUps: 0, followUpsRefused: 0, resultsRefused: 0, settledInSql: 0,
  };

  constructor(client: Client, opts?: WorkerOptions);
  /** One handler for every queue of `queues`. */
  constructor(client: Client, queues: string[], handler: Handler, opts?: WorkerOptions);
  constructor(client: Client, a?: WorkerOptions | string[], b?: Handler, c?: WorkerOptions) {
    super();
    const opts: WorkerOptions = (Array.isArray(a) ? c : a) ?? {};
    const { concurrency, maxInFlight, prefetch, graceMs = 30000, timeoutMs = null, handlers, burst = false, burstIdleMs = 500, ...streamOpts } = opts;
    const n = concurrency ?? maxInFlight ?? DEFAULT_CONCURRENCY;
    const nName = concurrency === undefined && maxInFlight !== undefined ? 'maxInFlight' : 'concurrency';
    if (!(Number.isInteger(n) && n >= 1)) throw new RangeError(`${nName}: must be an integer of at least 1, not ${n}`);
    const credit = prefetch ?? n;
    if (!(Number.isInteger(credit) && credit >= n)) {
      throw new RangeError(`prefetch: must be an integer of at least ${nName} (${n}), not ${credit}`);
    }
    this.#client = client;
    this.concurrency = n;
    this.prefetch = credit;
    this.graceMs = graceMs;
    this.leaseMs = streamOpts.leaseMs ?? 30000;
    this.#defaultTimeoutMs = timeoutMs;
    this.#streamOpts = streamOpts;
    this.#log = loggerOf(streamOpts.log);
    this.#free = n;
    this.#burstIdleMs = burst ? burstIdleMs : null;
    this.#keeper = new LeaseKeeper(
      this.leaseMs,
      (job, err) => this.#leaseLost(job, err),
      (m) => this.#log.warn(m),
    );
    this.#stopped = new Promise((resolve) => (this.#signalStop = resolve));
    if (Array.isArray(a)) {
      if (typeof b !== 'function') throw new TypeError('handler: expected a function');
      for (const q of a) this.handle(q, b);
    }
    for (const [q, h] of Object.entries(handlers ?? {})) this.handle(q, h);
  }

  /** Registers the handler of `queue` (before run()). */
  handle<T = unknown>(queue: string, handler: Handler<T>, opts: HandlerOptions = {}): this {
    if (this.#run) throw new Error('handle(): the worker is already running');
    if (typeof handler !== 'function') throw new TypeError('handler: expected a function');
    this.#routes.set(queue, {
      handler: handler as Handler,
      timeoutMs: opts.timeoutMs !== undefined ? opts.timeoutMs : this.#defaultTimeoutMs,
    });
    return this;
  }

  /** Registers a task's handler for its queue (see defineTask). */
  register<T>(task: Task<T>): this {
    const { handler } = task;
    // A resolved value (not undefined, not an Ack or an outcome) is the job's JSON result.
    return this.handle<T>(task.queue, async (job, ctx) => taskResult(await handler(job.json(), job, ctx)), task.options);
  }

  /**
   * Adds a middleware around every handler (before run()); the first added
   * runs outermost. A worker without middleware calls its handlers directly.
   */
  use(middleware: Middleware): this {
    if (this.#run) throw new Error('use(): the worker is already running');
    if (typeof middleware !== 'function') throw new TypeError('middleware: expected a function');
    this.#middleware.push(middleware);
    return this;
  }

  /** The current stream's protocol: 'consume' (settles on the stream) or 'subscribe'. */
  get protocol(): Protocol | null {
    return this.#consumer?.protocol ?? null;
  }

  /**
   * What the broker said it understands (its first heartbeat's features,
   * e.g. "deliveries"; empty from a broker before them), or null before
   * the first stream is up.
   */
  get features(): readonly string[] | null {
    return this.#consumer?.features ?? null;
  }

  /** A snapshot of the worker's counters (see WorkerStats). */
  get stats(): WorkerStats {
    return { ...this.#stats };
  }

  /** Handlers running now. */
  get running(): number {
    return this.#running.size;
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
    if (this.#middleware.length > 0) {
      for (const route of this.#routes.values()) route.handler = wrap(this.#middleware, route.handler);
      this.#middleware = [];
    }
    const consumer = new Consumer(
      this.#client._rpc,
      { ...this.#streamOpts, queues: [...this.#routes.keys()], maxInFlight: this.prefetch },
      (job) => this.#take(job),
      (c) => this.#cancelled(c),
    );
    this.#consumer = consumer;
    this.#run = (async () => {
      try {
        await this.#work(consumer);
      } finally {
        this.#keeper.clear();
        for (const t of this.#timeouts.values()) t.clear();
        for (const cleanup of [...this.#cleanups]) cleanup();
      }
    })();
    return this.#run;
  }

  async #work(consumer: Consumer): Promise<void> {
    const consuming = consumer.run();
    let fatal: unknown = null;
    if (this.#burstIdleMs != null) this.#watchBurst(consumer, this.#burstIdleMs);
    await Promise.race([consuming.catch((e) => (fatal = e)), this.#stopped]);
    this.#stopping = true;
    this.#turnAway();
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
    this.#turnAway();
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

  // Waits up to the grace for the jobs taken, then aborts the handlers
  // still running.
  async #finishJobs(): Promise<void> {
    if (this.#live === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const late = await Promise.race([
      this.#whenIdle().then(() => false),
      new Promise<boolean>((resolve) => (timer = setTimeout(resolve, this.graceMs, true))),
    ]);
    clearTimeout(timer);
    if (late) {
      this.#log.warn(`leaseq worker: ${this.#running.size} handler(s) still running after the ${this.graceMs} ms grace; abandoned`);
      const reason = new Error('worker stop grace ran out');
      for (const run of [...this.#running]) this.#abort(run, reason);
      await this.#whenIdle();
    }
  }

  // Burst mode: stop once the stream is up and nothing was delivered or
  // running for idleMs. One timer, checking when work was last seen.
  #watchBurst(consumer: Consumer, idleMs: number): void {
    const check = () => {
      if (this.#stopping) return;
      const quiet = Date.now() - this.#lastWorkAt;
      if (consumer.features !== null && this.#live === 0 && quiet >= idleMs) {
        void this.stop();
        return;
      }
      setTimeout(check, this.#live === 0 && consumer.features !== null ? idleMs - quiet : idleMs);
    };
    this.#lastWorkAt = Date.now();
    setTimeout(check, idleMs);
  }

  #whenIdle(): Promise<void> {
    if (this.#live === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const prev = this.#idle;
      this.#idle = () => {
        prev?.();
        resolve();
      };
    });
  }

  #emit(e: JobEvent): void {
    const st = this.#stats;
    if (e.settleError) st.settleFailed += 1;
    else {
      switch (e.outcome) {
        case 'ack':
          st.acked += 1;
          break;
        case 'nack':
        case 'retry':
        case 'dead-letter':
        case 'timeout':
          st.nacked += 1;
          break;
        case 'lease-lost':
          st.leaseLost += 1;
          break;
        case 'cancelled':
          st.cancelled += 1;
          break;
        case 'abandoned':
          st.abandoned += 1;
          break;
        case 'settled-in-sql':
          st.settledInSql += 1;
          break;
      }
      if (e.enqueued) st.followUps += e.enqueued.length;
      if (e.deadLettered) st.deadLettered += 1;
    }
    try {
      this.emit('job', e);
    } catch (err) {
      this.#log.warn(`leaseq worker: a 'job' listener threw: ${errorText(err)}`);
    }
  }

  // --- a job's path: no promise, timer or AbortController of its own
  // unless its handler asks for one (an async handler's own promise, a
  // signal read) or it has a timeout (its length's shared timer).

  // A delivery: run it now, or when a handler finishes.
  #take(job: Job): void {
    const run = new JobRun(this, job, this.#routes.get(job.queue) ?? null);
    this.#stats.delivered += 1;
    this.#live += 1;
    this.#keeper.add(job);
    this.#waiting.push(run);
    this.#pump();
  }

  // Starts waiting jobs while slots are free. Not re-entered: a handler
  // that finishes at once frees its slot inside the loop, which goes on.
  #pump(): void {
    if (this.#pumping) return;
    this.#pumping = true;
    try {
      while (this.#free > 0 && this.#waiting.length > 0 && !this.#stopping) {
        const run = this.#waiting.shift() as JobRun;
        this.#free -= 1;
        this.#start(run);
      }
    } finally {
      this.#pumping = false;
    }
  }

  // Stopped: waiting jobs never run; released when the stream closes.
  #turnAway(): void {
    for (const run of this.#waiting.splice(0, this.#waiting.length)) {
      run.job._stopKeeping();
      run.state = DONE;
      this.#emit({ job: run.job, outcome: 'abandoned', durationMs: 0 });
      this.#finished();
    }
  }

  #start(run: JobRun): void {
    const { job, route } = run;
    if (!route) {
      // Cannot happen: the stream asks only for routed queues.
      this.#free += 1;
      job._stopKeeping();
      run.state = DONE;
      job._nack(`no handler for queue ${job.queue}`, {}, IGNORE);
      this.#emit({ job, outcome: 'abandoned', durationMs: 0 });
      this.#finished();
      return;
    }
    run.state = RUNNING;
    run.started = Date.now();
    this.#running.add(run);
    if (route.timeoutMs != null) this.#timeoutsOf(route.timeoutMs).add(run);
    const span = startJobSpan(job);
    run.span = span;
    let result: unknown;
    try {
      result = span === NOOP_SPAN ? route.handler(job, run.ctx) : span.run(() => route.handler(job, run.ctx));
    } catch (e) {
      this.#handled(run, false, e);
      return;
    }
    if (result !== null && (typeof result === 'object' || typeof result === 'function') && typeof (result as PromiseLike<unknown>).then === 'function') {
      try {
        (result as PromiseLike<unknown>).then(
          (v) => this.#handled(run, true, v),
          (e) => this.#handled(run, false, e),
        );
      } catch (e) {
        this.#handled(run, false, e);
      }
    } else this.#handled(run, true, result);
  }

  #timeoutsOf(ms: number): DueSet<JobRun> {
    let set = this.#timeouts.get(ms);
    if (!set) {
      set = new DueSet<JobRun>(ms, (run) => this.#abort(run, new JobTimeoutError(ms)));
      this.#timeouts.set(ms, set);
    }
    return set;
  }

  // The handler is no longer ours to wait for: its slot goes back. Also
  // after a timeout, when a handler ignoring its signal may still run: its
  // job is settled and its credit back, so its slot goes too.
  #release(run: JobRun): void {
    this.#running.delete(run);
    if (run.route?.timeoutMs != null) this.#timeouts.get(run.route.timeoutMs)?.delete(run);
    this.#free += 1;
    this.#pump();
  }

  // The handler returned or threw (ok: whether it returned).
  #handled(run: JobRun, ok: boolean, value: unknown): void {
    if (run.state !== RUNNING) return; // aborted meanwhile: its result no longer counts
    run.state = SETTLING;
    this.#release(run);
    const kind = outcomeOf(value);
    if (kind === 'retry') this.#settle(run, 'retry', errorText(value), { retryAfterMs: (value as Retry).after });
    else if (kind === 'dead-letter') this.#settle(run, 'dead-letter', errorText(value), { deadLetter: true });
    else if (ok) this.#ack(run, ackOf(value));
    else this.#settle(run, 'nack', errorText(value), NO_OPTS);
  }

  // A handler's success: a plain ack, one with follow-ups, or nothing to
  // send (settled in SQL).
  #ack(run: JobRun, a: Ack | null): void {
    const { job } = run;
    if (a?.inSql) {
      job._settledElsewhere();
      run.state = DONE;
      if (a.enqueue.length > 0) {
        // The job is gone already: nothing can carry them now.
        this.#stats.followUpsRefused += 1;
        this.#log.warn(
          `leaseq worker: job ${job.id}: settled in SQL by its handler, which also asked for ${a.enqueue.length} follow-up job(s): not enqueued (enqueue them in that transaction with leaseq.enqueue)`,
        );
      }
      const durationMs = Date.now() - run.started;
      (run.span as JobSpan).end('settled-in-sql');
      this.#emit({ job, outcome: 'settled-in-sql', durationMs });
      this.#finished();
      return;
    }
    if (!a || (a.enqueue.length === 0 && !a.result)) return this.#settle(run, 'ack', undefined, NO_OPTS);
    if (a.enqueue.length > 0 && !job._supports(ACK_ENQUEUE)) {
      // Never an ack without its follow-ups: the job fails, and comes back.
      this.#stats.followUpsRefused += 1;
      const error = `ack.enqueue: the broker did not list "ack.enqueue" in its first heartbeat (it predates follow-up jobs), so the ack and its ${a.enqueue.length} follow-up job(s) could not be sent together; nacked instead`;
      this.#log.warn(`leaseq worker: job ${job.id}: ${error}`);
      return this.#settle(run, 'nack', error, NO_OPTS);
    }
    if (a.result && !job._supports(ACK_RESULT)) {
      // Nor without its result.
      this.#stats.resultsRefused += 1;
      const error = `ack.result: the broker did not list "ack.result" in its first heartbeat (it predates results), so the ack and its ${a.result.length}-byte result could not be sent together; nacked instead`;
      this.#log.warn(`leaseq worker: job ${job.id}: ${error}`);
      return this.#settle(run, 'nack', error, NO_OPTS);
    }
    const extra: AckExtra = {};
    if (a.result) extra.result = a.result;
    if (a.enqueue.length > 0) {
      try {
        extra.enqueue = a.enqueue.map((j) => enqueueRequest(j, true));
      } catch (e) {
        return this.#settle(run, 'nack', `follow-ups: ${errorText(e)}`, NO_OPTS);
      }
    }
    this.#settle(run, 'ack', undefined, NO_OPTS, extra);
  }

  // A timeout, a lost lease or the stop grace, while the handler runs.
  #abort(run: JobRun, reason: unknown): void {
    if (run.state !== RUNNING) return;
    run.state = reason instanceof JobTimeoutError ? SETTLING : DONE;
    this.#release(run);
    run.abort(reason);
    if (reason instanceof JobTimeoutError) {
      this.#stats.timedOut += 1;
      this.#settle(run, 'timeout', reason.message, NO_OPTS);
      return;
    }
    // Cancelled, lease lost, or the stop grace ran out: not ours to settle.
    run.job._stopKeeping();
    const outcome: JobOutcome =
      reason instanceof JobCancelledError ? 'cancelled' : asLeaseqError(reason).code === status.FAILED_PRECONDITION ? 'lease-lost' : 'abandoned';
    const span = run.span as JobSpan;
    span.fail(errorText(reason));
    span.end(outcome);
    this.#emit({ job: run.job, outcome, durationMs: Date.now() - run.started });
    this.#finished();
  }

  // The broker cancelled a job of ours (CancelJob): it is gone and its
  // credit is back. Waiting: it never runs. Running: its signal aborts, its
  // slot goes to the next job, and what the handler returns is dropped.
  // Settling: the settle's refusal is reported as 'cancelled'. Cancels are
  // rare and these lists at most about `prefetch` long: a scan.
  #cancelled(c: Cancelled): void {
    const match = (r: JobRun) => r.job.id === c.jobId && r.job.leaseToken === c.leaseToken;
    const at = this.#waiting.findIndex(match);
    if (at >= 0) {
      const [run] = this.#waiting.splice(at, 1);
      run.job._cancel();
      run.state = DONE;
      this.#log.debug(`leaseq worker: job ${c.jobId}: cancelled before its handler started; dropped`);
      this.#emit({ job: run.job, outcome: 'cancelled', durationMs: 0 });
      this.#finished();
      return;
    }
    for (const run of this.#running) {
      if (match(run)) {
        run.job._cancel();
        this.#log.debug(`leaseq worker: job ${c.jobId}: cancelled; its handler's signal aborts, nothing is settled`);
        this.#abort(run, new JobCancelledError(c.jobId));
        return;
      }
    }
    // Settling: its answer, a refusal, may still be on its way; remembered
    // (a few, only on this rare path) so that it reads as 'cancelled'.
    this.#cancelledKeys.add(`${c.jobId}\n${c.leaseToken}`);
    if (this.#cancelledKeys.size > 1024) this.#cancelledKeys.delete(this.#cancelledKeys.values().next().value as string);
  }

  // The keeper's extension was refused: the lease is gone.
  #leaseLost(job: Job, err: LeaseqError): void {
    this.#log.debug(`leaseq worker: job ${job.id}: lease lost; it will be redelivered`);
    const at = this.#waiting.findIndex((r) => r.job === job);
    if (at >= 0) {
      // Not started yet: it never runs.
      const [run] = this.#waiting.splice(at, 1);
      run.state = DONE;
      this.#emit({ job, outcome: 'lease-lost', durationMs: 0 });
      this.#finished();
      return;
    }
    for (const run of this.#running) {
      if (run.job === job) {
        this.#abort(run, err);
        return;
      }
    }
  }

  #settle(run: JobRun, outcome: JobOutcome, error: string | undefined, opts: NackOptions, extra: AckExtra | null = null): void {
    run.outcome = outcome;
    run.durationMs = Date.now() - run.started;
    const span = run.span as JobSpan;
    if (error !== undefined) {
      span.fail(error);
      run.error = error;
    }
    if (outcome === 'ack') run.job._ack(run, extra);
    else run.job._nack(error as string, opts, run);
  }

  /** @internal The broker answered a settle of `run`. */
  _settled(run: JobRun, deadLettered: boolean, err: LeaseqError | null, enqueued?: readonly string[]): void {
    run.state = DONE;
    const event: JobEvent = { job: run.job, outcome: run.outcome as JobOutcome, durationMs: run.durationMs };
    if (!err && enqueued && enqueued.length > 0) event.enqueued = [...enqueued];
    if (run.outcome !== 'ack') {
      event.error = run.error;
      if (!err) event.deadLettered = deadLettered;
    }
    if (err) {
      if (err.code === status.FAILED_PRECONDITION && this.#cancelledKeys.delete(`${run.job.id}\n${run.job.leaseToken}`)) {
        // The broker cancelled the job while its settle was on the way.
        this.#log.debug(`leaseq worker: job ${run.job.id}: cancelled before its ${run.outcome} was settled`);
        event.outcome = 'cancelled';
        delete event.error;
        delete event.deadLettered;
      } else if (err.code === status.FAILED_PRECONDITION) {
        // The lease was lost (expired, cancelled, or the stream closed): the
        // job is or will be redelivered. Nothing to report.
        this.#log.debug(`leaseq worker: job ${run.job.id}: lease lost before its ${run.outcome} was settled`);
        event.outcome = 'lease-lost';
      } else {
        this.#log.warn(`leaseq worker: job ${run.job.id}: settling failed (${err.message}); it will be redelivered`);
        event.settleError = err;
      }
    }
    (run.span as JobSpan).end(event.outcome);
    this.#emit(event);
    this.#finished();
  }

  #finished(): void {
    this.#live -= 1;
    if (this.#burstIdleMs != null) this.#lastWorkAt = Date.now();
    if (this.#live === 0 && this.#idle) {
      const idle = this.#idle;
      this.#idle = null;
      idle();
    }
  }
}

// The handler inside the middleware, the first one outermost.
function wrap(middleware: Middleware[], handler: Handler): Handler {
  return middleware.reduceRight<Handler>((inner, mw) => (job, ctx) => mw(job, ctx, () => inner(job, ctx)), handler);
}

const WAITING = 0;
const RUNNING = 1;
const SETTLING = 2;
const DONE = 3;
const NO_OPTS: NackOptions = {};
const IGNORE: SettleWaiter = { settleOk: () => {}, settleFailed: () => {} };

/**
 * @internal One job in a worker: waiting for a slot, running, settling,
 * done. It is its own settle waiter; its AbortController is made only when
 * the handler reads its signal, or when it must abort one already read.
 */
class JobRun implements SettleWaiter {
  readonly job: Job;
  readonly route: Route | null;
  state = WAITING;
  started = 0;
  durationMs = 0;
  span: JobSpan | null = null;
  outcome: JobOutcome | null = null;
  error: string | undefined = undefined;
  readonly worker: Worker;
  #controller: AbortController | null = null;
  #reason: unknown = undefined;
  #aborted = false;
  #ctx: HandlerContext | null = null;

  constructor(worker: Worker, job: Job, route: Route | null) {
    this.worker = worker;
    this.job = job;
    this.route = route;
  }

  // What the handler gets: `signal` made when first read.
  get ctx(): HandlerContext {
    return (this.#ctx ??= new Context(this));
  }

  signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#aborted) this.#controller.abort(this.#reason);
    }
    return this.#controller.signal;
  }

  abort(reason: unknown): void {
    this.#aborted = true;
    this.#reason = reason;
    this.#controller?.abort(reason);
  }

  settleOk(deadLettered: boolean, _expires: Date | null, enqueued?: readonly string[]): void {
    this.worker._settled(this, deadLettered, null, enqueued);
  }

  settleFailed(err: LeaseqError): void {
    this.worker._settled(this, false, err);
  }
}

/** A handler's context: the signal, made when first read. */
class Context implements HandlerContext {
  #run: JobRun;

  constructor(run: JobRun) {
    this.#run = run;
  }

  get signal(): AbortSignal {
    return this.#run.signal();
  }
}

// A task handler's resolved value as the worker reads it: undefined, null,
// an Ack and an outcome (Retry, DeadLetter) as they are; anything else the
// job's result in JSON.
function taskResult(v: unknown): unknown {
  if (v === undefined || v === null || ackOf(v) || outcomeOf(v)) return v;
  return new Ack({ result: JSON.stringify(v) });
}
