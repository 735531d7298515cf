// One consuming stream: the bidirectional Consume (settles on the stream),
// or Subscribe (settles as AckBatch / unary calls) on a broker that answers
// Consume with UNIMPLEMENTED.

import * as grpc from '@grpc/grpc-js';
import { asLeaseqError, LeaseqError } from './errors';
import { Job, type NackOptions, type PbDelivery, type Settler } from './job';
import { duration, toDate, type PbTime } from './proto';
import type { NackReq, Rpc } from './rpc';

const { status } = grpc;

/** @internal What a stream subscribes to. */
export interface StreamParams {
  queues: string[];
  consumer: string;
  maxInFlight: number;
  leaseMs: number | undefined;
}

/** The streaming RPC a consumer uses: 'consume' (settles on the stream) or 'subscribe' (the fallback). */
export type Protocol = 'consume' | 'subscribe';

interface PbSettleResult {
  jobId: string;
  op: 'SETTLE_OP_ACK' | 'SETTLE_OP_NACK' | 'SETTLE_OP_EXTEND' | 'SETTLE_OP_UNSPECIFIED';
  code: number;
  message: string;
  deadLettered: boolean;
  leaseExpiresAt: PbTime | null;
  leaseToken?: string;
}

interface StreamMessage {
  kind: 'delivery' | 'heartbeat' | 'settled';
  delivery?: PbDelivery;
  settled?: { results: PbSettleResult[] };
}

interface Pending {
  // The settle's lease token: two settles of one job are answered in no set
  // order, and the broker echoes the token to tell them apart.
  leaseToken: string;
  resolve: (r: PbSettleResult) => void;
  reject: (e: LeaseqError) => void;
  retryUnary: () => Promise<unknown>;
}

const OPS = { ack: 'SETTLE_OP_ACK', nack: 'SETTLE_OP_NACK', extend: 'SETTLE_OP_EXTEND' } as const;

/** @internal */
export interface SessionEvents {
  /** A job arrived. */
  delivery(job: Job): void;
  /** Any message arrived (the first one means the stream is up). */
  message(): void;
  warn(msg: string): void;
}

/**
 * @internal One stream. `ended` resolves with the stream's error (null when
 * it ended with OK, or was closed by us).
 */
export class Session implements Settler {
  readonly protocol: Protocol;
  readonly ended: Promise<grpc.ServiceError | null>;
  /** Whether any message arrived (a stream refused at once has none). */
  received = false;
  #rpc: Rpc;
  #call: grpc.ClientDuplexStream<object, StreamMessage> | grpc.ClientReadableStream<StreamMessage>;
  #open = true;
  #closing = false;
  #events: SessionEvents;
  #idle: NodeJS.Timeout | null = null;
  #idleTimeoutMs: number | null;
  // Consume: settles written and not yet answered, by op and job id.
  #pending = new Map<string, Pending[]>();
  #outbox: { acks: object[]; nacks: object[]; extends: object[] } = { acks: [], nacks: [], extends: [] };
  #flush: NodeJS.Immediate | null = null;
  // Subscribe: settle calls in flight (awaited before the stream is closed).
  #inflight = new Set<Promise<unknown>>();

