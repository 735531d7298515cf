"""The asyncio client (``grpc.aio``): :class:`AsyncClient`, and its streams
:class:`AsyncSubscription` (Subscribe) and :class:`AsyncConsumer` (Consume,
settles on the stream)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import (
    Any,
    AsyncIterator,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import grpc

from leaseq import _produce, _tracing
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
    SettleResult,
    ACK_ENQUEUE,
    ACK_RESULT,
    NO_ACK_ENQUEUE,
    NO_ACK_RESULT,
    NO_PROGRESS,
    PROGRESS,
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
from leaseq.v1 import queue_pb2 as pb
from leaseq.v1 import queue_pb2_grpc as pb_grpc

log = logging.getLogger("leaseq")

Queues = Union[str, Sequence[str]]


class AsyncClient:
    """An asyncio connection to a leaseq broker.

    ``target`` is ``host:port`` (plaintext), ``http://host:port`` or
    ``https://host:port`` (TLS with the system's roots). ``tls`` is a
    :class:`leaseq.TLS` (CA, client certificate and key) or True;
    ``token`` is sent as ``authorization: Bearer <token>`` on every call;
    ``timeout`` (seconds) is the deadline of each unary call (None: none).

    Every call raises :class:`leaseq.RpcError` on failure. Use it as
    ``async with AsyncClient(addr) as c`` or call ``close()``.
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
        self._channel = self._conn.aio_channel()
        self._stub = pb_grpc.QueueServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self._producer = _produce.AsyncProducer(self._stub, self._conn.metadata)

    @classmethod
    def from_connection(cls, conn: Connection, *, timeout: Optional[float] = None) -> "AsyncClient":
        """A client on the settings of another (e.g. ``Client(...).connection``)."""
        self = cls.__new__(cls)
        self._conn, self._timeout = conn, timeout
        self._channel = conn.aio_channel()
        self._stub = pb_grpc.QueueServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]
        self._producer = _produce.AsyncProducer(self._stub, conn.metadata)
        return self

    @property
    def connection(self) -> Connection:
        return self._conn

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._producer.close()
        await self._channel.close()

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._conn.metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None

    async def enqueue(
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
        req = job.to_request(_tracing.inject())
        try:
            resp = await self._producer.enqueue(req, self._timeout)
        except _produce.Unsupported:
            resp = await self._unary(self._stub.Enqueue, req)
        return EnqueueResult(resp.job_id, resp.duplicate, resp.replaced)

    async def enqueue_batch(self, jobs: Iterable[NewJob]) -> List[EnqueueResult]:
        """Adds all the jobs atomically (all or none); results in the same order."""
        trace = _tracing.inject()
        req = pb.EnqueueBatchRequest(jobs=[j.to_request(trace) for j in jobs])
        resp = await self._unary(self._stub.EnqueueBatch, req)
        return [EnqueueResult(r.job_id, r.duplicate, r.replaced) for r in resp.results]

    async def ack(
        self, job_id: str, lease_token: str, *, enqueue: Iterable[NewJob] = (), result: Optional[bytes] = None
    ) -> List[str]:
        """The job is done. FAILED_PRECONDITION: the lease token is not
        current. ``enqueue``: follow-up jobs, inserted in the ack's
        transaction (they exist if and only if the ack committed; a broker
        must list ``"ack.enqueue"`` in a stream's first heartbeat, or it
        drops them); returns their ids, in order. ``result``: the job's
        result (see :class:`leaseq.Ack`; a broker must list ``"ack.result"``,
        or it drops it)."""
        req = ack_request(job_id, lease_token, enqueue, result)
        resp = await self._unary(self._stub.Ack, req)
        return list(resp.enqueued)

    async def ack_batch(self, acks: Iterable[AckItem]) -> List[AckResult]:
        """Acks many jobs (``Job``s or ``(job_id, lease_token)`` pairs) in one
        call; each succeeds or fails on its own (see :class:`AckResult`)."""
        resp = await self._unary(self._stub.AckBatch, ack_batch_request(list(acks)))
        return ack_results(resp)

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
        req = nack_request(job_id, lease_token, error, retry_after, dead_letter)
        resp = await self._unary(self._stub.Nack, req)
        return bool(resp.dead_lettered)

    async def extend_lease(self, job_id: str, lease_token: str, lease: Seconds) -> dt.datetime:
        """Keeps the job for ``lease`` more from now; returns the new expiry."""
        resp = await self._unary(self._stub.ExtendLease, extend_request(job_id, lease_token, lease))
        return _datetime(resp.lease_expires_at)

    async def report_progress(self, job_id: str, lease_token: str, fraction: float, message: str = "") -> None:
        """Says how far a held job is (``ReportProgress``; on a Consume
        stream, :meth:`leaseq.Job.progress` in a Worker coalesces reports
        instead): ``fraction`` 0 to 1, ``message`` at most 256 bytes
        (``ValueError`` naming the field, nothing sent). FAILED_PRECONDITION:
        the lease token is not current; UNIMPLEMENTED: the broker predates
        progress."""
        check_progress(fraction, message)
        req = pb.ReportProgressRequest(job_id=job_id, lease_token=lease_token, fraction=fraction, message=message)
        await self._unary(self._stub.ReportProgress, req)

    async def wait(self, job_id: str, timeout: Seconds = 3600) -> JobOutcome:
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
            call = self._stub.WaitJob(req, metadata=self._conn.metadata, timeout=deadline)
            async for r in call:
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
        idle_timeout: Optional[float] = None,
        batched: bool = True,
        on_cancel: Optional[CancelCallback] = None,
    ) -> "AsyncSubscription":
        """A Subscribe stream: ``async for job in sub`` yields deliveries;
        settle them with :meth:`ack`/:meth:`nack`. Closing it (``close()``, or
        leaving ``async with``) releases its unsettled jobs. Most programs
        want :class:`leaseq.Worker`. ``batched``: let the broker send
        several deliveries in one message (``accept: ["deliveries"]``; a
        broker that predates it sends one a message either way).
        ``on_cancel``: called on the event loop with a
        :class:`leaseq.Cancelled` when the broker says a job this stream
        delivered was cancelled (``CancelJob``): stop its work, settle
        nothing (a broker whose :attr:`features` lack ``"cancel"`` never
        says so)."""
        req = subscribe_request(queues, consumer, max_in_flight, lease, batched)
        return AsyncSubscription(self._stub.Subscribe(req, metadata=self._conn.metadata), idle_timeout, on_cancel)

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
    ) -> "AsyncConsumer":
        """A Consume stream: deliveries as :meth:`subscribe`, and settles sent
        on the same stream (``await stream.ack(job)``); settles made in one
        event-loop turn go in one message. A broker without Consume fails it
        with UNIMPLEMENTED (see :meth:`AsyncConsumer.opened`).
        ``on_cancel``: as :meth:`subscribe`."""
        req = pb.ConsumeRequest(
            subscribe=subscribe_request(queues, consumer, max_in_flight, lease, batched), confirm_settles=True
        )
        return AsyncConsumer(lambda: self._stub.Consume(metadata=self._conn.metadata), req, idle_timeout, on_cancel)


