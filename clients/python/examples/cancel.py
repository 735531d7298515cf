"""Cancelling a running job: AdminService.CancelJob reaches the handler."""

import asyncio
import os
import threading

from leaseq import AsyncAdminClient, AsyncClient, Job, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "renders")


async def main() -> None:
    worker = Worker(addr, max_in_flight=4, lease=600)
    render_started, export_started = asyncio.Event(), threading.Event()
    export_stopped = threading.Event()

    @worker.handler(queue)
    async def render(job: Job) -> None:
        render_started.set()
        try:
            await asyncio.sleep(3600)  # the long work
        except asyncio.CancelledError:
            print("render stopped:", job.payload.decode())  # clean up; nothing is settled
            raise

    @worker.handler(queue + "-export")
    def export(job: Job) -> None:  # a plain handler (a thread): it checks its flag
        export_started.set()
        while not job.cancelled.wait(0.05):
            pass  # a step of the work
        print("export stopped:", job.payload.decode())  # what it returns is ignored
        export_stopped.set()

    running = asyncio.ensure_future(worker.run_async())
    async with AsyncClient(addr) as client, AsyncAdminClient(addr) as admin:
        job = await client.enqueue(queue, b"film")
        await render_started.wait()
        await admin.cancel_job(job.job_id)  # or `leaseq job cancel ID`, or the console

        job = await client.enqueue(queue + "-export", b"archive")
        await asyncio.get_running_loop().run_in_executor(None, export_started.wait)
        await admin.cancel_job(job.job_id)
        while worker.stats.cancelled < 2:
            await asyncio.sleep(0.01)
        # The thread sees its flag at its next check: let it finish first.
        await asyncio.get_running_loop().run_in_executor(None, export_stopped.wait)
    worker.stop()
    await running
    print("cancelled", worker.stats.cancelled, "acked", worker.stats.acked)


asyncio.run(main())
