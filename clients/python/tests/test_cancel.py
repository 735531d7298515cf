"""A cancel that reaches the handler (issue 34, item 3): AdminService.CancelJob
on a job a worker holds stops its handler (an async one cancelled, a plain
one flagged through job.cancelled), drops it if it has not started, and
settles nothing; the raw streams hand the notice to ``on_cancel``. Against
the real broker process."""

import asyncio
import logging
import threading

import pytest
from util import LogEvent, queue_name, run

from leaseq import AdminClient, AsyncAdminClient, AsyncClient, Cancelled, Client, Job, RpcError, Worker

WORKER_LOG = logging.getLogger("leaseq.worker")

# Long enough that nothing in a test comes from a lease running out.
LEASE = 600


def start(worker: Worker) -> "asyncio.Task[None]":
    return asyncio.ensure_future(worker.run_async(handle_signals=False))


async def until(cond, timeout: float = 10.0) -> None:
    """Polls ``cond()`` every 10 ms until it holds (fails after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("stream_acks", [True, False], ids=["consume", "subscribe"])
def test_a_running_async_handler_is_cancelled_and_nothing_is_settled(addr, stream_acks):
    async def body():
        q = queue_name()
        logs = LogEvent("cancelled by the broker", logging.INFO)
        WORKER_LOG.addHandler(logs)
        level = WORKER_LOG.level
        WORKER_LOG.setLevel(logging.INFO)
        try:
            async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
                started, stopped, done = asyncio.Event(), asyncio.Event(), asyncio.Queue()
                w = Worker(addr, max_in_flight=1, lease=LEASE, stream_acks=stream_acks)

                @w.handler(q)
                async def handle(job: Job) -> None:
                    if job.payload == b"long":
                        started.set()
                        try:
                            await asyncio.sleep(3600)
                        except asyncio.CancelledError:
                            assert job.is_cancelled()
                            stopped.set()
                            raise
                    await done.put(job.payload)

                task = start(w)
                long = await c.enqueue(q, b"long")
                await asyncio.wait_for(started.wait(), 10)
                assert "cancel" in w.features
                # One credit, held by the long job: the next waits in the broker.
                await c.enqueue(q, b"next")
                assert await admin.cancel_job(long.job_id)
                await asyncio.wait_for(stopped.wait(), 5)  # CancelledError in the handler
                # The credit came back with the notice: the next job runs now,
                # not when the 600 s lease would have run out.
                assert await asyncio.wait_for(done.get(), 5) == b"next"
                await until(lambda: w.stats.acked == 1)
                w.stop()
                await task
                s = w.stats
                assert (s.delivered, s.cancelled, s.acked, s.nacked, s.lease_lost, s.timed_out) == (2, 1, 1, 0, 0, 0)
                assert w.transport == ("consume" if stream_acks else "subscribe")
                with pytest.raises(RpcError) as e:
                    await admin.get_job(long.job_id)
                assert e.value.code_name == "NOT_FOUND"
                assert logs.event.is_set()
                (line,) = [m for m in logs.at_least(logging.INFO) if "cancelled by the broker" in m]
                assert long.job_id in line and "nothing settled" in line
        finally:
            WORKER_LOG.removeHandler(logs)
            WORKER_LOG.setLevel(level)

    run(body())


def test_a_plain_handler_sees_its_flag_and_what_it_returns_is_not_settled(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            started, seen = threading.Event(), []
            done: asyncio.Queue = asyncio.Queue()
            loop = asyncio.get_running_loop()
            w = Worker(addr, max_in_flight=1, lease=LEASE)

            @w.handler(q)
            def handle(job: Job) -> None:
                if job.payload == b"long":
                    started.set()
                    # The work, a step at a time, until the flag is set.
                    ok = job.cancelled.wait(30)
                    seen.append((ok, job.is_cancelled(), threading.current_thread().name))
                    return  # would ack; ignored
                loop.call_soon_threadsafe(done.put_nowait, job.payload)

            task = start(w)
            long = await c.enqueue(q, b"long")
            await loop.run_in_executor(None, started.wait, 10)
            assert await admin.cancel_job(long.job_id)
            await until(lambda: bool(seen), 5)
            assert seen[0][:2] == (True, True) and seen[0][2].startswith("leaseq-handler-")
            await c.enqueue(q, b"next")
            assert await asyncio.wait_for(done.get(), 5) == b"next"
            await until(lambda: w.stats.acked == 1)
            w.stop()
            await task
            s = w.stats
            assert (s.delivered, s.cancelled, s.acked, s.nacked, s.lease_lost) == (2, 1, 1, 0, 0)

    run(body())


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_a_job_cancelled_before_its_handler_started_is_dropped(addr, kind):
    """The one slot is held by a cancelled handler that is slow to unwind
    (its cleanup waits); the broker gave the credit back with the notice, so
    the next job is delivered and waits for the slot. Cancelled there, it
    never runs."""

    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            loop = asyncio.get_running_loop()
            started, release = threading.Event(), threading.Event()
            ran: list = []
            w = Worker(addr, max_in_flight=1, lease=LEASE)

            if kind == "async":

                @w.handler(q)
                async def handle(job: Job) -> None:
                    ran.append(job.payload)
                    if job.payload == b"first":
                        started.set()
                        try:
                            await asyncio.sleep(3600)
                        except asyncio.CancelledError:
                            # A slow cleanup: the runner stays busy meanwhile.
                            await loop.run_in_executor(None, release.wait, 30)
                            raise

            else:

                @w.handler(q)
                def handle(job: Job) -> None:
                    ran.append(job.payload)
                    if job.payload == b"first":
                        started.set()
                        job.cancelled.wait(30)
                        release.wait(30)  # slow to return: the thread stays busy

            task = start(w)
            first = await c.enqueue(q, b"first")
            await loop.run_in_executor(None, started.wait, 10)
            second = await c.enqueue(q, b"second")
            assert await admin.cancel_job(first.job_id)
            await until(lambda: w.stats.delivered == 2)  # delivered, waiting for the slot
            assert await admin.cancel_job(second.job_id)
            await until(lambda: w.stats.cancelled == (1 if kind == "async" else 2))
            release.set()
            await until(lambda: w.stats.cancelled == 2)
            third = await c.enqueue(q, b"third")
            await until(lambda: w.stats.acked == 1)
            w.stop()
            await task
            assert ran == [b"first", b"third"]
            s = w.stats
            assert (s.delivered, s.cancelled, s.acked, s.nacked, s.lease_lost) == (3, 2, 1, 0, 0)
            assert third.job_id not in (first.job_id, second.job_id)

    run(body())


@pytest.mark.parametrize("stream", ["consume", "subscribe"])
def test_raw_async_streams_hand_the_notice_to_on_cancel(addr, stream):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            notices: asyncio.Queue = asyncio.Queue()
            opts = dict(max_in_flight=1, lease=LEASE, on_cancel=notices.put_nowait)
            s = c.consume(q, **opts) if stream == "consume" else c.subscribe(q, **opts)
            async with s:
                await s.opened()
                assert "cancel" in s.features
                r = await c.enqueue(q, b"x")
                job = await asyncio.wait_for(s.next_job(), 10)
                assert await admin.cancel_job(r.job_id)
                notice = await asyncio.wait_for(notices.get(), 5)
                assert notice == Cancelled(job.id, job.lease_token) and notice.matches(job)
                # The job is gone: an ack is refused; the credit is back.
                with pytest.raises(RpcError) as e:
                    if stream == "consume":
                        await s.ack(job)
                    else:
                        await c.ack(job.id, job.lease_token)
                assert e.value.lease_lost
                await c.enqueue(q, b"y")
                assert (await asyncio.wait_for(s.next_job(), 5)).payload == b"y"

    run(body())


def test_raw_sync_streams_hand_the_notice_to_on_cancel(addr):
    q = queue_name()
    with Client(addr) as c, AdminClient(addr) as admin:
        # Consume: on the client's background loop, as soon as it arrives.
        got: list = []
        arrived = threading.Event()

        def on_cancel(n: Cancelled) -> None:
            got.append(n)
            arrived.set()

        r = c.enqueue(q, b"a")
        with c.consume(q, max_in_flight=1, lease=LEASE, on_cancel=on_cancel) as s:
            job = next(iter(s))
            assert admin.cancel_job(r.job_id)
            assert arrived.wait(5)
            assert got == [Cancelled(job.id, job.lease_token)]
        # Subscription: on the iterating thread, as it reads the stream.
        got.clear()
        r = c.enqueue(q, b"b")
        with c.subscribe(q, max_in_flight=1, lease=LEASE, on_cancel=got.append) as sub:
            it = iter(sub)
            job = next(it)
            assert admin.cancel_job(r.job_id)
            c.enqueue(q, b"c")
            assert next(it).payload == b"c"  # the credit came back with the notice
            assert got == [Cancelled(job.id, job.lease_token)]
