"""The unary calls of leaseq.v1.QueueService, and the types a handler sees."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterable, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from leaseq.v1 import queue_pb2 as pb
from leaseq.v1 import queue_pb2_grpc as pb_grpc

#: A length of time: seconds as a number, or a ``datetime.timedelta``.
Seconds = Union[int, float, dt.timedelta]


def duration(value: Seconds) -> duration_pb2.Duration:
    """A protobuf Duration from seconds or a timedelta."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    whole = int(value)
    return duration_pb2.Duration(seconds=whole, nanos=round((value - whole) * 1e9))


def _timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    if value.tzinfo is None:
        # A naive datetime is ambiguous; refusing it beats guessing local time.
        raise ValueError("run_at: must be a timezone-aware datetime")
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(dt.timezone.utc))
    return ts


def _datetime(ts: timestamp_pb2.Timestamp) -> dt.datetime:
    return ts.ToDatetime(tzinfo=dt.timezone.utc)


@dataclass(frozen=True)
class EnqueueResult:
    job_id: str
    #: True when ``dedup_key`` matched a live job; ``job_id`` is that job's.
    duplicate: bool


@dataclass(frozen=True)
class Job:
    """One delivery: the job and the lease under which this worker holds it."""

    id: str
    queue: str
    payload: bytes
    headers: Mapping[str, str]
    priority: int
    #: 1 on first delivery.
    attempt: int
    enqueued_at: dt.datetime
    #: The error text of the previous failed attempt, "" if none.
    last_error: str
    lease_token: str
    #: By the broker's (database's) clock.
    lease_expires_at: dt.datetime

    @classmethod
    def from_delivery(cls, d: pb.Delivery) -> "Job":
        return cls(
            id=d.job.id,
            queue=d.job.queue,
            payload=d.job.payload,
            headers=dict(d.job.headers),
            priority=d.job.priority,
            attempt=d.job.attempt,
            enqueued_at=_datetime(d.job.enqueued_at),
            last_error=d.job.last_error,
            lease_token=d.lease_token,
            lease_expires_at=_datetime(d.lease_expires_at),
        )


@dataclass
class NewJob:
    """A job to enqueue; the fields mirror ``EnqueueRequest`` in queue.proto."""

    queue: str
    payload: Union[bytes, str] = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    delay: Optional[Seconds] = None
    run_at: Optional[dt.datetime] = None
    dedup_key: str = ""
    max_attempts: int = 0
    ttl: Optional[Seconds] = None

    def to_request(self) -> pb.EnqueueRequest:
        payload = self.payload.encode() if isinstance(self.payload, str) else self.payload
        req = pb.EnqueueRequest(
            queue=self.queue,
            payload=payload,
            headers=dict(self.headers),
            priority=self.priority,
            dedup_key=self.dedup_key,
            max_attempts=self.max_attempts,
        )
        # Optional messages are set only when given: an absent `delay` and a
        # zero one are different requests to the broker.
        if self.delay is not None:
            req.delay.CopyFrom(duration(self.delay))
        if self.run_at is not None:
            req.run_at.CopyFrom(_timestamp(self.run_at))
        if self.ttl is not None:
            req.ttl.CopyFrom(duration(self.ttl))
        return req


# gRPC's own reconnect backoff grows to 120 s, and while a channel waits in it
# every call fails at once: a worker would sit idle for minutes after a broker
# restart. Capped at the Worker's default backoff_max instead.
_CHANNEL_DEFAULTS = (("grpc.max_reconnect_backoff_ms", 10_000),)


class Client:
    """A connection to a leaseq broker.

    Every call raises ``grpc.aio.AioRpcError`` on failure; its ``code()`` is
    the documented status (``INVALID_ARGUMENT`` naming the field,
    ``FAILED_PRECONDITION`` for a stale lease token, ``UNAVAILABLE`` when the
    broker cannot serve: retry). Use it as ``async with Client(addr) as c``
    or call ``close()``.
    """

    def __init__(
        self,
        target: str,
        *,
        channel: Optional[grpc.aio.Channel] = None,
        options: Sequence[tuple] = (),
    ) -> None:
        # Plaintext by default, like the broker; pass a secure channel for TLS.
        opts = {**dict(_CHANNEL_DEFAULTS), **dict(options)}
        self._channel = channel or grpc.aio.insecure_channel(target, options=list(opts.items()))
        self._stub = pb_grpc.QueueServiceStub(self._channel)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def enqueue(self, queue: str, payload: Union[bytes, str] = b"", **fields) -> EnqueueResult:
        """Adds one job; returns once it is committed. ``fields`` are those of
        :class:`NewJob` (headers, priority, delay, run_at, dedup_key,
        max_attempts, ttl)."""
        resp = await self._stub.Enqueue(NewJob(queue, payload, **fields).to_request())
        return EnqueueResult(resp.job_id, resp.duplicate)

    async def enqueue_batch(self, jobs: Iterable[NewJob]) -> list[EnqueueResult]:
        """Adds all the jobs atomically (all or none); results in the same order."""
        req = pb.EnqueueBatchRequest(jobs=[j.to_request() for j in jobs])
        resp = await self._stub.EnqueueBatch(req)
        return [EnqueueResult(r.job_id, r.duplicate) for r in resp.results]

    async def ack(self, job_id: str, lease_token: str) -> None:
        await self._stub.Ack(pb.AckRequest(job_id=job_id, lease_token=lease_token))

    async def nack(
        self,
        job_id: str,
        lease_token: str,
        error: str = "",
        *,
        retry_after: Optional[Seconds] = None,
        dead_letter: bool = False,
    ) -> bool:
        """Fails the job; returns True when it went to the dead letters.
        ``retry_after`` None = the queue's backoff, 0 = at once."""
        req = pb.NackRequest(job_id=job_id, lease_token=lease_token, error=error, dead_letter=dead_letter)
        if retry_after is not None:
            req.retry_after.CopyFrom(duration(retry_after))
        resp = await self._stub.Nack(req)
        return resp.dead_lettered

    async def extend_lease(self, job_id: str, lease_token: str, lease: Seconds) -> dt.datetime:
        """Keeps the job for ``lease`` more from now; returns the new expiry."""
        req = pb.ExtendLeaseRequest(job_id=job_id, lease_token=lease_token, lease=duration(lease))
        resp = await self._stub.ExtendLease(req)
        return _datetime(resp.lease_expires_at)

    def subscribe(
        self,
        queues: Sequence[str],
        *,
        consumer: str = "",
        max_in_flight: int = 0,
        lease: Optional[Seconds] = None,
    ) -> "grpc.aio.UnaryStreamCall":
        """The raw Subscribe stream (``SubscribeResponse`` messages). Most
        programs want :class:`leaseq.Worker`, which adds reconnects, lease
        extension and settling; cancel the returned call to close the stream,
        which releases its unsettled jobs."""
        req = pb.SubscribeRequest(queues=list(queues), consumer=consumer, max_in_flight=max_in_flight)
        if lease is not None:
            req.lease.CopyFrom(duration(lease))
        return self._stub.Subscribe(req)


async def deliveries(call: "grpc.aio.UnaryStreamCall") -> AsyncIterator[Job]:
    """The deliveries of a raw Subscribe stream, skipping heartbeats."""
    async for msg in call:
        if msg.WhichOneof("kind") == "delivery":
            yield Job.from_delivery(msg.delivery)
