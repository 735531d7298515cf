// One consuming stream: the bidirectional Consume (settles on the stream),
// or Subscribe (settles as AckBatch / unary calls) on a broker that answers
// Consume with UNIMPLEMENTED.

import * as grpc from '@grpc/grpc-js';
import { asLeaseqError, LeaseqError } from './errors';
import { Job, type AckExtra, type NackOptions, type PbDelivery, type SettleWaiter, type Settler } from './job';
import { duration, toDate, type PbTime } from './proto';
import type { NackReq, Rpc } from './rpc';

const { status } = grpc;

/** @internal What a stream subscribes to. */
export interface StreamParams {
  queues: string[];
  consumer: string;
  maxInFlight: number;
  leaseMs: number | undefined;
  /** Ask for batched deliveries (SubscribeRequest.accept: ["deliveries"]). */
  batchDeliveries: boolean;
}

/** The streaming RPC a consumer uses: 'consume' (settles on the stream) or 'subscribe' (the fallback). */
export type Protocol = 'consume' | 'subscribe';

type PbOp = 'SETTLE_OP_ACK' | 'SETTLE_OP_NACK' | 'SETTLE_OP_EXTEND' | 'SETTLE_OP_UNSPECIFIED';

interface PbSettleResult {
  jobId: string;
  op: PbOp;
  code: number;
  message: string;
  deadLettered: boolean;
  leaseExpiresAt: PbTime | null;
  leaseToken?: string;
  /** ACK: the follow-up jobs' ids. */
  enqueued?: string[];
}

/**
 * A job this stream holds was cancelled (AdminService.CancelJob): it is
 * gone, the stream's credit for it is back, and a settle of it is refused
 * (FAILED_PRECONDITION). Sent after the job's delivery, at most once per
 * lease, by a broker whose first heartbeat lists "cancel".
 */
export interface Cancelled {
  jobId: string;
  leaseToken: string;
}

interface StreamMessage {
  kind: 'delivery' | 'deliveries' | 'heartbeat' | 'settled' | 'cancelled';
  delivery?: PbDelivery;
  deliveries?: { deliveries: PbDelivery[] };
  heartbeat?: { features?: string[] };
  settled?: { results: PbSettleResult[] };
  cancelled?: Cancelled;
}

type Op = 'ack' | 'nack' | 'extend';
const OP_OF: Record<PbOp, Op | null> = {
  SETTLE_OP_ACK: 'ack',
  SETTLE_OP_NACK: 'nack',
  SETTLE_OP_EXTEND: 'extend',
  SETTLE_OP_UNSPECIFIED: null,
};

// A settle written on the stream and not yet answered. A job's settles
// form a chain, oldest first (most jobs have one): two settles of one job
// are answered in no set order, and the broker echoes the lease token to
// tell them apart, so results are matched by (job id, op, lease token).
interface Pending {
  op: Op;
  job: Job;
  // What was written: NackReq for a nack; for an extend, its length.
  nack: NackReq | null;
  leaseMs: number;
  waiter: SettleWaiter;
  next: Pending | null;
  // An ack's follow-up jobs and result, for a unary retry.
  extra: AckExtra | null;
}

