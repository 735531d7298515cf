"""Run by tests/test_packaging.py with the python of a fresh venv that has
only the built wheel (and its dependencies at their floors, where that
python can have them): the installed package against the broker."""

import asyncio
import sys
import uuid

import google.protobuf
import grpc

import leaseq
from leaseq import AdminClient, AsyncClient, Client, Job, Worker

addr = sys.argv[1]
q = f"smoke-{uuid.uuid4().hex[:8]}"
assert "site-packages" in leaseq.__file__, leaseq.__file__

with Client(addr) as c:
    c.enqueue(q, b"sync")


async def produce() -> None:
    async with AsyncClient(addr) as c:
        await c.enqueue(q, b"async")


asyncio.run(produce())
seen = []
w = Worker(addr, lease=5)


@w.handler(q)
def handle(job: Job) -> None:
    seen.append(job.payload)
    if len(seen) == 2:
        w.stop()


w.run()
assert sorted(seen) == [b"async", b"sync"], seen
with AdminClient(addr) as admin:
    stats = admin.get_queue(q).stats
    assert (stats.available, stats.leased) == (0, 0), stats
print(f"smoke ok: leaseq {leaseq.__version__}, grpcio {grpc.__version__}, protobuf "
      f"{google.protobuf.__version__}, python {sys.version.split()[0]}, transport {w.transport}")
