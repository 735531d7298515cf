// A task: a queue whose payloads are JSON of one type, declared once with
// its handler, so the producer (task.enqueue) and the worker
// (worker.register) agree on the payload's type, as Celery's task.delay()
// and BullMQ's queue.add do.

import type { Client, EnqueueOptions, EnqueueResult, WaitResult } from './client';
import type { Job } from './job';
import type { HandlerContext, HandlerOptions } from './worker';

/** A task's handler: the payload parsed from JSON, and the job. */
export type TaskHandler<T> = (payload: T, job: Job<T>, ctx: HandlerContext) => unknown;

/**
 * A queue of JSON payloads of type T with its handler:
 *
 *     const sendEmail = defineTask<{ to: string }>('emails', async ({ to }) => { ... });
 *     await sendEmail.enqueue(client, { to: 'ada@example.com' });   // producer
 *     new Worker(client).register(sendEmail);                       // worker
 */
export class Task<T = unknown> {
  readonly queue: string;
  readonly handler: TaskHandler<T>;
  readonly options: HandlerOptions;

  constructor(queue: string, handler: TaskHandler<T>, options: HandlerOptions = {}) {
    if (typeof handler !== 'function') throw new TypeError('handler: expected a function');
    this.queue = queue;
    this.handler = handler;
    this.options = options;
  }

  /** Enqueues `payload` as JSON (content-type application/json). */
  enqueue(client: Client, payload: T, opts: EnqueueOptions = {}): Promise<EnqueueResult> {
    return client.enqueue(this.queue, JSON.stringify(payload), { ...opts, headers: { 'content-type': 'application/json', ...opts.headers } });
  }

  /**
   * Enqueues `payload` (as enqueue) and resolves to a JobHandle to wait for
   * the handler's resolved value, its JSON result:
   * `const sum = await (await add.submit(client, { a: 2, b: 3 })).result<number>()`.
   */
  async submit<R = unknown>(client: Client, payload: T, opts: EnqueueOptions = {}): Promise<JobHandle<R>> {
    const r = await this.enqueue(client, payload, opts);
    return new JobHandle<R>(client, r.jobId, r.duplicate);
  }

  /** Enqueues every payload as JSON, atomically (all or none). */
  enqueueMany(client: Client, payloads: T[], opts: EnqueueOptions = {}): Promise<EnqueueResult[]> {
    const headers = { 'content-type': 'application/json', ...opts.headers };
    return client.enqueueBatch(payloads.map((p) => ({ ...opts, headers, queue: this.queue, payload: JSON.stringify(p) })));
  }
}

/**
 * A job enqueued by Task.submit: `result()` waits for its outcome (WaitJob,
 * no polling), as BullMQ's job.waitUntilFinished.
 */
export class JobHandle<R = unknown> {
  constructor(
    readonly client: Client,
    readonly jobId: string,
    readonly duplicate: boolean,
  ) {}

  /** How the job ended (client.wait). */
  wait(timeoutMs?: number): Promise<WaitResult> {
    return this.client.wait(this.jobId, timeoutMs);
  }

  /**
   * Resolves to the handler's result parsed as JSON (undefined when it
   * completed without one); rejects with JobFailedError when the job ended
   * otherwise (dead, cancelled, unknown), DEADLINE_EXCEEDED past timeoutMs.
   */
  async result(timeoutMs?: number): Promise<R | undefined> {
    return (await this.wait(timeoutMs)).value<R>();
  }
}

/** A Task (see there). */
export function defineTask<T>(queue: string, handler: TaskHandler<T>, options?: HandlerOptions): Task<T> {
  return new Task<T>(queue, handler, options);
}
