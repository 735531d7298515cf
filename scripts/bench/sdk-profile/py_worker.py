"""One Python SDK Worker with a no-op handler: works N jobs from QUEUE, then
stops. Prints one JSON line: the rate from the first delivery (the first
handler call) to the last handler completion, and the process's CPU over
that window from /proc/self/stat (every thread: the event loop, gRPC's and
the handler pool's).

    py_worker.py MODE ADDR QUEUE N [--credit 256] [--concurrency C] [--sleep-ms MS] [--cprofile FILE] [--count] [--single]

MODE: "async" (an `async def` handler: the async Worker's path) or "sync"
(a plain function: run in the Worker's thread pool). --credit is the
Worker's max_in_flight (its stream's credit: jobs delivered and unsettled);
--concurrency C its handlers at once (runner tasks in async mode, threads in
sync mode; default: the credit).
--sleep-ms MS: the handler sleeps MS milliseconds (`await asyncio.sleep`
in async mode, `time.sleep` in the Worker's thread pool in sync mode)
instead of returning at once (scripts/bench/sdk-rabbitmq.sh's real
handler). --cprofile FILE: the whole
run under cProfile, stats dumped to FILE (pstats format). --count: counts,
from outside the SDK, what each job costs on the event loop and the stream:
writes on the Consume stream and the acks they carry, responses read by
kind, tasks, futures, event-loop turns and callbacks run (wrappers around
grpc.aio's call and asyncio's loop installed here, nothing in the SDK
changed). Counting slows the run: its rate is not a figure. --single: the
Worker does not ask for batched deliveries (``batched=False``: one delivery
a message, as from a broker that predates them).
scripts/bench/sdk-workers.sh and sdk-rabbitmq.sh run it."""

import argparse
import asyncio
import json
import os
import threading
import time

from leaseq import Job, Worker

TCK = os.sysconf("SC_CLK_TCK")


def cpu_s() -> float:
    """utime + stime of this process (all its threads), in seconds."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TCK


p = argparse.ArgumentParser()
p.add_argument("mode", choices=["async", "sync"])
p.add_argument("addr")
p.add_argument("queue")
p.add_argument("n", type=int)
p.add_argument("--credit", type=int, default=256)
p.add_argument("--concurrency", type=int)
p.add_argument("--sleep-ms", type=float, default=0.0)
p.add_argument("--cprofile")
p.add_argument("--count", action="store_true")
p.add_argument("--single", action="store_true")
args = p.parse_args()

opts = {"batched": False} if args.single else {}
worker = Worker(args.addr, max_in_flight=args.credit, concurrency=args.concurrency, lease=60, **opts)
lock = threading.Lock()
seen = {"n": 0, "t0": None, "c0": None, "t1": None, "c1": None}
counts: dict = {}


def bump(key: str, k: int = 1) -> None:
    counts[key] = counts.get(key, 0) + k


def started() -> None:
    if seen["t0"] is None:
        with lock:
            if seen["t0"] is None:
                seen["t0"], seen["c0"] = time.monotonic(), cpu_s()


def finished() -> None:
    with lock:
        seen["n"] += 1
        if seen["n"] == args.n:
            seen["t1"], seen["c1"] = time.monotonic(), cpu_s()
            worker.stop()


pause = args.sleep_ms / 1000
if args.mode == "async" and pause:

    @worker.handler(args.queue)
    async def sleeper(job: Job) -> None:
        started()
        await asyncio.sleep(pause)
        finished()

elif args.mode == "async":

    @worker.handler(args.queue)
    async def noop(job: Job) -> None:
        started()
        finished()

elif pause:

    @worker.handler(args.queue)
    def sleeper_sync(job: Job) -> None:
        started()
        time.sleep(pause)
        finished()

else:

    @worker.handler(args.queue)
    def noop_sync(job: Job) -> None:
        started()
        finished()


def instrument() -> None:
    """Counting wrappers (--count): grpc.aio's stream calls, and this
    thread's event loop."""
    import grpc.aio._call as gcall

    write0 = gcall._StreamRequestMixin.write
    read0 = gcall._StreamResponseMixin.read

    async def write(self, request):  # type: ignore[no-untyped-def]
        bump("stream_writes")
        bump("acks_written", len(getattr(request, "acks", ())))
        return await write0(self, request)

    async def read(self):  # type: ignore[no-untyped-def]
        msg = await read0(self)
        if msg is not grpc.aio.EOF:
            kind = msg.WhichOneof("kind")
            bump("reads_" + str(kind))
            if kind == "settled":
                bump("settle_results", len(msg.settled.results))
        return msg

    import grpc

    gcall._StreamRequestMixin.write = write
    gcall._StreamResponseMixin.read = read

    loop = asyncio.get_running_loop()
    run_once0 = loop._run_once  # type: ignore[attr-defined]
    create_future0 = loop.create_future

    def run_once() -> None:
        bump("loop_turns")
        bump("callbacks", len(loop._ready))  # type: ignore[attr-defined]
        run_once0()

    def create_future():  # type: ignore[no-untyped-def]
        bump("futures")
        return create_future0()

    def task_factory(loop_, coro, **kw):  # type: ignore[no-untyped-def]
        bump("tasks")
        return asyncio.Task(coro, loop=loop_, **kw)

    loop._run_once = run_once  # type: ignore[attr-defined]
    loop.create_future = create_future  # type: ignore[method-assign]
    loop.set_task_factory(task_factory)


async def main() -> None:
    if args.count:
        instrument()
    await worker.run_async(handle_signals=False)


prof = None
if args.cprofile:
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
asyncio.run(main())
if prof is not None:
    prof.disable()
    prof.dump_stats(args.cprofile)

out = {"sdk": "python-" + args.mode, "jobs": seen["n"], "credit": args.credit}
out["concurrency"] = args.concurrency or args.credit
if pause:
    out["sleep_ms"] = args.sleep_ms
if seen["t1"] is not None:
    secs = seen["t1"] - seen["t0"]
    cpu = seen["c1"] - seen["c0"]
    out.update(
        secs=round(secs, 3),
        rate=round(args.n / secs),
        cpu_s=round(cpu, 2),
        cpu_us_per_job=round(cpu / args.n * 1e6, 1),
        cores=round(cpu / secs, 2),
    )
if args.count:
    out["counts"] = counts
    out["per_job"] = {k: round(v / max(seen["n"], 1), 3) for k, v in counts.items()}
out["profile"] = "cprofile" if args.cprofile else ("count" if args.count else "none")
print(json.dumps(out), flush=True)
