"""What a Python single enqueue costs in grpcio alone (issue 36's Python
producer target): N sequential Enqueue calls through a bare generated stub
(no SDK), with and without the SDK's per-call timeout and metadata and a
few channel options, against N calls of the SDK's Client.enqueue, each
run alternated REPS times. Prints one line per run: calls a second, the
process's CPU a call (/proc/self/stat) and the wall time a call.

    py_grpc_floor.py ADDR [N=4000] [REPS=2]

Run with the SDK's venv (clients/setup.sh python) against a broker
(`leaseq serve --listen ADDR`). The bare stub's CPU a call is the floor
the SDK's sync producer can reach with grpcio; pika's confirmed publish
is the figure it is compared with (sdk-rabbitmq.sh)."""

import os
import sys
import time

import grpc

from leaseq import Client
from leaseq.v1 import queue_pb2 as pb
from leaseq.v1 import queue_pb2_grpc as pbg

TCK = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


addr = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 2
payload = b"x" * 100
req = pb.EnqueueRequest(queue="grpc-floor", payload=payload)


def run(name: str, call) -> None:
    for _ in range(50):  # the connection and the first calls, outside the window
        call()
    t, c = time.monotonic(), cpu_s()
    for _ in range(n):
        call()
    t, c = time.monotonic() - t, cpu_s() - c
    print(f"{name:44s} {n / t:7.0f}/s  {c / n * 1e6:6.1f} µs CPU a call  {t / n * 1e6:6.1f} µs wall a call", flush=True)


channels = {
    "bare stub, default channel": [],
    "bare stub, grpc.enable_retries=0": [("grpc.enable_retries", 0)],
    "bare stub, grpc.minimal_stack=1": [("grpc.minimal_stack", 1)],
}
for _ in range(reps):
    for name, options in channels.items():
        with grpc.insecure_channel(addr, options=options) as ch:
            stub = pbg.QueueServiceStub(ch)
            run(name, lambda: stub.Enqueue(req))
            run(name + ", timeout and metadata", lambda: stub.Enqueue(req, timeout=30, metadata=(("x-a", "b"),)))
    with Client(addr) as c:
        run("SDK Client.enqueue", lambda: c.enqueue("grpc-floor", payload))
