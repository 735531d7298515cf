// One Node SDK Worker with a no-op handler: works N jobs from QUEUE, then
// stops. Prints one JSON line: the rate from the first delivery (the first
// handler call) to the last handler completion, and the process's CPU over
// that window from /proc/self/stat (every thread: the main one, libuv's).
//
//     node [--cpu-prof --cpu-prof-dir DIR] node_worker.mjs ADDR QUEUE N [--credit 256] [--concurrency C] [--sleep-ms MS] [--count]
//
// The SDK is the repository's (clients/node/dist, built by
// `clients/setup.sh node`). --credit: the Worker's prefetch (its stream's
// credit). --concurrency C: its handlers at once, at most --credit;
// default --credit (handlers at once = credit). --sleep-ms MS: the handler
// awaits a setTimeout of MS milliseconds instead of returning at once
// (scripts/bench/sdk-rabbitmq.sh's real handler). --count: counts, from
// outside the SDK, writes on the stream and the acks they carry, messages
// read by kind, and the promises and timers created (an async_hooks hook
// and wrappers around grpc-js's duplex call, installed here; nothing in
// the SDK changed). Counting slows the run: its rate is not a figure.
// scripts/bench/sdk-workers.sh and sdk-rabbitmq.sh run it.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const sdk = path.resolve(here, '../../../clients/node');
const { Client, Worker } = await import(path.join(sdk, 'dist/esm/index.mjs'));

const argv = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = argv.indexOf(name);
  if (i < 0) return dflt;
  const v = argv[i + 1];
  argv.splice(i, 2);
  return v;
};
const count = argv.includes('--count');
if (count) argv.splice(argv.indexOf('--count'), 1);
const credit = Number(flag('--credit', '256'));
const concurrency = Number(flag('--concurrency', String(credit)));
const sleepMs = Number(flag('--sleep-ms', '0'));
const { setTimeout: sleep } = await import('node:timers/promises');
const [addr, queue, nArg] = argv;
const n = Number(nArg);

const TCK = 100; // CLK_TCK on Linux
const cpuS = () => {
  const f = readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' ');
  return (Number(f[11]) + Number(f[12])) / TCK;
};

const counts = {};
const bump = (k, by = 1) => (counts[k] = (counts[k] ?? 0) + by);
if (count) {
  const req = createRequire(path.join(sdk, 'package.json'));
  const call = req('@grpc/grpc-js/build/src/call.js');
  const proto = call.ClientDuplexStreamImpl.prototype;
  const write0 = proto.write;
  proto.write = function (msg, ...rest) {
    bump('stream_writes');
    bump('acks_written', msg?.acks?.length ?? 0);
    return write0.call(this, msg, ...rest);
  };
  const push0 = proto.push;
  proto.push = function (msg, ...rest) {
    if (msg) {
      bump(`reads_${msg.kind}`);
      if (msg.kind === 'settled') bump('settle_results', msg.settled?.results?.length ?? 0);
    }
    return push0.call(this, msg, ...rest);
  };
  const { createHook } = await import('node:async_hooks');
  createHook({
    init(_id, type) {
      if (type === 'PROMISE') bump('promises');
      else if (type === 'Timeout') bump('timers');
      else if (type === 'Immediate') bump('immediates');
    },
  }).enable();
}

const client = new Client(addr);
const worker = new Worker(client, { concurrency, prefetch: credit, leaseMs: 60_000 });
let done = 0;
let t0 = null;
let c0 = null;
let t1 = null;
let c1 = null;
worker.handle(queue, async () => {
  if (t0 === null) {
    t0 = performance.now();
    c0 = cpuS();
  }
  if (sleepMs > 0) await sleep(sleepMs);
  done += 1;
  if (done === n) {
    t1 = performance.now();
    c1 = cpuS();
    void worker.stop();
  }
});
await worker.run();
client.close();

const out = { sdk: 'node', jobs: done, credit, concurrency };
if (sleepMs > 0) out.sleep_ms = sleepMs;
if (t1 !== null) {
  const secs = (t1 - t0) / 1000;
  const cpu = c1 - c0;
  Object.assign(out, {
    secs: Number(secs.toFixed(3)),
    rate: Math.round(n / secs),
    cpu_s: Number(cpu.toFixed(2)),
    cpu_us_per_job: Number(((cpu / n) * 1e6).toFixed(1)),
    cores: Number((cpu / secs).toFixed(2)),
  });
}
if (count) {
  out.counts = counts;
  out.per_job = Object.fromEntries(Object.entries(counts).map(([k, v]) => [k, Number((v / Math.max(done, 1)).toFixed(3))]));
}
out.profile = process.execArgv.some((a) => a.startsWith('--cpu-prof')) ? 'cpu-prof' : count ? 'count' : 'none';
console.log(JSON.stringify(out));
