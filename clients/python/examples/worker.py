"""A worker: a handler per queue, outcomes, a timeout; stops gracefully on
SIGTERM (finishes what runs, settles, closes the stream)."""

import json
import logging
import os
import threading
import time

from leaseq import DeadLetter, Job, Retry, Worker

logging.basicConfig(level=logging.INFO)
addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")

out = threading.Lock()  # handlers run in threads: print one whole line at a time


def say(*words: object) -> None:
    with out:
        print(*words, flush=True)


worker = Worker(addr, max_in_flight=8, lease=30, timeout=60, grace=30)


@worker.handler(queue)
def send_email(job: Job) -> None:  # plain functions run in a thread pool
    say("started", job.id)  # print under a lock (examples/worker.py)
    try:
        msg = json.loads(job.payload)
    except ValueError:
        raise DeadLetter("payload is not JSON")  # no point retrying
    if msg.get("busy"):
        raise Retry("mail server busy", after=30)  # again in 30 s
    time.sleep(float(msg.get("seconds", 0)))  # the work; any other exception = nack
    say("finished", job.id)


worker.run()  # until SIGTERM or SIGINT
print("stopped", worker.stats, flush=True)
