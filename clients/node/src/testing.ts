// Test helpers (`import { testing } from '@leaseq/client'`): a throwaway
// broker (the real `leaseq serve` on an embedded PostgreSQL cluster in a
// fresh temporary directory) and drain(), which runs handlers in burst
// mode until their queues are empty and reports each job's outcome.
//
// No in-process fake: the broker's behaviour (leases, retries, dead
// letters, dedup, schedules) is what a test should exercise, and the real
// one starts in seconds.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { AdminClient } from './admin';
import { Client } from './client';
import type { Logger } from './consumer';
import type { Task } from './task';
import { Worker, type Handler, type JobEvent, type Middleware } from './worker';

export interface StartBrokerOptions {
  /** The `leaseq` binary. Default: $LEASEQ_BIN, else `leaseq` on PATH. */
  bin?: string;
  /**
   * The embedded cluster's directory. Default: `pg/` in a fresh temporary
   * directory, removed by stop(). Give one to share a cluster between test
   * files: initdb runs once, and a broker started on a running cluster
   * reuses it (it is left in place by stop()).
   */
  dataDir?: string;
  /** An existing PostgreSQL instead of the embedded cluster. */
  databaseUrl?: string;
  /** More `leaseq serve` flags, e.g. ['--schedule-grace', '30s']. */
  args?: string[];
  /** How long the start may take (a first initdb takes seconds). Default 120000. */
  timeoutMs?: number;
}

export interface TestBroker {
  /** host:port on 127.0.0.1. */
  readonly address: string;
  /** A Client on the broker (closed by stop()). */
  readonly client: Client;
  /** An AdminClient sharing the client's channel. */
  readonly admin: AdminClient;
  /** The broker process's id. */
  readonly pid: number;
  /** The temporary directory (the broker's log, and the cluster in pg/ unless dataDir or databaseUrl), removed by stop(). */
  readonly dir: string;
  /** The broker's log (JSON lines), in dir. */
  readonly logFile: string;
  /**
   * Closes the clients, stops the broker (SIGTERM to its PID; it drains and
   * stops its embedded cluster) and removes the temporary directory.
   */
  stop(): Promise<void>;
}

function executable(file: string): boolean {
  try {
    fs.accessSync(file, fs.constants.X_OK);
    return fs.statSync(file).isFile();
  } catch {
    return false;
  }
}

/** @internal The broker binary: opts.bin, $LEASEQ_BIN, else `leaseq` on PATH. */
export function findBinary(bin?: string): string {
  const given = bin ?? process.env.LEASEQ_BIN;
  if (given) {
    if (!executable(given)) throw new Error(`leaseq testing: ${bin ? 'bin' : 'LEASEQ_BIN'}=${given} is not an executable file`);
    return given;
  }
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (dir && executable(path.join(dir, 'leaseq'))) return path.join(dir, 'leaseq');
  }
  throw new Error(
    'leaseq testing: no broker binary: LEASEQ_BIN is not set and there is no `leaseq` on PATH ' +
      '(build it with `cargo build` and set LEASEQ_BIN=target/debug/leaseq, or install leaseq)',
  );
}

// Brokers started and not yet stopped: SIGTERM on process exit (a test
// that never called stop(), or --test-force-exit), and a detached shell
// that removes the temporary directory once the broker has exited.
const live = new Set<{ child: ChildProcess; tmp: string }>();
let exitHook = false;
function onExit(): void {
  for (const { child, tmp } of live) {
    if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) continue;
    child.kill('SIGTERM');
    const sweep = spawn('sh', ['-c', 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; rm -rf "$2"', 'sh', String(child.pid), tmp], {
      detached: true,
      stdio: 'ignore',
    });
    sweep.unref();
  }
}

/**
 * Starts a throwaway broker: `leaseq serve` on 127.0.0.1 and a free port,
 * over an embedded PostgreSQL cluster in a fresh temporary directory (the
 * PostgreSQL server binaries must be installed; the broker finds them).
 * Resolves once the broker answers an admin call. Start one per test file
 * (before/after), not per test: the cluster's initdb takes seconds.
 */
