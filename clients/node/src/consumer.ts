// A consuming stream that survives its failures: reconnects with backoff,
// falls back from Consume to Subscribe on a broker without it; and the async
// iterator built on it.

import { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import { LeaseKeeper, type Job } from './job';
import { Backoff, type Rpc } from './rpc';
import { Session, type Cancelled, type Protocol } from './session';

const { status } = grpc;

/** Where warnings go (reconnects, failed lease extensions). `debug` is optional. */
export interface Logger {
  warn(message: string): void;
  debug?(message: string): void;
}

/**
 * Stream failures that retrying cannot fix: bad input or configuration.
 * Anything else (UNAVAILABLE from a drain or an unreachable database, a
 * refused connection, a reset stream) is retried with backoff.
 */
export const FATAL_CODES: ReadonlySet<number> = new Set([
  status.INVALID_ARGUMENT,
  status.UNAUTHENTICATED,
  status.PERMISSION_DENIED,
  status.UNIMPLEMENTED,
  status.NOT_FOUND,
  status.FAILED_PRECONDITION,
  status.OUT_OF_RANGE,
]);

/**
 * Which streaming RPC to consume with. 'auto' (default): Consume, whose
 * settles travel on the stream itself; Subscribe plus AckBatch / unary
 * calls when the broker answers Consume with UNIMPLEMENTED (tried again at
 * each reconnect).
 */
export type ProtocolOption = 'auto' | 'consume' | 'subscribe';

/** The stream's settings, shared by Client.consume() and Worker. */
export interface StreamOptions {
  /** Free-form consumer name (e.g. a pod name), shown in admin views. */
  consumer?: string;
  /** Lease of each delivery in ms (1 s to 12 h). Default 30000. */
  leaseMs?: number;
  /** First reconnect delay; doubles up to backoffMaxMs. Default 100. */
  backoffInitialMs?: number;
  /** Default 10000. */
  backoffMaxMs?: number;
  /**
   * A stream with no message (delivery or heartbeat) for this long is taken
   * for dead and reopened; keep it above the broker's --heartbeat-interval
   * (15 s by default). null disables the check. Default 60000.
   */
  idleTimeoutMs?: number | null;
  protocol?: ProtocolOption;
  /**
   * Ask the broker to pack deliveries that are ready together into one
   * message (`accept: ["deliveries"]`); a broker without batched deliveries
   * sends one delivery a message, which is read as well. Default true;
   * false asks for one delivery a message, as clients before it did.
   */
  batchDeliveries?: boolean;
  /** Default: console (warnings only). */
  log?: Logger;
}

/** @internal */
export interface ConsumerParams extends StreamOptions {
  queues: string[];
  maxInFlight: number;
}

const defaultLog: Logger = { warn: (m) => console.warn(m) };

/** @internal */
export function loggerOf(log: Logger | undefined): Required<Logger> {
  const l = log ?? defaultLog;
  return { warn: (m) => l.warn(m), debug: (m) => l.debug?.(m) };
}

/** @internal The reconnect loop over Sessions. */
export class Consumer {
  readonly params: ConsumerParams;
  readonly leaseMs: number;
  #rpc: Rpc;
  #log: Required<Logger>;
  #backoff: Backoff;
  #onDelivery: (job: Job) => void;
  #onCancelled: (c: Cancelled) => void;
  #stopped = false;
  #session: Session | null = null;
  #wake: (() => void) | null = null;
  #protocol: Protocol | null = null;
  #features: readonly string[] | null = null;

  constructor(rpc: Rpc, params: ConsumerParams, onDelivery: (job: Job) => void, onCancelled: (c: Cancelled) => void = () => {}) {
    if (!Array.isArray(params.queues) || params.queues.length === 0) throw new TypeError('queues: expected at least one queue name');
    if (!(Number.isInteger(params.maxInFlight) && params.maxInFlight >= 1)) {
      throw new RangeError(`maxInFlight: must be an integer of at least 1, not ${params.maxInFlight}`);
    }
    this.#rpc = rpc;
    this.params = params;
    this.leaseMs = params.leaseMs ?? 30000;
    this.#log = loggerOf(params.log);
    this.#backoff = new Backoff(params.backoffInitialMs ?? 100, params.backoffMaxMs ?? 10000);
    this.#onDelivery = onDelivery;
    this.#onCancelled = onCancelled;
  }

  /** The protocol of the current (or last) stream. */
  get protocol(): Protocol | null {
    return this.#protocol;
  }

  /**
   * What the broker of the current (or last) stream said it understands
   * (its first heartbeat's features; empty from a broker before them), or
   * null before the first stream is up.
   */
  get features(): readonly string[] | null {
    return this.#session?.received ? this.#session.features : this.#features;
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /** Works until close(); rejects with the stream's error for FATAL_CODES. */
  async run(): Promise<void> {
    const choice = this.params.protocol ?? 'auto';
    let protocol: Protocol = choice === 'subscribe' ? 'subscribe' : 'consume';
    while (!this.#stopped) {
      const session = new Session(
        this.#rpc,
        protocol,
        {
          queues: this.params.queues,
          consumer: this.params.consumer ?? '',
          maxInFlight: this.params.maxInFlight,
          leaseMs: this.leaseMs,
          batchDeliveries: this.params.batchDeliveries ?? true,
        },
        this.params.idleTimeoutMs === undefined ? 60000 : this.params.idleTimeoutMs,
        {
          delivery: (job) => {
            // After stop() deliveries are left alone: the close releases them.
            if (!this.#stopped) this.#onDelivery(job);
          },
          // Also after stop(): handlers still running must hear of it.
          cancelled: (c) => this.#onCancelled(c),
          // The broker's first message is a heartbeat sent once the stream
          // is registered: the stream is up.
          message: () => this.#backoff.reset(),
          warn: (m) => this.#log.warn(m),
        },
      );
      this.#session = session;
      this.#protocol = protocol;
      const err = await session.ended;
      if (session.received) this.#features = session.features;
      this.#session = null;
      if (this.#stopped) break;
      if (err && err.code === status.UNIMPLEMENTED && protocol === 'consume' && choice === 'auto' && !session.received) {
        this.#log.debug('leaseq: the broker does not serve Consume; consuming with Subscribe and AckBatch');
        protocol = 'subscribe';
        continue;
      }
      if (err && FATAL_CODES.has(err.code)) throw err;
      this.#log.warn(`leaseq: ${protocol} stream ${err ? `failed (${err.code}: ${err.details})` : 'ended'}; reconnecting`);
      if (choice === 'auto') protocol = 'consume'; // the broker may have been upgraded
      await this.#pause(this.#backoff.delay());
    }
  }

  // Sleeps, waking early if close() is called.
  #pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() {
        clearTimeout(timer);
        self.#wake = null;
        resolve();
      }
      this.#wake = done;
    });
  }

  /** Takes no new jobs from now on; the stream stays open for settles. */
  stop(): void {
    this.#stopped = true;
    this.#wake?.();
  }

  /**
   * stop(), then ends the stream gracefully: answers to settles already
   * sent are awaited, then a Consume stream is half-closed (a Subscribe one
   * cancelled); the broker releases the jobs left unsettled.
   */
  async close(timeoutMs?: number): Promise<void> {
    this.stop();
    await this.#session?.close(timeoutMs);
  }

  /** Ends the stream at once. */
  cancel(): void {
    this.stop();
    this.#session?.cancel();
  }
}

