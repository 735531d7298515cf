'use strict';
// A worker: Subscribe with reconnect, one handler per job, leases kept while
// handlers run, Ack on success, Nack with the error text on failure.

const { status } = require('@grpc/grpc-js');
const { jobFromDelivery } = require('./client');

// Subscribe failures that retrying cannot fix: bad input or configuration.
// Anything else (UNAVAILABLE from a drain or an unreachable database, a
// refused connection, a reset stream) is retried with backoff.
const FATAL_CODES = new Set([
  status.INVALID_ARGUMENT,
  status.UNAUTHENTICATED,
  status.PERMISSION_DENIED,
  status.UNIMPLEMENTED,
  status.NOT_FOUND,
  status.FAILED_PRECONDITION,
  status.OUT_OF_RANGE,
]);

// Settling is retried this many times on UNAVAILABLE; after that the lease
// runs out and the job is redelivered (at-least-once).
const SETTLE_TRIES = 5;

/** Exponential backoff with jitter: each delay is drawn from [d/2, d), d
 * doubling from initialMs up to maxMs. */
class Backoff {
  constructor(initialMs, maxMs) {
    this.initialMs = initialMs;
    this.maxMs = maxMs;
    this.nextMs = initialMs;
  }

  reset() {
    this.nextMs = this.initialMs;
  }

  delay() {
    const d = this.nextMs;
    this.nextMs = Math.min(this.maxMs, d * 2);
    return d / 2 + Math.random() * (d / 2);
  }
}

/** A counting semaphore: acquire() resolves when a slot is free. */
class Slots {
  #free;
  #waiters = [];

  constructor(n) {
    this.#free = n;
  }

