'use strict';
// Test harness: a real leaseq broker process over real PostgreSQL.
//
// - LEASEQ_ADDR (set by clients/run-tests.sh): the broker most tests use.
//   Without it, each test file starts one.
// - Brokers started here run LEASEQ_BIN (default: the repository's
//   target/debug/leaseq) on 127.0.0.1 and a free port, against DATABASE_URL
//   if set, else the embedded cluster in LEASEQ_DATA_DIR (a fresh temporary
//   directory if unset). A second broker on the same directory reuses the
//   running cluster, so the restart test does not initialise another one.

const { spawn } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

// The repository (its target/debug/leaseq, proto/, docs/): LEASEQ_REPO
// when the suite runs from the project the packed tarball is installed in
// (clients/setup.sh node-installed).
const REPO = process.env.LEASEQ_REPO || path.resolve(__dirname, '..', '..', '..');
const Health = grpc.loadPackageDefinition(
  protoLoader.loadSync(path.join(__dirname, 'health.proto'), { enums: String }),
).grpc.health.v1.Health;

/** A queue of the test's own, so tests sharing a broker never meet. */
const queueName = (prefix = 'js') => `${prefix}-${crypto.randomBytes(6).toString('hex')}`;

/** The job fields of a raw Subscribe delivery. */
function jobFromDelivery(d) {
  return {
    id: d.job.id,
    queue: d.job.queue,
    payload: d.job.payload,
    headers: { ...d.job.headers },
    priority: d.job.priority,
    attempt: d.job.attempt,
    enqueuedAt: new Date(Number(d.job.enqueuedAt.seconds) * 1000 + Math.floor(d.job.enqueuedAt.nanos / 1e6)),
    lastError: d.job.lastError,
    leaseToken: d.leaseToken,
    leaseExpiresAt: new Date(Number(d.leaseExpiresAt.seconds) * 1000 + Math.floor(d.leaseExpiresAt.nanos / 1e6)),
  };
}

/** The broker's health status for the queue service, or null if unreachable. */
function health(addr, credentials = grpc.credentials.createInsecure(), channelOptions = {}) {
  const client = new Health(addr, credentials, channelOptions);
  return new Promise((resolve) => {
    client.check({ service: 'leaseq.v1.QueueService' }, { deadline: Date.now() + 1000 }, (err, resp) => {
      client.close();
      resolve(err ? null : resp.status);
    });
  });
}

// Where brokers started by this process keep their data, decided once.
let dbEnvCache = null;
let ownTmp = null; // a data directory this process made, removed by suiteBroker's stop
function dbEnv() {
  if (dbEnvCache) return dbEnvCache;
  if (process.env.DATABASE_URL) dbEnvCache = { DATABASE_URL: process.env.DATABASE_URL };
  else if (process.env.LEASEQ_DATA_DIR) dbEnvCache = { LEASEQ_DATA_DIR: process.env.LEASEQ_DATA_DIR };
  else {
    const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'leaseq-js-'));
    fs.chmodSync(tmp, 0o755); // as root the cluster runs as `postgres`, which must enter it
    ownTmp = tmp;
    dbEnvCache = { LEASEQ_DATA_DIR: path.join(tmp, 'pg') };
  }
  return dbEnvCache;
}

/**
 * The real `leaseq serve` as a child process.
 *
 * The first start binds port 0 and reads the port from the broker's own
 * "leaseq serving" log line: a port picked here and bound later could be
 * taken meanwhile by a broker of a parallel test file, whose health check
 * would then answer for ours. A restart binds the same port again.
 */
class Broker {
  /**
   * @param {{args?: string[], healthCredentials?: object, healthOptions?: object}} [opts]
   *   extra `serve` flags (TLS, --auth-file), and the credentials the
   *   health check needs to reach a TLS port.
   */
  constructor(opts = {}) {
    this.addr = null;
    this.child = null;
    this.opts = opts;
    this.log = []; // the broker's stderr lines
  }

  static async start(opts) {
    const b = new Broker(opts);
    await b.start();
    return b;
  }

