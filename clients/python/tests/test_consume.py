"""Settles on the stream (the Consume RPC), and the fallback to Subscribe +
AckBatch for a broker without it.

The Consume tests need a broker that serves Consume: against one that
answers UNIMPLEMENTED they fail, saying so (the fallback tests below cover
such a broker)."""

import asyncio
from concurrent import futures

import grpc
import pytest
from util import first_delivery, job_is_gone, queue_name, run

from leaseq import AsyncClient, Client, Job, NewJob, RpcError, Worker

NEEDS_CONSUME = (
    "the broker at {addr} answers UNIMPLEMENTED to Consume: it predates the server side of the "
    "Consume RPC (acks on the stream). Build the broker from a main that has it; the Subscribe + "
    "AckBatch fallback is tested by test_worker_falls_back_*"
)


async def require_consume(c: AsyncClient, addr: str) -> None:
    stream = c.consume(queue_name(), max_in_flight=1)
    try:
        await asyncio.wait_for(stream.opened(), 10)
    except RpcError as e:
        if e.code_name == "UNIMPLEMENTED":
            pytest.fail(NEEDS_CONSUME.format(addr=addr))
        raise
    finally:
        stream.cancel()


def test_worker_settles_on_the_consume_stream(addr):
    async def body():
        q = queue_name()
        n = 20
        async with AsyncClient(addr) as c:
            await require_consume(c, addr)
            await c.enqueue_batch([NewJob(q, str(i), dedup_key=str(i)) for i in range(n)])
            await c.enqueue(q, b"fail", dedup_key="fail", max_attempts=1)
            done = asyncio.Event()
            w = Worker(addr, max_in_flight=8, lease=5)

            handled = 0

            @w.handler(q)
            async def handle(job: Job) -> None:
                nonlocal handled
                handled += 1
                if handled == n + 1:
                    done.set()
                if job.payload == b"fail":
                    raise RuntimeError("no")

            task = asyncio.ensure_future(w.run_async(handle_signals=False))
            await done.wait()
            while w.stats.acked + w.stats.nacked < n + 1:
                await asyncio.sleep(0.02)
            w.stop()
            await task
            assert w.transport == "consume"
            assert (w.stats.acked, w.stats.nacked, w.stats.dead_lettered) == (n, 1, 1)
            assert (w.stats.settled_on_stream, w.stats.settled_batched, w.stats.settled_unary) == (n + 1, 0, 0)
            for key in ["0", str(n - 1), "fail"]:
                assert await job_is_gone(c, q, key)

    run(body())


def test_raw_consume_stream_settles_and_half_close(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await require_consume(c, addr)
            ra, rb, rc = await c.enqueue_batch([NewJob(q, "a"), NewJob(q, "b"), NewJob(q, "c")])
            async with c.consume(q, max_in_flight=3, lease=5) as stream:
                await stream.opened()
                jobs = {}
                async for job in stream:
                    jobs[job.payload] = job
                    if len(jobs) == 3:
                        break
                a, b, cc = jobs[b"a"], jobs[b"b"], jobs[b"c"]
                assert (await stream.extend(a, 60)) > a.lease_expires_at
                await stream.ack(a)
                assert await stream.nack(b, "gone", dead_letter=True) is True
                with pytest.raises(RpcError) as e:  # already settled
                    await stream.ack(a)
                assert e.value.lease_lost
                # c stays unsettled: the half-close releases it.
            assert stream.error is None  # ended with OK
            again = await first_delivery(c, q)
            assert (again.id, again.attempt) == (cc.id, 2)
            assert (a.id, b.id) == (ra.job_id, rb.job_id)

    run(body())


def test_sync_consumer_acks_on_the_stream(addr):
    async def check():
        async with AsyncClient(addr) as c:
            await require_consume(c, addr)

    run(check())
    q = queue_name()
    with Client(addr) as c:
        r = c.enqueue(q, b"x", dedup_key="x")
        with c.consume(q, max_in_flight=1, lease=5) as stream:
            stream.opened()
            for job in stream:
                assert job.id == r.job_id
                stream.ack(job)
                break
        assert not c.enqueue(q, b"probe", dedup_key="x").duplicate


def test_worker_falls_back_to_batched_acks_when_asked(addr):
    async def body():
        q = queue_name()
        n = 10
        async with AsyncClient(addr) as c:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(n)])
            w = Worker(addr, max_in_flight=n, lease=5, stream_acks=False, ack_batch_delay=0.05)

            @w.handler(q)
            async def handle(job: Job) -> None:
                pass

            task = asyncio.ensure_future(w.run_async(handle_signals=False))
            while w.stats.acked < n:
                await asyncio.sleep(0.02)
            w.stop()
            await task
            assert w.transport == "subscribe"
            assert (w.stats.settled_batched, w.stats.settled_on_stream) == (n, 0)

    run(body())


