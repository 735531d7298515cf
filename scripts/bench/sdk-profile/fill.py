"""Pre-fills a queue: N jobs of BYTES bytes, in EnqueueBatch calls of 500
(the Python SDK's Client). Prints one JSON line.

    fill.py ADDR QUEUE N [BYTES=100]

Run with the SDK's venv (clients/setup.sh python); scripts/bench/sdk-workers.sh
calls it."""

import json
import sys
import time

from leaseq import Client, NewJob

addr, queue, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = int(sys.argv[4]) if len(sys.argv) > 4 else 100
payload = b"x" * size
t0 = time.monotonic()
with Client(addr) as c:
    left = n
    while left:
        k = min(500, left)
        c.enqueue_batch([NewJob(queue, payload) for _ in range(k)])
        left -= k
print(json.dumps({"filled": n, "queue": queue, "bytes": size, "secs": round(time.monotonic() - t0, 3)}))
