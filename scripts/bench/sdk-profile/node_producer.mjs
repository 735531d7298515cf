// One Node SDK producer: sequential single enqueues (each awaited before
// the next; no batching) of BYTES-byte jobs into QUEUE until N are
// enqueued or SECS have passed. Prints one JSON line: the rate and the
// process's CPU per job from /proc/self/stat. One enqueue before the
// measured window (the connection's setup).
//
//     node node_producer.mjs ADDR QUEUE N SECS [BYTES=100]
//
// The SDK is the repository's (clients/node/dist, built by
// `clients/setup.sh node`). scripts/bench/sdk-rabbitmq.sh runs it.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const here = path.dirname(fileURLToPath(import.meta.url));
const { Client } = await import(path.resolve(here, '../../../clients/node/dist/esm/index.mjs'));

const [addr, queue, nArg, secsArg, bytesArg] = process.argv.slice(2);
const n = Number(nArg);
const secs = Number(secsArg);
const payload = Buffer.alloc(Number(bytesArg ?? 100), 'x');

const cpuS = () => {
  const f = readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' ');
  return (Number(f[11]) + Number(f[12])) / 100; // CLK_TCK on Linux
};

const client = new Client(addr);
await client.enqueue(queue, payload);
const t0 = performance.now();
const c0 = cpuS();
const deadline = t0 + secs * 1000;
let sent = 0;
while (sent < n && performance.now() < deadline) {
  await client.enqueue(queue, payload);
  sent += 1;
}
const wall = (performance.now() - t0) / 1000;
const cpu = cpuS() - c0;
client.close();
console.log(
  JSON.stringify({
    sdk: 'node',
    sent,
    bytes: payload.length,
    secs: Number(wall.toFixed(3)),
    rate: Math.round(sent / wall),
    cpu_s: Number(cpu.toFixed(2)),
    cpu_us_per_job: Number(((cpu / Math.max(sent, 1)) * 1e6).toFixed(1)),
    cores: Number((cpu / wall).toFixed(2)),
  }),
);
