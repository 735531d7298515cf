"""Results, progress and waiting for a job: a task's handler returns a
value (the job's result, as JSON) that the producer waits for; a plain
handler reports progress and returns ``Ack(result=...)``."""

import os
import threading
from dataclasses import dataclass

from leaseq import Ack, Client, Job, Task, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "add")


@dataclass
class Pair:
    a: int
    b: int


worker = Worker(addr, max_in_flight=4)

add = Task(queue, Pair)


@worker.task(add)
def add_them(p: Pair) -> int:
    return p.a + p.b  # the result, as JSON


@worker.handler(f"{queue}.thumbs")
def thumbnail(job: Job) -> Ack:
    job.progress(0.5, "resized")
    return Ack(result=b"s3://thumbs/" + job.payload)


serving = threading.Thread(target=lambda: worker.run(handle_signals=False))
serving.start()
try:
    with Client(addr) as client:
        print("sum", add.submit(client, Pair(2, 3)).result(timeout=30))
        outcome = client.wait(client.enqueue(f"{queue}.thumbs", b"cat.png").job_id, timeout=30)
        print(outcome.state, outcome.result.decode())
finally:
    worker.stop()
    serving.join(30)