  acquire() {
    if (this.#free > 0) {
      this.#free -= 1;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  release() {
    const next = this.#waiters.shift();
    if (next) next(); // the slot passes straight to the next waiter
    else this.#free += 1;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Runs `handler(job, { signal })` for every job delivered from `queues`.
 *
 * - At most `maxInFlight` handlers run at once; it is also the stream's
 *   credit, so the broker never pushes more than that.
 * - Every delivery's lease is extended by `leaseMs` every `leaseMs / 2` until
 *   the handler settles.
 * - A handler that resolves acks the job; one that throws (or rejects) nacks
 *   it with the error's message as the error (the job's next lastError), and
 *   the queue's backoff decides the retry.
 * - `signal` (an AbortSignal) aborts when the lease is lost or the stop grace
 *   runs out: the job will be redelivered, so the handler may as well stop.
 * - The stream is reopened after any retryable failure, with exponential
 *   backoff and jitter between backoffInitialMs and backoffMaxMs (reset once
 *   a stream is established). run() rejects for the codes in FATAL_CODES.
 * - A stream with no message (delivery or heartbeat) for idleTimeoutMs is
 *   taken for dead and reopened; it must exceed the broker's
 *   --heartbeat-interval (15 s by default). null disables the check.
 * - stop(): take no new jobs, let running handlers finish for up to graceMs,
 *   then close the stream, which makes the broker release every job this
 *   worker has not settled (handlers still running are abandoned: their
 *   jobs are not settled by this worker).
 */
class Worker {
  #stopping = false;
  #stopped; // resolves when stop() is called
  #signalStop;
  #slots;
  #jobs = new Set(); // promises of running job tasks, across streams
  #aborts = new Set(); // abort functions of the running job tasks
  #backoff;

  constructor(client, queues, handler, opts = {}) {
    const {
      maxInFlight = 16,
      leaseMs = 30000,
      consumer = '',
      graceMs = 30000,
      backoffInitialMs = 100,
      backoffMaxMs = 10000,
      idleTimeoutMs = 60000,
      log = console, // anything with warn(); warnings only
    } = opts;
    if (!(maxInFlight >= 1)) throw new RangeError('maxInFlight: must be at least 1');
    Object.assign(this, { client, queues, handler, maxInFlight, leaseMs, consumer, graceMs, idleTimeoutMs, log });
    this.#backoff = new Backoff(backoffInitialMs, backoffMaxMs);
    this.#stopped = new Promise((resolve) => (this.#signalStop = resolve));
    // Bounds running handlers to maxInFlight. Credit alone would not: after
    // a reconnect the new stream has full credit while handlers of the old
    // stream (whose jobs the broker already released) may still be running.
    // Deliveries wait here, their leases kept meanwhile.
    this.#slots = new Slots(maxInFlight);
  }

  /** Asks run() to finish gracefully. Safe to call more than once. */
  stop() {
    this.#stopping = true;
    this.#signalStop();
  }

  /** Works until stop(); resolves once the stream is closed. */
  async run() {
    try {
      while (!this.#stopping) {
        const err = await this.#serve();
        if (this.#stopping) break;
        if (err && FATAL_CODES.has(err.code)) throw err;
        this.log.warn(`leaseq worker: subscribe stream ${err ? `failed (${err.code}: ${err.details})` : 'ended'}; reconnecting`);
        await this.#pause(this.#backoff.delay());
      }
    } finally {
      await this.#finishJobs();
    }
  }

  // Sleeps, waking early (and leaving no timer behind) if stop() is called.
  #pause(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      this.#stopped.then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  // Reads one stream; resolves with its error (null if it ended cleanly)
  // when it ends, fails, or is closed after stop().
  #serve() {
    return new Promise((resolve) => {
      const call = this.client.subscribe(this.queues, {
        consumer: this.consumer,
        maxInFlight: this.maxInFlight,
        leaseMs: this.leaseMs,
      });
      let error = null;
      let open = true;
      // Heartbeats stopped: a hung broker or a silently dropped connection.
      // Cancelling ends the stream (CANCELLED, retried) and run() reopens it.
      let idle = null;
      const watch = () => {
        if (this.idleTimeoutMs == null) return;
        clearTimeout(idle);
        idle = setTimeout(() => {
          this.log.warn(`leaseq worker: no message on the stream for ${this.idleTimeoutMs} ms; reconnecting`);
          call.cancel();
        }, this.idleTimeoutMs);
      };
      watch();
      call.on('data', (msg) => {
        watch();
        // The broker's first message is a heartbeat sent once the
        // subscription is registered: the stream is up.
        this.#backoff.reset();
        if (msg.kind !== 'delivery' || this.#stopping) return;
        const p = this.#job(jobFromDelivery(msg.delivery));
        this.#jobs.add(p);
        p.finally(() => this.#jobs.delete(p));
      });
      call.on('error', (err) => (error = err));
      // 'status' comes last, whatever the outcome.
      call.on('status', () => {
        open = false;
        clearTimeout(idle);
        resolve(error);
      });
      this.#stopped.then(async () => {
        if (!open) return; // an earlier stream, long closed
        // The stream stays open while running handlers finish, so their
        // Acks still hold current leases; deliveries meanwhile are left
        // unsettled and released by the close.
        await this.#finishJobs();
        call.cancel();
      });
    });
  }

  // Waits up to the grace for job tasks, then abandons the rest.
  async #finishJobs() {
    if (this.#jobs.size === 0) return;
    let timer;
    const late = new Promise((resolve) => (timer = setTimeout(resolve, this.graceMs, 'late')));
    const outcome = await Promise.race([Promise.allSettled([...this.#jobs]), late]);
    clearTimeout(timer);
    if (outcome === 'late') {
      for (const abort of this.#aborts) abort(new Error('worker stop grace ran out'));
      this.log.warn(`leaseq worker: ${this.#jobs.size} handler(s) still running after the grace; abandoned`);
      // No longer ours: nothing waits for them again.
      this.#jobs.clear();
    }
  }

  async #job(job) {
    const controller = new AbortController();
    let abandoned = false;
    let keeper = null;
    const abort = (reason) => {
      abandoned = true;
      clearInterval(keeper);
      controller.abort(reason);
    };
    this.#aborts.add(abort);
    keeper = this.#keepLease(job, abort);
    try {
      await this.#slots.acquire();
      let error = null;
      try {
        if (this.#stopping) return; // not started: released when the stream closes
        try {
          await this.handler(job, { signal: controller.signal });
        } catch (e) {
          error = (e && e.message) || String(e);
        }
      } finally {
        this.#slots.release();
      }
      clearInterval(keeper);
      if (!abandoned) await this.#settle(job, error);
    } finally {
      clearInterval(keeper);
      this.#aborts.delete(abort);
    }
  }

  // Counted from the delivery; each extension is a full lease from now, so
  // one lost call still leaves half a lease to try again.
  #keepLease(job, abort) {
    const timer = setInterval(async () => {
      try {
        await this.client.extendLease(job.id, job.leaseToken, this.leaseMs);
      } catch (e) {
        if (e.code === status.FAILED_PRECONDITION) {
          this.log.warn(`leaseq worker: job ${job.id}: lease lost; it will be redelivered`);
          abort(new Error('lease lost'));
        } else {
          this.log.warn(`leaseq worker: job ${job.id}: extending the lease failed (${e.code}); will retry`);
        }
      }
    }, this.leaseMs / 2);
    return timer;
  }

  async #settle(job, error) {
    const backoff = new Backoff(50, 1000);
    for (let i = 0; i < SETTLE_TRIES; i++) {
      try {
        if (error === null) await this.client.ack(job.id, job.leaseToken);
        else await this.client.nack(job.id, job.leaseToken, error);
        return;
      } catch (e) {
        if (e.code !== status.UNAVAILABLE) {
          // FAILED_PRECONDITION: the lease was lost (expired, or the stream
          // closed); the job is or will be redelivered.
          this.log.warn(`leaseq worker: job ${job.id}: settling failed (${e.code}: ${e.details})`);
          return;
        }
        await sleep(backoff.delay());
      }
    }
    this.log.warn(`leaseq worker: job ${job.id}: broker unavailable, not settled; it will be redelivered`);
  }
}

module.exports = { Worker, Backoff, FATAL_CODES };
