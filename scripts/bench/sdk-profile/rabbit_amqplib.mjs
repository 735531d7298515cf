// RabbitMQ's Node client (amqplib, its promise API) as a user would write a
// worker and a producer: the peer of the Node SDK in
// scripts/bench/sdk-rabbitmq.sh (issue 36). A durable quorum queue,
// persistent messages; the queue is deleted at the end. Prints one JSON
// line.
//
//     node rabbit_amqplib.mjs MODULES worker URI QUEUE N [PREFETCH=256]
//         one consumer (prefetch PREFETCH, manual acks) whose callback acks
//         each message with one ch.ack (allUpTo false) until N are acked;
//         the queue is filled beforehand (lapin-bench fill). The rate from
//         the first delivery to the last callback's completion, and the
//         process's CPU over that window (/proc/self/stat)
//     node rabbit_amqplib.mjs MODULES producer URI QUEUE N SECS [BYTES=100]
//         the queue (re)declared, a confirm channel, then one publish at a
//         time, each awaited to its confirm, until N are confirmed or SECS
//         have passed (one publish before the window)
//
// MODULES: the node_modules directory amqplib is installed in (the
// script's private one, from npm).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [modules, cmd, uri, queue, nArg, ...rest] = process.argv.slice(2);
const amqp = createRequire(path.join(path.resolve(modules), 'x.js'))('amqplib');
const n = Number(nArg);

const cpuS = () => {
  const f = readFileSync('/proc/self/stat', 'utf8').split(')').pop().trim().split(' ');
  return (Number(f[11]) + Number(f[12])) / 100; // CLK_TCK on Linux
};
const window = (k, wall, cpu) => ({
  secs: Number(wall.toFixed(3)),
  rate: Math.round(k / wall),
  cpu_s: Number(cpu.toFixed(2)),
  cpu_us_per_job: Number(((cpu / Math.max(k, 1)) * 1e6).toFixed(1)),
  cores: Number((cpu / wall).toFixed(2)),
});

const conn = await amqp.connect(uri);
let out;
if (cmd === 'worker') {
  const prefetch = Number(rest[0] ?? 256);
  const ch = await conn.createChannel();
  await ch.prefetch(prefetch);
  let done = 0;
  let t0;
  let c0;
  out = await new Promise((resolve) => {
    ch.consume(queue, (msg) => {
      if (msg === null) return;
      if (done === 0) {
        t0 = performance.now();
        c0 = cpuS();
      }
      ch.ack(msg);
      done += 1;
      if (done === n) {
        const wall = (performance.now() - t0) / 1000;
        const cpu = cpuS() - c0;
        resolve({ sdk: 'amqplib', jobs: done, credit: prefetch, queue_type: 'quorum', ...window(n, wall, cpu) });
      }
    });
  });
  await ch.close();
} else if (cmd === 'producer') {
  const secs = Number(rest[0]);
  const body = Buffer.alloc(Number(rest[1] ?? 100), 'x');
  const ch = await conn.createConfirmChannel();
  await ch.deleteQueue(queue);
  await ch.assertQueue(queue, { durable: true, arguments: { 'x-queue-type': 'quorum' } });
  const publish = () =>
    new Promise((resolve, reject) =>
      ch.sendToQueue(queue, body, { persistent: true }, (err) => (err ? reject(err) : resolve())),
    );
  await publish();
  let sent = 0;
  const t0 = performance.now();
  const c0 = cpuS();
  const deadline = t0 + secs * 1000;
  while (sent < n && performance.now() < deadline) {
    await publish();
    sent += 1;
  }
  const wall = (performance.now() - t0) / 1000;
  out = { sdk: 'amqplib', sent, bytes: body.length, queue_type: 'quorum', ...window(sent, wall, cpuS() - c0) };
  await ch.close();
} else {
  console.error('usage: node rabbit_amqplib.mjs MODULES worker|producer URI QUEUE N ...');
  process.exit(2);
}
const admin = await conn.createChannel();
await admin.deleteQueue(queue);
await conn.close();
console.log(JSON.stringify(out));
