// leaseq.v1.AdminService: queues, jobs, dead letters. Needs a token with
// `admin` on `*` when the broker runs with --auth-file.

import * as grpc from '@grpc/grpc-js';
import { Client, type ClientOptions } from './client';
import { Connection } from './connection';
import { AdminService, duration, toDate, toMs, type PbTime } from './proto';

export interface QueueSettings {
  /** Lease given to deliveries when the stream does not ask for one. */
  defaultLeaseMs: number | null;
  maxAttempts: number;
  backoffBaseMs: number | null;
  backoffCapMs: number | null;
  /** How long acked jobs are kept; null = not kept. */
  completedRetentionMs: number | null;
  paused: boolean;
  /** 0 = no limit. */
  concurrencyLimit: number;
  /** Jobs per second; 0 = no limit. */
  rateLimit: number;
  rateBurst: number;
}

export interface QueueStats {
  available: number;
  scheduled: number;
  leased: number;
  dead: number;
  /** null when nothing is available. */
  oldestAvailableAgeMs: number | null;
  /** Streams on this queue held by the broker that answered. */
  streams: number;
  consumers: number;
}

export interface QueueInfo {
  name: string;
  settings: QueueSettings;
  stats: QueueStats;
  createdAt: Date | null;
}

/** Only the fields given change. */
export interface QueueUpdate {
  defaultLeaseMs?: number;
  maxAttempts?: number;
  backoffBaseMs?: number;
  backoffCapMs?: number;
  /** 0 clears it. */
  completedRetentionMs?: number;
  paused?: boolean;
  /** Create the queue if it does not exist (instead of NOT_FOUND). */
  create?: boolean;
  /** 0 removes the limit. */
  concurrencyLimit?: number;
  /** 0 removes the limit. */
  rateLimit?: number;
  rateBurst?: number;
}

export type JobState = 'available' | 'scheduled' | 'leased' | 'dead' | 'completed' | 'unspecified';

export interface JobInfo {
  id: string;
  queue: string;
  state: JobState;
  /** Empty in lists unless includePayload was set. */
  payload: Buffer;
  headers: Record<string, string>;
  priority: number;
  /** Deliveries so far. */
  attempt: number;
  /** 0 = the queue's default. */
  maxAttempts: number;
  dedupKey: string;
  enqueuedAt: Date | null;
  runAt: Date | null;
  expiresAt: Date | null;
  lastError: string;
  leasedBy: string;
  leaseExpiresAt: Date | null;
  /** Dead jobs: 'max_attempts', 'nacked' or 'expired'. */
  deadReason: string;
  diedAt: Date | null;
  completedAt: Date | null;
  completedBy: string;
}

export interface Page {
  /** 0 = 100; at most 1000. */
  pageSize?: number;
  /** From a previous response's nextPageToken. */
  pageToken?: string;
}

export interface JobList {
  jobs: JobInfo[];
  /** '' on the last page. */
  nextPageToken: string;
}

/** Dead letters by id (optionally restricted to a queue), or all of a queue. */
export type DeadLettersSelector = { queue?: string; ids: string[] } | { queue: string; all: true };

interface PbQueueInfo {
  name: string;
  settings: Record<string, unknown> & {
    defaultLease: PbTime | null;
    backoffBase: PbTime | null;
    backoffCap: PbTime | null;
    completedRetention: PbTime | null;
  };
  stats: Record<string, unknown> & { oldestAvailableAge: PbTime | null };
  createdAt: PbTime | null;
}

function queueInfo(q: PbQueueInfo): QueueInfo {
  const s = q.settings ?? ({} as PbQueueInfo['settings']);
  const t = q.stats ?? ({} as PbQueueInfo['stats']);
  return {
    name: q.name,
    settings: {
      defaultLeaseMs: toMs(s.defaultLease),
      maxAttempts: Number(s.maxAttempts ?? 0),
      backoffBaseMs: toMs(s.backoffBase),
      backoffCapMs: toMs(s.backoffCap),
      completedRetentionMs: toMs(s.completedRetention),
      paused: !!s.paused,
      concurrencyLimit: Number(s.concurrencyLimit ?? 0),
      rateLimit: Number(s.rateLimit ?? 0),
      rateBurst: Number(s.rateBurst ?? 0),
    },
    stats: {
      available: Number(t.available ?? 0),
      scheduled: Number(t.scheduled ?? 0),
      leased: Number(t.leased ?? 0),
      dead: Number(t.dead ?? 0),
      oldestAvailableAgeMs: toMs(t.oldestAvailableAge),
      streams: Number(t.streams ?? 0),
      consumers: Number(t.consumers ?? 0),
    },
    createdAt: toDate(q.createdAt),
  };
}

