// Client.enqueue's transport: one Produce stream per client, opened by the
// first enqueue, each job a message with an id and each answer matched to
// its caller by it. A unary Enqueue costs grpc-js a new call (its HTTP/2
// stream, headers both ways, the interceptor and filter stack); a message
// on an open stream costs a write and a read.
//
// The stream is half-closed once no answer has been awaited for IDLE_MS, so
// an idle client holds no call open (an open call keeps Node's event loop
// alive: a script that enqueues and returns exits at most IDLE_MS later).
// When the stream breaks (the broker restarted or drained, the connection
// dropped), the jobs awaiting an answer reject with its status
// (UNAVAILABLE: each may or may not be enqueued, as with a unary call whose
// answer was lost), and the next enqueue opens a new stream. A broker from
// before Produce answers UNIMPLEMENTED: nothing was enqueued, so the jobs
// are sent again with the unary Enqueue, as every later one is.

import type * as grpc from '@grpc/grpc-js';
import { status } from '@grpc/grpc-js';
import { asLeaseqError, LeaseqError } from './errors';
import type { Rpc } from './rpc';

/** @internal A stream with no answer awaited for this long is half-closed. */
export const IDLE_MS = 200;

interface Pending {
  req: Record<string, unknown>;
  resolve: (r: EnqueuedPb) => void;
  reject: (e: unknown) => void;
  timer: NodeJS.Timeout | null;
}

/** @internal */
export interface EnqueuedPb {
  jobId: string;
  duplicate: boolean;
  replaced: boolean;
}

interface ProduceResponse {
  id: number;
  code: number;
  message: string;
  enqueued: EnqueuedPb | null;
}

/** @internal */
export class Producer {
  readonly #rpc: Rpc;
  #call: grpc.ClientDuplexStream<object, ProduceResponse> | null = null;
  #pending = new Map<number, Pending>();
  #nextId = 0;
  #unsupported = false;
  #idle: NodeJS.Timeout | null = null;

  constructor(rpc: Rpc) {
    this.#rpc = rpc;
  }

  /** Enqueues one job (an EnqueueRequest); resolves once it is committed. */
  enqueue(req: Record<string, unknown>, deadlineMs: number | undefined): Promise<EnqueuedPb> {
    if (this.#unsupported) return this.#rpc.unary<EnqueuedPb>('Enqueue', req, deadlineMs);
    return new Promise((resolve, reject) => {
      const call = this.#call ?? this.#open();
      const id = ++this.#nextId;
      const p: Pending = { req, resolve, reject, timer: null };
      if (deadlineMs != null) {
        p.timer = setTimeout(() => {
          if (this.#pending.delete(id)) {
            reject(new LeaseqError(status.DEADLINE_EXCEEDED, `no answer within ${deadlineMs} ms (the job may or may not be enqueued)`));
            this.#maybeIdle();
          }
        }, deadlineMs);
      }
      this.#pending.set(id, p);
      if (this.#idle) {
        clearTimeout(this.#idle);
        this.#idle = null;
      }
      call.write({ id, job: req });
    });
  }

  #open(): grpc.ClientDuplexStream<object, ProduceResponse> {
    const call = this.#rpc.stub.Produce() as grpc.ClientDuplexStream<object, ProduceResponse>;
    this.#call = call;
    call.on('data', (r: ProduceResponse) => {
      const p = this.#pending.get(r.id);
      if (!p) return;
      this.#pending.delete(r.id);
      if (p.timer) clearTimeout(p.timer);
      if (r.code === status.OK && r.enqueued) p.resolve(r.enqueued);
      else p.reject(asLeaseqError({ code: r.code, details: r.message }));
      this.#maybeIdle();
    });
    const ended = (err: unknown) => {
      if (this.#call !== call) return;
      this.#call = null;
      if (this.#idle) {
        clearTimeout(this.#idle);
        this.#idle = null;
      }
      const code = (err as { code?: unknown } | null)?.code;
      const waiting = [...this.#pending.values()];
      this.#pending.clear();
      if (code === status.UNIMPLEMENTED) {
        // A broker without Produce: nothing was enqueued; each job goes as
        // a unary Enqueue, now and from now on.
        this.#unsupported = true;
        for (const p of waiting) {
          if (p.timer) clearTimeout(p.timer);
          this.#rpc.unary<EnqueuedPb>('Enqueue', p.req, this.#rpc.callTimeoutMs).then(p.resolve, p.reject);
        }
        return;
      }
      const e = err ? asLeaseqError(err) : new LeaseqError(status.UNAVAILABLE, 'the Produce stream ended before answering');
      for (const p of waiting) {
        if (p.timer) clearTimeout(p.timer);
        p.reject(e);
      }
    };
    // Every call ends with a status (an error first when it is not OK).
    call.on('error', () => {});
    call.on('status', (s: grpc.StatusObject) => ended(s.code === status.OK ? null : { code: s.code, details: s.details }));
    return call;
  }

  // With no answer awaited, the stream is half-closed after IDLE_MS unless
  // another job comes first.
  #maybeIdle(): void {
    if (this.#pending.size > 0 || this.#idle || !this.#call) return;
    const call = this.#call;
    this.#idle = setTimeout(() => {
      this.#idle = null;
      if (this.#call === call && this.#pending.size === 0) {
        this.#call = null;
        call.end();
      }
    }, IDLE_MS);
    this.#idle.unref();
  }

  /** Half-closes the stream (the broker answers what was sent). */
  close(): void {
    if (this.#idle) {
      clearTimeout(this.#idle);
      this.#idle = null;
    }
    const call = this.#call;
    if (!call) return;
    // With answers awaited, the call stays current until it ends, so that
    // they are resolved by it.
    if (this.#pending.size === 0) this.#call = null;
    call.end();
  }
}
