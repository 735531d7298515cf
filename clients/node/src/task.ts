// A task: a queue whose payloads are JSON of one type, declared once with
// its handler, so the producer (task.enqueue) and the worker
// (worker.register) agree on the payload's type, as Celery's task.delay()
// and BullMQ's queue.add do.

import type { Client, EnqueueOptions, EnqueueResult } from './client';
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

  /** Enqueues every payload as JSON, atomically (all or none). */
  enqueueMany(client: Client, payloads: T[], opts: EnqueueOptions = {}): Promise<EnqueueResult[]> {
    const headers = { 'content-type': 'application/json', ...opts.headers };
    return client.enqueueBatch(payloads.map((p) => ({ ...opts, headers, queue: this.queue, payload: JSON.stringify(p) })));
  }
}

/** A Task (see there). */
export function defineTask<T>(queue: string, handler: TaskHandler<T>, options?: HandlerOptions): Task<T> {
  return new Task<T>(queue, handler, options);
}