  async start(timeoutMs = 60000) {
    const bin = process.env.LEASEQ_BIN || path.join(REPO, 'target', 'debug', 'leaseq');
    fs.accessSync(bin, fs.constants.X_OK); // throws naming the path: run `cargo build` or set LEASEQ_BIN
    const env = { ...process.env, ...dbEnv(), RUST_LOG: 'warn,leaseq_server::server=info' };
    if (!dbEnv().DATABASE_URL) delete env.DATABASE_URL;
    const args = ['serve', '--listen', this.addr || '127.0.0.1:0', '--log-format', 'json',
      '--heartbeat-interval', '1s', '--reap-interval', '200ms', '--health-interval', '200ms',
      '--drain-grace', '5s', ...(this.opts.args ?? [])];
    this.child = spawn(bin, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
    this.exited = new Promise((resolve) => this.child.once('exit', (code) => resolve(code)));
    const deadline = Date.now() + timeoutMs;
    this.addr = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`broker did not start serving within ${timeoutMs} ms`)), timeoutMs);
      const lines = readline.createInterface({ input: this.child.stderr });
      lines.on('line', (line) => {
        this.log.push(line);
        let event;
        try {
          event = JSON.parse(line);
        } catch {
          process.stderr.write(`${line}\n`);
          return;
        }
        if (event.fields?.message === 'leaseq serving') {
          clearTimeout(timer);
          resolve(event.fields.addr);
        } else if (event.level === 'WARN' || event.level === 'ERROR') {
          process.stderr.write(`${line}\n`);
        }
      });
      lines.on('close', () => {
        clearTimeout(timer);
        reject(new Error('broker exited before serving'));
      });
    }).catch((e) => {
      this.child.kill('SIGKILL');
      throw e;
    });
    for (;;) {
      if ((await health(this.addr, this.opts.healthCredentials, this.opts.healthOptions)) === 'SERVING') return;
      if (this.child.exitCode !== null) throw new Error(`broker exited with ${this.child.exitCode} before serving`);
      if (Date.now() > deadline) {
        this.child.kill('SIGKILL');
        throw new Error(`broker at ${this.addr} not SERVING within ${timeoutMs} ms`);
      }
      // Polling a process we do not control: there is no event to await.
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** SIGTERM (drain); resolves to the exit code. */
  async stop(timeoutMs = 30000) {
    if (this.child.exitCode !== null) return this.child.exitCode;
    this.child.kill('SIGTERM');
    let timer;
    const late = new Promise((resolve) => (timer = setTimeout(resolve, timeoutMs, 'late')));
    const code = await Promise.race([this.exited, late]);
    clearTimeout(timer);
    if (code === 'late') {
      this.child.kill('SIGKILL');
      throw new Error(`broker did not exit within ${timeoutMs} ms of SIGTERM`);
    }
    return code;
  }
}

/** The suite's broker: LEASEQ_ADDR, or one started for this test file. */
async function suiteBroker() {
  if (process.env.LEASEQ_ADDR) return { addr: process.env.LEASEQ_ADDR, stop: async () => {} };
  const b = await Broker.start();
  return {
    addr: b.addr,
    // The first broker started the embedded cluster, and stops it on exit.
    stop: async () => {
      await b.stop();
      if (ownTmp) fs.rmSync(ownTmp, { recursive: true, force: true });
    },
  };
}

