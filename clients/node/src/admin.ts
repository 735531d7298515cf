// leaseq.v1.AdminService: queues, jobs, dead letters, schedules. Needs a token with
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
  /**
   * The jobs of one key are delivered in enqueue order, at most
   * keyConcurrency of a key leased at once; a retry keeps its place at the
   * head of its key, a dead letter or a cancel lets the key go on.
   */
  orderedByKey: boolean;
  /**
   * Most jobs of one key leased at once, across replicas; 0 = off. With
   * orderedByKey the first N of the key in order; without, any N.
   */
  keyConcurrency: number;
  /**
   * Fair shares: each lease round serves the keys with jobs waiting in turn
   * (up to a key's weight per turn), so one key's backlog does not delay
   * another key's jobs.
   */
  fairByKey: boolean;
  /** Jobs of one key started per second, across replicas; 0 = no limit. */
  keyRateLimit: number;
  /** Bucket size of keyRateLimit (0 when there is none). */
  keyRateBurst: number;
  /** Named keys' own settings, in key order. */
  keyOverrides: KeyOverride[];
}

/**
 * What one named key of a queue gets instead of the queue's per-key
 * settings. A setting left out (or 0) is the queue's; give at least one.
 * The broker checks the ranges (INVALID_ARGUMENT naming
 * `key_overrides[i].field`).
 */
export interface KeyOverride {
  /** 1 to 256 bytes. */
  key: string;
  /** Most jobs of this key leased at once (1 to 1000). */
  concurrency?: number;
  /** Jobs of this key started per second (0.001 to 1,000,000); its bucket holds max(1, ceil(rateLimit)). */
  rateLimit?: number;
  /** Jobs of this key per turn in a fair round (1 to 100; 0 = 1). */
  weight?: number;
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
  /** Keys with jobs waiting (available or scheduled), counted up to 10,000: keysWaitingCapped then says there are at least that many. */
  keysWaiting: number;
  /** Keys with jobs leased. */
  keysLeased: number;
  keysWaitingCapped: boolean;
}

/** One key of a queue's live jobs (listKeys). */
export interface KeyInfo {
  key: string;
  /** Jobs of the key available or scheduled. */
  waiting: number;
  leased: number;
  /** null when none of its jobs is deliverable. */
  oldestAvailableAgeMs: number | null;
}

export interface KeyList {
  keys: KeyInfo[];
  /** '' on the last page. */
  nextPageToken: string;
}

/** listKeys' order: by key (paged), or the keys with the most jobs waiting first (one page). */
export type KeyOrder = 'key' | 'waiting';

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
  /** Order the jobs of each key (see QueueSettings); true sets keyConcurrency to 1 unless given, false clears it. */
  orderedByKey?: boolean;
  /** 1 to 1000, with or without orderedByKey; 0 clears it. */
  keyConcurrency?: number;
  /** Serve the keys in turn (see QueueSettings). */
  fairByKey?: boolean;
  /** 0.001 to 1,000,000 jobs per second per key; 0 removes it (and its burst). */
  keyRateLimit?: number;
  /** 1 to 1,000,000; 0 = the default, max(1, ceil(keyRateLimit)). */
  keyRateBurst?: number;
  /** Replaces the queue's whole list (at most 1000, keys unique); [] removes them all. */
  keyOverrides?: KeyOverride[];
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
  /** The job's key inside its queue; '' if none. */
  key: string;
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
  /** Completed jobs acked with a result (Ack({ result })): the result; empty otherwise. */
  result: Buffer;
  /** Live jobs whose handler reported progress (job.progress): the latest written report; progressAt null when none was. */
  progress: number;
  progressMessage: string;
  progressAt: Date | null;
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

/** What a tick does while the job of the schedule's previous run is still live: enqueue anyway, or nothing. */
export type OverlapPolicy = 'allow' | 'skip';
/** Ticks no broker fired within its --schedule-grace (all were down): none, the latest, or the latest catchUpLimit. */
export type CatchUpPolicy = 'none' | 'one' | 'all';

/** The job each tick of a schedule enqueues (the rules of an enqueue). */
export interface JobTemplate {
  queue: string;
  /** Bytes, or a string (sent as UTF-8). */
  payload?: Buffer | Uint8Array | string;
  /** At most 62, none starting with `leaseq-schedule` (each job gets `leaseq-schedule` and `leaseq-schedule-tick`). */
  headers?: Record<string, string>;
  priority?: number;
  /** 0 = the queue's default. */
  maxAttempts?: number;
  /** Dead-lettered (expired) if not done this long after its enqueue; 0 or absent = never. */
  ttlMs?: number;
}

