"""A producer without asyncio (a Django view, a Flask route, a script)."""

import os

from leaseq import Client, NewJob

addr = os.environ.get("LEASEQ_ADDR", "127.0.0.1:50051")
queue = os.environ.get("LEASEQ_QUEUE", "emails")

# One client per process, shared by every thread; it reconnects by itself.
client = Client(addr)

r = client.enqueue(queue, b'{"to": "a@example.com"}', headers={"content-type": "application/json"})
print("enqueued", r.job_id)

# A delayed job, and one that a second enqueue with the same key will not repeat.
client.enqueue(queue, "reminder", delay=3600)
first = client.enqueue(queue, "welcome", dedup_key="welcome:42")
again = client.enqueue(queue, "welcome", dedup_key="welcome:42")
assert again.duplicate and again.job_id == first.job_id
# Debounce: the key's job is still waiting, so it takes this payload (and
# headers, priority, delay) and keeps its id.
latest = client.enqueue(queue, "welcome, v2", dedup_key="welcome:42", on_duplicate="replace")
assert latest.replaced and latest.job_id == first.job_id
# Unique for a window: once this job completes, its key stays held for a day.
client.enqueue(queue, "receipt", dedup_key="receipt:42", unique_for=24 * 3600)

# A job of a key (a customer): in a queue ordered by key, a key's jobs go out in enqueue order.
client.enqueue(queue, "invoice 1", key="customer-42")

# Many jobs in one atomic call.
results = client.enqueue_batch([NewJob(queue, f"bulk {i}", priority=i) for i in range(3)])
print("batch", [x.job_id for x in results])
client.close()