export async function startBroker(opts: StartBrokerOptions = {}): Promise<TestBroker> {
  const bin = findBinary(opts.bin);
  const timeoutMs = opts.timeoutMs ?? 120000;
  // The broker's log goes to a file here, not to a pipe: a broker whose
  // test process exited (and with it the pipe's reader) must still be able
  // to log its drain and stop its cluster.
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'leaseq-test-'));
  // As root the cluster runs as `postgres`, which must enter the directory.
  fs.chmodSync(tmp, 0o755);
  const logFile = path.join(tmp, 'broker.log');
  const env: NodeJS.ProcessEnv = { ...process.env, RUST_LOG: 'warn,leaseq_server::server=info' };
  // The embedded cluster is used only without these.
  delete env.DATABASE_URL;
  delete env.PGHOST;
  delete env.PGHOSTADDR;
  delete env.LEASEQ_LISTEN;
  const args = ['serve', '--listen', '127.0.0.1:0', '--log-format', 'json',
    // Prompt reaping and short drains: a test's timings.
    '--heartbeat-interval', '1s', '--reap-interval', '200ms', '--health-interval', '200ms', '--drain-grace', '2s'];
  const ownCluster = !opts.databaseUrl && !opts.dataDir;
  if (opts.databaseUrl) env.DATABASE_URL = opts.databaseUrl; // not on the command line: it may hold a password
  else args.push('--data-dir', opts.dataDir ?? path.join(tmp, 'pg'));
  args.push(...(opts.args ?? []));

  const fd = fs.openSync(logFile, 'a');
  let child: ChildProcess;
  try {
    child = spawn(bin, args, { env, stdio: ['ignore', 'ignore', fd] });
  } finally {
    fs.closeSync(fd);
  }
  const entry = { child, tmp };
  live.add(entry);
  if (!exitHook) {
    exitHook = true;
    process.once('exit', onExit);
  }
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve();
    else child.once('exit', () => resolve());
  });
  let stopped = false;

  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      let timer: NodeJS.Timeout | undefined;
      const late = await Promise.race([exited.then(() => false), new Promise<boolean>((r) => (timer = setTimeout(r, 30000, true)))]);
      clearTimeout(timer);
      if (late) {
        child.kill('SIGKILL');
        await exited;
        // The cluster outlives a killed broker: stop the postmaster it
        // started in our directory (its pid from postmaster.pid).
        if (ownCluster) stopPostmaster(path.join(tmp, 'pg', 'data'));
      }
    }
    live.delete(entry);
    fs.rmSync(tmp, { recursive: true, force: true });
  };
  const tail = () => {
    try {
      return fs.readFileSync(logFile, 'utf8').trimEnd().split('\n').slice(-20).join('\n');
    } catch {
      return '';
    }
  };

  // The port the broker bound: its "leaseq serving" log line (JSON). A
  // file has no event to await: polled.
  let address = '';
  let spawnError: Error | null = null;
  child.once('error', (e) => (spawnError = e));
  const deadline = Date.now() + timeoutMs;
  while (!address) {
    for (const line of fs.readFileSync(logFile, 'utf8').split('\n')) {
      if (!line.includes('leaseq serving')) continue;
      try {
        const event = JSON.parse(line);
        if (event.fields?.message === 'leaseq serving') address = String(event.fields.addr);
      } catch {
        // a line still being written
      }
    }
    if (address) break;
    if (spawnError || child.exitCode !== null || child.signalCode !== null || Date.now() > deadline) {
      const why = spawnError
        ? `could not run ${bin}: ${(spawnError as Error).message}`
        : Date.now() > deadline
          ? `the broker did not start within ${timeoutMs} ms`
          : 'the broker exited before serving';
      const log = tail();
      await stop();
      throw new Error(`leaseq testing: ${why}${log ? `:\n${log}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }

  const client = new Client(address, { tls: false }); // plaintext whatever LEASEQ_TLS_CA says
  const admin = new AdminClient(client);
  // Serving once migrations ran and PostgreSQL answers: an admin call goes through.
  const probe = new AdminClient(client, { callTimeoutMs: 2000 });
  for (;;) {
    try {
      await probe.listQueues({ pageSize: 1 });
      break;
    } catch (e) {
      if (Date.now() > deadline || child.exitCode !== null) {
        client.close();
        await stop();
        throw new Error(`leaseq testing: the broker at ${address} did not answer: ${(e as Error).message}\n${tail()}`);
      }
      await new Promise((r) => setTimeout(r, 100)); // a process we do not control: nothing to await
    }
  }
  return {
    address,
    client,
    admin,
    pid: child.pid as number,
    dir: tmp,
    logFile,
    stop: async () => {
      client.close();
      await stop();
    },
  };
}

function stopPostmaster(dataDir: string): void {
  let pid: number;
  try {
    pid = Number(fs.readFileSync(path.join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  } catch {
    return;
  }
  if (!Number.isInteger(pid) || pid <= 1) return;
  try {
    process.kill(pid, 'SIGQUIT'); // immediate shutdown
  } catch {
    return;
  }
  // Wait (bounded) for it to go, so the directory can be removed.
  for (let i = 0; i < 50; i++) {
    try {
      process.kill(pid, 0);
    } catch {
      return;
    }
    spawnSync('sleep', ['0.1']);
  }
}

export interface DrainOptions {
  /** Reject if the queues are not drained within this long. Default 30000. */
  timeoutMs?: number;
  /** How long without a delivery means drained (burst mode's burstIdleMs). Default 300. */
  idleMs?: number;
  /** Middleware around the handlers, the first outermost. */
  use?: Middleware[];
  /** Handlers at once. Default 16. */
  concurrency?: number;
  /** Per-job timeout in ms. Default none. */
  jobTimeoutMs?: number;
  /** The worker's warnings; default console.warn. */
  log?: Logger;
}

/** What drain() runs: a task, tasks, handlers by queue name, or a function setting up a Worker. */
export type DrainTarget = Task<any> | Task<any>[] | Record<string, Handler<any>> | ((worker: Worker) => void);

function isTask(x: unknown): x is Task<any> {
  return typeof x === 'object' && x !== null && typeof (x as Task).queue === 'string' && typeof (x as Task).handler === 'function';
}

/**
 * Runs the handlers on their queues in burst mode until nothing is
 * delivered for idleMs, and resolves to each job's JobEvent (outcome,
 * error, deadLettered), in the order they finished. A nacked job retried
 * after its backoff (longer than idleMs) is left for later: its event is
 * the 'nack'. Rejects if the queues are not drained within timeoutMs (the
 * worker is stopped first).
 */
export async function drain(client: Client, target: DrainTarget, opts: DrainOptions = {}): Promise<JobEvent[]> {
  const timeoutMs = opts.timeoutMs ?? 30000;
  const worker = new Worker(client, {
    burst: true,
    burstIdleMs: opts.idleMs ?? 300,
    concurrency: opts.concurrency,
    timeoutMs: opts.jobTimeoutMs ?? null,
    graceMs: 1000,
    log: opts.log,
  });
  if (typeof target === 'function') target(worker);
  else if (Array.isArray(target)) for (const t of target) worker.register(t);
  else if (isTask(target)) worker.register(target);
  else for (const [queue, handler] of Object.entries(target)) worker.handle(queue, handler);
  for (const mw of opts.use ?? []) worker.use(mw);
  const events: JobEvent[] = [];
  worker.on('job', (e) => events.push(e));
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((resolve) => (timer = setTimeout(resolve, timeoutMs, 'late')));
  try {
    const r = await Promise.race([worker.run(), late]);
    if (r === 'late') {
      await worker.stop();
      throw new Error(`leaseq testing: drain: the queues were not drained within ${timeoutMs} ms (${events.length} job(s) finished)`);
    }
  } finally {
    clearTimeout(timer);
  }
  return events;
}
