"""Python client for leaseq, a durable gRPC job queue on PostgreSQL.

- :class:`Client`: Enqueue, EnqueueBatch, Ack, Nack, ExtendLease (grpc.aio).
- :class:`Worker`: Subscribe with reconnect, bounded concurrency, automatic
  lease extension, Ack/Nack from the handler's outcome, graceful stop.
- ``leaseq.v1``: the stubs generated from proto/ (``generate.sh``).
"""

from leaseq.client import Client, EnqueueResult, Job, NewJob, deliveries, duration
from leaseq.worker import FATAL_CODES, Backoff, Worker

__all__ = [
    "Backoff",
    "Client",
    "EnqueueResult",
    "FATAL_CODES",
    "Job",
    "NewJob",
    "Worker",
    "deliveries",
    "duration",
]