/** @internal */
export interface SessionEvents {
  /** A job arrived. */
  delivery(job: Job): void;
  /** The broker cancelled a job this stream holds. */
  cancelled(c: Cancelled): void;
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
  /** What the broker said it understands (its first heartbeat); empty from an older broker. */
  features: readonly string[] = [];
  #rpc: Rpc;
  #call: grpc.ClientDuplexStream<object, StreamMessage> | grpc.ClientReadableStream<StreamMessage>;
  #open = true;
  #closing = false;
  #events: SessionEvents;
  // The idle watch: one timer that looks at when the last message came,
  // not a timer re-armed by every message.
  #idle: NodeJS.Timeout | null = null;
  #idleTimeoutMs: number | null;
  #lastMessageAt = Date.now();
  // Consume: settles written and not yet answered, by job id.
  #pending = new Map<string, Pending>();
  #outbox: { acks: object[]; nacks: object[]; extends: object[] } = { acks: [], nacks: [], extends: [] };
  #flush: NodeJS.Immediate | null = null;
  // Consume: progress reports for the next write, the latest per job.
  #progress = new Map<string, object>();
  // Subscribe: jobs with a ReportProgress call in flight, and the report
  // waiting for it (null: none).
  #progressBusy = new Map<string, { jobId: string; leaseToken: string; fraction: number; message: string } | null>();
  // Settles not yet answered (on the stream, as unary calls, retried):
  // what a graceful close waits for.
  #unanswered = 0;
  #answered: (() => void)[] = [];

