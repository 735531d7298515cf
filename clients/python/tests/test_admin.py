"""Every AdminService call, through the blocking and the asyncio admin clients."""

import asyncio
import datetime as dt
import time

import pytest
from util import queue_name, run

from leaseq import AdminClient, AsyncAdminClient, AsyncClient, Client, NewJob, RpcError


def test_every_admin_call_sync(addr):
    q = queue_name("adm")
    with Client(addr) as c, AdminClient(addr) as admin:
        info = admin.update_queue(
            q, create=True, max_attempts=2, default_lease=dt.timedelta(seconds=20), backoff_base=0.5,
            backoff_cap=60, completed_retention=3600, concurrency_limit=5, rate_limit=100.0, rate_burst=10,
        )  # fmt: skip
        s = info.settings
        assert (info.name, s.max_attempts, s.default_lease, s.concurrency_limit) == (q, 2, dt.timedelta(seconds=20), 5)
        assert (s.completed_retention, s.rate_limit, s.rate_burst) == (dt.timedelta(hours=1), 100.0, 10)
        a, b, later = c.enqueue_batch([NewJob(q, "a"), NewJob(q, "b"), NewJob(q, "later", delay=3600)])
        assert admin.get_queue(q).stats.available == 2
        assert admin.pause_queue(q).settings.paused
        assert not admin.resume_queue(q).settings.paused

        names, token = [], ""
        while True:  # every page
            page = admin.list_queues(page_size=50, page_token=token)
            names += [x.name for x in page.items]
            token = page.next_page_token
            if not token:
                break
        assert q in names

        live = admin.list_jobs(q, include_payload=True)
        assert [(j.id, j.payload) for j in live.items] == [(a.job_id, b"a"), (b.job_id, b"b"), (later.job_id, b"later")]
        assert [j.id for j in admin.list_jobs(q, state="scheduled").items] == [later.job_id]
        with pytest.raises(ValueError, match="state"):
            admin.list_jobs(q, state="bogus")  # type: ignore[arg-type]

        with c.subscribe(q, max_in_flight=2, lease=30) as sub:
            it = iter(sub)
            ja, jb = next(it), next(it)
            job = admin.get_job(ja.id)
            assert (job.state, job.attempt, job.lease_expires_at is not None) == ("leased", 1, True)
            c.ack(ja.id, ja.lease_token)
            c.nack(jb.id, jb.lease_token, "broken", dead_letter=True)
        assert admin.get_job(ja.id).state == "completed"  # kept for completed_retention
        assert [j.id for j in admin.list_jobs(q, state="completed").items] == [ja.id]
        dead = admin.list_dead_letters(q)
        assert [(j.id, j.state, j.dead_reason, j.last_error) for j in dead.items] == [
            (jb.id, "dead", "nacked", "broken")
        ]
        # The subscription above is closed on our side; until the broker
        # counts it gone (stats.streams, which waits for the lease rounds
        # still asking for it), it may hand that stream the requeued job
        # (then cancel_job would find it leased).
        deadline = time.monotonic() + 10
        while admin.get_queue(q).stats.streams > 0:
            assert time.monotonic() < deadline, "stream never closed"
            time.sleep(0.05)
        assert admin.requeue_dead_letters(q, ids=[jb.id]).requeued == 1
        assert admin.get_job(jb.id).state == "available"
        assert admin.cancel_job(jb.id) is False
        with pytest.raises(RpcError) as e:
            admin.get_job(jb.id)
        assert e.value.code_name == "NOT_FOUND"

        c.enqueue(q, "to be purged")
        purged = admin.purge_queue(q)
        assert (purged.purged, purged.purged_completed) == (2, 1)  # "later" + the new one; the acked one
        assert admin.purge_dead_letters(q, all=True) == 0

        watch = admin.watch_queues([q], interval=1)
        snap = next(watch)
        watch.close()
        assert [x.name for x in snap.queues] == [q] and snap.sent_at is not None


def test_every_admin_call_async(addr):
    async def body():
        q = queue_name("adm")
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await admin.update_queue(q, create=True, max_attempts=1)
            r = await c.enqueue(q, b"x")
            assert (await admin.get_queue(q)).stats.available == 1
            assert (await admin.pause_queue(q)).settings.paused
            assert not (await admin.resume_queue(q)).settings.paused
            assert q in [x.name for x in (await admin.list_queues(page_size=1000)).items]
            assert [j.id for j in (await admin.list_jobs(q)).items] == [r.job_id]
            async with c.subscribe(q, max_in_flight=1, lease=30) as sub:
                job = await asyncio.wait_for(sub.next_job(), 10)
                # max_attempts 1: a plain nack on the last attempt dead-letters.
                assert await c.nack(job.id, job.lease_token, "once") is True
            dead = await admin.list_dead_letters(q)
            assert [(j.id, j.dead_reason) for j in dead.items] == [(r.job_id, "max_attempts")]
            assert (await admin.get_job(r.job_id)).state == "dead"
            # The subscription above is closed on our side; until the broker
            # counts it gone (stats.streams), it may hand that stream the
            # requeued job.
            deadline = asyncio.get_running_loop().time() + 10
            while (await admin.get_queue(q)).stats.streams > 0:
                assert asyncio.get_running_loop().time() < deadline, "stream never closed"
                await asyncio.sleep(0.05)
            assert (await admin.requeue_dead_letters(q, all=True)).requeued == 1
            assert await admin.cancel_job(r.job_id) is False
            await c.enqueue(q, b"y")
            assert (await admin.purge_queue(q)).purged == 1
            async with c.subscribe(q, max_in_flight=1, lease=30):
                pass
            await c.enqueue(q, b"z")
            async with c.subscribe(q, max_in_flight=1, lease=30) as sub:
                job = await asyncio.wait_for(sub.next_job(), 10)
                await c.nack(job.id, job.lease_token, "dead", dead_letter=True)
            assert await admin.purge_dead_letters(q, all=True) == 1
            async for snap in admin.watch_queues([q], interval=1):
                assert [x.name for x in snap.queues] == [q]
                break

    run(body())
