"""User code that mypy --strict must accept (tests/test_packaging.py runs it
against the installed wheel). It uses the public API, typed: the blocking
and asyncio clients, their streams, the worker's decorators and outcomes,
TLS and tokens, and both admin clients. Not run."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import List, Optional

import leaseq
from leaseq import (
    TLS,
    AdminClient,
    AsyncAdminClient,
    AsyncClient,
    Cancelled,
    Client,
    DeadLetter,
    EnqueueResult,
    Job,
    JobInfo,
    KeyOverride,
    NewJob,
    QueueInfo,
    Retry,
    RpcError,
    Worker,
)


def produce(client: Client) -> List[str]:
    r: EnqueueResult = client.enqueue("emails", b"x", headers={"k": "v"}, delay=dt.timedelta(seconds=5))
    batch = client.enqueue_batch([NewJob("emails", "y", priority=1, ttl=60, key="customer-7")])
    client.enqueue("emails", b"z", key="customer-7", dedup_key="z")
    return [r.job_id] + [b.job_id for b in batch]


def consume_sync(client: Client) -> int:
    n = 0
    with client.subscribe(["emails"], max_in_flight=4, lease=30) as sub:
        for job in sub:
            expires: dt.datetime = client.extend_lease(job.id, job.lease_token, 60)
            assert expires
            try:
                client.ack(job.id, job.lease_token)
            except RpcError as e:
                if not e.lease_lost:
                    raise
            n += 1
    cancels: List[Cancelled] = []
    with client.consume("emails", on_cancel=cancels.append) as stream:
        for job in stream:
            if any(c.matches(job) for c in cancels):
                continue
            stream.ack(job)
            dead: bool = stream.nack(job, "no", retry_after=1.5)
            assert not dead
    results = client.ack_batch([("id", "token")])
    return n + sum(1 for r in results if r.ok)


async def consume_async(client: AsyncClient) -> Optional[Job]:
    await client.enqueue("emails", "hello", run_at=dt.datetime.now(dt.timezone.utc))
    def on_cancel(c: Cancelled) -> None:
        print(c.job_id, c.lease_token)

    async with client.subscribe("emails", on_cancel=on_cancel) as sub:
        async for job in sub:
            await client.nack(job.id, job.lease_token, "later", retry_after=10)
            return job
    async with client.consume(["emails"], max_in_flight=2) as stream:
        await stream.opened()
        job2 = await stream.next_job()
        if job2 is not None:
            await stream.extend(job2, 30)
            await stream.ack(job2)
    return None


def make_worker() -> Worker:
    tls = TLS(ca="ca.pem", cert="client.pem", key="client.key", server_name="broker")
    worker = Worker("broker:50051", tls=tls, token="t", max_in_flight=8, lease=30, timeout=60)

    @worker.handler("emails", timeout=dt.timedelta(seconds=10))
    def send(job: Job) -> None:
        if job.cancelled.is_set() or job.is_cancelled():
            return
        if not job.payload:
            raise DeadLetter("empty")
        if job.attempt < 3:
            raise Retry("busy", after=5)
        key: str = job.key
        print(job.text, job.headers.get("traceparent"), key)

    @worker.handler("reports")
    async def build(job: Job) -> None:
        await asyncio.sleep(0)

    send(Job("i", "q", b"", {}, 0, 1, dt.datetime.now(dt.timezone.utc), "", "t", dt.datetime.now(dt.timezone.utc)))
    return worker


def run_worker(worker: Worker) -> int:
    worker.run()
    return worker.stats.acked + worker.stats.nacked + worker.stats.cancelled


def admin_sync(addr: str) -> List[JobInfo]:
    with AdminClient(addr, token="ops") as admin:
        q: QueueInfo = admin.update_queue("emails", create=True, max_attempts=3, paused=False)
        admin.update_queue("emails", ordered_by_key=True, key_concurrency=2)
        ordered: bool = q.settings.ordered_by_key and q.settings.key_concurrency > 0
        assert ordered or q.settings.key_concurrency == 0
        fair = admin.update_queue(
            "reports", fair_by_key=True, key_rate_limit=2.5, key_rate_burst=5,
            key_overrides=[KeyOverride("vip", concurrency=10, weight=5), KeyOverride("trial", rate_limit=0.5)],
        ).settings  # fmt: skip
        weights: List[int] = [o.weight for o in fair.key_overrides]
        print(fair.fair_by_key, fair.key_rate_limit + fair.key_rate_burst, weights)
        admin.update_queue("reports", key_overrides=[])
        assert q.settings.default_lease is None or q.settings.default_lease.total_seconds() > 0
        page = admin.list_jobs("emails", state="dead", include_payload=True)
        print([j.key for j in page.items])
        admin.requeue_dead_letters("emails", ids=[j.id for j in page.items])
        for snapshot in admin.watch_queues(["emails"], interval=5):
            print([i.stats.available for i in snapshot.queues])
            break
        return page.items


async def admin_async(addr: str) -> int:
    async with AsyncAdminClient(addr) as admin:
        info = await admin.get_queue("emails")
        purged = await admin.purge_dead_letters("emails", all=True)
        async for snap in admin.watch_queues():
            print(len(snap.queues))
            break
        return info.stats.dead + purged


print(leaseq.__version__)
