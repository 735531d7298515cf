"""One Python SDK producer: sequential single enqueues (each awaited or
returned before the next; no batching) of BYTES-byte jobs into QUEUE until
N are enqueued or SECS have passed. Prints one JSON line: the rate and the
process's CPU per job from /proc/self/stat.

    py_producer.py MODE ADDR QUEUE N SECS [BYTES=100]

MODE: "sync" (Client.enqueue) or "async" (AsyncClient.enqueue, awaited one
at a time). Run with the SDK's venv (clients/setup.sh python);
scripts/bench/sdk-rabbitmq.sh runs it."""

import asyncio
import json
import os
import sys
import time

from leaseq import Client
from leaseq.aio import AsyncClient

TCK = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    """utime + stime of this process (all its threads), in seconds."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


mode, addr, queue = sys.argv[1], sys.argv[2], sys.argv[3]
n, secs = int(sys.argv[4]), float(sys.argv[5])
payload = b"x" * (int(sys.argv[6]) if len(sys.argv) > 6 else 100)


def sync_run() -> int:
    sent = 0
    with Client(addr) as c:
        c.enqueue(queue, payload)  # the connection, outside the window
        t0[:] = [time.monotonic(), cpu_s()]
        deadline = t0[0] + secs
        while sent < n and time.monotonic() < deadline:
            c.enqueue(queue, payload)
            sent += 1
        t1[:] = [time.monotonic(), cpu_s()]
    return sent


async def async_run() -> int:
    sent = 0
    c = AsyncClient(addr)
    try:
        await c.enqueue(queue, payload)
        t0[:] = [time.monotonic(), cpu_s()]
        deadline = t0[0] + secs
        while sent < n and time.monotonic() < deadline:
            await c.enqueue(queue, payload)
            sent += 1
        t1[:] = [time.monotonic(), cpu_s()]
    finally:
        await c.close()
    return sent


t0: list = []
t1: list = []
sent = sync_run() if mode == "sync" else asyncio.run(async_run())
wall, cpu = t1[0] - t0[0], t1[1] - t0[1]
print(
    json.dumps(
        {
            "sdk": "python-" + mode,
            "sent": sent,
            "bytes": len(payload),
            "secs": round(wall, 3),
            "rate": round(sent / wall),
            "cpu_s": round(cpu, 2),
            "cpu_us_per_job": round(cpu / max(sent, 1) * 1e6, 1),
            "cores": round(cpu / wall, 2),
        }
    ),
    flush=True,
)