/** The first job a fresh raw Subscribe stream on `queue` receives. */
function firstDelivery(client, queue, timeoutMs = 10000) {
  const call = client.subscribe([queue], { maxInFlight: 1 });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no delivery on ${queue} within ${timeoutMs} ms`)), timeoutMs);
    call.on('data', (msg) => {
      if (msg.kind !== 'delivery') return;
      clearTimeout(timer);
      resolve(jobFromDelivery(msg.delivery));
    });
    call.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  }).finally(() => {
    call.cancel();
  });
}

/**
 * fn(), retried on UNAVAILABLE for up to limitMs: what a producer does while
 * a broker restarts (its channel fails calls at once until reconnected).
 */
async function retryUnavailable(fn, limitMs = 15000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    try {
      return await fn();
    } catch (e) {
      if (e.code !== grpc.status.UNAVAILABLE || Date.now() > deadline) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** A promise with its resolve function, for waiting on an event. */
function deferred() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}

/** An unbounded async queue: put() from handlers, get() in the test. */
class Inbox {
  #items = [];
  #waiters = [];

  put(item) {
    const w = this.#waiters.shift();
    if (w) w(item);
    else this.#items.push(item);
  }

  get() {
    if (this.#items.length) return Promise.resolve(this.#items.shift());
    return new Promise((resolve) => this.#waiters.push(resolve));
  }
}

/** Resolves with fn's value once it is truthy; polls every 100 ms, up to limitMs. */
async function eventually(fn, limitMs = 10000, what = 'condition') {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not true within ${limitMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * A grpc-js interceptor counting calls by method name ('Ack', 'Consume',
 * ...): pass it as the Client's `interceptors` option.
 */
function callCounter() {
  const counts = {};
  const interceptor = (options, nextCall) => {
    const name = options.method_definition.path.split('/').pop();
    counts[name] = (counts[name] ?? 0) + 1;
    return new grpc.InterceptingCall(nextCall(options));
  };
  return { counts, interceptor };
}

/**
 * Counts what travels on Consume streams, through a grpc-js client
 * interceptor (the public hook: nothing in the SDK is patched): requests
 * written after the opening one and the acks they carry, responses read by
 * kind, and the deliveries they carry.
 */
function streamCounter() {
  const c = { writes: 0, acks: 0, nacks: 0, kinds: {}, delivered: 0, opening: [] };
  c.interceptor = (options, nextCall) => {
    if (!options.method_definition.path.endsWith('/Consume')) return new grpc.InterceptingCall(nextCall(options));
    return new grpc.InterceptingCall(nextCall(options), {
      sendMessage(message, next) {
        if (message.subscribe) c.opening.push(message.subscribe);
        else {
          c.writes += 1;
          c.acks += message.acks?.length ?? 0;
          c.nacks += message.nacks?.length ?? 0;
        }
        next(message);
      },
      start(metadata, listener, next) {
        next(metadata, {
          onReceiveMessage(msg, nextMsg) {
            c.kinds[msg.kind] = (c.kinds[msg.kind] ?? 0) + 1;
            if (msg.kind === 'deliveries') c.delivered += msg.deliveries.deliveries.length;
            else if (msg.kind === 'delivery') c.delivered += 1;
            nextMsg(msg);
          },
        });
      },
    });
  };
  return c;
}

/**
 * A grpc-js interceptor that hides Cancelled messages on Consume and
 * Subscribe streams (each read as a heartbeat instead, so the stream reads
 * on): a job cancelled through it loses its lease untold, as when its lease
 * expired and another consumer took it, or behind a broker that does not
 * send Cancelled. Counts what it hid in `hidden`.
 */
function untold() {
  const u = { hidden: 0 };
  u.interceptor = (options, nextCall) => {
    const path = options.method_definition.path;
    if (!path.endsWith('/Consume') && !path.endsWith('/Subscribe')) return new grpc.InterceptingCall(nextCall(options));
    return new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        next(metadata, {
          onReceiveMessage(msg, nextMsg) {
            if (msg.kind !== 'cancelled') return nextMsg(msg);
            u.hidden += 1;
            nextMsg({ kind: 'heartbeat', heartbeat: { sentAt: null, features: [] } });
          },
        });
      },
    });
  };
  return u;
}

/** Warnings kept out of the test output but available to assertions. */
function quietLog() {
  const lines = [];
  const waiters = [];
  return {
    lines,
    debugLines: [],
    warn(line) {
      lines.push(line);
      for (const w of waiters) if (w.re.test(line)) w.resolve(line);
    },
    debug(line) {
      this.debugLines.push(line);
    },
    /** Resolves once a warning matching `re` was logged. */
    waitFor(re) {
      const seen = lines.find((l) => re.test(l));
      return seen ? Promise.resolve(seen) : new Promise((resolve) => waiters.push({ re, resolve }));
    },
  };
}

/** Whether the job is gone (acked, or purged): GetJob answers NOT_FOUND. */
async function jobGone(admin, jobId) {
  try {
    await admin.getJob(jobId);
    return false;
  } catch (e) {
    if (e.code === grpc.status.NOT_FOUND) return true;
    throw e;
  }
}

/** The message a stream-ack test fails with against a broker without Consume. */
const NO_CONSUME =
  'the broker answered Consume with UNIMPLEMENTED, so settles went through Subscribe + AckBatch: ' +
  'acks on the stream need a broker built with the Consume server side (LEASEQ_BIN)';

/**
 * The broker's database, as `pg` takes it: DATABASE_URL if the suite runs
 * on one, else the embedded cluster's Unix socket (<LEASEQ_DATA_DIR>/run,
 * user and database `leaseq`: src/embedded.rs). Also as libpq's variables
 * (pgEnv), for a child process.
 */
function pgConfig() {
  const env = dbEnv();
  if (env.DATABASE_URL) return { connectionString: env.DATABASE_URL };
  return { host: path.join(env.LEASEQ_DATA_DIR, 'run'), user: 'leaseq', database: 'leaseq' };
}

function pgEnv() {
  const c = pgConfig();
  return c.connectionString ? { DATABASE_URL: c.connectionString } : { PGHOST: c.host, PGUSER: c.user, PGDATABASE: c.database };
}

module.exports = {
  pgConfig, pgEnv,
  callCounter, streamCounter, untold, quietLog, jobGone, NO_CONSUME,
  Broker, suiteBroker, queueName, firstDelivery, deferred, Inbox, health, retryUnavailable, eventually, jobFromDelivery, REPO,
};
