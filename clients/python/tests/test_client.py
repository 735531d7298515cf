"""Client calls against a real broker: results, and documented status codes."""

import datetime as dt
import uuid

import grpc
import pytest
from util import first_delivery, queue_name, run

from leaseq import Client, NewJob


def test_enqueue_then_deliver_carries_every_field(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, "hello", headers={"content-type": "text/plain"}, priority=3)
            assert not r.duplicate
            job = await first_delivery(c, q)
            assert (job.id, job.queue, job.payload) == (r.job_id, q, b"hello")
            assert job.headers == {"content-type": "text/plain"}
            assert (job.priority, job.attempt, job.last_error) == (3, 1, "")
            assert job.lease_token
            assert job.lease_expires_at > job.enqueued_at

    run(body())


def test_dedup_key_returns_the_live_job(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            a = await c.enqueue(q, b"1", dedup_key="k")
            b = await c.enqueue(q, b"2", dedup_key="k")
            assert (b.job_id, b.duplicate) == (a.job_id, True)

    run(body())


def test_enqueue_batch_keeps_order(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            results = await c.enqueue_batch([NewJob(q, f"j{i}") for i in range(5)])
            assert len(results) == 5 and len({r.job_id for r in results}) == 5
            job = await first_delivery(c, q)
            assert (job.id, job.payload) == (results[0].job_id, b"j0")

    run(body())


def test_extend_nack_and_fencing(addr):
    async def body():
        q = queue_name()
        async with Client(addr) as c:
            r = await c.enqueue(q, b"y")
            call = c.subscribe([q], max_in_flight=1, lease=5)
            try:
                d = None
                async for msg in call:
                    if msg.WhichOneof("kind") == "delivery":
                        d = msg.delivery
                        break
                assert d is not None and d.job.id == r.job_id
                expires = await c.extend_lease(d.job.id, d.lease_token, 60)
                # Same machine, so the database clock and ours agree closely.
                assert (expires - dt.datetime.now(dt.timezone.utc)).total_seconds() > 30
                # A malformed token is bad input, naming the field.
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.ack(d.job.id, "not-a-token")
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "lease_token" in e.value.details()
                # A well-formed token that is not the current one changes nothing.
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.ack(d.job.id, str(uuid.uuid4()))
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert await c.nack(d.job.id, d.lease_token, "gave up", dead_letter=True) is True
                # Settled: the token is no longer current.
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await c.ack(d.job.id, d.lease_token)
                assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            finally:
                call.cancel()

    run(body())


@pytest.mark.parametrize("queue", ["bad name", "", "-leading-dash", "x" * 129])
def test_bad_queue_name_is_invalid_argument(addr, queue):
    async def body():
        async with Client(addr) as c:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.enqueue(queue, b"x")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "queue" in e.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await c.enqueue_batch([NewJob("fine"), NewJob(queue)])
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "jobs[1].queue" in e.value.details()

    run(body())


def test_naive_run_at_is_refused_locally(addr):
    async def body():
        async with Client(addr) as c:
            with pytest.raises(ValueError, match="run_at"):
                await c.enqueue(queue_name(), b"x", run_at=dt.datetime(2030, 1, 1))

    run(body())