/** What JobStream's 'cancelled' event carries. */
export interface JobCancelled extends Cancelled {
  /** The Job, if the stream still held it (unsettled, its lease kept, or buffered); else null. */
  job: Job | null;
}

export interface JobStream {
  on(event: 'cancelled', listener: (c: JobCancelled) => void): this;
  once(event: 'cancelled', listener: (c: JobCancelled) => void): this;
  off(event: 'cancelled', listener: (c: JobCancelled) => void): this;
  emit(event: 'cancelled', c: JobCancelled): boolean;
}

/** Client.consume()'s options. */
export interface ConsumeOptions extends StreamOptions {
  /** One or more queue names, served fairly. */
  queues: string[];
  /** Credits: jobs delivered and not yet settled, at most. Default 16. */
  maxInFlight?: number;
  /** Keep leases of jobs not yet settled extended (every leaseMs / 2). Default true. */
  autoExtend?: boolean;
  /** Ends the iteration (gracefully, as `break` would) when aborted. */
  signal?: AbortSignal;
}

/**
 * The jobs of a consuming stream, as an async iterator:
 *
 *     for await (const job of client.consume({ queues: ['emails'] })) {
 *       await job.ack();
 *     }
 *
 * At most `maxInFlight` jobs are delivered and unsettled at once (the
 * broker waits for settles before it sends more). Leaving the loop (break,
 * return, throw) or close() ends the stream gracefully: settles already
 * made are confirmed, and jobs not settled are released to other consumers.
 * The stream reconnects by itself; the loop throws only for errors retrying
 * cannot fix (FATAL_CODES).
 *
 * Emits 'cancelled' (JobCancelled) when the broker says a job this stream
 * holds was cancelled (AdminService.CancelJob): the job is gone, its credit
 * is back, and a settle of it is refused (LeaseLostError). Its Job's
 * `cancelled` turns true and its lease is no longer extended; a job still
 * buffered (not yet taken by the loop) never reaches the loop.
 */
