"""Results, progress and waiting for a job (issue 34, item 2) in the Python
SDK, against the real broker process:

- ``return Ack(result=...)`` (and a Task handler's returned value, as JSON)
  is read back by ``client.wait`` and ``AdminClient.get_job``, on Consume
  and on Subscribe (whose AckBatch cannot carry it: a unary Ack), from
  async and plain handlers;
- ``job.progress(f, msg)`` is read back by ``get_job`` while the job is
  held (Consume: on the stream; Subscribe: ReportProgress); bad reports
  raise ValueError naming the field and send nothing;
- ``wait`` for completed, dead and cancelled jobs, from the blocking and
  the asyncio client; ``Task.submit(...).result()``;
- a broker that did not list "ack.result"/"progress" (a proxy strips the
  heartbeat's features): the job with a result is nacked with a reason,
  never acked without it; ``job.progress`` raises UNIMPLEMENTED."""

import asyncio
import json
import threading
import time
from dataclasses import dataclass

import grpc
import pytest
from featureless_proxy import FeaturelessProxy
from util import queue_name, run

from leaseq import (
    Ack,
    AdminClient,
    AsyncAdminClient,
    AsyncClient,
    Client,
    DeadLetter,
    Job,
    JobFailed,
    RpcError,
    Task,
    Worker,
)

LEASE = 600


def start(worker: Worker) -> "asyncio.Task[None]":
    return asyncio.ensure_future(worker.run_async(handle_signals=False))


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("stream_acks", [True, False], ids=["consume", "subscribe"])
def test_a_handlers_result_is_read_back_by_wait_and_get_job(addr, plain, stream_acks):
    async def body():
        q = queue_name()
        w = Worker(addr, max_in_flight=4, lease=LEASE, stream_acks=stream_acks)
        if plain:

            @w.handler(q)
            def handle(job: Job) -> Ack:
                return Ack(result=b"done:" + job.payload)

        else:

            @w.handler(q)
            async def handle_async(job: Job) -> Ack:
                return Ack(result=b"done:" + job.payload)

        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            task = start(w)
            try:
                ids = [(await c.enqueue(q, f"p{i}")).job_id for i in range(3)]
                outcomes = await asyncio.gather(*(c.wait(i, timeout=20) for i in ids))
                for i, (job_id, o) in enumerate(zip(ids, outcomes)):
                    assert (o.job_id, o.state, o.result) == (job_id, "completed", f"done:p{i}".encode()), o
                    assert o.finished_at is not None
                    info = await admin.get_job(job_id)
                    assert (info.state, info.result) == ("completed", f"done:p{i}".encode()), info
                # A job that already ended is answered at once, as often as asked.
                again = await c.wait(ids[0], timeout=5)
                assert again.result == b"done:p0"
            finally:
                w.stop()
                await task
        s = w.stats
        assert (s.acked, s.nacked, s.results_refused) == (3, 0, 0), s
        if stream_acks:
            assert s.settled_on_stream == 3 and s.settled_unary == 0, s
        else:
            # AckBatch cannot carry a result: each went by a unary Ack.
            assert s.settled_unary == 3 and s.settled_batched == 0, s

    run(body(), timeout=60)


@dataclass
class Pair:
    a: int
    b: int