#: Called with a settle's result from the broker, or with the error that
#: ended the stream before it answered (then the settle may or may not have
#: been applied).
SettleCallback = Callable[[Optional[pb.SettleResult], Optional[RpcError]], None]


class _Stream:
    """A background reader of a server stream: deliveries into a queue (or
    to a Worker's sink), the rest to ``_on_settled``; the end (or failure)
    recorded for iterators. One ``read()`` a message and nothing more per
    message: the idle watch is one timer that checks a timestamp."""

    def __init__(self, call: Any, idle_timeout: Optional[float], on_cancel: Optional[CancelCallback] = None) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._call = call
        self._idle_timeout = idle_timeout
        self._jobs: "asyncio.Queue[Optional[Job]]" = asyncio.Queue()
        # A Worker sets this before its first await: then every message's
        # deliveries go to it as one list instead of into the queue.
        self._sink: Optional[Callable[[List[Job]], None]] = None
        # Called with each Cancelled notice (the user's, or a Worker's).
        self._on_cancel = on_cancel
        self._opened: "asyncio.Future[None]" = loop.create_future()
        self._error: Optional[RpcError] = None
        self._closing = False
        self._features: FrozenSet[str] = frozenset()
        self._last_message = loop.time()
        self._watchdog: Optional[asyncio.TimerHandle] = None
        self._reader = asyncio.ensure_future(self._read())
        if idle_timeout is not None:
            self._watchdog = loop.call_later(idle_timeout, self._check_idle)

    def _check_idle(self) -> None:
        self._watchdog = None
        if self._reader.done():
            return
        assert self._idle_timeout is not None
        idle = self._loop.time() - self._last_message
        if idle < self._idle_timeout:
            self._watchdog = self._loop.call_later(self._idle_timeout - idle, self._check_idle)
            return
        # Heartbeats stopped: a hung broker or a silently dropped connection.
        if self._error is None:
            self._error = RpcError(grpc.StatusCode.UNAVAILABLE, f"no message on the stream for {self._idle_timeout}s")
        self._call.cancel()
        self._reader.cancel()

    async def _read(self) -> None:
        loop = self._loop
        try:
            while True:
                try:
                    msg = await self._call.read()
                except grpc.RpcError as e:
                    if not self._opened.done() and self._reopen(e):
                        continue
                    raise
                if msg is grpc.aio.EOF:
                    break
                self._last_message = loop.time()
                kind = msg.WhichOneof("kind")
                if kind == "deliveries":
                    if not self._closing:
                        self._deliver([Job.from_delivery(d) for d in msg.deliveries.deliveries])
                elif kind == "delivery":
                    if not self._closing:
                        self._deliver([Job.from_delivery(msg.delivery)])
                elif kind == "settled":
                    self._on_settled(msg.settled)
                elif kind == "heartbeat" and not self._opened.done():
                    self._features = frozenset(msg.heartbeat.features)
                elif kind == "cancelled":
                    self._cancelled(msg.cancelled)
                if not self._opened.done():
                    # The broker's first message is a heartbeat sent once
                    # the subscription is registered: the stream is up.
                    self._opened.set_result(None)
        except grpc.RpcError as e:
            if self._error is None:
                self._error = _from_grpc(e)
        except asyncio.CancelledError:
            if self._error is None:
                self._error = RpcError(grpc.StatusCode.CANCELLED, "stream closed by the client")
        except RpcError as e:
            self._error = e
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            if not self._opened.done():
                if self._error is not None:
                    self._opened.set_exception(self._error)
                    self._opened.exception()  # retrieved here; opened() re-raises
                else:
                    self._opened.set_result(None)
            self._ended()
            self._jobs.put_nowait(None)

    def _deliver(self, jobs: List[Job]) -> None:
        if self._sink is not None:
            self._sink(jobs)
            return
        for job in jobs:
            self._jobs.put_nowait(job)

    def _cancelled(self, c: pb.Cancelled) -> None:
        callback = self._on_cancel
        if callback is None:
            log.debug("job %s was cancelled (no on_cancel callback)", c.job_id)
            return
        try:
            callback(Cancelled.from_pb(c))
        except Exception:
            # The stream goes on: a failing callback must not end it.
            log.exception("on_cancel callback failed for job %s", c.job_id)

    def _on_settled(self, settled: Any) -> None:  # overridden by AsyncConsumer
        pass

    def _reopen(self, error: grpc.RpcError) -> bool:  # overridden by AsyncConsumer
        """Whether the stream, failed with ``error`` before its first
        message, was opened again (and is to be read again)."""
        return False

    def _ended(self) -> None:  # overridden by AsyncConsumer
        pass

    @property
    def error(self) -> Optional[RpcError]:
        """Why the stream ended: None while it runs and after a clean end
        (OK from the broker)."""
        return self._error

    @property
    def features(self) -> FrozenSet[str]:
        """What the broker said it understands, in the stream's first
        message (``Heartbeat.features``, e.g. ``"deliveries"``); empty
        before that message and from a broker that predates the field."""
        return self._features

    @property
    def done(self) -> bool:
        return self._reader.done()

    async def opened(self) -> None:
        """Returns once the broker has registered the stream (its first
        message); raises :class:`leaseq.RpcError` if the stream failed
        first (UNIMPLEMENTED, UNAUTHENTICATED, INVALID_ARGUMENT...)."""
        await asyncio.shield(self._opened)

    def __aiter__(self) -> "AsyncIterator[Job]":
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Job]:
        while True:
            job = await self._jobs.get()
            if job is None:
                self._jobs.put_nowait(None)  # for any other iterator
                if self._error is not None and not self._closing:
                    raise self._error
                return
            yield job

    async def next_job(self) -> Optional[Job]:
        """The next delivery; None once the stream has ended cleanly. Raises
        the stream's error if it failed."""
        job = await self._jobs.get()
        if job is None:
            self._jobs.put_nowait(None)
            if self._error is not None and not self._closing:
                raise self._error
        return job

    def cancel(self) -> None:
        """Closes the stream at once; the broker releases its unsettled jobs."""
        self._closing = True
        self._call.cancel()
        self._reader.cancel()

    async def _wait_reader(self) -> None:
        try:
            await asyncio.shield(self._reader)
        except asyncio.CancelledError:
            if not self._reader.done():
                raise


