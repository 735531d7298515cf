"""The operator API: queues, jobs, dead letters."""

import os

from leaseq import AdminClient

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")

with AdminClient(addr) as admin:
    info = admin.update_queue(queue, create=True, max_attempts=5, default_lease=60)
    print(info.name, info.settings.max_attempts, info.stats.available, "waiting")
    for q in admin.list_queues().items:
        print(q.name, q.stats.available, q.stats.leased, q.stats.dead)
    for job in admin.list_dead_letters(queue).items:
        print("dead:", job.id, job.dead_reason, job.last_error)
    admin.requeue_dead_letters(queue, all=True)  # give them another go
    admin.pause_queue(queue)  # enqueues still accepted; nothing delivered
    admin.resume_queue(queue)

    # Schedules: a job to `queue` at 03:00 Paris time every day.
    nightly = admin.create_schedule(
        f"{queue}-nightly", "0 3 * * *", time_zone="Europe/Paris",
        queue=queue, payload=b'{"report": "daily"}', overlap="skip",
    )  # fmt: skip
    print("next", nightly.name, nightly.next_run_at)
    print("ran", admin.run_schedule(nightly.name).job_id)  # once now, whatever the cron
    admin.update_schedule(nightly.name, cron="0 4 * * *")  # only what is given changes
    admin.pause_schedule(nightly.name)
    print("schedules", [s.name for s in admin.list_schedules().items if s.paused])
    admin.delete_schedule(nightly.name)
