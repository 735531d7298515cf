// What a Node single enqueue costs in grpc-js alone (issue 36's Node
// producer target): N sequential enqueues through the SDK's own service
// definition without the SDK (a bare unary Enqueue, then a bare Produce
// stream: write one job, await its answer), against N of the SDK's
// Client.enqueue (which uses the Produce stream), each run alternated
// REPS times. One line per run: calls a second, the process's CPU a call
// (/proc/self/stat) and the wall time a call.
//
//     node node_grpc_floor.mjs ADDR [N=4000] [REPS=2]
//
// Needs clients/setup.sh node (clients/node/dist) and a broker
// (`leaseq serve --listen ADDR`). The bare stream's CPU a call is the floor
// the SDK's producer can reach with grpc-js; amqplib's confirmed publish is
// the figure it is compared with (sdk-rabbitmq.sh).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const dist = path.resolve(here, '../../../clients/node/dist');
const require = createRequire(path.join(dist, 'cjs', 'index.js'));
const grpc = require('@grpc/grpc-js');
const { QueueService } = require(path.join(dist, 'cjs', 'proto.js'));
const { Client } = await import(path.join(dist, 'esm', 'index.mjs'));

const [addr, nArg, repsArg] = process.argv.slice(2);
const n = Number(nArg ?? 4000);
const reps = Number(repsArg ?? 2);
const payload = Buffer.alloc(100, 'x');
const job = { queue: 'grpc-floor', payload };

const cpuS = () => {
  const f = readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' ');
  return (Number(f[11]) + Number(f[12])) / 100; // CLK_TCK on Linux
};

async function run(name, call) {
  for (let i = 0; i < 50; i++) await call(); // the connection, outside the window
  const t0 = performance.now();
  const c0 = cpuS();
  for (let i = 0; i < n; i++) await call();
  const wall = (performance.now() - t0) / 1000;
  const cpu = cpuS() - c0;
  console.log(
    `${name.padEnd(36)} ${String(Math.round(n / wall)).padStart(6)}/s  ` +
      `${((cpu / n) * 1e6).toFixed(1).padStart(6)} µs CPU a call  ${((wall / n) * 1e6).toFixed(1).padStart(6)} µs wall a call`,
  );
}

for (let r = 0; r < reps; r++) {
  const stub = new QueueService(addr, grpc.credentials.createInsecure());
  await run('bare unary Enqueue', () =>
    new Promise((resolve, reject) => stub.enqueue(job, (err, resp) => (err ? reject(err) : resolve(resp)))),
  );
  const call = stub.produce();
  const waiting = new Map();
  call.on('data', (resp) => {
    const w = waiting.get(Number(resp.id));
    waiting.delete(Number(resp.id));
    if (w) w(resp);
  });
  let id = 0;
  await run('bare Produce stream', () =>
    new Promise((resolve) => {
      id += 1;
      waiting.set(id, resolve);
      call.write({ id, job });
    }),
  );
  call.end();
  stub.close();
  const client = new Client(addr);
  await run('SDK Client.enqueue', () => client.enqueue('grpc-floor', payload));
  client.close();
}
