"""RabbitMQ's Python client (pika, BlockingConnection) as a user would
write a worker and a producer: the peer of the Python SDK in
scripts/bench/sdk-rabbitmq.sh (issue 36). A durable quorum queue,
persistent messages (delivery mode 2); the queue is deleted at the end.
Prints one JSON line.

    rabbit_pika.py worker URI QUEUE N [PREFETCH=256]
        one consumer (basic_qos PREFETCH, manual acks) whose callback acks
        each message with one basic_ack (multiple=False) until N are
        acked; the queue is filled beforehand (lapin-bench fill). The rate
        from the first delivery to the last callback's completion, and the
        process's CPU over that window (/proc/self/stat)
    rabbit_pika.py producer URI QUEUE N SECS [BYTES=100]
        the queue (re)declared, publisher confirms on (confirm_delivery:
        each basic_publish returns once the broker confirmed it), then one
        publish at a time until N are confirmed or SECS have passed (one
        publish before the window: the channel's first)

Run with the script's private venv (pika from PyPI, installed by
scripts/bench/sdk-rabbitmq.sh)."""

import json
import os
import sys
import time

import pika

TCK = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    """utime + stime of this process (all its threads), in seconds."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


def window(n: int, wall: float, cpu: float) -> dict:
    return {
        "secs": round(wall, 3),
        "rate": round(n / wall),
        "cpu_s": round(cpu, 2),
        "cpu_us_per_job": round(cpu / max(n, 1) * 1e6, 1),
        "cores": round(cpu / wall, 2),
    }


cmd, uri, queue, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
conn = pika.BlockingConnection(pika.URLParameters(uri))
ch = conn.channel()

if cmd == "worker":
    prefetch = int(sys.argv[5]) if len(sys.argv) > 5 else 256
    ch.basic_qos(prefetch_count=prefetch)
    seen = {"n": 0, "t0": 0.0, "c0": 0.0, "t1": 0.0, "c1": 0.0}

    def on_message(chan, method, _props, _body):  # type: ignore[no-untyped-def]
        if seen["n"] == 0:
            seen["t0"], seen["c0"] = time.monotonic(), cpu_s()
        chan.basic_ack(delivery_tag=method.delivery_tag)
        seen["n"] += 1
        if seen["n"] == n:
            seen["t1"], seen["c1"] = time.monotonic(), cpu_s()
            chan.stop_consuming()

    ch.basic_consume(queue=queue, on_message_callback=on_message)
    ch.start_consuming()
    out = {"sdk": "pika", "jobs": seen["n"], "credit": prefetch, "queue_type": "quorum"}
    out.update(window(n, seen["t1"] - seen["t0"], seen["c1"] - seen["c0"]))
elif cmd == "producer":
    secs = float(sys.argv[5])
    body = b"x" * (int(sys.argv[6]) if len(sys.argv) > 6 else 100)
    ch.queue_delete(queue=queue)
    ch.queue_declare(queue=queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    ch.basic_publish(exchange="", routing_key=queue, body=body, properties=props)
    sent = 0
    t0, c0 = time.monotonic(), cpu_s()
    deadline = t0 + secs
    while sent < n and time.monotonic() < deadline:
        # Confirm mode: returns once the broker acked it; raises on a nack.
        ch.basic_publish(exchange="", routing_key=queue, body=body, properties=props)
        sent += 1
    t1, c1 = time.monotonic(), cpu_s()
    out = {"sdk": "pika", "sent": sent, "bytes": len(body), "queue_type": "quorum"}
    out.update(window(sent, t1 - t0, c1 - c0))
else:
    sys.exit("usage: rabbit_pika.py worker|producer URI QUEUE N ...")

conn.channel().queue_delete(queue=queue)
conn.close()
print(json.dumps(out), flush=True)