/** A schedule's definition (createSchedule). */
export interface ScheduleSpec {
  /** Five fields (minute first) or six (seconds first); names, ranges, steps, L, W, #, @hourly. */
  cron: string;
  /** An IANA zone name (Europe/Paris); default UTC. */
  timeZone?: string;
  job: JobTemplate;
  /** Default 'allow'. */
  overlap?: OverlapPolicy;
  /** Default 'one'. */
  catchUp?: CatchUpPolicy;
  /** With catchUp 'all': 1 to 1000; default 10. */
  catchUpLimit?: number;
  /** Created paused: fires nothing until resumed. */
  paused?: boolean;
}

/** Only the fields given change; a new cron or time zone counts the next tick from now. */
export type ScheduleUpdate = Partial<ScheduleSpec>;

export interface ScheduleInfo {
  name: string;
  cron: string;
  /** 'UTC' unless another zone was given. */
  timeZone: string;
  job: { queue: string; payload: Buffer; headers: Record<string, string>; priority: number; maxAttempts: number; ttlMs: number | null };
  overlap: OverlapPolicy;
  catchUp: CatchUpPolicy;
  catchUpLimit: number;
  paused: boolean;
  /** The next tick (while paused: where it stood). */
  nextRunAt: Date | null;
  /** The last tick that enqueued a job (or runSchedule's time), and that job. */
  lastTickAt: Date | null;
  lastJobId: string;
  createdAt: Date | null;
  updatedAt: Date | null;
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
      orderedByKey: !!s.orderedByKey,
      keyConcurrency: Number(s.keyConcurrency ?? 0),
      fairByKey: !!s.fairByKey,
      keyRateLimit: Number(s.keyRateLimit ?? 0),
      keyRateBurst: Number(s.keyRateBurst ?? 0),
      keyOverrides: ((s.keyOverrides ?? []) as Record<string, unknown>[]).map((o) => {
        const out: KeyOverride = { key: String(o.key) };
        if (o.concurrency) out.concurrency = Number(o.concurrency);
        if (o.rateLimit) out.rateLimit = Number(o.rateLimit);
        if (o.weight) out.weight = Number(o.weight);
        return out;
      }),
    },
    stats: {
      available: Number(t.available ?? 0),
      scheduled: Number(t.scheduled ?? 0),
      leased: Number(t.leased ?? 0),
      dead: Number(t.dead ?? 0),
      oldestAvailableAgeMs: toMs(t.oldestAvailableAge),
      streams: Number(t.streams ?? 0),
      consumers: Number(t.consumers ?? 0),
      keysWaiting: Number(t.keysWaiting ?? 0),
      keysLeased: Number(t.keysLeased ?? 0),
      keysWaitingCapped: !!t.keysWaitingCapped,
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
    key: j.key ?? '',
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
    result: j.result ?? Buffer.alloc(0),
    progress: j.progress ?? 0,
    progressMessage: j.progressMessage ?? '',
    progressAt: toDate(j.progressAt),
  };
}

function jobList(r: { jobs: Record<string, unknown>[]; nextPageToken: string }): JobList {
  return { jobs: r.jobs.map(jobInfo), nextPageToken: r.nextPageToken };
}

function selector(sel: DeadLettersSelector): Record<string, unknown> {
  if ('all' in sel) return { queue: sel.queue, ids: [], all: !!sel.all };
  return { queue: sel.queue ?? '', ids: sel.ids, all: false };
}

const OVERLAP: Record<OverlapPolicy, string> = { allow: 'OVERLAP_POLICY_ALLOW', skip: 'OVERLAP_POLICY_SKIP' };
const CATCH_UP: Record<CatchUpPolicy, string> = { none: 'CATCH_UP_POLICY_NONE', one: 'CATCH_UP_POLICY_ONE', all: 'CATCH_UP_POLICY_ALL' };