function jobState(s: string): JobState {
  const short = s.replace(/^JOB_STATE_/, '').toLowerCase();
  return (['available', 'scheduled', 'leased', 'dead', 'completed'].includes(short) ? short : 'unspecified') as JobState;
}

function jobInfo(j: Record<string, any>): JobInfo {
  return {
    id: j.id,
    queue: j.queue,
    state: jobState(j.state),
    payload: j.payload,
    headers: { ...j.headers },
    priority: j.priority,
    attempt: j.attempt,
    maxAttempts: j.maxAttempts,
    dedupKey: j.dedupKey,
    enqueuedAt: toDate(j.enqueuedAt),
    runAt: toDate(j.runAt),
    expiresAt: toDate(j.expiresAt),
    lastError: j.lastError,
    leasedBy: j.leasedBy,
    leaseExpiresAt: toDate(j.leaseExpiresAt),
    deadReason: j.deadReason,
    diedAt: toDate(j.diedAt),
    completedAt: toDate(j.completedAt),
    completedBy: j.completedBy,
  };
}

function jobList(r: { jobs: Record<string, unknown>[]; nextPageToken: string }): JobList {
  return { jobs: r.jobs.map(jobInfo), nextPageToken: r.nextPageToken };
}

function selector(sel: DeadLettersSelector): Record<string, unknown> {
  if ('all' in sel) return { queue: sel.queue, ids: [], all: !!sel.all };
  return { queue: sel.queue ?? '', ids: sel.ids, all: false };
}

type AnyStub = grpc.Client & Record<string, (...args: unknown[]) => any>;

/**
 * The operator API (every AdminService call). Errors reject with grpc-js's
 * ServiceError: INVALID_ARGUMENT naming the field, NOT_FOUND for an unknown
 * queue or job, PERMISSION_DENIED without the `admin` grant.
 *
 * `new AdminClient(address, options)` opens its own channel;
 * `new AdminClient(client)` shares a Client's (close the Client, not this).
 */
export class AdminClient {
  #stub: AnyStub;
  #conn: Connection | null;
  #callTimeoutMs: number | undefined;

  constructor(address?: string | Client | null, opts: ClientOptions = {}) {
    let conn: Connection;
    if (address instanceof Client) {
      conn = address._conn;
      this.#conn = null;
    } else {
      conn = new Connection(address, { ...opts, channelOptions: { ...opts.options, ...opts.channelOptions } });
      this.#conn = conn;
    }
    this.#callTimeoutMs = opts.callTimeoutMs;
    this.#stub = new AdminService(conn.target, grpc.credentials.createInsecure(), conn.stubOptions()) as unknown as AnyStub;
  }

