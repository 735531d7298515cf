"""Exactly-once effects (issue 34, item 5) in the Worker, against the real
broker process and its PostgreSQL (psycopg 3):

- ``return Ack([...])``: follow-up jobs enqueued in the ack's transaction;
  none when the handler raises; the job nacked (never acked without them)
  by a broker that does not list "ack.enqueue" (a proxy strips its
  heartbeat's features).
- ``return Ack.settled_in_sql()`` after ``select leaseq.ack(...)`` in the
  handler's own transaction: nothing sent, the slot freed, the stream's
  credit given back by the broker on the commit's notice (a lost credit
  would stall a worker of two credits after two jobs).

The kill -9 test of the example is in test_examples.py; the broker's side
(kill -9 between every two steps of an SQL ack) in tests/sql_ack.rs."""

import asyncio
from dataclasses import dataclass

import grpc
import psycopg
import pytest
from featureless_proxy import FeaturelessProxy
from util import queue_name, run

from leaseq import Ack, AsyncClient, DeadLetter, Job, NewJob, RpcError, Task, Worker

# Long enough that nothing in a test comes from a lease running out.
LEASE = 600


def start(worker: Worker) -> "asyncio.Task[None]":
    return asyncio.ensure_future(worker.run_async(handle_signals=False))


async def until(cond, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def count(dsn: str, sql: str, *args) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as db:
        cur = await db.execute(sql, args)
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


def live(dsn: str, queue: str):
    async def n() -> int:
        return await count(dsn, "select count(*) from leaseq.jobs where queue = %s", queue)

    return n


@dataclass
class Receipt:
    order: str


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
@pytest.mark.parametrize("stream_acks", [True, False], ids=["consume", "subscribe"])
def test_follow_ups_exist_once_the_handler_returns_and_the_parent_is_gone(addr, db_dsn, plain, stream_acks):
    async def body():
        q = queue_name()
        receipts = Task(f"{q}.receipts", Receipt)
        w = Worker(addr, max_in_flight=4, lease=LEASE, stream_acks=stream_acks)

        def follow_ups(order: str) -> Ack:
            if order == "plain":
                return Ack()  # a plain ack, batched in the fallback
            return Ack([NewJob(f"{q}.emails", f"mail {order}")]).then(receipts.job(Receipt(order)))

        # Through a middleware that returns what next() returned.
        if plain:

            @w.use
            def passing(job: Job, next):
                return next(job)

            @w.task(f"{q}.orders", str)
            def handle(order: str) -> Ack:
                return follow_ups(order)

        else:

            @w.use
            async def passing_async(job: Job, next):
                return await next(job)

            @w.handler(f"{q}.orders")
            async def handle_async(job: Job) -> Ack:
                await asyncio.sleep(0)
                return follow_ups(job.text)

        async with AsyncClient(addr) as c:
            task = start(w)
            orders = [NewJob(f"{q}.orders", f'"o-{i}"' if plain else f"o-{i}") for i in range(5)]
            orders.append(NewJob(f"{q}.orders", '"plain"' if plain else "plain"))
            await c.enqueue_batch(orders)

            async def parents_gone() -> bool:
                return await live(db_dsn, f"{q}.orders")() == 0 and w.stats.acked == 6

            await until(parents_gone)
            w.stop()
            await task
        assert await live(db_dsn, f"{q}.emails")() == 5
        async with await psycopg.AsyncConnection.connect(db_dsn) as db:
            cur = await db.execute(
                "select convert_from(payload, 'UTF8') from leaseq.jobs where queue = %s order by 1",
                (f"{q}.receipts",),
            )
            rows = [r[0] for r in await cur.fetchall()]
        assert rows[0] == '{"order":"o-0"}' and len(rows) == 5
        s = w.stats
        assert (s.acked, s.follow_ups, s.nacked, s.follow_ups_refused) == (6, 10, 0, 0), s
        if stream_acks:
            assert s.settled_on_stream == 6, s
        else:
            # The five with follow-ups by unary Ack (AckBatch cannot carry
            # them), the plain one batched.
            assert (s.settled_unary, s.settled_batched) == (5, 1), s

    run(body())


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
def test_a_handler_that_raises_after_asking_for_follow_ups_enqueues_none(addr, db_dsn, plain):
    async def body():
        q = queue_name()
        w = Worker(addr, max_in_flight=2, lease=LEASE)

        def fail(job: Job) -> None:
            ack = Ack([NewJob(f"{q}.emails", "must not exist")])
            assert len(ack.enqueue) == 1
            raise DeadLetter(f"failed after asking for follow-ups: {job.text}")

        if plain:
            w.add_handler(q, fail)
        else:

            @w.handler(q)
            async def handle(job: Job) -> None:
                fail(job)

        async with AsyncClient(addr) as c:
            task = start(w)
            await c.enqueue(q, "a")
            await c.enqueue(q, "b")

            async def dead() -> bool:
                return await count(db_dsn, "select count(*) from leaseq.dead_jobs where queue = %s", q) == 2

            await until(dead)
            w.stop()
            await task
        assert await live(db_dsn, f"{q}.emails")() == 0
        assert (w.stats.nacked, w.stats.follow_ups, w.stats.acked) == (2, 0, 0)

    run(body())


@pytest.mark.parametrize("plain", [False, True], ids=["async", "plain"])
def test_sql_acks_free_the_slot_and_the_worker_keeps_consuming(addr, db_dsn, plain):
    """Thirty jobs acked in SQL by a worker of two credits: each effect once,
    nothing sent for them, no redelivery."""

    async def body():
        q = queue_name()
        table = q.replace("-", "_") + "_effects"
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as db:
            await db.execute(f"create table {table} (job uuid not null)")
        w = Worker(addr, max_in_flight=2, lease=LEASE)

        if plain:

            @w.handler(q)
            def handle(job: Job) -> Ack:
                with psycopg.connect(db_dsn) as db, db.transaction():
                    db.execute(f"insert into {table} values (%s)", (job.id,))
                    db.execute("select leaseq.ack(%s, %s)", (job.id, job.lease_token))
                return Ack.settled_in_sql()

        else:

            @w.handler(q)
            async def handle_async(job: Job) -> Ack:
                async with await psycopg.AsyncConnection.connect(db_dsn) as db:
                    async with db.transaction():
                        await db.execute(f"insert into {table} values (%s)", (job.id,))
                        await db.execute("select leaseq.ack(%s, %s)", (job.id, job.lease_token))
                return Ack.settled_in_sql()

        async with AsyncClient(addr) as c:
            task = start(w)
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(30)])

            async def all_done() -> bool:
                return await count(db_dsn, f"select count(*) from {table}") == 30 and await live(db_dsn, q)() == 0

            await until(all_done)
            w.stop()
            await task
        assert await count(db_dsn, f"select count(distinct job) from {table}") == 30
        s = w.stats
        assert (s.delivered, s.settled_in_sql, s.acked, s.nacked, s.lease_lost, s.settled_on_stream) == (
            30,
            30,
            0,
            0,
            0,
            0,
        ), s

    run(body(), timeout=60)


