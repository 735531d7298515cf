"""Exactly-once effects: a job's effect and its ack commit together.

- ``<queue>.orders``: the handler writes a shipment row and acks its job
  with ``select leaseq.ack(%s, %s)`` in one transaction of the broker's
  database (psycopg 3), then returns ``Ack.settled_in_sql()``: the worker
  sends no ack. A crash before the commit leaves neither (the job comes
  back); after it, both.
- ``<queue>.shipping``: the handler acks with a follow-up job on
  ``<queue>.emails`` (``Ack([...])``): the broker inserts it in the ack's
  transaction, so the email exists if and only if the ack committed.

DATABASE_URL: the broker's database (a URL or libpq's key=value string).
It enqueues three orders and two shipping jobs, works them all (burst
mode), and prints the shipments. tests/test_examples.py also stops it with
kill -9 between every two steps of a handler (``LEASEQ_EXAMPLE_PAUSE``) and
runs it again (``LEASEQ_EXAMPLE_ENQUEUE=0``): each order is shipped once.
"""

import os
import time

import psycopg

from leaseq import Ack, Client, Job, NewJob, Worker

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "shop")
dsn = os.environ["DATABASE_URL"]
pause = os.environ.get("LEASEQ_EXAMPLE_PAUSE", "")  # for the kill -9 test
table = queue.replace(".", "_").replace("-", "_") + "_shipments"

with psycopg.connect(dsn, autocommit=True) as db:
    # No unique key: an effect applied twice would show as two rows.
    db.execute(f"create table if not exists {table} (job_id uuid not null, order_ref text not null)")

if os.environ.get("LEASEQ_EXAMPLE_ENQUEUE", "1") == "1":
    with Client(addr) as client:
        client.enqueue_batch([NewJob(f"{queue}.orders", f"order-{i}") for i in range(3)])
        client.enqueue_batch([NewJob(f"{queue}.shipping", f"parcel-{i}") for i in range(2)])

worker = Worker(addr, max_in_flight=4, lease=10)


def step(name: str) -> None:
    if pause == name:
        print("paused after", name, flush=True)
        time.sleep(3600)  # until the test's kill -9


@worker.handler(f"{queue}.orders")
def ship(job: Job) -> Ack:
    with psycopg.connect(dsn) as db, db.transaction():
        db.execute(f"insert into {table} (job_id, order_ref) values (%s, %s)", (job.id, job.text))
        step("effect")
        db.execute("select leaseq.ack(%s, %s)", (job.id, job.lease_token))
        step("ack")
    # Committed: the effect and the ack, together.
    step("commit")
    return Ack.settled_in_sql()


@worker.handler(f"{queue}.shipping")
def notify(job: Job) -> Ack:
    return Ack([NewJob(f"{queue}.emails", f"{job.text} has shipped")])


worker.run(burst=True)
with psycopg.connect(dsn) as db:
    for (order,) in db.execute(f"select order_ref from {table} order by order_ref"):
        print("shipped", order)
print("settled in SQL", worker.stats.settled_in_sql, "acked", worker.stats.acked, "follow-ups", worker.stats.follow_ups)
