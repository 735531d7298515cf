"""Typed JSON payloads, and a worker in burst mode: it works what is
waiting, then returns (a cron job, a CI step, a one-off backfill)."""

import os
from dataclasses import dataclass
from typing import List

from leaseq import Client, Job, NewJob, Worker, to_json

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")


@dataclass
class Email:
    to: str
    subject: str


with Client(addr) as client:
    # to_json: a dataclass, a pydantic model or plain data, as JSON bytes.
    client.enqueue_batch([NewJob(queue, to_json(Email(f"user{i}@example.com", "hello"))) for i in range(3)])

worker = Worker(addr, max_in_flight=4)
sent: List[str] = []


@worker.handler(queue)
def send(job: Job) -> None:
    email = job.json(Email)  # the payload as an Email (a pydantic model works too)
    sent.append(email.to)


worker.run(burst=True)  # returns once nothing is waiting and nothing runs
print("sent", len(sent), "acked", worker.stats.acked)
