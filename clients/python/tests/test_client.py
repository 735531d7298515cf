"""Client calls against a real broker: results, and documented status codes,
for the asyncio client and the blocking one."""

import asyncio
import datetime as dt
import uuid

import pytest
from util import first_delivery, queue_name, run

from leaseq import AsyncClient, Client, NewJob, RpcError


def test_enqueue_then_deliver_carries_every_field(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, "hello", headers={"content-type": "text/plain"}, priority=3)
            assert not r.duplicate
            job = await first_delivery(c, q)
            assert (job.id, job.queue, job.payload, job.text) == (r.job_id, q, b"hello", "hello")
            assert job.headers == {"content-type": "text/plain"}
            assert (job.priority, job.attempt, job.last_error) == (3, 1, "")
            assert job.lease_token
            assert job.lease_expires_at > job.enqueued_at

    run(body())


def test_dedup_key_returns_the_live_job(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            a = await c.enqueue(q, b"1", dedup_key="k")
            b = await c.enqueue(q, b"2", dedup_key="k")
            assert (b.job_id, b.duplicate, b.replaced) == (a.job_id, True, False)

    run(body())


def test_on_duplicate_replace_and_unique_for(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            a = await c.enqueue(q, b"v1", dedup_key="doc", delay=3600)
            b = await c.enqueue(q, b"v2", dedup_key="doc", on_duplicate="replace")
            assert (b.job_id, b.duplicate, b.replaced) == (a.job_id, True, True)
            # Replaced without a delay: delivered now, with the new payload.
            job = await first_delivery(c, q)
            assert (job.id, job.payload) == (a.job_id, b"v2")
            with pytest.raises(RpcError) as e:
                await c.enqueue(q, b"w", unique_for=60)
            assert e.value.code_name == "INVALID_ARGUMENT" and "unique_for" in str(e.value)
            # Held for the window after its ack.
            q2 = queue_name()
            w = await c.enqueue(q2, b"w", dedup_key="once", unique_for=3600)
            async with c.subscribe(q2, max_in_flight=1) as sub:
                job = await asyncio.wait_for(sub.next_job(), 10)
                assert job is not None and job.id == w.job_id
                await c.ack(job.id, job.lease_token)
        # The blocking client, in a batch: the completed job holds the key.
        with Client(addr) as bc:
            [r] = bc.enqueue_batch([NewJob(q2, "w2", dedup_key="once")])
            assert (r.job_id, r.duplicate, r.replaced) == (w.job_id, True, False)

    run(body())


def test_enqueue_batch_keeps_order(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            results = await c.enqueue_batch([NewJob(q, f"j{i}") for i in range(5)])
            assert len(results) == 5 and len({r.job_id for r in results}) == 5
            job = await first_delivery(c, q)
            assert (job.id, job.payload) == (results[0].job_id, b"j0")

    run(body())


def test_extend_nack_and_fencing(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            r = await c.enqueue(q, b"y")
            async with c.subscribe(q, max_in_flight=1, lease=5) as sub:
                job = await asyncio.wait_for(sub.next_job(), 10)
                assert job is not None and job.id == r.job_id
                expires = await c.extend_lease(job.id, job.lease_token, 60)
                # Same machine, so the database clock and ours agree closely.
                assert (expires - dt.datetime.now(dt.timezone.utc)).total_seconds() > 30
                # A malformed token is bad input, naming the field.
                with pytest.raises(RpcError) as e:
                    await c.ack(job.id, "not-a-token")
                assert e.value.code_name == "INVALID_ARGUMENT"
                assert "lease_token" in e.value.details()
                # A well-formed token that is not the current one changes nothing.
                with pytest.raises(RpcError) as e:
                    await c.ack(job.id, str(uuid.uuid4()))
                assert e.value.lease_lost and e.value.code_name == "FAILED_PRECONDITION"
                assert await c.nack(job.id, job.lease_token, "gave up", dead_letter=True) is True
                # Settled: the token is no longer current.
                with pytest.raises(RpcError) as e:
                    await c.ack(job.id, job.lease_token)
                assert e.value.lease_lost

    run(body())


def test_ack_batch_reports_each_entry(addr):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue_batch([NewJob(q, "a"), NewJob(q, "b")])
            async with c.subscribe(q, max_in_flight=2, lease=30) as sub:
                a = await asyncio.wait_for(sub.next_job(), 10)
                b = await asyncio.wait_for(sub.next_job(), 10)
                results = await c.ack_batch([a, (b.id, str(uuid.uuid4()))])
            assert [(r.job_id, r.code, r.ok) for r in results] == [
                (a.id, "OK", True),
                (b.id, "FAILED_PRECONDITION", False),
            ]

    run(body())


@pytest.mark.parametrize("queue", ["bad name", "", "-leading-dash", "x" * 129])
def test_bad_queue_name_is_invalid_argument(addr, queue):
    async def body():
        async with AsyncClient(addr) as c:
            with pytest.raises(RpcError) as e:
                await c.enqueue(queue, b"x")
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert "queue" in e.value.details()
            with pytest.raises(RpcError) as e:
                await c.enqueue_batch([NewJob("fine"), NewJob(queue)])
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert "jobs[1].queue" in e.value.details()

    run(body())


def test_async_enqueues_share_one_produce_stream(addr):
    """AsyncClient.enqueue sends its jobs on one Produce stream: 50 at once
    are 50 jobs, a refused one names its field as Enqueue does and the
    stream goes on, and close() half-closes it."""

    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            sent = await asyncio.gather(*(c.enqueue(q, str(i)) for i in range(50)))
            assert len({r.job_id for r in sent}) == 50
            stream = c._producer._stream
            assert stream is not None and len(stream.pending) == 0
            with pytest.raises(RpcError) as e:
                await c.enqueue("bad name", b"x")
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert e.value.details().startswith("queue:")
            await c.enqueue(q, "after")
            assert c._producer._stream is stream, "one stream throughout"
            assert not c._producer.unsupported

    run(body())


def test_rpc_error_is_also_a_grpc_error(addr):
    import grpc

    with Client(addr) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.enqueue("bad name")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_naive_run_at_is_refused_locally(addr):
    with Client(addr) as c:
        with pytest.raises(ValueError, match="run_at"):
            c.enqueue(queue_name(), b"x", run_at=dt.datetime(2030, 1, 1))


def test_sync_client_has_the_same_calls(addr):
    q = queue_name()
    with Client(addr, timeout=10) as c:
        first = c.enqueue(q, b"one", headers={"k": "v"}, delay=0, max_attempts=3, ttl=3600)
        c.enqueue_batch([NewJob(q, "two", dedup_key="two")])
        assert c.enqueue(q, "dup", dedup_key="two").duplicate
        with c.subscribe([q], max_in_flight=2, lease=10) as sub:
            it = iter(sub)
            got = {j.payload: j for j in (next(it), next(it))}  # in either order
            one, two = got[b"one"], got[b"two"]
            assert (one.id, one.payload, one.headers) == (first.job_id, b"one", {"k": "v"})
            assert c.extend_lease(one.id, one.lease_token, 30) > one.lease_expires_at
            c.ack(one.id, one.lease_token)
            assert c.nack(two.id, two.lease_token, "later", retry_after=0) is False
            again = next(it)  # retried at once, on the same stream
            assert (again.id, again.attempt, again.last_error) == (two.id, 2, "later")
            assert [r.ok for r in c.ack_batch([again])] == [True]
        with pytest.raises(RpcError) as e:
            c.ack(one.id, one.lease_token)
        assert e.value.lease_lost


def test_https_target_and_token_validation():
    from leaseq import TLS, Connection

    assert Connection("https://example.test:443").tls == TLS()
    assert Connection("http://127.0.0.1:1").tls is None
    with pytest.raises(ValueError, match="http://"):
        Connection("http://127.0.0.1:1", tls=True)
    with pytest.raises(ValueError, match="token"):
        Connection("127.0.0.1:1", token="a\nb")
    with pytest.raises(ValueError, match="cert and key"):
        Client("127.0.0.1:1", tls=TLS(cert=b"x"))


def test_every_address_form_reaches_a_plaintext_broker(addr, monkeypatch):
    from leaseq import Worker

    q = queue_name("addr")
    host_port = addr.split("://", 1)[-1]
    for target in (host_port, f"http://{host_port}", f"http://{host_port}/"):
        with Client(target, timeout=10) as c:
            c.enqueue(q, target.encode())
    monkeypatch.setenv("LEASEQ_ADDR", host_port)
    with Client(timeout=10) as c:
        c.enqueue(q, b"LEASEQ_ADDR")
    # Every SDK's default: 16 handlers at once (the stream's credit).
    assert Worker(host_port)._max_in_flight == 16


def test_async_enqueue_opens_a_new_stream_after_the_broker_restarts(private_broker):
    """A drain ends the client's Produce stream (UNAVAILABLE to any job
    waiting on it); the next enqueue, once the broker is back, opens a new
    stream and succeeds."""

    async def body():
        q = queue_name()
        async with AsyncClient(private_broker.addr) as c:
            await c.enqueue(q, "before")
            first = c._producer._stream
            assert first is not None
            assert await asyncio.to_thread(private_broker.stop) == 0
            await asyncio.to_thread(private_broker.start)
            for _ in range(100):
                try:
                    r = await c.enqueue(q, "after")
                    break
                except RpcError as e:
                    assert e.code_name == "UNAVAILABLE", e
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("no enqueue succeeded after the restart")
            assert r.job_id
            assert c._producer._stream is not None and c._producer._stream is not first

    run(body())
