"""Worker behaviour against a real broker process."""

import asyncio
import logging
import os
import signal

import grpc
import pytest
from util import first_delivery, queue_name, retry_unavailable, run

from leaseq import Client, NewJob, Worker


async def job_is_gone(c: Client, q: str, dedup_key: str) -> bool:
    """Whether the job enqueued with ``dedup_key`` was acked or dead-lettered:
    only then is its key free again (a waiting or leased job keeps it)."""
    again = await c.enqueue(q, b"probe", dedup_key=dedup_key)
    return not again.duplicate


def test_handler_success_acks(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, b"hello", dedup_key="one")
            got: asyncio.Queue = asyncio.Queue()
            w = Worker(c, [q], got.put, max_in_flight=2, lease=5)
            task = asyncio.create_task(w.run())
            job = await got.get()
            assert (job.id, job.payload, job.attempt) == (r.job_id, b"hello", 1)
            w.stop()
            await task  # a graceful stop settles before returning
            assert await job_is_gone(c, q, "one")
            # And a second consumer gets the probe, not the acked job.
            assert (await first_delivery(c, q)).payload == b"probe"

    run(body())


def test_sync_handler_runs_in_a_thread(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            await c.enqueue(q, b"sync", dedup_key="s")
            loop = asyncio.get_running_loop()
            seen: asyncio.Future = loop.create_future()

            def handler(job):  # blocking code is fine here
                loop.call_soon_threadsafe(seen.set_result, job.payload)

            w = Worker(c, [q], handler, lease=5)
            task = asyncio.create_task(w.run())
            assert await seen == b"sync"
            w.stop()
            await task
            assert await job_is_gone(c, q, "s")

    run(body())


def test_handler_exception_nacks_with_its_text(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, b"flaky")
            attempts: asyncio.Queue = asyncio.Queue()

            async def handler(job):
                await attempts.put(job)
                if job.attempt == 1:
                    raise RuntimeError("disk on fire")

            w = Worker(c, [q], handler, lease=5)
            task = asyncio.create_task(w.run())
            first = await attempts.get()
            # Redelivered after the queue's default backoff (about 1 s).
            second = await attempts.get()
            w.stop()
            await task
            assert (first.id, first.attempt, first.last_error) == (r.job_id, 1, "")
            assert (second.id, second.attempt, second.last_error) == (r.job_id, 2, "disk on fire")

    run(body())


def test_lease_is_extended_while_a_slow_handler_runs(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            await c.enqueue(q, b"slow", dedup_key="slow")
            deliveries = []
            done = asyncio.Event()

            async def handler(job):
                deliveries.append(job)
                if len(deliveries) == 1:
                    await asyncio.sleep(2.5)  # the work: 2.5 leases long
                    done.set()

            # Two workers: had the 1 s lease lapsed, the job would have gone
            # to the idle one (or back to the first) with attempt 2.
            workers = [Worker(c, [q], handler, max_in_flight=1, lease=1) for _ in range(2)]
            tasks = [asyncio.create_task(w.run()) for w in workers]
            await done.wait()
            for w in workers:
                w.stop()
            await asyncio.gather(*tasks)
            assert [j.attempt for j in deliveries] == [1]
            assert await job_is_gone(c, q, "slow")

    run(body())


def test_concurrency_never_exceeds_max_in_flight(addr):
    async def body():
        q = queue_name()
        total, limit = 15, 3
        async with Client(addr) as c:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(total)])
            running = peak = finished = 0
            all_done = asyncio.Event()

            async def handler(job):
                nonlocal running, peak, finished
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.1)  # the work
                running -= 1
                finished += 1
                if finished == total:
                    all_done.set()

            w = Worker(c, [q], handler, max_in_flight=limit, lease=5)
            task = asyncio.create_task(w.run())
            await all_done.wait()
            w.stop()
            await task
            # Reaching the limit shows the bound is what held it back.
            assert peak == limit

    run(body())