function keyOverridesPb(list: KeyOverride[]): Record<string, unknown>[] {
  if (!Array.isArray(list)) throw new TypeError('keyOverrides: expected an array of { key, concurrency?, rateLimit?, weight? }');
  return list.map((o, i) => {
    if (o == null || typeof o.key !== 'string') throw new TypeError(`keyOverrides[${i}].key: expected a string`);
    for (const f of ['concurrency', 'rateLimit', 'weight'] as const) {
      if (o[f] != null && typeof o[f] !== 'number') throw new TypeError(`keyOverrides[${i}].${f}: expected a number`);
    }
    return { key: o.key, concurrency: o.concurrency ?? 0, rateLimit: o.rateLimit ?? 0, weight: o.weight ?? 0 };
  });
}

function enumValue<K extends string>(map: Record<K, string>, v: K, field: string): string {
  const e = map[v];
  if (e === undefined) throw new TypeError(`${field}: expected one of ${Object.keys(map).join(', ')}, not ${JSON.stringify(v)}`);
  return e;
}

function templatePb(t: JobTemplate): Record<string, unknown> {
  const p = t.payload;
  const pb: Record<string, unknown> = {
    queue: t.queue,
    payload: typeof p === 'string' ? Buffer.from(p) : p == null ? Buffer.alloc(0) : Buffer.from(p),
    headers: { ...(t.headers ?? {}) },
    priority: t.priority ?? 0,
    maxAttempts: t.maxAttempts ?? 0,
  };
  if (t.ttlMs != null) pb.ttl = duration(t.ttlMs);
  return pb;
}

interface PbScheduleInfo {
  schedule: Record<string, any>;
  nextRunAt: PbTime | null;
  lastTickAt: PbTime | null;
  lastJobId: string;
  createdAt: PbTime | null;
  updatedAt: PbTime | null;
}