def test_follow_ups_against_a_broker_without_ack_enqueue_nack_the_job(addr, db_dsn):
    async def body():
        q = queue_name()
        with FeaturelessProxy(addr) as proxy:
            w = Worker(proxy.addr, max_in_flight=2, lease=LEASE)

            @w.handler(q)
            async def handle(job: Job) -> Ack:
                if job.text == "plain":
                    return Ack()
                return Ack([NewJob(f"{q}.emails", "never")])

            async with AsyncClient(addr) as c:
                task = start(w)
                await c.enqueue(q, "with follow-ups", max_attempts=1)
                await c.enqueue(q, "plain")

                async def settled() -> bool:
                    return await live(db_dsn, q)() == 0

                await until(settled)
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
                            await stream.ack(job, enqueue=[NewJob(f"{q}.emails", "never")])
                        assert e.value.status == grpc.StatusCode.UNIMPLEMENTED
                        assert e.value.details().startswith("ack.enqueue:")
                        assert await stream.ack(job) == []
        async with await psycopg.AsyncConnection.connect(db_dsn) as db:
            cur = await db.execute("select last_error from leaseq.dead_jobs where queue = %s", (q,))
            (error,) = [r[0] for r in await cur.fetchall()]
        assert error.startswith('ack.enqueue: the broker did not list "ack.enqueue"'), error
        assert await live(db_dsn, f"{q}.emails")() == 0
        s = w.stats
        assert (s.acked, s.nacked, s.follow_ups_refused, s.follow_ups) == (1, 1, 1, 0), s

    run(body(), timeout=60)


def test_the_raw_stream_acks_with_follow_ups_and_returns_their_ids(addr, db_dsn):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue(q, "x")
            async with c.consume(q, max_in_flight=1, lease=LEASE) as stream:
                job = await asyncio.wait_for(stream.next_job(), 10)
                assert job is not None
                ids = await stream.ack(job, enqueue=[NewJob(f"{q}.next", "a"), NewJob(f"{q}.next", "b")])
            # Unary too.
            await c.enqueue(q, "y")
            async with c.subscribe(q, max_in_flight=1, lease=LEASE) as sub:
                job2 = await asyncio.wait_for(sub.next_job(), 10)
                assert job2 is not None
                more = await c.ack(job2.id, job2.lease_token, enqueue=[NewJob(f"{q}.next", "c")])
        async with await psycopg.AsyncConnection.connect(db_dsn) as db:
            cur = await db.execute(
                "select id::text from leaseq.jobs where queue = %s order by payload", (f"{q}.next",)
            )
            stored = [r[0] for r in await cur.fetchall()]
        assert stored == ids + more and len(stored) == 3

    run(body())
