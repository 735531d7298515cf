"""Tasks: a queue and its payload type declared once, for the producer and
the handler; middleware around every handler (logging, metrics, an error
policy)."""

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

from leaseq import Client, Job, Retry, Task, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")
log = logging.getLogger("app")


@dataclass
class Email:
    to: str
    subject: str


# In a module both the producer and the worker import:
send_email = Task(queue, Email)

# The producer: the payload is an Email or a TypeError, never a typo.
with Client(addr) as client:
    send_email.enqueue(client, Email("ada@example.com", "welcome"))
    send_email.enqueue(client, Email("bob@example.com", "welcome"), priority=5)
    client.enqueue(queue, b'{"to": "eve@example.com"}')  # no subject: dead-lettered

worker = Worker(addr, max_in_flight=8)
took: Dict[str, int] = {}
sent: List[str] = []


@worker.use
def timing(job: Job, next: Callable[[Job], Any]) -> Any:
    # Outermost first; what next() raises is the outcome, so re-raising keeps
    # it (a Retry stays a retry). An async def middleware wraps async handlers.
    start = time.perf_counter()
    try:
        return next(job)
    except Retry:
        raise
    except Exception:
        log.exception("job %s failed", job.id)
        raise
    finally:
        took[job.id] = int((time.perf_counter() - start) * 1e6)


@worker.task(send_email)
def send(email: Email) -> None:  # or send(email, job) for the Job too
    sent.append(f"{email.subject} to {email.to}")


worker.run(burst=True)
for line in sorted(sent):
    print("sent", line)
print("timed", len(took), "acked", worker.stats.acked, "dead-lettered", worker.stats.dead_lettered)