def test_stop_lets_running_handlers_finish_and_settle(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            await c.enqueue(q, b"x", dedup_key="x")
            started, finished = asyncio.Event(), asyncio.Event()

            async def handler(job):
                started.set()
                await asyncio.sleep(1)
                finished.set()

            w = Worker(c, [q], handler, lease=5, grace=10)
            task = asyncio.create_task(w.run())
            await started.wait()
            w.stop()
            await task
            assert finished.is_set()
            assert await job_is_gone(c, q, "x")

    run(body())


def test_stop_grace_cancels_a_handler_and_releases_its_job(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, b"stuck")
            started = asyncio.Event()
            cancelled = False

            async def handler(job):
                nonlocal cancelled
                started.set()
                try:
                    await asyncio.Event().wait()  # never finishes by itself
                except asyncio.CancelledError:
                    cancelled = True
                    raise

            w = Worker(c, [q], handler, lease=30, grace=0.5)
            task = asyncio.create_task(w.run())
            await started.wait()
            w.stop()
            await task
            assert cancelled
            # Released when the stream closed, long before its 30 s lease.
            again = await first_delivery(c, q)
            assert (again.id, again.attempt) == (r.job_id, 2)

    run(body())


def test_cancelling_run_cancels_handlers_at_once(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, b"x")
            started, cancelled = asyncio.Event(), asyncio.Event()

            async def handler(job):
                started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            # A grace far longer than the test's timeout: cancelling must not wait for it.
            w = Worker(c, [q], handler, lease=30, grace=3600)
            task = asyncio.create_task(w.run())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert cancelled.is_set()
            again = await first_delivery(c, q)
            assert (again.id, again.attempt) == (r.job_id, 2)

    run(body())


def test_worker_survives_a_broker_restart(private_broker):
    async def body():
        q = queue_name()
        async with Client(private_broker.addr) as c:
            got: asyncio.Queue = asyncio.Queue()
            w = Worker(c, [q], got.put, lease=5, backoff_initial=0.05, backoff_max=0.5)
            task = asyncio.create_task(w.run())
            await c.enqueue(q, b"before")
            assert (await got.get()).payload == b"before"

            # SIGTERM drains (streams end with UNAVAILABLE); same port again.
            assert await asyncio.to_thread(private_broker.stop) == 0
            await asyncio.to_thread(private_broker.start)

            await retry_unavailable(lambda: c.enqueue(q, b"after", dedup_key="after"))
            # "before" may come again first: if the restart beat its Ack, the
            # drain released it (at-least-once).
            while (await got.get()).payload != b"after":
                pass
            assert not task.done()
            w.stop()
            await task
            assert await job_is_gone(c, q, "after")

    run(body(), timeout=90)


def test_worker_with_a_bad_queue_name_fails_fast(addr):
    async def body():
        async with Client(addr) as c:
            w = Worker(c, ["no spaces allowed"], lambda job: None)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await w.run()
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "queues" in e.value.details()

    run(body())


class _LogEvent(logging.Handler):
    """Sets an asyncio.Event when the worker logs a message containing ``text``
    (the worker logs from the event loop's thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text, self.event = text, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_a_silent_stream_is_reopened(private_broker):
    async def body():
        q = queue_name()
        pid = private_broker.proc.pid
        watchdog = _LogEvent("no message on the stream")
        logging.getLogger("leaseq.worker").addHandler(watchdog)
        try:
            async with Client(private_broker.addr) as c:
                got: asyncio.Queue = asyncio.Queue()
                w = Worker(c, [q], got.put, lease=5, idle_timeout=3, backoff_initial=0.05, backoff_max=0.5)
                task = asyncio.create_task(w.run())
                await c.enqueue(q, b"before")
                assert (await got.get()).payload == b"before"

                # A hung broker: the connection stays up, heartbeats stop.
                os.kill(pid, signal.SIGSTOP)
                try:
                    await watchdog.event.wait()
                finally:
                    os.kill(pid, signal.SIGCONT)

                await retry_unavailable(lambda: c.enqueue(q, b"after"))
                while (await got.get()).payload != b"after":
                    pass
                w.stop()
                await task
        finally:
            logging.getLogger("leaseq.worker").removeHandler(watchdog)

    run(body(), timeout=60)
