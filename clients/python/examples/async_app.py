"""The asyncio client and worker: same methods, awaited."""

import asyncio
import os

from leaseq import AsyncClient, Job, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "reports")


async def main() -> None:
    async with AsyncClient(addr) as client:
        await client.enqueue(queue, b"report 1")
        await client.enqueue(queue, b"report 2")

    done = 0
    worker = Worker(addr, max_in_flight=4, lease=30)

    @worker.handler(queue, timeout=10)  # cancelled after 10 s, then nacked
    async def build_report(job: Job) -> None:
        nonlocal done
        await asyncio.sleep(0.1)  # the work
        print("built", job.payload.decode(), "attempt", job.attempt)
        done += 1
        if done == 2:
            worker.stop()  # a real worker runs until SIGTERM

    await worker.run_async()
    print("acked", worker.stats.acked)


asyncio.run(main())
