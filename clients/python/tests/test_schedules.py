"""Schedules through the admin clients, against the real broker: create,
list, get, pause/resume, run now (a job appears), update, delete; bad input
is INVALID_ARGUMENT naming the field."""

import datetime as dt

import pytest
from util import queue_name, run

from leaseq import AdminClient, AsyncAdminClient, JobTemplate, RpcError


def test_schedule_lifecycle_sync(addr):
    q, name = queue_name("sch"), queue_name("nightly")
    with AdminClient(addr) as admin:
        created = admin.create_schedule(
            name, "0 3 * * *", queue=q, payload=b'{"report":"daily"}', headers={"team": "ops"}, priority=4,
            max_attempts=3, ttl=3600, time_zone="Europe/Paris", overlap="skip", catch_up="all", catch_up_limit=5,
        )  # fmt: skip
        assert (created.name, created.cron, created.time_zone) == (name, "0 3 * * *", "Europe/Paris")
        assert created.job == JobTemplate(q, b'{"report":"daily"}', {"team": "ops"}, 4, 3, dt.timedelta(hours=1))
        assert (created.overlap, created.catch_up, created.catch_up_limit, created.paused) == ("skip", "all", 5, False)
        assert created.next_run_at is not None and created.next_run_at > dt.datetime.now(dt.timezone.utc)
        assert created.last_tick_at is None and created.last_job_id == ""
        assert admin.get_schedule(name) == created

        names, token = [], ""
        while True:  # every page
            page = admin.list_schedules(page_size=2, page_token=token)
            names += [s.name for s in page.items]
            token = page.next_page_token
            if not token:
                break
        assert name in names and names == sorted(names)

        assert admin.pause_schedule(name).paused
        # Paused, run_schedule still enqueues: the job appears in the queue.
        ran = admin.run_schedule(name)
        assert ran.job_id and ran.tick_at is not None
        job = admin.get_job(ran.job_id)
        assert (job.queue, job.payload, job.priority) == (q, b'{"report":"daily"}', 4)
        assert job.headers["team"] == "ops" and job.state == "available"
        after_run = admin.get_schedule(name)
        assert (after_run.last_job_id, after_run.last_tick_at) == (ran.job_id, ran.tick_at)
        assert not admin.resume_schedule(name).paused

        # Only what is given changes; `job` replaces the whole template.
        updated = admin.update_schedule(name, cron="*/5 * * * *", job=JobTemplate(q, "v2"), catch_up="none")
        assert (updated.cron, updated.time_zone, updated.overlap, updated.catch_up) == ("*/5 * * * *", "Europe/Paris", "skip", "none")
        assert updated.job == JobTemplate(q, b"v2", {}, 0, 0, None)

        admin.delete_schedule(name)
        with pytest.raises(RpcError) as e:
            admin.get_schedule(name)
        assert e.value.code_name == "NOT_FOUND"
        with pytest.raises(RpcError) as e:
            admin.delete_schedule(name)
        assert e.value.code_name == "NOT_FOUND"
        assert admin.get_job(ran.job_id).id == ran.job_id  # the jobs it enqueued stay


def test_schedule_bad_input_is_refused_naming_the_field(addr):
    q, name = queue_name("sch"), queue_name("bad")
    with AdminClient(addr) as admin:
        for kwargs, field in (
            (dict(cron="not a cron"), "cron"),
            (dict(cron="0 3 * * *", time_zone="Mars/Olympus"), "time_zone"),
            (dict(cron="0 3 * * *", queue=""), "queue"),
        ):
            args = {"queue": q, **kwargs}
            with pytest.raises(RpcError) as e:
                admin.create_schedule(name, args.pop("cron"), **args)
            assert e.value.code_name == "INVALID_ARGUMENT", e.value
            assert field in e.value.details(), e.value.details()
        with pytest.raises(RpcError) as e:  # nothing was made
            admin.get_schedule(name)
        assert e.value.code_name == "NOT_FOUND"
        with pytest.raises(ValueError, match="overlap"):
            admin.create_schedule(name, "0 3 * * *", queue=q, overlap="sometimes")  # type: ignore[arg-type]
        admin.create_schedule(name, "0 3 * * *", queue=q)
        with pytest.raises(RpcError) as e:
            admin.create_schedule(name, "0 4 * * *", queue=q)
        assert e.value.code_name == "ALREADY_EXISTS"
        with pytest.raises(RpcError) as e:
            admin.update_schedule(name, cron="61 * * * *")
        assert e.value.code_name == "INVALID_ARGUMENT" and "cron" in e.value.details()
        assert admin.get_schedule(name).cron == "0 3 * * *"  # unchanged
        admin.delete_schedule(name)


def test_schedule_calls_async(addr):
    q, name = queue_name("sch"), queue_name("async")

    async def main():
        async with AsyncAdminClient(addr) as admin:
            created = await admin.create_schedule(name, "@hourly", queue=q, payload="hi")
            assert (created.overlap, created.catch_up) == ("allow", "one")  # the defaults, as stored
            assert (await admin.get_schedule(name)).cron == "@hourly"
            assert name in [s.name for s in (await admin.list_schedules(page_size=1000)).items]
            assert (await admin.pause_schedule(name)).paused
            assert not (await admin.resume_schedule(name)).paused
            ran = await admin.run_schedule(name)
            assert (await admin.get_job(ran.job_id)).payload == b"hi"
            assert (await admin.update_schedule(name, paused=True)).paused
            await admin.delete_schedule(name)
            assert name not in [s.name for s in (await admin.list_schedules(page_size=1000)).items]

    run(main())
