"""The synchronous client: :class:`Client`, with the same methods as
:class:`leaseq.AsyncClient` for code without an event loop (Django, Flask,
scripts)."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import (
    Any,
    Awaitable,
    Callable,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import grpc

from leaseq import _tracing
from leaseq._connection import TLS, Connection
from leaseq._types import (
    AckItem,
    AckResult,
    CancelCallback,
    Cancelled,
    EnqueueResult,
    Job,
    NewJob,
    OnDuplicate,
    RpcError,
    Seconds,
    JobOutcome,
    _datetime,
    _from_grpc,
    _wait_outcome,
    check_progress,
    seconds,
    wait_request,
    ack_batch_request,
    ack_request,
    ack_results,
    extend_request,
    nack_request,
    subscribe_request,
)
from leaseq.aio import AsyncClient, AsyncConsumer, Queues
from leaseq.v1 import queue_pb2 as pb
from leaseq.v1 import queue_pb2_grpc as pb_grpc

T = TypeVar("T")


class Client:
    """A blocking connection to a leaseq broker; thread-safe.

    ``target`` is ``host:port`` (plaintext, or TLS when ``tls`` is given),
    ``http://host:port`` or ``https://host:port`` (TLS: the CA of ``tls``,
    else the system's roots). ``tls`` is a :class:`leaseq.TLS` (CA, client
    certificate and key) or True; ``token`` is sent as ``authorization:
    Bearer <token>`` on every call; ``timeout`` (seconds) is the deadline of
    each unary call (None: none). What is not given comes from
    ``LEASEQ_ADDR`` (default ``127.0.0.1:50051``), ``LEASEQ_TOKEN``,
    ``LEASEQ_TLS_CA``, ``LEASEQ_CLIENT_CERT`` and ``LEASEQ_CLIENT_KEY``, as
    every leaseq client reads them.

    Every call raises :class:`leaseq.RpcError` on failure. Use it as
    ``with Client(addr) as c`` or call ``close()``.
    """

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        token: Optional[str] = None,
        tls: Union[TLS, bool, None] = None,
        options: Sequence[Tuple[str, Any]] = (),
        timeout: Optional[float] = None,
    ) -> None:
        self._conn = Connection(target, token=token, tls=tls, options=options)
        self._timeout = timeout
        self._channel = self._conn.sync_channel()
        self._stub = pb_grpc.QueueServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self._loop: Optional[_LoopThread] = None
        self._aio: Optional[AsyncClient] = None
        self._lock = threading.Lock()

    @property
    def connection(self) -> Connection:
        return self._conn

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()
        with self._lock:
            loop, aio = self._loop, self._aio
            self._loop = self._aio = None
        if loop is not None:
            if aio is not None:
                loop.run(aio.close())
            loop.stop()

    def _unary(self, method: Any, request: Any) -> Any:
        try:
            return method(request, metadata=self._conn.metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None

    def enqueue(
        self,
        queue: str,
        payload: Union[bytes, str] = b"",
        *,
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        delay: Optional[Seconds] = None,
        run_at: Optional[dt.datetime] = None,
        dedup_key: str = "",
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        key: str = "",
        unique_for: Optional[Seconds] = None,
        on_duplicate: OnDuplicate = "keep",
    ) -> EnqueueResult:
        """Adds one job; returns once it is committed. With OpenTelemetry
        installed and a span active, the job's headers carry its
        ``traceparent``/``tracestate``. ``key``: the job's key inside its
        queue (at most 256 bytes), which orders the jobs of one key in a
        queue with ``ordered_by_key`` (see :attr:`NewJob.key`).
        ``unique_for`` and ``on_duplicate``: see :attr:`NewJob.unique_for`
        and :attr:`NewJob.on_duplicate`."""
        job = NewJob(
            queue, payload, headers or {}, priority, delay, run_at, dedup_key, max_attempts, ttl, key,
            unique_for, on_duplicate,
        )
        resp = self._unary(self._stub.Enqueue, job.to_request(_tracing.inject()))
        return EnqueueResult(resp.job_id, resp.duplicate, resp.replaced)

    def enqueue_batch(self, jobs: Iterable[NewJob]) -> List[EnqueueResult]:
        """Adds all the jobs atomically (all or none); results in the same order."""
        trace = _tracing.inject()
        req = pb.EnqueueBatchRequest(jobs=[j.to_request(trace) for j in jobs])
        resp = self._unary(self._stub.EnqueueBatch, req)
        return [EnqueueResult(r.job_id, r.duplicate, r.replaced) for r in resp.results]

    def ack(
        self, job_id: str, lease_token: str, *, enqueue: Iterable[NewJob] = (), result: Optional[bytes] = None
    ) -> List[str]:
        """The job is done. FAILED_PRECONDITION: the lease token is not
        current. ``enqueue``: follow-up jobs, ``result``: the job's result,
        as :meth:`AsyncClient.ack`; returns the follow-ups' ids."""
        return list(self._unary(self._stub.Ack, ack_request(job_id, lease_token, enqueue, result)).enqueued)

    def ack_batch(self, acks: Iterable[AckItem]) -> List[AckResult]:
        """Acks many jobs (``Job``s or ``(job_id, lease_token)`` pairs) in one
        call; each succeeds or fails on its own (see :class:`AckResult`)."""
        return ack_results(self._unary(self._stub.AckBatch, ack_batch_request(list(acks))))

    def nack(
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
        req = nack_request(job_id, lease_token, error, retry_after, dead_letter)
        return bool(self._unary(self._stub.Nack, req).dead_lettered)

    def extend_lease(self, job_id: str, lease_token: str, lease: Seconds) -> dt.datetime:
        """Keeps the job for ``lease`` more from now; returns the new expiry."""
        resp = self._unary(self._stub.ExtendLease, extend_request(job_id, lease_token, lease))
        return _datetime(resp.lease_expires_at)

    def report_progress(self, job_id: str, lease_token: str, fraction: float, message: str = "") -> None:
        """Says how far a held job is (``ReportProgress``; on a Consume
        stream, :meth:`leaseq.Job.progress` in a Worker coalesces reports
        instead): ``fraction`` 0 to 1, ``message`` at most 256 bytes
        (``ValueError`` naming the field, nothing sent). FAILED_PRECONDITION:
        the lease token is not current; UNIMPLEMENTED: the broker predates
        progress."""
        check_progress(fraction, message)
        req = pb.ReportProgressRequest(job_id=job_id, lease_token=lease_token, fraction=fraction, message=message)
        self._unary(self._stub.ReportProgress, req)

    def wait(self, job_id: str, timeout: Seconds = 3600) -> JobOutcome:
        """Waits for the job to end (``WaitJob``: no polling) and returns how
        it ended: completed with its result, dead, cancelled, or unknown
        (see :class:`leaseq.JobOutcome`); at once for a job that already
        ended. ``timeout``: more than 0, at most 1 hour; past it
        :class:`leaseq.RpcError` DEADLINE_EXCEEDED. Needs the enqueue or
        consume permission on the job's queue."""
        req = wait_request(job_id, timeout)
        # The broker ends the stream at `timeout`; the call's own deadline
        # a little later only guards against a broker that went silent.
        deadline = seconds(timeout) + 10.0
        try:
            for r in self._stub.WaitJob(req, metadata=self._conn.metadata, timeout=deadline):
                outcome = _wait_outcome(r)
                if outcome is not None:
                    return outcome
        except grpc.RpcError as e:
            raise _from_grpc(e) from None
        raise RpcError(grpc.StatusCode.UNAVAILABLE, f"wait: the stream ended without the outcome of job {job_id}")

    def subscribe(
        self,
        queues: Queues,
        *,
        consumer: str = "",
        max_in_flight: int = 0,
        lease: Optional[Seconds] = None,
        batched: bool = True,
        on_cancel: Optional[CancelCallback] = None,
    ) -> "Subscription":
        """A Subscribe stream: ``for job in sub`` yields deliveries; settle
        them with :meth:`ack`/:meth:`nack`. Closing it (``close()``, or
        leaving ``with``) releases its unsettled jobs. Most programs want
        :class:`leaseq.Worker`. ``batched``: as :meth:`AsyncClient.subscribe`.
        ``on_cancel``: called with a :class:`leaseq.Cancelled` when the
        broker says a job this stream delivered was cancelled; on the
        iterating thread, as the iterator reads the stream (so not while
        the loop's body runs: a consumer that must notice a cancel while it
        works wants :meth:`consume`, or :class:`leaseq.Worker`)."""
        req = subscribe_request(queues, consumer, max_in_flight, lease, batched)
        return Subscription(self._stub.Subscribe(req, metadata=self._conn.metadata), on_cancel)

    def consume(
        self,
        queues: Queues,
        *,
        consumer: str = "",
        max_in_flight: int = 0,
        lease: Optional[Seconds] = None,
        idle_timeout: Optional[float] = None,
        batched: bool = True,
        on_cancel: Optional[CancelCallback] = None,
    ) -> "Consumer":
        """A Consume stream: deliveries as :meth:`subscribe`, and settles sent
        on the same stream (``stream.ack(job)``). It runs on a background
        event loop of this client. ``on_cancel``: as
        :meth:`AsyncClient.consume`, called on that loop's thread as soon as
        the notice arrives (keep it short: e.g. set an Event)."""
        loop, aio = self._background()

        async def open_stream() -> AsyncConsumer:
            return aio.consume(
                queues,
                consumer=consumer,
                max_in_flight=max_in_flight,
                lease=lease,
                idle_timeout=idle_timeout,
                batched=batched,
                on_cancel=on_cancel,
            )

        return Consumer(loop, loop.run(open_stream()))

    def _background(self) -> "Tuple[_LoopThread, AsyncClient]":
        with self._lock:
            if self._loop is None:
                self._loop = _LoopThread()
                conn, timeout = self._conn, self._timeout

                async def make() -> AsyncClient:
                    return AsyncClient.from_connection(conn, timeout=timeout)

                self._aio = self._loop.run(make())
            assert self._aio is not None
            return self._loop, self._aio


class Subscription:
    """A Subscribe stream (see :meth:`Client.subscribe`): an iterator of
    :class:`Job`; ``close()`` ends it."""

    def __init__(self, call: Any, on_cancel: Optional[CancelCallback] = None) -> None:
        self._call = call
        self._closed = False
        self._on_cancel = on_cancel

    def __iter__(self) -> Iterator[Job]:
        try:
            for msg in self._call:
                kind = msg.WhichOneof("kind")
                if kind == "deliveries":
                    for d in msg.deliveries.deliveries:
                        yield Job.from_delivery(d)
                elif kind == "delivery":
                    yield Job.from_delivery(msg.delivery)
                elif kind == "cancelled" and self._on_cancel is not None:
                    self._on_cancel(Cancelled.from_pb(msg.cancelled))
        except grpc.RpcError as e:
            if self._closed and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise _from_grpc(e) from None

    def close(self) -> None:
        """Ends the stream; the broker releases its unsettled jobs."""
        self._closed = True
        self._call.cancel()

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """A Consume stream (see :meth:`Client.consume`): an iterator of
    :class:`Job`, with :meth:`ack`, :meth:`nack` and :meth:`extend` sent on
    the stream, each returning once the broker has answered (raising
    :class:`leaseq.RpcError` as the unary calls do). :meth:`close`
    half-closes, which releases the jobs not settled."""

    def __init__(self, loop: "_LoopThread", stream: AsyncConsumer) -> None:
        self._loop = loop
        self._stream = stream

    def opened(self) -> None:
        """Returns once the broker has registered the stream; raises
        :class:`leaseq.RpcError` (e.g. UNIMPLEMENTED) if it failed first."""
        self._loop.run(self._stream.opened())

    def __iter__(self) -> Iterator[Job]:
        while True:
            job = self._loop.run(self._stream.next_job())
            if job is None:
                return
            yield job

    def ack(self, job: Job, *, enqueue: Iterable[NewJob] = (), result: Optional[bytes] = None) -> List[str]:
        """As :meth:`AsyncConsumer.ack`: with ``enqueue``, follow-up jobs
        (UNIMPLEMENTED from a broker without "ack.enqueue"); their ids.
        ``result``: the job's result (UNIMPLEMENTED without "ack.result")."""
        return self._loop.run(self._stream.ack(job, enqueue=enqueue, result=result))

    def progress(self, job: Job, fraction: float, message: str = "") -> None:
        """As :meth:`AsyncConsumer.progress`: with the stream's next write
        (its errors raised here)."""

        async def report() -> None:
            self._stream.progress(job, fraction, message)

        self._loop.run(report())

    def nack(
        self,
        job: Job,
        error: str = "",
        *,
        retry_after: Optional[Seconds] = None,
        dead_letter: bool = False,
    ) -> bool:
        return self._loop.run(self._stream.nack(job, error, retry_after=retry_after, dead_letter=dead_letter))

    def extend(self, job: Job, lease: Seconds) -> dt.datetime:
        return self._loop.run(self._stream.extend(job, lease))

    @property
    def error(self) -> Optional[RpcError]:
        return self._stream.error

    @property
    def features(self) -> FrozenSet[str]:
        """As :attr:`AsyncConsumer.features`."""
        return self._stream.features

    def close(self, timeout: Optional[float] = 10.0) -> None:
        """Half-closes and waits (up to ``timeout``) for the broker to end the stream."""
        self._loop.run(self._stream.close(timeout))

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._loop.call(self._stream.cancel)


class _LoopThread:
    """An event loop on a daemon thread, for the sync wrappers of async code."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leaseq-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        async def wrap() -> T:
            return await coro

        return asyncio.run_coroutine_threadsafe(wrap(), self._loop).result()

    def call(self, fn: Callable[[], Any]) -> None:
        self._loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