def test_a_task_handlers_returned_value_is_its_json_result_and_submit_waits_for_it(addr):
    q = queue_name()
    add = Task(q, Pair)
    w = Worker(addr, max_in_flight=2, lease=LEASE)

    @w.task(add)
    def handle(p: Pair) -> dict:
        if p.a < 0:
            raise DeadLetter("negative")
        return {"sum": p.a + p.b}

    t = threading.Thread(target=lambda: w.run(handle_signals=False))
    t.start()
    try:
        with Client(addr) as c:
            h = add.submit(c, Pair(2, 3))
            assert h.result(timeout=20) == {"sum": 5}
            assert h.wait(timeout=5).json() == {"sum": 5}
            with AdminClient(addr) as admin:
                assert json.loads(admin.get_job(h.job_id).result) == {"sum": 5}
            bad = add.submit(c, Pair(-1, 0))
            with pytest.raises(JobFailed) as e:
                bad.result(timeout=20)
            assert e.value.outcome.state == "dead"
            assert e.value.outcome.last_error == "negative"
            assert "is dead (nacked): negative" in str(e.value)
    finally:
        w.stop()
        t.join(30)

    async def body():
        async with AsyncClient(addr) as c:
            h = await add.submit_async(c, Pair(1, 1))
            # Nobody consumes now: the wait runs out.
            with pytest.raises(RpcError) as e:
                await h.result(timeout=0.5)
            assert e.value.status == grpc.StatusCode.DEADLINE_EXCEEDED

    run(body(), timeout=30)


def test_wait_for_dead_cancelled_and_unknown_jobs(addr):
    q = queue_name()
    with Client(addr) as c, AdminClient(addr) as admin:
        dead = c.enqueue(q, "x", max_attempts=1).job_id
        cancelled = c.enqueue(q, "y", delay=3600).job_id

        results = {}

        def waiter(job_id: str) -> None:
            results[job_id] = c.wait(job_id, timeout=20)

        threads = [threading.Thread(target=waiter, args=(j,)) for j in (dead, cancelled)]
        for t in threads:
            t.start()
        # The waits are open before the jobs end.
        with c.consume(q, max_in_flight=1, lease=LEASE) as stream:
            job = next(iter(stream))
            assert job.id == dead
            stream.nack(job, "boom")
        admin.cancel_job(cancelled)
        for t in threads:
            t.join(25)
        assert (results[dead].state, results[dead].last_error, results[dead].dead_reason) == (
            "dead",
            "boom",
            "max_attempts",
        ), results[dead]
        assert results[cancelled].state == "cancelled" and results[cancelled].finished_at is not None
        # Acked without a result in a queue without retention: nothing to read.
        plain = c.enqueue(q, "z").job_id
        with c.consume(q, max_in_flight=1, lease=LEASE) as stream:
            job = next(iter(stream))
            stream.ack(job)
        unknown = c.wait(plain, timeout=10)
        assert unknown.state == "unknown" and unknown.finished_at is None and unknown.json() is None
        with pytest.raises(RpcError) as e:
            c.wait("", timeout=1)
        assert e.value.status == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("stream_acks", [True, False], ids=["consume", "subscribe"])
def test_progress_is_read_back_by_get_job_while_the_job_is_held(addr, plain, stream_acks):
    async def body():
        q = queue_name()
        w = Worker(addr, max_in_flight=1, lease=LEASE, stream_acks=stream_acks)
        reported = threading.Event()
        release = threading.Event()
        errors = []

        def report(job: Job) -> None:
            for bad, field in [((1.5, ""), "fraction"), ((float("nan"), ""), "fraction"), ((0.5, "x" * 257), "message")]:
                try:
                    job.progress(*bad)
                except ValueError as e:
                    assert str(e).startswith(field + ":"), e
                else:
                    errors.append(f"{bad[0]!r} was not refused")
            job.progress(0.25, "first")
            job.progress(0.5, "half way")  # replaces the first before it is written (Consume)
            reported.set()

        if plain:

            @w.handler(q)
            def handle(job: Job) -> None:
                report(job)
                release.wait(30)

        else:

            @w.handler(q)
            async def handle_async(job: Job) -> None:
                report(job)
                await asyncio.get_running_loop().run_in_executor(None, release.wait, 30)

        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            task = start(w)
            try:
                job_id = (await c.enqueue(q, "x")).job_id
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 20
                while True:
                    info = await admin.get_job(job_id)
                    if info.progress_at is not None and info.progress_message == "half way":
                        break
                    assert loop.time() < deadline, info
                    await asyncio.sleep(0.05)
                assert info.state == "leased" and info.progress == 0.5, info
                assert reported.is_set() and errors == []
            finally:
                release.set()
                w.stop()
                await task
        assert (w.stats.acked, w.stats.progress_failed) == (1, 0), w.stats

    run(body(), timeout=60)