class _NoConsumeProxy(grpc.GenericRpcHandler):
    """Forwards every QueueService call to a real broker except Consume,
    which it answers UNIMPLEMENTED, as a broker from before Consume does."""

    UNARY = {"Enqueue", "EnqueueBatch", "Ack", "AckBatch", "Nack", "ExtendLease"}

    def __init__(self, upstream: grpc.Channel) -> None:
        self._up = upstream

    def service(self, details):
        service, _, method = details.method.rpartition("/")
        if service != "/leaseq.v1.QueueService":
            return None
        if method in self.UNARY:
            call = self._up.unary_unary(details.method)

            def unary(req: bytes, ctx):
                try:
                    return call(req, metadata=ctx.invocation_metadata())
                except grpc.RpcError as e:
                    ctx.abort(e.code(), e.details())

            return grpc.unary_unary_rpc_method_handler(unary)
        if method == "Subscribe":
            stream = self._up.unary_stream(details.method)

            def subscribe(req: bytes, ctx):
                up = stream(req, metadata=ctx.invocation_metadata())
                ctx.add_callback(up.cancel)
                try:
                    yield from up
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        ctx.abort(e.code(), e.details())

            return grpc.unary_stream_rpc_method_handler(subscribe)
        return None  # Consume: UNIMPLEMENTED


@pytest.fixture
def old_broker(addr):
    """The address of a :class:`_NoConsumeProxy` in front of the broker."""
    upstream = grpc.insecure_channel(addr)
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((_NoConsumeProxy(upstream),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)
    upstream.close()


def test_worker_falls_back_to_subscribe_when_consume_is_unimplemented(old_broker):
    async def body():
        q = queue_name()
        proxy = old_broker
        async with AsyncClient(proxy) as c:
            with pytest.raises(RpcError) as e:
                await c.consume(q).opened()
            assert e.value.code_name == "UNIMPLEMENTED"
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(5)])
            w = Worker(proxy, max_in_flight=5, lease=5)

            @w.handler(q)
            async def handle(job: Job) -> None:
                if job.payload == b"0" and job.attempt == 1:
                    raise RuntimeError("once")

            task = asyncio.ensure_future(w.run_async(handle_signals=False))
            while w.stats.acked < 5:
                await asyncio.sleep(0.02)
            w.stop()
            await task
            assert w.transport == "subscribe"
            assert (w.stats.settled_batched, w.stats.settled_unary, w.stats.nacked) == (5, 1, 1)

    run(body())


def test_async_enqueue_falls_back_to_unary_when_produce_is_unimplemented(addr, old_broker):
    """The proxy knows no Produce either (a broker from before it):
    AsyncClient.enqueue is answered UNIMPLEMENTED once, then every job goes
    as a unary Enqueue; all of them are enqueued."""

    async def body():
        q = queue_name()
        async with AsyncClient(old_broker) as c:
            sent = await asyncio.gather(*(c.enqueue(q, str(i)) for i in range(10)))
            assert len({r.job_id for r in sent}) == 10
            await c.enqueue(q, "later")
            assert c._producer.unsupported
        async with AsyncClient(addr) as direct:
            n = 0
            async with direct.consume(q, max_in_flight=20) as s:
                async for d in s:
                    await s.ack(d)
                    n += 1
                    if n == 11:
                        break
            assert n == 11

    run(body())