class AsyncSubscription(_Stream):
    """A Subscribe stream (see :meth:`AsyncClient.subscribe`)."""

    async def close(self) -> None:
        self.cancel()
        await self._wait_reader()

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncConsumer(_Stream):
    """A Consume stream (see :meth:`AsyncClient.consume`): iterate it for
    deliveries; :meth:`ack`, :meth:`nack` and :meth:`extend` send settles on
    the stream (many per message when they pile up) and return the broker's
    answer, raising :class:`leaseq.RpcError` as the unary calls do
    (FAILED_PRECONDITION: the lease is lost). :meth:`close` half-closes:
    the broker settles what it was sent, releases the rest, and ends the
    stream."""

    # grpc.aio reports a write that gRPC core fails because the call has
    # already ended as INTERNAL "Internal error from Core", and that status
    # replaces the one the broker sent. A broker that ends the call before
    # reading the opening message (UNIMPLEMENTED from a broker without
    # Consume, UNAUTHENTICATED) races the opening write, so about one open in
    # ten would fail with INTERNAL instead. Such an open is tried again, up
    # to this many times; nothing was read or settled on it.
    _OPEN_ATTEMPTS = 5
    _CORE_WRITE_FAILED = "Internal error from Core"

    def __init__(
        self,
        open_call: Any,
        first: pb.ConsumeRequest,
        idle_timeout: Optional[float],
        on_cancel: Optional[CancelCallback] = None,
    ) -> None:
        # Settles waiting for their SettleResult, by (op, job id, lease
        # token): the broker answers two settles of one job in no set order
        # and echoes the token to tell them apart. A callback each, no
        # future: the Worker's settles cost a list entry.
        self._pending: Dict[Tuple[int, str, str], List[SettleCallback]] = {}
        # What the next write carries: acks as (job id, token), the rest as
        # (op, request message). Everything settled in one event-loop turn
        # (and while the previous write was in flight) goes in one request.
        self._acks: List[Tuple[str, str]] = []
        self._others: List[Tuple[int, Any]] = []
        # Progress reports, the latest per job (the broker keeps only that).
        self._progress: Dict[str, pb.Progress] = {}
        self._wake = asyncio.Event()
        self._half_closed = False
        self._credit: Optional[int] = None
        self._open_call = open_call
        self._opens = 1
        self._opening_sent = False
        #: Requests written after the opening one (each carries every settle
        #: that was waiting): the Worker's and the tests' count.
        self.writes = 0
        super().__init__(open_call(), idle_timeout, on_cancel)
        self._outbox_first = first
        self._writer = asyncio.ensure_future(self._write())

    def _reopen(self, error: grpc.RpcError) -> bool:
        if (
            self._opening_sent
            or self._opens >= self._OPEN_ATTEMPTS
            or error.code() != grpc.StatusCode.INTERNAL
            or error.details() != self._CORE_WRITE_FAILED
        ):
            return False
        log.debug("consume stream: the opening write failed as the call ended (status lost); opening again")
        self._opens += 1
        self._writer.cancel()
        self._call.cancel()
        self._call = self._open_call()
        self._writer = asyncio.ensure_future(self._write())
        return True

    def _next_request(self) -> Optional[pb.ConsumeRequest]:
        if not self._acks and not self._others and not self._progress and self._credit is None:
            return None
        req = pb.ConsumeRequest(max_in_flight=self._credit or 0)
        self._credit = None
        if self._acks:
            acks, self._acks = self._acks, []
            add = req.acks.add
            for job_id, token in acks:
                add(job_id=job_id, lease_token=token)
        if self._others:
            others, self._others = self._others, []
            for op, msg in others:
                if op == pb.SETTLE_OP_NACK:
                    req.nacks.append(msg)
                elif op == pb.SETTLE_OP_EXTEND:
                    req.extends.append(msg)
                else:
                    req.acks.append(msg)
        if self._progress:
            progress, self._progress = self._progress, {}
            req.progress.extend(progress.values())
        return req

    def _gather_limit(self) -> int:
        credit = self._credit or self._outbox_first.subscribe.max_in_flight
        return max(1, credit // 4) if credit else 64

    async def _gather(self) -> None:
        """Lets settles that keep coming, one event-loop turn after another
        (a broker that sends one delivery a message; handlers that finish
        one a turn), join the next write: waits a turn more while the last
        turn added some, up to a quarter of the stream's credit (the
        broker gives credit back as the acks arrive), until two turns
        in a row add none. A lone settle waits two turns."""
        limit = self._gather_limit()
        n = len(self._acks) + len(self._others)
        quiet = 0
        while 0 < n < limit and not self._half_closed:
            await asyncio.sleep(0)
            m = len(self._acks) + len(self._others)
            if m == n:
                quiet += 1
                if quiet == 2:
                    return
            else:
                quiet = 0
            n = m

    async def _write(self) -> None:
        try:
            await self._call.write(self._outbox_first)
            self._opening_sent = True
            while True:
                await self._wake.wait()
                await self._gather()
                self._wake.clear()
                req = self._next_request()
                if req is None:
                    if self._half_closed:
                        await self._call.done_writing()
                        return
                    continue
                self.writes += 1
                await self._call.write(req)
                if self._half_closed and not self._acks and not self._others:
                    await self._call.done_writing()
                    return
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            # The call ended: the reader records why; pending settles fail.
            log.debug("consume stream: write failed: %s", e)
        except asyncio.CancelledError:
            pass

    def _on_settled(self, settled: Any) -> None:
        pending = self._pending
        for r in settled.results:
            key = (r.op, r.job_id, r.lease_token)
            callbacks = pending.get(key)
            if callbacks is None:
                if r.lease_token:
                    continue
                # A broker from before the echo sends no token: the oldest
                # settle of that op and job.
                found = next((k for k in pending if k[0] == r.op and k[1] == r.job_id), None)
                if found is None:
                    continue
                key, callbacks = found, pending[found]
            callback = callbacks.pop(0)
            if not callbacks:
                del pending[key]
            callback(r, None)

    def _ended(self) -> None:
        self._writer_cancel()
        why = self._error or RpcError(grpc.StatusCode.UNAVAILABLE, "the stream ended")
        pending, self._pending = self._pending, {}
        self._acks, self._others, self._progress = [], [], {}
        for callbacks in pending.values():
            for callback in callbacks:
                callback(
                    None,
                    RpcError(
                        grpc.StatusCode.UNAVAILABLE,
                        f"the stream ended before the broker answered ({why.code_name}); "
                        "the settle may or may not have been applied",
                    ),
                )

    def _writer_cancel(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None and not writer.done() and not self._half_closed:
            writer.cancel()

    def _submit(self, op: int, job_id: str, lease_token: str, msg: Any, callback: SettleCallback) -> None:
        """Queues one settle for the next write; ``callback`` gets its
        result. ``msg`` is its request message (unused for an ack). Raises
        UNAVAILABLE when the stream has ended or is half-closed."""
        if self._half_closed or self._reader.done():
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "the stream is closed")
        key = (op, job_id, lease_token)
        callbacks = self._pending.get(key)
        if callbacks is None:
            self._pending[key] = [callback]
        else:
            callbacks.append(callback)
        if op == pb.SETTLE_OP_ACK and (msg is None or not (msg.enqueue or msg.result)):
            self._acks.append((job_id, lease_token))
        else:
            self._others.append((op, msg))
        self._wake.set()

    async def _send(self, op: int, msg: Any) -> SettleResult:
        fut: "asyncio.Future[SettleResult]" = self._loop.create_future()

        def answered(r: Optional[pb.SettleResult], error: Optional[RpcError]) -> None:
            if fut.done():
                return
            if r is None:
                assert error is not None
                fut.set_exception(error)
            else:
                fut.set_result(SettleResult.from_pb(r))

        self._submit(op, msg.job_id, msg.lease_token, msg, answered)
        return await fut

    async def settle(self, op: str, msg: Any) -> SettleResult:
        """Sends one settle (``op`` "ack", "nack" or "extend" with its request
        message) and returns the broker's result, failed or not."""
        return await self._send(_OP_CODES[op], msg)

    async def ack(self, job: Job, *, enqueue: Iterable[NewJob] = (), result: Optional[bytes] = None) -> List[str]:
        """Acks ``job``; with ``enqueue``, together with follow-up jobs
        (they exist if and only if the ack committed) whose ids it returns;
        with ``result``, the job's result (see :class:`leaseq.Ack`).
        Follow-ups raise UNIMPLEMENTED, with nothing sent, when the broker
        did not list ``"ack.enqueue"`` in :attr:`features` (an older broker
        would ack and drop them); a result likewise without
        ``"ack.result"``."""
        req = ack_request(job.id, job.lease_token, enqueue, result)
        if req.enqueue and ACK_ENQUEUE not in self.features:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, NO_ACK_ENQUEUE)
        if req.result and ACK_RESULT not in self.features:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, NO_ACK_RESULT)
        r = await self._send(pb.SETTLE_OP_ACK, req)
        if not r.ok:
            raise r.error()
        return list(r.enqueued)

    async def nack(
        self,
        job: Job,
        error: str = "",
        *,
        retry_after: Optional[Seconds] = None,
        dead_letter: bool = False,
    ) -> bool:
        req = nack_request(job.id, job.lease_token, error, retry_after, dead_letter)
        r = await self._send(pb.SETTLE_OP_NACK, req)
        if not r.ok:
            raise r.error()
        return bool(r.dead_lettered)

    async def extend(self, job: Job, lease: Seconds) -> dt.datetime:
        r = await self._send(pb.SETTLE_OP_EXTEND, extend_request(job.id, job.lease_token, lease))
        if not r.ok:
            raise r.error()
        assert r.lease_expires_at is not None
        return r.lease_expires_at

    def progress(self, job: Job, fraction: float, message: str = "") -> None:
        """Reports how far ``job`` is with the stream's next write, replacing
        a report of it not yet written (the broker keeps the latest and
        writes a stream's at most once a second). ``ValueError`` naming the
        field for a fraction outside 0 to 1 or a message over 256 bytes;
        UNIMPLEMENTED when the broker did not list ``"progress"`` in
        :attr:`features`; UNAVAILABLE when the stream is closed. Refusals
        (a lost lease) are not reported back."""
        check_progress(fraction, message)
        if PROGRESS not in self.features:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, NO_PROGRESS)
        if self._half_closed or self._reader.done():
            raise RpcError(grpc.StatusCode.UNAVAILABLE, "the stream is closed")
        self._progress[job.id] = pb.Progress(
            job_id=job.id, lease_token=job.lease_token, fraction=fraction, message=message
        )
        self._wake.set()

    def set_max_in_flight(self, credit: int) -> None:
        """Changes the stream's credit (1 to 10000) with the next message."""
        if not 1 <= credit <= 10000:
            raise ValueError("max_in_flight: must be 1 to 10000")
        self._credit = credit
        self._wake.set()

    async def close(self, timeout: Optional[float] = 10.0) -> None:
        """Half-closes: every settle already sent is applied, the stream's
        unsettled jobs are released, and the broker ends the stream. Waits up
        to ``timeout`` for that end, then cancels the call."""
        self._closing = True
        if not self.done and not self._half_closed:
            self._half_closed = True
            self._wake.set()
        try:
            await asyncio.wait_for(self._wait_reader(), timeout)
        except asyncio.TimeoutError:
            log.warning("consume stream: no end from the broker %ss after the half-close; cancelling", timeout)
        finally:
            self._call.cancel()
            self._reader.cancel()
            self._writer.cancel()

    async def __aenter__(self) -> "AsyncConsumer":
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], *exc: object) -> None:
        if exc_type is None:
            await self.close()
        else:
            self.cancel()
            self._writer.cancel()


_OP_CODES = {"ack": pb.SETTLE_OP_ACK, "nack": pb.SETTLE_OP_NACK, "extend": pb.SETTLE_OP_EXTEND}