  constructor(rpc: Rpc, protocol: Protocol, params: StreamParams, idleTimeoutMs: number | null, events: SessionEvents) {
    this.#rpc = rpc;
    this.protocol = protocol;
    this.#events = events;
    this.#idleTimeoutMs = idleTimeoutMs;
    const sub: Record<string, unknown> = { queues: params.queues, consumer: params.consumer, maxInFlight: params.maxInFlight };
    if (params.leaseMs != null) sub.lease = duration(params.leaseMs);
    if (protocol === 'consume') {
      const call = rpc.stub.Consume() as grpc.ClientDuplexStream<object, StreamMessage>;
      // With confirm_settles every settle gets its result, so a job's ack()
      // resolves exactly when the broker has it, as the unary call would.
      call.write({ subscribe: sub, confirmSettles: true });
      this.#call = call;
    } else {
      this.#call = rpc.stub.Subscribe(sub) as grpc.ClientReadableStream<StreamMessage>;
    }
    let error: grpc.ServiceError | null = null;
    this.ended = new Promise((resolve) => {
      this.#call.on('data', (msg: StreamMessage) => this.#onMessage(msg));
      this.#call.on('error', (err: grpc.ServiceError) => {
        // Our own cancel (close after a stop, or an idle stream) is no failure.
        if (!(this.#closing && err.code === status.CANCELLED)) error = err;
      });
      // 'status' comes last, whatever the outcome.
      this.#call.on('status', () => {
        this.#open = false;
        if (this.#idle) clearTimeout(this.#idle);
        this.#rerouteAll();
        resolve(error);
      });
    });
    this.#watch();
  }

  get open(): boolean {
    return this.#open;
  }

  // Heartbeats stopped: a hung broker or a silently dropped connection.
  // Cancelling ends the stream (CANCELLED, retried) and the consumer reopens it.
  #watch(): void {
    if (this.#idleTimeoutMs == null) return;
    if (this.#idle) clearTimeout(this.#idle);
    this.#idle = setTimeout(() => {
      this.#events.warn(`leaseq: no message on the stream for ${this.#idleTimeoutMs} ms; reconnecting`);
      this.#call.cancel();
    }, this.#idleTimeoutMs);
  }

  #onMessage(msg: StreamMessage): void {
    this.received = true;
    this.#watch();
    this.#events.message();
    if (msg.kind === 'delivery' && msg.delivery) {
      this.#events.delivery(new Job(msg.delivery, this));
    } else if (msg.kind === 'settled' && msg.settled) {
      for (const r of msg.settled.results) this.#onResult(r);
    }
  }

  #onResult(r: PbSettleResult): void {
    const key = `${r.op}:${r.jobId}`;
    const queue = this.#pending.get(key);
    // The waiter with the echoed token; a broker from before the echo sends
    // none: the oldest.
    const at = r.leaseToken ? (queue?.findIndex((w) => w.leaseToken === r.leaseToken) ?? -1) : 0;
    const p = at >= 0 ? queue?.splice(at, 1)[0] : undefined;
    if (queue && queue.length === 0) this.#pending.delete(key);
    if (!p) return; // not ours (a settle sent before a reconnect, say)
    if (r.code === status.OK) p.resolve(r);
    else if (r.code === status.UNAVAILABLE) {
      // The database was not reachable for it: the unary path retries.
      p.retryUnary().then(() => p.resolve({ ...r, code: 0 }), p.reject);
    } else p.reject(asLeaseqError({ code: r.code, details: r.message }));
  }

  // The stream is gone: settles without an answer go as unary calls. Their
  // leases were released with the stream unless the broker applied them
  // first, so these mostly end in LeaseLostError; either way the truth.
  #rerouteAll(): void {
    if (this.#flush) clearImmediate(this.#flush);
    this.#flush = null;
    this.#outbox = { acks: [], nacks: [], extends: [] };
    const all = [...this.#pending.values()].flat();
    this.#pending.clear();
    for (const p of all) p.retryUnary().then(() => p.resolve(okResult), p.reject);
  }

  #send<T>(op: keyof typeof OPS, job: Job, entry: object, unary: () => Promise<T>): Promise<PbSettleResult | T> {
    if (this.protocol !== 'consume' || !this.#open || this.#closing) return unary();
    return new Promise<PbSettleResult | T>((resolve, reject) => {
      let unaryResult: T | undefined;
      const key = `${OPS[op]}:${job.id}`;
      const list = this.#pending.get(key) ?? [];
      list.push({
        leaseToken: job.leaseToken,
        resolve: (r) => resolve(unaryResult !== undefined ? unaryResult : r),
        reject,
        retryUnary: () => unary().then((v) => (unaryResult = v)),
      });
      this.#pending.set(key, list);
      this.#outbox[op === 'ack' ? 'acks' : op === 'nack' ? 'nacks' : 'extends'].push(entry);
      if (!this.#flush) this.#flush = setImmediate(() => this.#flushOutbox());
    });
  }

  // Everything settled in one turn of the event loop goes in one message.
  #flushOutbox(): void {
    this.#flush = null;
    const { acks, nacks, extends: ext } = this.#outbox;
    if (acks.length + nacks.length + ext.length === 0) return;
    this.#outbox = { acks: [], nacks: [], extends: [] };
    if (!this.#open) return; // rerouted by 'status'
    (this.#call as grpc.ClientDuplexStream<object, StreamMessage>).write({ acks, nacks, extends: ext });
  }

  // Subscribe: settle calls are tracked so a graceful close waits for them.
  #track<T>(p: Promise<T>): Promise<T> {
    this.#inflight.add(p);
    const done = () => this.#inflight.delete(p);
    p.then(done, done);
    return p;
  }

  ack(job: Job): Promise<void> {
    const unary = () => this.#rpc.ack(job.id, job.leaseToken);
    if (this.protocol === 'subscribe') return this.#track(unary());
    return this.#send('ack', job, { jobId: job.id, leaseToken: job.leaseToken }, unary).then(() => {});
  }

  nack(job: Job, error: string, opts: NackOptions): Promise<boolean> {
    const req: NackReq = { jobId: job.id, leaseToken: job.leaseToken, error, deadLetter: !!opts.deadLetter };
    if (opts.retryAfterMs != null) req.retryAfter = duration(opts.retryAfterMs);
    const unary = () => this.#rpc.nack(req);
    if (this.protocol === 'subscribe') return this.#track(unary());
    return this.#send('nack', job, req, unary).then((r) => (typeof r === 'boolean' ? r : r.deadLettered));
  }

  extend(job: Job, leaseMs: number): Promise<Date> {
    const req = { jobId: job.id, leaseToken: job.leaseToken, lease: duration(leaseMs) };
    const unary = () => this.#rpc.extend(job.id, job.leaseToken, leaseMs);
    if (this.protocol === 'subscribe') return unary();
    return this.#send('extend', job, req, unary).then((r) =>
      r instanceof Date ? r : (toDate(r.leaseExpiresAt) ?? new Date(Date.now() + leaseMs)),
    );
  }

  /**
   * Answers to every settle sent so far, including any sent while waiting
   * (or the stream's end), for up to timeoutMs.
   */
  async #settlesDone(timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.#open && Date.now() < deadline) {
      if (!(await this.#settlesSent(deadline - Date.now()))) return;
    }
  }

  // One round of #settlesDone; false if nothing was waiting.
  async #settlesSent(timeoutMs: number): Promise<boolean> {
    const waits: Promise<unknown>[] = [...this.#inflight];
    if (this.#flush) this.#flushOutbox();
    for (const list of this.#pending.values()) {
      for (const p of list) {
        waits.push(new Promise<void>((resolve) => {
          const { resolve: res, reject: rej } = p;
          p.resolve = (r) => {
            res(r);
            resolve();
          };
          p.reject = (e) => {
            rej(e);
            resolve();
          };
        }));
      }
    }
    if (waits.length === 0) return false;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled(waits),
      new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs))),
    ]);
    clearTimeout(timer);
    return true;
  }

  /**
   * Graceful end: waits for the answers to settles already sent, then
   * half-closes a Consume stream (the broker releases the stream's unsettled
   * jobs and ends it with OK) or cancels a Subscribe stream (same release).
   */
  async close(timeoutMs = 10000): Promise<void> {
    if (!this.#open) return;
    await this.#settlesDone(timeoutMs);
    if (!this.#open) return;
    this.#closing = true;
    if (this.protocol === 'consume') {
      (this.#call as grpc.ClientDuplexStream<object, StreamMessage>).end();
      let timer: NodeJS.Timeout | undefined;
      const late = await Promise.race([
        this.ended.then(() => false),
        new Promise<boolean>((resolve) => (timer = setTimeout(resolve, timeoutMs, true))),
      ]);
      clearTimeout(timer);
      if (!late) return;
      this.#events.warn(`leaseq: the broker did not end the stream within ${timeoutMs} ms of the half-close; cancelling it`);
    }
    this.#call.cancel();
    await this.ended;
  }

  /** Ends the stream at once; the broker releases its unsettled jobs. */
  cancel(): void {
    this.#closing = true;
    if (this.#open) this.#call.cancel();
  }
}

const okResult: PbSettleResult = {
  jobId: '',
  op: 'SETTLE_OP_UNSPECIFIED',
  code: 0,
  message: '',
  deadLettered: false,
  leaseExpiresAt: null,
  leaseToken: '',
};
