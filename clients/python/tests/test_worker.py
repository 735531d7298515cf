"""Worker behaviour against a real broker process."""

import asyncio
import datetime as dt
import logging
import os
import signal
import threading
import time

import pytest
from util import LogEvent, first_delivery, job_is_gone, queue_name, retry_unavailable, run

from leaseq import AsyncAdminClient, AsyncClient, DeadLetter, Job, NewJob, Retry, RpcError, Worker

WORKER_LOG = logging.getLogger("leaseq.worker")


def start(worker: Worker) -> "asyncio.Task[None]":
    return asyncio.ensure_future(worker.run_async(handle_signals=False))


def test_handler_success_acks(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"hello", dedup_key="one")
            got: asyncio.Queue = asyncio.Queue()
            w = Worker(addr, max_in_flight=2, lease=5)

            @w.handler(q)
            async def handle(job: Job) -> None:
                await got.put(job)

            task = start(w)
            job = await got.get()
            assert (job.id, job.payload, job.attempt) == (r.job_id, b"hello", 1)
            w.stop()
            await task  # a graceful stop settles before returning
            assert await job_is_gone(c, q, "one")
            assert w.stats.acked == 1 and w.transport in ("consume", "subscribe")
            # And a second consumer gets the probe, not the acked job.
            assert (await first_delivery(c, q)).payload == b"probe"

    run(body())


def test_handlers_per_queue_and_the_positional_form(addr):
    async def body():
        qa, qb = queue_name(), queue_name()
        async with AsyncClient(addr) as c:
            seen: asyncio.Queue = asyncio.Queue()
            # Worker(client, queues, handler) registers one handler for each.
            w = Worker(c, [qa], lambda job: seen.put_nowait(("a", job.payload)), lease=5)
            w.add_handler(qb, lambda job: seen.put_nowait(("b", job.payload)))
            assert w.queues == [qa, qb]
            with pytest.raises(ValueError, match="already registered"):
                w.add_handler(qa, lambda job: None)
            task = start(w)
            await c.enqueue(qa, b"1")
            await c.enqueue(qb, b"2")
            got = {await seen.get(), await seen.get()}
            assert got == {("a", b"1"), ("b", b"2")}
            w.stop()
            await task

    run(body())


def test_sync_run_blocks_until_stop_and_runs_plain_handlers_in_threads(addr):
    q = queue_name()
    from leaseq import Client

    with Client(addr) as c:
        c.enqueue(q, b"sync", dedup_key="s")
        w = Worker(c, lease=5)
        threads = []
        seen = threading.Event()

        @w.handler(q)
        def handle(job: Job) -> None:  # blocking code is fine here
            threads.append(threading.current_thread().name)
            seen.set()

        runner = threading.Thread(target=w.run)  # not the main thread: no signal handlers
        runner.start()
        assert seen.wait(10)
        w.stop()
        runner.join(10)
        assert not runner.is_alive()
        assert threads[0].startswith("leaseq-handler")
        assert not c.enqueue(q, b"probe", dedup_key="s").duplicate


def test_handler_exception_nacks_with_its_text(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"flaky")
            attempts: asyncio.Queue = asyncio.Queue()
            w = Worker(addr, lease=5)

            @w.handler(q)
            async def handle(job: Job) -> None:
                await attempts.put(job)
                if job.attempt == 1:
                    raise RuntimeError("disk on fire")

            task = start(w)
            first = await attempts.get()
            # Redelivered after the queue's default backoff (about 1 s).
            second = await attempts.get()
            w.stop()
            await task
            assert (first.id, first.attempt, first.last_error) == (r.job_id, 1, "")
            assert (second.id, second.attempt, second.last_error) == (r.job_id, 2, "disk on fire")

    run(body())