function scheduleInfo(r: PbScheduleInfo): ScheduleInfo {
  const s = r.schedule ?? {};
  const j = s.job ?? {};
  const short = (v: string, prefix: string, dflt: string) => (v && !v.endsWith('UNSPECIFIED') ? v.slice(prefix.length).toLowerCase() : dflt);
  return {
    name: s.name,
    cron: s.cron,
    timeZone: s.timeZone,
    job: {
      queue: j.queue ?? '',
      payload: j.payload ?? Buffer.alloc(0),
      headers: { ...j.headers },
      priority: j.priority ?? 0,
      maxAttempts: j.maxAttempts ?? 0,
      ttlMs: toMs(j.ttl),
    },
    overlap: short(s.overlap, 'OVERLAP_POLICY_', 'allow') as OverlapPolicy,
    catchUp: short(s.catchUp, 'CATCH_UP_POLICY_', 'one') as CatchUpPolicy,
    catchUpLimit: Number(s.catchUpLimit ?? 0),
    paused: !!s.paused,
    nextRunAt: toDate(r.nextRunAt),
    lastTickAt: toDate(r.lastTickAt),
    lastJobId: r.lastJobId,
    createdAt: toDate(r.createdAt),
    updatedAt: toDate(r.updatedAt),
  };
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
    for (const k of ['maxAttempts', 'paused', 'concurrencyLimit', 'rateLimit', 'rateBurst', 'orderedByKey', 'keyConcurrency', 'fairByKey', 'keyRateLimit', 'keyRateBurst'] as const) {
      if (update[k] != null) req[k] = update[k];
    }
    if (update.keyOverrides != null) req.keyOverrides = { overrides: keyOverridesPb(update.keyOverrides) };
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

  /** Jobs of a queue (or all queues) in enqueue order; state: default every live job; key: only that key's jobs (exact match). */
  async listJobs(
    opts: Page & { queue?: string; state?: JobState; includePayload?: boolean; key?: string } = {},
  ): Promise<JobList> {
    return jobList(
      await this.#unary('ListJobs', {
        queue: opts.queue ?? '',
        state: `JOB_STATE_${(opts.state ?? 'unspecified').toUpperCase()}`,
        pageSize: opts.pageSize ?? 0,
        pageToken: opts.pageToken ?? '',
        includePayload: !!opts.includePayload,
        key: opts.key ?? '',
      }),
    );
  }

  /** The keys of a queue's live jobs with their jobs waiting and leased: by key (paged), or order 'waiting': the pageSize keys with the most jobs waiting (one page). */
  async listKeys(queue: string, opts: Page & { order?: KeyOrder } = {}): Promise<KeyList> {
    const r = await this.#unary<{ keys: Record<string, unknown>[]; nextPageToken: string }>('ListKeys', {
      queue,
      pageSize: opts.pageSize ?? 0,
      pageToken: opts.pageToken ?? '',
      order: `KEY_ORDER_${(opts.order ?? 'key').toUpperCase()}`,
    });
    return {
      keys: r.keys.map((k) => ({
        key: String(k.key ?? ''),
        waiting: Number(k.waiting ?? 0),
        leased: Number(k.leased ?? 0),
        oldestAvailableAgeMs: toMs(k.oldestAvailableAge as PbTime | null | undefined),
      })),
      nextPageToken: r.nextPageToken,
    };
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

  // --- schedules (docs/design/schedules.md): a cron expression in a time
  // zone enqueues a job made from a template at each tick, exactly once
  // whatever the number of brokers.

  /** Creates a schedule; ALREADY_EXISTS if the name is taken. */
  async createSchedule(name: string, spec: ScheduleSpec): Promise<ScheduleInfo> {
    const schedule: Record<string, unknown> = {
      name,
      cron: spec.cron,
      timeZone: spec.timeZone ?? '',
      job: templatePb(spec.job),
      overlap: spec.overlap != null ? enumValue(OVERLAP, spec.overlap, 'overlap') : 'OVERLAP_POLICY_UNSPECIFIED',
      catchUp: spec.catchUp != null ? enumValue(CATCH_UP, spec.catchUp, 'catchUp') : 'CATCH_UP_POLICY_UNSPECIFIED',
      catchUpLimit: spec.catchUpLimit ?? 0,
      paused: !!spec.paused,
    };
    return scheduleInfo(await this.#unary<PbScheduleInfo>('CreateSchedule', { schedule }));
  }

  async getSchedule(name: string): Promise<ScheduleInfo> {
    return scheduleInfo(await this.#unary<PbScheduleInfo>('GetSchedule', { name }));
  }

  /** Schedules in name order. */
  async listSchedules(page: Page = {}): Promise<{ schedules: ScheduleInfo[]; nextPageToken: string }> {
    const r = await this.#unary<{ schedules: PbScheduleInfo[]; nextPageToken: string }>('ListSchedules', {
      pageSize: page.pageSize ?? 0,
      pageToken: page.pageToken ?? '',
    });
    return { schedules: r.schedules.map(scheduleInfo), nextPageToken: r.nextPageToken };
  }

  /** Changes the fields given (and only those); `job` replaces the whole template. */
  async updateSchedule(name: string, update: ScheduleUpdate): Promise<ScheduleInfo> {
    const req: Record<string, unknown> = { name };
    if (update.cron != null) req.cron = update.cron;
    if (update.timeZone != null) req.timeZone = update.timeZone;
    if (update.job != null) req.job = templatePb(update.job);
    if (update.overlap != null) req.overlap = enumValue(OVERLAP, update.overlap, 'overlap');
    if (update.catchUp != null) req.catchUp = enumValue(CATCH_UP, update.catchUp, 'catchUp');
    if (update.catchUpLimit != null) req.catchUpLimit = update.catchUpLimit;
    if (update.paused != null) req.paused = update.paused;
    return scheduleInfo(await this.#unary<PbScheduleInfo>('UpdateSchedule', req));
  }

  /** A paused schedule fires nothing (runSchedule still enqueues); ticks passed while paused are not caught up. */
  async pauseSchedule(name: string): Promise<ScheduleInfo> {
    return scheduleInfo(await this.#unary<PbScheduleInfo>('PauseSchedule', { name }));
  }

  /** Resumes it; the next tick counts from now. */
  async resumeSchedule(name: string): Promise<ScheduleInfo> {
    return scheduleInfo(await this.#unary<PbScheduleInfo>('ResumeSchedule', { name }));
  }

  /** Deletes the schedule; the jobs it enqueued stay. */
  async deleteSchedule(name: string): Promise<void> {
    await this.#unary('DeleteSchedule', { name });
  }

  /** Enqueues the schedule's job now, once, whatever its cron, overlap or pause; the next tick stays. */
  async runSchedule(name: string): Promise<{ jobId: string; tickAt: Date | null }> {
    const r = await this.#unary<{ jobId: string; tickAt: PbTime | null }>('RunSchedule', { name });
    return { jobId: r.jobId, tickAt: toDate(r.tickAt) };
  }

  /** Closes the channel, if this AdminClient opened it. */
  close(): void {
    this.#conn?.close();
  }
}