  constructor(rpc: Rpc, protocol: Protocol, params: StreamParams, idleTimeoutMs: number | null, events: SessionEvents) {
    this.#rpc = rpc;
    this.protocol = protocol;
    this.#events = events;
    this.#idleTimeoutMs = idleTimeoutMs;
    const sub: Record<string, unknown> = { queues: params.queues, consumer: params.consumer, maxInFlight: params.maxInFlight };
    if (params.leaseMs != null) sub.lease = duration(params.leaseMs);
    // An older broker ignores the field and sends one delivery a message,
    // which is read as well.
    if (params.batchDeliveries) sub.accept = ['deliveries'];
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
        this.#idle = null;
        this.#rerouteAll();
        this.#wakeClose();
        resolve(error);
      });
    });
    if (this.#idleTimeoutMs != null) this.#watch(this.#idleTimeoutMs);
  }

  get open(): boolean {
    return this.#open;
  }

  // Heartbeats stopped: a hung broker or a silently dropped connection.
  // Cancelling ends the stream (CANCELLED, retried) and the consumer reopens it.
  #watch(ms: number): void {
    this.#idle = setTimeout(() => {
      this.#idle = null;
      const limit = this.#idleTimeoutMs as number;
      const quiet = Date.now() - this.#lastMessageAt;
      if (quiet < limit) {
        this.#watch(limit - quiet);
        return;
      }
      this.#events.warn(`leaseq: no message on the stream for ${limit} ms; reconnecting`);
      this.#call.cancel();
    }, ms);
  }

  #onMessage(msg: StreamMessage): void {
    this.#lastMessageAt = Date.now();
    if (!this.received) {
      this.received = true;
      // The broker's first message is a heartbeat, with what it understands.
      if (msg.kind === 'heartbeat' && msg.heartbeat?.features) this.features = msg.heartbeat.features;
      this.#events.message();
    }
    switch (msg.kind) {
      case 'deliveries': {
        const list = msg.deliveries?.deliveries ?? [];
        for (let i = 0; i < list.length; i++) this.#events.delivery(new Job(list[i], this));
        break;
      }
      case 'delivery':
        if (msg.delivery) this.#events.delivery(new Job(msg.delivery, this));
        break;
      case 'settled': {
        const results = msg.settled?.results ?? [];
        for (let i = 0; i < results.length; i++) this.#onResult(results[i]);
        break;
      }
      case 'cancelled':
        if (msg.cancelled) this.#events.cancelled({ jobId: msg.cancelled.jobId, leaseToken: msg.cancelled.leaseToken });
        break;
    }
  }

  #onResult(r: PbSettleResult): void {
    const op = OP_OF[r.op];
    const head = this.#pending.get(r.jobId);
    let prev: Pending | null = null;
    let p: Pending | null = head ?? null;
    // The settle with the echoed token; a broker from before the echo sends
    // none: the oldest of that op.
    while (p && !(p.op === op && (!r.leaseToken || p.job.leaseToken === r.leaseToken))) {
      prev = p;
      p = p.next;
    }
    if (!p) return; // not ours (a settle sent before a reconnect, say)
    if (prev) prev.next = p.next;
    else if (p.next) this.#pending.set(r.jobId, p.next);
    else this.#pending.delete(r.jobId);
    if (r.code === status.OK) {
      const expires = op === 'extend' ? (toDate(r.leaseExpiresAt) ?? new Date(Date.now() + p.leaseMs)) : null;
      this.#answer(p.waiter, r.deadLettered, expires, r.enqueued);
    } else if (r.code === status.UNAVAILABLE) {
      // The database was not reachable for it: the unary path retries.
      this.#unary(p.op, p.job, p.nack, p.leaseMs, p.waiter, p.extra);
    } else this.#fail(p.waiter, asLeaseqError({ code: r.code, details: r.message }));
  }

  #answer(w: SettleWaiter, deadLettered: boolean, expires: Date | null, enqueued?: readonly string[]): void {
    this.#unanswered -= 1;
    try {
      w.settleOk(deadLettered, expires, enqueued);
    } finally {
      if (this.#unanswered === 0) this.#wakeClose();
    }
  }

  #fail(w: SettleWaiter, err: LeaseqError): void {
    this.#unanswered -= 1;
    try {
      w.settleFailed(err);
    } finally {
      if (this.#unanswered === 0) this.#wakeClose();
    }
  }

  #wakeClose(): void {
    if (this.#answered.length === 0) return;
    for (const wake of this.#answered.splice(0, this.#answered.length)) wake();
  }

  // The settle as a unary call (AckBatch for acks), retried on UNAVAILABLE:
  // Subscribe's way, and Consume's once the stream is gone.
  #unary(op: Op, job: Job, nack: NackReq | null, leaseMs: number, w: SettleWaiter, extra: AckExtra | null = null): void {
    const fail = (e: LeaseqError) => this.#fail(w, e);
    // Follow-ups or a result: a unary Ack (AckBatch cannot carry them).
    if (op === 'ack' && extra) this.#rpc.ackWith(job.id, job.leaseToken, extra).then((ids) => this.#answer(w, false, null, ids), fail);
    else if (op === 'ack') this.#rpc.ack(job.id, job.leaseToken).then(() => this.#answer(w, false, null), fail);
    else if (op === 'nack') this.#rpc.nack(nack as NackReq).then((dl) => this.#answer(w, dl, null), fail);
    else this.#rpc.extend(job.id, job.leaseToken, leaseMs).then((d) => this.#answer(w, false, d), fail);
  }

  // The stream is gone: settles without an answer go as unary calls. Their
  // leases were released with the stream unless the broker applied them
  // first, so these mostly end in LeaseLostError; either way the truth.
  #rerouteAll(): void {
    if (this.#flush) clearImmediate(this.#flush);
    this.#flush = null;
    this.#outbox = { acks: [], nacks: [], extends: [] };
    this.#progress = new Map();
    const all: Pending[] = [];
    for (let p of this.#pending.values()) for (; p; p = p.next as Pending) all.push(p);
    this.#pending.clear();
    for (const p of all) this.#unary(p.op, p.job, p.nack, p.leaseMs, p.waiter, p.extra);
  }

  #send(op: Op, job: Job, entry: object, nack: NackReq | null, leaseMs: number, w: SettleWaiter, extra: AckExtra | null = null): void {
    this.#unanswered += 1;
    if (this.protocol !== 'consume' || !this.#open || this.#closing) {
      this.#unary(op, job, nack, leaseMs, w, extra);
      return;
    }
    const p: Pending = { op, job, nack, leaseMs, waiter: w, next: null, extra };
    const head = this.#pending.get(job.id);
    if (head) {
      let last = head;
      while (last.next) last = last.next;
      last.next = p;
    } else this.#pending.set(job.id, p);
    const box = this.#outbox;
    (op === 'ack' ? box.acks : op === 'nack' ? box.nacks : box.extends).push(entry);
    if (!this.#flush) this.#flush = setImmediate(() => this.#flushOutbox());
  }

  // Everything settled in one turn of the event loop goes in one message.
  #flushOutbox(): void {
    if (this.#flush) clearImmediate(this.#flush);
    this.#flush = null;
    const { acks, nacks, extends: ext } = this.#outbox;
    const progress = this.#progress;
    if (acks.length + nacks.length + ext.length + progress.size === 0) return;
    this.#outbox = { acks: [], nacks: [], extends: [] };
    if (!this.#open) return; // rerouted by 'status'
    const msg: Record<string, unknown> = { acks, nacks, extends: ext };
    if (progress.size > 0) {
      msg.progress = [...progress.values()];
      this.#progress = new Map();
    }
    (this.#call as grpc.ClientDuplexStream<object, StreamMessage>).write(msg);
  }

  ack(job: Job, w: SettleWaiter, extra: AckExtra | null = null): void {
    const entry = extra ? { jobId: job.id, leaseToken: job.leaseToken, ...extra } : { jobId: job.id, leaseToken: job.leaseToken };
    this.#send('ack', job, entry, null, 0, w, extra);
  }

  progress(job: Job, fraction: number, message: string): void {
    const report = { jobId: job.id, leaseToken: job.leaseToken, fraction, message };
    if (this.protocol === 'consume' && this.#open && !this.#closing) {
      // The latest per job; the broker keeps only that anyway.
      this.#progress.set(job.id, report);
      if (!this.#flush) this.#flush = setImmediate(() => this.#flushOutbox());
      return;
    }
    // ReportProgress, one call at a time per job, the latest waiting.
    const busy = this.#progressBusy.has(job.id);
    this.#progressBusy.set(job.id, report);
    if (!busy) this.#reportUnary(job.id);
  }

  #reportUnary(jobId: string): void {
    const report = this.#progressBusy.get(jobId);
    if (!report) return;
    this.#progressBusy.set(jobId, null);
    this.#rpc.reportProgress(report).then(
      () => this.#reportNext(jobId),
      (e: LeaseqError) => {
        this.#events.warn(`leaseq: job ${jobId}: progress not written (${e.message})`);
        this.#reportNext(jobId);
      },
    );
  }

  #reportNext(jobId: string): void {
    if (this.#progressBusy.get(jobId)) this.#reportUnary(jobId);
    else this.#progressBusy.delete(jobId);
  }

  supports(feature: string): boolean {
    return this.features.includes(feature);
  }

  nack(job: Job, error: string, opts: NackOptions, w: SettleWaiter): void {
    const req: NackReq = { jobId: job.id, leaseToken: job.leaseToken, error, deadLetter: !!opts.deadLetter };
    if (opts.retryAfterMs != null) req.retryAfter = duration(opts.retryAfterMs);
    this.#send('nack', job, req, req, 0, w);
  }

  extend(job: Job, leaseMs: number, w: SettleWaiter): void {
    const req = { jobId: job.id, leaseToken: job.leaseToken, lease: duration(leaseMs) };
    this.#send('extend', job, req, null, leaseMs, w);
  }

  /**
   * Answers to every settle sent so far, including any sent while waiting,
   * for up to timeoutMs or until the stream ends.
   */
  async #settlesDone(timeoutMs: number): Promise<void> {
    if (this.#flush) this.#flushOutbox();
    if (this.#unanswered === 0 || !this.#open) return;
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      this.#answered.push(resolve);
      timer = setTimeout(resolve, timeoutMs);
    });
    clearTimeout(timer);
  }

  /**
   * Graceful end: waits for the answers to settles already sent, then
   * half-closes a Consume stream (the broker releases the stream's unsettled
   * jobs and ends it with OK, or UNAVAILABLE when it could not: they come
   * back when their leases run out) or cancels a Subscribe stream (same
   * release).
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
