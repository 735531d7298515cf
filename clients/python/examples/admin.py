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