  #unary<T>(method: string, req: object): Promise<T> {
    return new Promise((resolve, reject) => {
      const opts: grpc.CallOptions = this.#callTimeoutMs != null ? { deadline: Date.now() + this.#callTimeoutMs } : {};
      this.#stub[method](req, opts, (err: grpc.ServiceError | null, resp: T) => (err ? reject(err) : resolve(resp)));
    });
  }

  /** Queues with live statistics, in name order. */
  async listQueues(page: Page = {}): Promise<{ queues: QueueInfo[]; nextPageToken: string }> {
    const r = await this.#unary<{ queues: PbQueueInfo[]; nextPageToken: string }>('ListQueues', {
      pageSize: page.pageSize ?? 0,
      pageToken: page.pageToken ?? '',
    });
    return { queues: r.queues.map(queueInfo), nextPageToken: r.nextPageToken };
  }

  async getQueue(queue: string): Promise<QueueInfo> {
    return queueInfo(await this.#unary<PbQueueInfo>('GetQueue', { queue }));
  }

  /** Changes the settings given (and only those). */
  async updateQueue(queue: string, update: QueueUpdate): Promise<QueueInfo> {
    const req: Record<string, unknown> = { queue, create: !!update.create };
    if (update.defaultLeaseMs != null) req.defaultLease = duration(update.defaultLeaseMs);
    if (update.backoffBaseMs != null) req.backoffBase = duration(update.backoffBaseMs);
    if (update.backoffCapMs != null) req.backoffCap = duration(update.backoffCapMs);
    if (update.completedRetentionMs != null) req.completedRetention = duration(update.completedRetentionMs);
    for (const k of ['maxAttempts', 'paused', 'concurrencyLimit', 'rateLimit', 'rateBurst'] as const) {
      if (update[k] != null) req[k] = update[k];
    }
    return queueInfo(await this.#unary<PbQueueInfo>('UpdateQueue', req));
  }

  async pauseQueue(queue: string): Promise<QueueInfo> {
    return queueInfo(await this.#unary<PbQueueInfo>('PauseQueue', { queue }));
  }

  async resumeQueue(queue: string): Promise<QueueInfo> {
    return queueInfo(await this.#unary<PbQueueInfo>('ResumeQueue', { queue }));
  }

  /** Deletes the queue's waiting jobs and its kept completed jobs. */
  async purgeQueue(queue: string): Promise<{ purged: number; purgedCompleted: number }> {
    const r = await this.#unary<{ purged: string; purgedCompleted: string }>('PurgeQueue', { queue });
    return { purged: Number(r.purged), purgedCompleted: Number(r.purgedCompleted) };
  }

  /** A live, dead or kept completed job, with its payload. */
  async getJob(jobId: string): Promise<JobInfo> {
    return jobInfo(await this.#unary<Record<string, unknown>>('GetJob', { jobId }));
  }

  /** Jobs of a queue (or all queues) in enqueue order; state: default every live job. */
  async listJobs(opts: Page & { queue?: string; state?: JobState; includePayload?: boolean } = {}): Promise<JobList> {
    return jobList(
      await this.#unary('ListJobs', {
        queue: opts.queue ?? '',
        state: `JOB_STATE_${(opts.state ?? 'unspecified').toUpperCase()}`,
        pageSize: opts.pageSize ?? 0,
        pageToken: opts.pageToken ?? '',
        includePayload: !!opts.includePayload,
      }),
    );
  }

  /** Deletes a live job; its lease holder's settles fail with FAILED_PRECONDITION. */
  async cancelJob(jobId: string): Promise<{ wasLeased: boolean }> {
    const r = await this.#unary<{ wasLeased: boolean }>('CancelJob', { jobId });
    return { wasLeased: r.wasLeased };
  }

  /** Dead letters, in the order they were first enqueued. */
  async listDeadLetters(opts: Page & { queue?: string; includePayload?: boolean } = {}): Promise<JobList> {
    return jobList(
      await this.#unary('ListDeadLetters', {
        queue: opts.queue ?? '',
        pageSize: opts.pageSize ?? 0,
        pageToken: opts.pageToken ?? '',
        includePayload: !!opts.includePayload,
      }),
    );
  }

  /** Moves dead letters back to their queue with attempt 0. */
  async requeueDeadLetters(sel: DeadLettersSelector): Promise<{ requeued: number; skippedDuplicates: number }> {
    const r = await this.#unary<{ requeued: string; skippedDuplicates: string }>('RequeueDeadLetters', selector(sel));
    return { requeued: Number(r.requeued), skippedDuplicates: Number(r.skippedDuplicates) };
  }

  /** Deletes dead letters for good. */
  async purgeDeadLetters(sel: DeadLettersSelector): Promise<{ purged: number }> {
    const r = await this.#unary<{ purged: string }>('PurgeDeadLetters', selector(sel));
    return { purged: Number(r.purged) };
  }

  /**
   * Queue statistics pushed at once, then whenever counts change and at
   * least every intervalMs; ends when `signal` aborts or the loop is left.
   */
  async *watchQueues(opts: { queues?: string[]; intervalMs?: number; signal?: AbortSignal } = {}): AsyncGenerator<{ queues: QueueInfo[]; sentAt: Date | null }> {
    const req: Record<string, unknown> = { queues: opts.queues ?? [] };
    if (opts.intervalMs != null) req.interval = duration(opts.intervalMs);
    const call = this.#stub.WatchQueues(req) as grpc.ClientReadableStream<{ queues: PbQueueInfo[]; sentAt: PbTime | null }>;
    const onAbort = () => call.cancel();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (opts.signal?.aborted) return;
      for await (const msg of call) {
        yield { queues: msg.queues.map(queueInfo), sentAt: toDate(msg.sentAt) };
      }
    } catch (e) {
      // Our own cancel ends the loop quietly.
      if ((e as grpc.ServiceError).code !== grpc.status.CANCELLED || !opts.signal?.aborted) throw e;
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      call.cancel();
    }
  }

  /** Closes the channel, if this AdminClient opened it. */
  close(): void {
    this.#conn?.close();
  }
}