def test_progress_outside_a_worker_and_report_progress_fencing(addr):
    q = queue_name()
    with Client(addr) as c, AdminClient(addr) as admin:
        job_id = c.enqueue(q, "x").job_id
        with c.consume(q, max_in_flight=1, lease=LEASE) as stream:
            job = next(iter(stream))
            with pytest.raises(RuntimeError):
                job.progress(0.5)
            stream.progress(job, 0.5, "on the stream")
            with pytest.raises(ValueError, match="^fraction:"):
                stream.progress(job, 2.0)
            deadline = time.monotonic() + 10
            while admin.get_job(job_id).progress_message != "on the stream":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            c.report_progress(job.id, job.lease_token, 0.75, "unary")
            info = admin.get_job(job_id)
            assert (info.progress, info.progress_message) == (0.75, "unary"), info
            with pytest.raises(ValueError, match="^fraction:"):
                c.report_progress(job.id, job.lease_token, -0.1)
            with pytest.raises(ValueError, match="^message:"):
                c.report_progress(job.id, job.lease_token, 0.1, "\0")
            assert admin.get_job(job_id).progress == 0.75
            stream.ack(job)
        # Fenced: the lease is gone with the ack.
        with pytest.raises(RpcError) as e:
            c.report_progress(job.id, job.lease_token, 0.8)
        assert e.value.status == grpc.StatusCode.FAILED_PRECONDITION, e.value


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("stream_acks", [True, False], ids=["consume", "subscribe"])
def test_a_broker_without_ack_result_and_progress(addr, db_dsn, plain, stream_acks):
    async def body():
        q = queue_name()
        progress_errors = []
        with FeaturelessProxy(addr) as proxy:
            w = Worker(proxy.addr, max_in_flight=2, lease=LEASE, stream_acks=stream_acks)

            def handle_sync(job: Job) -> Ack:
                try:
                    job.progress(0.5, "never")
                except RpcError as e:
                    progress_errors.append((e.status, e.details()))
                return Ack() if job.text == "plain" else Ack(result=b"lost")

            if plain:
                w.add_handler(q, handle_sync)
            else:

                @w.handler(q)
                async def handle(job: Job) -> Ack:
                    return handle_sync(job)

            async with AsyncClient(addr) as c:
                task = start(w)
                with_result = (await c.enqueue(q, "with a result", max_attempts=1)).job_id
                plain_id = (await c.enqueue(q, "plain")).job_id
                o = await c.wait(with_result, timeout=20)
                assert o.state == "dead", o
                assert o.last_error.startswith('ack.result: the broker did not list "ack.result"'), o
                assert (await c.wait(plain_id, timeout=20)).state == "unknown"
                assert w.features == frozenset(), "the proxy strips the features"
                w.stop()
                await task

                # The raw stream: refused before anything is sent.
                await c.enqueue(q, "raw")
                async with AsyncClient(proxy.addr) as old:
                    async with old.consume(q, max_in_flight=1, lease=LEASE) as stream:
                        job = await asyncio.wait_for(stream.next_job(), 10)
                        assert job is not None
                        with pytest.raises(RpcError) as e:
                            stream.progress(job, 0.5)
                        assert e.value.status == grpc.StatusCode.UNIMPLEMENTED
                        with pytest.raises(RpcError) as e:
                            await stream.ack(job, result=b"lost")
                        assert e.value.status == grpc.StatusCode.UNIMPLEMENTED
                        assert e.value.details().startswith("ack.result:")
                        assert await stream.ack(job) == []
        assert progress_errors == [(grpc.StatusCode.UNIMPLEMENTED, progress_errors[0][1])] * 2, progress_errors
        assert progress_errors[0][1].startswith("progress: the broker did not list")
        s = w.stats
        assert (s.acked, s.nacked, s.results_refused) == (1, 1, 1), s

    run(body(), timeout=60)
