"""Python client for leaseq, a durable gRPC job queue on PostgreSQL.

- :class:`Client` (blocking) and :class:`AsyncClient` (asyncio): enqueue,
  enqueue_batch, ack, ack_batch, nack, extend_lease, subscribe, consume.
- :class:`Worker`: handlers per queue, concurrency = credits, per-job
  timeout, lease extension, outcomes (:class:`Retry`, :class:`DeadLetter`;
  :class:`Ack` for follow-up jobs with the ack, or a job acked in SQL),
  settles on the Consume stream, reconnects, graceful stop on SIGTERM.
- :class:`Task`: a queue and its payload type, declared once: the producer
  (``task.enqueue(client, payload)``, or ``task.submit(...).result()`` to
  wait for the handler's returned value) and the worker's handler
  (``@worker.task(task)``). ``worker.use(middleware)`` wraps handlers.
- Results, progress and waiting: ``Ack(result=...)``, ``job.progress(f, msg)``,
  ``client.wait(job_id)`` (:class:`JobOutcome`).
- ``leaseq.testing``: a throwaway broker (and a pytest fixture), ``drain``.
- :class:`AdminClient` and :class:`AsyncAdminClient`: the AdminService.
- :class:`TLS` and ``token=``: TLS, mutual TLS and bearer tokens on every client.
- ``leaseq.v1``: the stubs generated from proto/ (``generate.sh``).
"""

from leaseq._connection import TLS, Connection
from leaseq._types import (
    Ack,
    AckResult,
    Cancelled,
    DeadLetter,
    EnqueueResult,
    Job,
    JobFailed,
    JobOutcome,
    NewJob,
    OnDuplicate,
    Retry,
    RpcError,
    Seconds,
    SettleResult,
    duration,
    from_json,
    to_json,
)
from leaseq.admin import (
    AdminClient,
    AsyncAdminClient,
    CatchUp,
    JobInfo,
    JobTemplate,
    KeyInfo,
    KeyOrder,
    KeyOverride,
    Overlap,
    JobState,
    Page,
    PurgeQueueResult,
    QueueInfo,
    QueueSettings,
    QueuesSnapshot,
    QueueStats,
    RequeueResult,
    ScheduleInfo,
    ScheduleRun,
)
from leaseq.aio import AsyncClient, AsyncConsumer, AsyncSubscription
from leaseq.client import Client, Consumer, Subscription
from leaseq.task import AsyncJobHandle, JobHandle, Task, TaskHandler
from leaseq.worker import FATAL_CODES, Backoff, Handler, Middleware, Worker, WorkerStats

__version__ = "0.2.0"

__all__ = [
    "Ack",
    "AckResult",
    "AdminClient",
    "AsyncAdminClient",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncJobHandle",
    "AsyncSubscription",
    "CatchUp",
    "Cancelled",
    "Backoff",
    "Client",
    "Connection",
    "Consumer",
    "DeadLetter",
    "EnqueueResult",
    "FATAL_CODES",
    "Handler",
    "Job",
    "JobFailed",
    "JobHandle",
    "JobInfo",
    "JobOutcome",
    "Middleware",
    "JobState",
    "JobTemplate",
    "KeyInfo",
    "KeyOrder",
    "KeyOverride",
    "NewJob",
    "OnDuplicate",
    "Overlap",
    "Page",
    "PurgeQueueResult",
    "QueueInfo",
    "QueueSettings",
    "QueueStats",
    "QueuesSnapshot",
    "RequeueResult",
    "Retry",
    "ScheduleInfo",
    "ScheduleRun",
    "RpcError",
    "Seconds",
    "SettleResult",
    "Subscription",
    "TLS",
    "Task",
    "TaskHandler",
    "Worker",
    "WorkerStats",
    "duration",
    "from_json",
    "to_json",
]