export class JobStream extends EventEmitter implements AsyncIterableIterator<Job> {
  #consumer: Consumer;
  #keeper: LeaseKeeper | null;
  #buffer: Job[] = [];
  #waiters: { resolve: (r: IteratorResult<Job>) => void; reject: (e: unknown) => void }[] = [];
  #running: Promise<void> | null = null;
  #error: unknown = null;
  #done = false;
  #closing: Promise<void> | null = null;

  /** @internal */
  constructor(rpc: Rpc, opts: ConsumeOptions) {
    super();
    const { maxInFlight = 16, autoExtend = true, signal, ...rest } = opts ?? ({} as ConsumeOptions);
    this.#consumer = new Consumer(rpc, { ...rest, maxInFlight }, (job) => this.#push(job), (c) => this.#cancelled(c));
    const log = loggerOf(opts.log);
    // One timer extends every unsettled job's lease (a settle stops it).
    this.#keeper = autoExtend ? new LeaseKeeper(this.#consumer.leaseMs, () => {}, (m) => log.warn(m)) : null;
    if (signal) {
      if (signal.aborted) this.#done = true;
      else signal.addEventListener('abort', () => void this.close(), { once: true });
    }
  }

  /** The current stream's protocol: 'consume' (settles on the stream) or 'subscribe'. */
  get protocol(): Protocol | null {
    return this.#consumer.protocol;
  }

  /** What the broker said it understands (see Consumer.features); null before the stream is up. */
  get features(): readonly string[] | null {
    return this.#consumer.features;
  }

  #push(job: Job): void {
    this.#keeper?.add(job);
    const w = this.#waiters.shift();
    if (w) w.resolve({ value: job, done: false });
    else this.#buffer.push(job);
  }

  #cancelled(c: Cancelled): void {
    const match = (j: Job) => j.id === c.jobId && j.leaseToken === c.leaseToken;
    let job = this.#keeper?.find(c.jobId, c.leaseToken);
    const at = this.#buffer.findIndex(match);
    if (at >= 0) job = this.#buffer.splice(at, 1)[0];
    job?._cancel();
    this.emit('cancelled', { jobId: c.jobId, leaseToken: c.leaseToken, job: job ?? null } satisfies JobCancelled);
  }

  #start(): void {
    if (this.#running) return;
    this.#running = this.#consumer.run().then(
      () => this.#finish(null),
      (e) => this.#finish(e),
    );
  }

  #finish(err: unknown): void {
    this.#done = true;
    this.#error = err;
    this.#keeper?.clear();
    const waiters = this.#waiters.splice(0, this.#waiters.length);
    for (const w of waiters) {
      if (this.#error) {
        w.reject(this.#error);
        this.#error = null;
      } else w.resolve({ value: undefined, done: true });
    }
  }

  next(): Promise<IteratorResult<Job>> {
    const job = this.#buffer.shift();
    if (job) return Promise.resolve({ value: job, done: false });
    if (this.#done) {
      if (this.#error) {
        const e = this.#error;
        this.#error = null;
        return Promise.reject(e);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    this.#start();
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }

  async return(): Promise<IteratorResult<Job>> {
    await this.close();
    return { value: undefined, done: true };
  }

  /** Ends the stream gracefully (see the class); safe to call more than once. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      // Buffered jobs were never seen by the loop: released with the stream.
      this.#buffer.length = 0;
      await this.#consumer.close();
      if (this.#running) await this.#running;
      this.#finish(null);
    })();
    return this.#closing;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