def test_retry_outcome_picks_the_delay_and_the_error(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            now = await c.enqueue(q, b"now")
            later = await c.enqueue(q, b"later")
            attempts: asyncio.Queue = asyncio.Queue()
            w = Worker(addr, lease=5)

            @w.handler(q)
            async def handle(job: Job) -> None:
                await attempts.put(job)
                if job.attempt == 1:
                    raise Retry("busy", after=0 if job.payload == b"now" else 3600)

            task = start(w)
            got = [await attempts.get() for _ in range(3)]
            again = [j for j in got if j.attempt == 2]
            assert [(j.id, j.last_error) for j in again] == [(now.job_id, "busy")]
            w.stop()
            await task
            info = await admin.get_job(later.job_id)
            assert (info.state, info.last_error, info.attempt) == ("scheduled", "busy", 1)
            assert info.run_at is not None
            assert info.run_at - dt.datetime.now(dt.timezone.utc) > dt.timedelta(minutes=50)

    run(body())


def test_dead_letter_outcome_moves_the_job_to_the_dead_letters(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            r = await c.enqueue(q, b"poison")
            done = asyncio.Event()
            w = Worker(addr, lease=5)

            @w.handler(q)
            def handle(job: Job) -> None:
                raise DeadLetter("cannot parse the payload")

            task = start(w)
            while w.stats.dead_lettered == 0:  # counted once the broker answered
                await asyncio.sleep(0.05)
            w.stop()
            await task
            dead = await admin.list_dead_letters(q, include_payload=True)
            assert [(j.id, j.dead_reason, j.last_error, j.payload) for j in dead.items] == [
                (r.job_id, "nacked", "cannot parse the payload", b"poison")
            ]
            assert (w.stats.nacked, w.stats.dead_lettered) == (1, 1)
            done.set()

    run(body())


def test_timeout_cancels_an_async_handler_and_the_job_comes_back(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"slow")
            attempts: asyncio.Queue = asyncio.Queue()
            cancelled = asyncio.Event()
            w = Worker(addr, lease=5, timeout=0.5)

            @w.handler(q)
            async def handle(job: Job) -> None:
                await attempts.put(job)
                if job.attempt == 1:
                    try:
                        await asyncio.Event().wait()  # never finishes by itself
                    except asyncio.CancelledError:
                        cancelled.set()
                        raise

            task = start(w)
            first = await attempts.get()
            second = await attempts.get()
            w.stop()
            await task
            assert cancelled.is_set() and first.cancelled.is_set()
            assert (second.id, second.attempt) == (r.job_id, 2)
            assert second.last_error == "timeout: the handler ran longer than 0.5s"
            assert w.stats.timed_out == 1

    run(body())


def test_timeout_of_a_plain_handler_nacks_and_flags_the_job(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"slow")
            seen: asyncio.Queue = asyncio.Queue()
            gave_up = threading.Event()
            loop = asyncio.get_running_loop()
            w = Worker(addr, lease=5, max_in_flight=2)

            @w.handler(q, timeout=0.3)  # the per-handler timeout wins
            def handle(job: Job) -> None:
                loop.call_soon_threadsafe(seen.put_nowait, job)
                if job.attempt == 1:
                    # A thread cannot be interrupted; the handler polls.
                    if job.cancelled.wait(10):
                        gave_up.set()

            task = start(w)
            first = await seen.get()
            second = await seen.get()
            w.stop()
            await task
            assert gave_up.is_set() and first.cancelled.is_set()
            assert (second.id, second.attempt) == (r.job_id, 2)
            assert "timeout" in second.last_error

    run(body())


def test_lease_is_extended_while_a_slow_handler_runs(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
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
            workers = [Worker(addr, [q], handler, max_in_flight=1, lease=1) for _ in range(2)]
            tasks = [start(w) for w in workers]
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
        async with AsyncClient(addr) as c:
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

            w = Worker(addr, [q], handler, max_in_flight=limit, lease=5)
            task = start(w)
            await all_done.wait()
            w.stop()
            await task
            # Reaching the limit shows the bound is what held it back.
            assert peak == limit
            assert w.stats.acked == total

    run(body())


def test_stop_lets_running_handlers_finish_and_settle(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue(q, b"x", dedup_key="x")
            started, finished = asyncio.Event(), asyncio.Event()

            async def handler(job):
                started.set()
                await asyncio.sleep(1)
                finished.set()

            w = Worker(addr, [q], handler, lease=5, grace=10)
            task = start(w)
            await started.wait()
            w.stop()
            await task
            assert finished.is_set()
            assert await job_is_gone(c, q, "x")

    run(body())


def test_stop_grace_cancels_a_handler_and_releases_its_job(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
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

            w = Worker(addr, [q], handler, lease=30, grace=0.5)
            task = start(w)
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
        async with AsyncClient(addr) as c:
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
            w = Worker(addr, [q], handler, lease=30, grace=3600)
            task = start(w)
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert cancelled.is_set()
            again = await first_delivery(c, q)
            assert (again.id, again.attempt) == (r.job_id, 2)

    run(body())


def test_a_lost_lease_ends_the_settle_quietly(addr):
    """The lease goes away while the handler runs, untold (here: the job is
    acked by another party with its token, as another consumer holding a
    later lease would): the worker's own ack is refused
    (FAILED_PRECONDITION), logged at debug only. (CancelJob tells the
    worker, which then settles nothing: tests/test_cancel.py.)"""

    async def body():
        q = queue_name()
        logs = LogEvent("lease lost before the ack")
        WORKER_LOG.addHandler(logs)
        level = WORKER_LOG.level
        WORKER_LOG.setLevel(logging.DEBUG)
        try:
            async with AsyncClient(addr) as c:
                await c.enqueue(q, b"x")

                async def handler(job):
                    await c.ack(job.id, job.lease_token)

                w = Worker(addr, [q], handler, lease=30)
                task = start(w)
                await logs.event.wait()
                w.stop()
                await task
            assert (w.stats.lease_lost, w.stats.acked) == (1, 0)
            assert [r.levelno for r in logs.records if "lease lost" in r.getMessage()] == [logging.DEBUG]
            assert logs.at_least(logging.WARNING) == []
        finally:
            WORKER_LOG.removeHandler(logs)
            WORKER_LOG.setLevel(level)

    run(body())


def test_extend_and_settle_after_the_lease_was_taken_over(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"x")
            async with c.subscribe(q, max_in_flight=1, lease=1) as a:
                old = await asyncio.wait_for(a.next_job(), 10)
                # The 1 s lease runs out; the reaper hands the job on, to B
                # (or first back to A, whose credit the expiry freed: then
                # A's copy expires too and B gets a later attempt).
                async with c.subscribe(q, max_in_flight=1, lease=30) as b:
                    new = await asyncio.wait_for(b.next_job(), 20)
                    assert new.id == r.job_id and new.attempt >= 2
                    assert new.lease_token != old.lease_token
                    for late in (
                        c.extend_lease(old.id, old.lease_token, 30),
                        c.ack(old.id, old.lease_token),
                        c.nack(old.id, old.lease_token, "late"),
                    ):
                        with pytest.raises(RpcError) as e:
                            await late
                        assert e.value.lease_lost
                    await c.ack(new.id, new.lease_token)

    run(body())


def test_worker_with_a_bad_queue_name_fails_fast(addr):
    async def body():
        w = Worker(addr, ["no spaces allowed"], lambda job: None)
        with pytest.raises(RpcError) as e:
            await w.run_async(handle_signals=False)
        assert e.value.code_name == "INVALID_ARGUMENT"
        assert "queues" in e.value.details()

    run(body())


def test_a_drain_loses_nothing_and_the_worker_reconnects(private_broker):
    """SIGTERM to the broker while jobs are in flight: the stream ends with
    UNAVAILABLE, the broker releases what was not settled, the worker
    reconnects to the restarted broker and every job is done."""

    async def body():
        q = queue_name()
        addr = private_broker.addr
        async with AsyncClient(addr) as c:
            ids = {r.job_id for r in await c.enqueue_batch([NewJob(q, str(i)) for i in range(30)])}
            done: set = set()
            halfway, all_done = asyncio.Event(), asyncio.Event()

            async def handler(job):
                await asyncio.sleep(0.05)
                done.add(job.id)
                if len(done) >= 10:
                    halfway.set()
                if done >= ids:
                    all_done.set()

            w = Worker(addr, [q], handler, max_in_flight=4, lease=5, backoff_initial=0.05, backoff_max=0.5)
            task = start(w)
            await halfway.wait()
            # SIGTERM drains (streams end with UNAVAILABLE); same port again.
            assert await asyncio.to_thread(private_broker.stop) == 0
            await asyncio.to_thread(private_broker.start)
            after = await retry_unavailable(lambda: c.enqueue(q, b"after", dedup_key="after"))
            ids.add(after.job_id)
            if not done >= ids:
                all_done.clear()
                await all_done.wait()
            assert not task.done()
            w.stop()
            await task
            assert w.stats.reconnects >= 1
            assert await job_is_gone(c, q, "after")

    run(body(), timeout=90)


def test_a_silent_stream_is_reopened(private_broker):
    async def body():
        q = queue_name()
        pid = private_broker.proc.pid
        watchdog = LogEvent("no message on the stream")
        WORKER_LOG.addHandler(watchdog)
        try:
            async with AsyncClient(private_broker.addr) as c:
                got: asyncio.Queue = asyncio.Queue()
                w = Worker(c, [q], got.put, lease=5, idle_timeout=3, backoff_initial=0.05, backoff_max=0.5)
                task = start(w)
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
            WORKER_LOG.removeHandler(watchdog)

    run(body(), timeout=60)


def test_burst_mode_works_what_waits_then_returns(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(20)])
            later = await c.enqueue(q, b"later", delay=3600)  # not waited for
            seen = []
            w = Worker(addr, [q], lambda job: seen.append(job.id), max_in_flight=4, lease=5)
            await w.run_async(handle_signals=False, burst=True)  # returns by itself
            assert len(seen) == 20 and later.job_id not in seen
            assert (w.stats.acked, w.stats.delivered) == (20, 20)
            # And with nothing waiting it returns too.
            empty = Worker(addr, [queue_name()], lambda job: None, lease=5)
            await empty.run_async(handle_signals=False, burst=True)
            assert empty.stats.delivered == 0

    run(body())


def test_job_json_into_plain_data_a_dataclass_and_back():
    import dataclasses

    from leaseq import from_json, to_json
    from leaseq.v1 import queue_pb2 as pb

    @dataclasses.dataclass
    class Email:
        to: str
        n: int

    job = Job.from_delivery(pb.Delivery(job=pb.Job(id="j", payload=to_json(Email("a@b", 2))), lease_token="t"))
    assert job.payload == b'{"to":"a@b","n":2}'
    assert job.json() == {"to": "a@b", "n": 2}
    assert job.json(Email) == Email("a@b", 2)
    assert from_json(b"[1, 2]", tuple) == (1, 2)
    with pytest.raises(TypeError, match="JSON object"):
        from_json(b"[1]", Email)
    with pytest.raises(ValueError):
        Job.from_delivery(pb.Delivery(job=pb.Job(id="j", payload=b"not json"))).json()
