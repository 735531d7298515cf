"""The Worker: handlers per queue, credit (``max_in_flight``) and handlers
at once (``concurrency``, at most the credit), per-job timeout,
leases kept while handlers run, outcomes from exceptions, settles on the
Consume stream (or Subscribe + batched AckBatch on a broker without it),
reconnect with backoff, graceful stop on SIGTERM.

Everything runs on one asyncio event loop. The per-job path is lean (issue
36): the stream's reader hands each message's deliveries to the worker as
one list; ``concurrency`` runner tasks, made once, take them from a deque
and await ``async def`` handlers directly (no task, future or timer per
job; a runner is woken only when the others are busy); settles go into the
stream's next write (one write carries every settle of an event-loop turn)
and their results come back to a callback, no future. One timer keeps the
leases of all jobs held, running or waiting for a runner. Plain (non-async)
handlers run on the worker's ``concurrency`` threads: a job a queue item,
and the finished ones handed back to the loop in batches (one wake-up of
the loop for all that finished meanwhile).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import queue
import random
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    FrozenSet,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    TypeVar,
    Union,
    overload,
)

import grpc

from leaseq import _tracing
from leaseq._connection import TLS, Connection
from leaseq._types import (
    ACK_ENQUEUE,
    ACK_RESULT,
    NO_PROGRESS,
    PROGRESS,
    Ack,
    Cancelled,
    DeadLetter,
    Job,
    Retry,
    RpcError,
    Seconds,
    _has_header,
    _status_of,
    ack_request,
    extend_request,
    nack_request,
    seconds,
)
from leaseq.aio import AsyncClient, AsyncConsumer, AsyncSubscription, _Stream
from leaseq.client import Client
from leaseq.v1 import queue_pb2 as pb

if TYPE_CHECKING:
    from leaseq.task import P, Task, TaskHandler

log = logging.getLogger("leaseq.worker")

#: What a handler may be: ``async def f(job)`` (runs on the worker's loop) or
#: ``def f(job)`` (runs in the worker's thread pool). Raising decides the
#: outcome (see :class:`Worker`); returning a :class:`leaseq.Ack` acks with
#: follow-up jobs or says the job was settled in SQL; any other return value
#: is a plain ack.
Handler = Callable[[Job], Any]
H = TypeVar("H", bound=Callable[[Job], Any])

#: What a middleware may be: ``async def m(job, next)`` around ``async def``
#: handlers, ``def m(job, next)`` around plain ones. ``next(job)`` runs the
#: rest of the chain (the handler last); what it raises decides the outcome
#: as a handler's exception does, so a middleware that re-raises keeps it,
#: and what it returns (a :class:`leaseq.Ack`) must be returned to keep it.
Middleware = Callable[[Job, Callable[[Job], Any]], Any]
M = TypeVar("M", bound=Middleware)

#: Stream failures that retrying cannot fix: bad input or configuration.
#: Anything else (UNAVAILABLE from a drain or an unreachable database, a
#: refused connection, a reset stream) is retried with backoff.
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)

# Settling is retried this many times on UNAVAILABLE; after that the lease
# runs out and the job is redelivered (at-least-once).
_SETTLE_TRIES = 5

# How long a chunk of a plain handler's jobs handed to one thread should
# take, by the handler's average: below it, waking another thread costs
# more than running the jobs one after the other.
_CHUNK_TIME = 2e-4


def _no_result(n: int) -> str:
    return (
        'ack.result: the broker did not list "ack.result" in its first heartbeat (it predates '
        f"results), so the ack and its {n}-byte result could not be sent together; nacked instead"
    )


def _no_follow_ups(n: int) -> str:
    return (
        'ack.enqueue: the broker did not list "ack.enqueue" in its first heartbeat (it predates '
        f"follow-up jobs), so the ack and its {n} follow-up job(s) could not be sent together; nacked instead"
    )


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _wrap(m: Middleware, inner: Handler) -> Handler:
    # The middleware's own call is the one frame added per job: for an async
    # one, its coroutine is what the runner awaits (no task, no future).
    def call(job: Job) -> Any:
        return m(job, inner)

    return call


class Backoff:
    """Exponential backoff with jitter: each delay is drawn from [d/2, d),
    with d doubling from ``initial`` up to ``maximum``."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial, self._maximum = initial, maximum
        self._next = initial

    def reset(self) -> None:
        self._next = self._initial

    def delay(self) -> float:
        d = self._next
        self._next = min(self._maximum, d * 2)
        return random.uniform(d / 2, d)


@dataclass
class WorkerStats:
    """Counters of one Worker (since it was made)."""

    delivered: int = 0
    acked: int = 0
    #: Every nack: handler errors, Retry, DeadLetter, timeouts.
    nacked: int = 0
    dead_lettered: int = 0
    timed_out: int = 0
    #: Settles the broker refused with FAILED_PRECONDITION (lease lost).
    lease_lost: int = 0
    #: Jobs the broker cancelled (``CancelJob``) while this worker held
    #: them: their handlers were stopped (or never started); not settled.
    cancelled: int = 0
    #: Settles (acks and nacks) sent on a Consume stream...
    settled_on_stream: int = 0
    #: ... in AckBatch calls (Subscribe fallback) ...
    settled_batched: int = 0
    #: ... and with unary calls (nacks in the fallback; settles of jobs whose
    #: stream had ended).
    settled_unary: int = 0
    #: Follow-up jobs (``Ack([...])``) enqueued with their jobs' acks.
    follow_ups: int = 0
    #: Jobs nacked instead of acked with follow-ups: the broker did not list
    #: "ack.enqueue" (or the handler also said ``Ack.settled_in_sql()``).
    follow_ups_refused: int = 0
    #: Jobs nacked instead of acked with a result: the broker did not list
    #: "ack.result".
    results_refused: int = 0
    #: Progress reports (``job.progress``) sent by ReportProgress (Subscribe)
    #: that failed (the lease lost, the broker unreachable): logged at
    #: DEBUG. (On a Consume stream the broker's refusals are not counted.)
    progress_failed: int = 0
    #: Jobs their handlers settled in SQL (``Ack.settled_in_sql()``):
    #: nothing sent.
    settled_in_sql: int = 0
    #: Streams opened after the first.
    reconnects: int = 0
    #: Messages written on Consume streams after their opening one: each
    #: carries every settle made while the one before was being written.
    stream_writes: int = 0


@dataclass
class _Entry:
    #: What the worker calls: the handler inside the middleware (made when
    #: the worker starts; the handler itself when there is none).
    fn: Handler
    is_async: bool
    timeout: Optional[float]
    #: The handler as registered.
    handler: Handler
    #: A plain handler's average run time (seconds, moving average): how
    #: many of its jobs one thread is handed at a time.
    avg: float = 1e-3


@dataclass
class _Outcome:
    #: "ack", "nack", "retry", "dead_letter", "timeout", or "sql" (settled
    #: in SQL by the handler: nothing to send).
    kind: str
    error: str = ""
    retry_after: Optional[Seconds] = None
    #: An ack with follow-up jobs: its request (None: a plain ack).
    ack: Optional[pb.AckRequest] = None
    #: "sql": follow-ups asked for beside it (not enqueued).
    follow_ups: int = 0

    @property
    def dead_letter(self) -> bool:
        return self.kind == "dead_letter"


_ACK = _Outcome("ack")


def _ack_of(job: Job, result: Any) -> _Outcome:
    """The outcome of a handler that returned ``result``."""
    if not isinstance(result, Ack):
        return _ACK
    if result.in_sql:
        return _Outcome("sql", follow_ups=len(result.enqueue))
    if not result.enqueue and not result.result:
        return _ACK
    try:
        return _Outcome("ack", ack=ack_request(job.id, job.lease_token, result.enqueue, result.result))
    except Exception as e:  # a follow-up the request cannot hold
        return _Outcome("nack", f"follow-ups: {e}")
_OK = 0
_FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]


class _AckBatcher:
    """Acks collected for up to ``delay`` seconds (or ``size`` of them) and
    sent in one AckBatch call; each caller gets its own entry's result."""

    def __init__(self, client: AsyncClient, size: int, delay: float) -> None:
        self._client, self._size, self._delay = client, size, delay
        self._queued: List[Tuple[Job, "asyncio.Future[None]"]] = []
        self._timer: Optional[asyncio.TimerHandle] = None
        self._flushes: Set["asyncio.Task[None]"] = set()

    async def ack(self, job: Job) -> None:
        fut: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._queued.append((job, fut))
        if len(self._queued) >= self._size:
            self._flush_now()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._flush_now)
        await fut

    def _flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._queued = self._queued, []
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)

    async def _send(self, batch: List[Tuple[Job, "asyncio.Future[None]"]]) -> None:
        try:
            results = await self._client.ack_batch([job for job, _ in batch])
        except RpcError as e:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), r in zip(batch, results):
            if fut.done():
                continue
            if r.ok:
                fut.set_result(None)
            else:
                fut.set_exception(RpcError(getattr(grpc.StatusCode, r.code, grpc.StatusCode.UNKNOWN), r.message))

    async def drain(self) -> None:
        """Sends what is queued and waits for every call in flight."""
        self._flush_now()
        if self._flushes:
            await asyncio.wait(set(self._flushes))


class _Run:
    """One delivery inside the worker: the job, the session it came on, and
    what the worker knows of it. Also the callback of its settle's result
    (``run(result, error)``), so a settle costs no closure or future."""

    __slots__ = ("worker", "job", "session", "entry", "extend_at", "timer", "stop", "outcome", "runner", "started")

    def __init__(self, worker: "Worker", job: Job, session: "_Session", entry: Optional[_Entry], extend_at: float):
        self.worker = worker
        self.job = job
        # job.progress() reaches the worker through its session (not its
        # run: a job -> run -> job cycle would leave every job to the GC).
        job.__dict__["_progress_to"] = session
        self.session = session
        self.entry = entry
        #: When the lease keeper extends the lease next (loop time).
        self.extend_at = extend_at
        #: The handler's timeout, when it has one.
        self.timer: Optional[asyncio.TimerHandle] = None
        #: Why the worker gave up on the handler: "timeout" (nacked),
        #: "abandon" (stop grace, second signal: not settled; released with
        #: the stream) or "cancel" (the broker cancelled the job: not
        #: settled, it is gone). None while it is the handler that decides.
        self.stop: Optional[str] = None
        self.outcome: _Outcome = _ACK
        #: The runner task awaiting an async handler (to cancel it).
        self.runner: "Optional[asyncio.Task[None]]" = None
        #: When a plain handler's thread started it (``time.monotonic()``);
        #: None while it waits for a thread (its timeout counts from here).
        self.started: Optional[float] = None

    def __call__(self, result: Optional[pb.SettleResult], error: Optional[RpcError]) -> None:
        self.worker._answered(self, result, error)


class _Session:
    """One stream and how settles of its jobs are sent."""

    transport = ""

    def __init__(self, worker: "Worker", unary: AsyncClient, stream: _Stream) -> None:
        self._w, self._unary = worker, unary
        self.stream = stream
        #: Set when the stream ended (its unstarted deliveries were released).
        self.ended = False

    @property
    def alive(self) -> bool:
        return not self.stream.done

    async def close(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        self.stream.cancel()

    def report_progress(self, job: Job, fraction: float, message: str) -> None:
        """``job.progress()``: from the handler, on the loop or a thread."""
        if PROGRESS not in self.stream.features:
            raise RpcError(grpc.StatusCode.UNIMPLEMENTED, NO_PROGRESS)
        loop = self._w._loop
        if loop is None:
            return  # the worker has stopped
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._w._progress(self, job, fraction, message)
        else:
            loop.call_soon_threadsafe(self._w._progress, self, job, fraction, message)

    # Settles without waiting: the fast path where there is one, else a task
    # that awaits the slow one below.
    def settle(self, run: _Run, outcome: _Outcome) -> None:
        self._w._settle_later(self, run, outcome, _SETTLE_TRIES, 0.0)

    def extend(self, run: _Run, lease: float) -> None:
        self._w._spawn(self._extend_unary(run, lease))

    async def _extend_unary(self, run: _Run, lease: float) -> None:
        try:
            await self.extend_async(run.job, lease)
        except RpcError as e:
            self._w._extend_failed(run, e)

    async def ack(self, job: Job, req: Optional[pb.AckRequest] = None) -> List[str]:
        """Acks ``job`` (``req``: with its follow-ups); their ids."""
        self._w.stats.settled_unary += 1
        if req is None:
            await self._unary.ack(job.id, job.lease_token)
            return []
        resp = await self._unary._unary(self._unary._stub.Ack, req)
        return list(resp.enqueued)

    async def nack(self, job: Job, o: _Outcome) -> bool:
        self._w.stats.settled_unary += 1
        return await self._unary.nack(
            job.id, job.lease_token, o.error, retry_after=o.retry_after, dead_letter=o.dead_letter
        )

    async def extend_async(self, job: Job, lease: float) -> None:
        await self._unary.extend_lease(job.id, job.lease_token, lease)


class _ConsumeSession(_Session):
    transport = "consume"

    def __init__(self, worker: "Worker", unary: AsyncClient, stream: AsyncConsumer) -> None:
        super().__init__(worker, unary, stream)
        self._consumer = stream

    async def close(self) -> None:
        await self._consumer.close(timeout=10.0)

    def settle(self, run: _Run, outcome: _Outcome) -> None:
        stream = self._consumer
        if not stream.done:
            job = run.job
            try:
                if outcome.kind == "ack":
                    stream._submit(pb.SETTLE_OP_ACK, job.id, job.lease_token, outcome.ack, run)
                else:
                    msg = nack_request(job.id, job.lease_token, outcome.error, outcome.retry_after, outcome.dead_letter)
                    stream._submit(pb.SETTLE_OP_NACK, job.id, job.lease_token, msg, run)
            except RpcError:
                pass  # half-closed or ended just now: the slow path
            else:
                self._w.stats.settled_on_stream += 1
                return
        super().settle(run, outcome)

    def extend(self, run: _Run, lease: float) -> None:
        stream = self._consumer
        if stream.done:
            return super().extend(run, lease)
        job, w = run.job, self._w

        def answered(r: Optional[pb.SettleResult], error: Optional[RpcError]) -> None:
            if r is not None:
                if r.code == _OK:
                    return
                error = RpcError(_status_of(r.code), r.message)
            assert error is not None
            w._extend_failed(run, error)

        try:
            stream._submit(
                pb.SETTLE_OP_EXTEND, job.id, job.lease_token, extend_request(job.id, job.lease_token, lease), answered
            )
        except RpcError:
            super().extend(run, lease)

    # The slow path's settles (retries): on the stream while it runs. A job
    # whose stream has ended was released by the broker; its settle goes by
    # a unary call and fails quietly with FAILED_PRECONDITION.
    async def ack(self, job: Job, req: Optional[pb.AckRequest] = None) -> List[str]:
        if not self.alive:
            return await super().ack(job, req)
        self._w.stats.settled_on_stream += 1
        r = await self._consumer._send(pb.SETTLE_OP_ACK, req or pb.AckRequest(job_id=job.id, lease_token=job.lease_token))
        if not r.ok:
            raise r.error()
        return list(r.enqueued)

    async def nack(self, job: Job, o: _Outcome) -> bool:
        if not self.alive:
            return await super().nack(job, o)
        self._w.stats.settled_on_stream += 1
        return await self._consumer.nack(job, o.error, retry_after=o.retry_after, dead_letter=o.dead_letter)

    async def extend_async(self, job: Job, lease: float) -> None:
        if not self.alive:
            return await super().extend_async(job, lease)
        await self._consumer.extend(job, lease)


class _SubscribeSession(_Session):
    transport = "subscribe"

    def __init__(
        self, worker: "Worker", unary: AsyncClient, stream: AsyncSubscription, batcher: _AckBatcher
    ) -> None:
        super().__init__(worker, unary, stream)
        self._subscription, self._batcher = stream, batcher

    async def close(self) -> None:
        # Acks first: closing a Subscribe stream releases what is unsettled.
        await self._w._settles_done()
        await self._batcher.drain()
        await self._subscription.close()

    async def ack(self, job: Job, req: Optional[pb.AckRequest] = None) -> List[str]:
        if req is not None:
            # AckBatch refuses follow-ups (its results have no place for
            # their ids): a unary Ack.
            return await super().ack(job, req)
        self._w.stats.settled_batched += 1
        await self._batcher.ack(job)
        return []


class _Threads:
    """The worker's own threads for plain handlers: up to ``size``, started
    as jobs come, each taking a chunk of jobs at a time from one queue (a
    ``SimpleQueue``: one C call to hand a chunk over)."""

    def __init__(self, size: int, work: Callable[[List[_Run]], None]) -> None:
        self._size, self._work = size, work
        self._queue: "queue.SimpleQueue[Optional[List[_Run]]]" = queue.SimpleQueue()
        self._threads: List[threading.Thread] = []

    def submit(self, runs: List[_Run]) -> None:
        self._queue.put(runs)
        # Another thread when none was free to take it (its job still waits).
        if len(self._threads) < self._size and self._queue.qsize() > 0:
            t = threading.Thread(target=self._main, name=f"leaseq-handler-{len(self._threads)}")
            self._threads.append(t)
            t.start()

    def _main(self) -> None:
        get, work = self._queue.get, self._work
        while True:
            runs = get()
            if runs is None:
                return
            work(runs)

    def shutdown(self) -> None:
        """Each thread ends once its current handler returns."""
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []


class Worker:
    """Runs a handler for every job delivered from its queues.

    ``target``: an address (as :class:`leaseq.Client`) with ``token``,
    ``tls`` and ``options``, or a ``Client``/``AsyncClient`` whose
    connection settings it reuses (it opens its own channel).

    Register handlers with ``@worker.handler("emails")`` or
    :meth:`add_handler`; ``Worker(target, ["emails"], fn)`` registers ``fn``
    for each queue listed. Then ``worker.run()`` (blocking) or
    ``await worker.run_async()``; both stop gracefully on ``stop()`` or
    SIGTERM/SIGINT.

    - **Outcomes**: a handler that returns acks the job; returning a
      :class:`leaseq.Ack` acks it with follow-up jobs (``Ack([...])``,
      enqueued in the ack's transaction; the job is nacked instead by a
      broker without "ack.enqueue") or sends nothing for a job the handler
      settled in SQL (``Ack.settled_in_sql()``). Raising
      :class:`leaseq.Retry` nacks it with ``retry_after``; raising
      :class:`leaseq.DeadLetter` dead-letters it; any other exception nacks it
      with ``str(exception)`` as the error (the job's next ``last_error``),
      and the queue's backoff decides the retry.
    - **Tasks and middleware**: ``@worker.task(task)`` registers a handler
      of typed payloads (:class:`leaseq.Task`); ``worker.use(m)`` or
      ``middleware=[...]`` wraps every handler (:meth:`use`).
    - **Credit and concurrency**: ``max_in_flight`` is the stream's credit
      (the prefetch): the broker never has more than that many of this
      worker's jobs delivered and unsettled, those waiting for a handler
      included. ``concurrency`` (default: ``max_in_flight``; from 1 to
      ``max_in_flight``) is how many handlers run at once. A credit above
      the concurrency keeps jobs waiting in the worker, so a handler that
      finishes takes the next one at once instead of waiting for its ack to
      reach the broker and a delivery to come back (RabbitMQ's prefetch
      against a consumer's threads). ``async def`` handlers run on
      ``concurrency`` runner tasks made when the worker starts (a handler is
      awaited by its runner, so handlers of one runner share its
      ``contextvars`` context); plain ones on up to ``concurrency`` threads
      of the worker's (with ``executor``, its own workers bound them
      instead). A worker with handlers of both kinds runs up to
      ``concurrency`` of each (and never more than ``max_in_flight``).
    - **Cancel**: when the broker says a job this worker holds was
      cancelled (``AdminService.CancelJob``; brokers whose first heartbeat
      lists ``"cancel"``), an async handler is cancelled (``CancelledError``
      at its next ``await``), a plain one has its job's ``cancelled`` event
      set (and what it returns is ignored; its thread keeps the slot until
      it returns), and a job whose handler has not started is dropped.
      Nothing is settled: the job is gone. Counted in ``stats.cancelled``,
      logged at INFO.
    - **Timeout** (``timeout``, or per handler), counted from the
      handler's start (not from the delivery): an async handler is
      cancelled; a plain one cannot be (it runs in a thread): its job's
      ``cancelled`` event is set, its result is ignored, and its thread keeps
      the slot until it returns. Either way the job is nacked with a
      ``timeout`` error at once.
    - **Leases**: the stream asks for ``lease``; every delivery's lease is
      extended by ``lease`` about every ``lease / 2`` (one timer for all
      jobs held, ticking every ``lease / 8``) while its handler runs or it
      waits for one.
    - **Settles** go on the Consume stream, all those made in one event-loop
      turn in one message; on a broker that answers UNIMPLEMENTED to
      Consume (or with ``stream_acks=False``) the worker uses Subscribe,
      acks in batched AckBatch calls (``ack_batch_size``,
      ``ack_batch_delay``) and unary Nack/ExtendLease. A settle refused with
      FAILED_PRECONDITION (the lease was lost: expired, taken over, job
      cancelled) is logged at debug level and counted in ``stats``.
    - **Deliveries**: the worker asks the broker for several deliveries per
      message (``batched``; a broker that predates it sends one a message,
      and the worker reads both).
    - **Reconnect**: a failed or ended stream is reopened after exponential
      backoff with jitter (``backoff_initial`` to ``backoff_max`` seconds).
      Statuses in :data:`FATAL_CODES` end ``run()`` with
      :class:`leaseq.RpcError` instead. A stream with no message for
      ``idle_timeout`` seconds (it must exceed the broker's heartbeat
      interval) is taken for dead and reopened.
    - **Stop**: take no new jobs, and start none of those waiting for a
      handler; running handlers get ``grace`` seconds to finish and settle,
      the rest are cancelled; then the stream is half-closed (the broker
      releases what was not settled, the waiting jobs with it). A second signal
      cancels the handlers at once.
    - **Tracing**: with OpenTelemetry installed, each handler runs in a
      CONSUMER span, the child of the job's ``traceparent``; when no tracer
      provider records spans (none set), only jobs with a ``traceparent``
      get one (it carries their context on).
    """

    def __init__(
        self,
        target: Union[str, Client, AsyncClient, Connection, None] = None,
        queues: Optional[Sequence[str]] = None,
        handler: Optional[Handler] = None,
        *,
        token: Optional[str] = None,
        tls: Union[TLS, bool, None] = None,
        options: Sequence[Tuple[str, Any]] = (),
        max_in_flight: int = 16,
        concurrency: Optional[int] = None,
        lease: Seconds = 30.0,
        timeout: Optional[Seconds] = None,
        consumer: str = "",
        grace: Seconds = 30.0,
        backoff_initial: Seconds = 0.1,
        backoff_max: Seconds = 10.0,
        idle_timeout: Optional[Seconds] = 60.0,
        stream_acks: bool = True,
        ack_batch_size: int = 500,
        ack_batch_delay: Seconds = 0.005,
        executor: Optional[Executor] = None,
        batched: bool = True,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        if isinstance(target, (Client, AsyncClient)):
            self._conn = target.connection
        elif isinstance(target, Connection):
            self._conn = target
        else:
            self._conn = Connection(target, token=token, tls=tls, options=options)
        if max_in_flight < 1:
            raise ValueError("max_in_flight: must be at least 1")
        if concurrency is None:
            concurrency = max_in_flight
        elif concurrency < 1:
            raise ValueError("concurrency: must be at least 1")
        elif concurrency > max_in_flight:
            raise ValueError(
                f"concurrency: must be at most max_in_flight ({max_in_flight}): "
                "handlers run only on jobs delivered, and the credit bounds those"
            )
        self._max_in_flight = max_in_flight
        self._concurrency = concurrency
        self._lease = seconds(lease)
        self._timeout = None if timeout is None else seconds(timeout)
        self._consumer = consumer
        self._grace = seconds(grace)
        self._backoff = Backoff(seconds(backoff_initial), seconds(backoff_max))
        self._idle_timeout = None if idle_timeout is None else seconds(idle_timeout)
        self._use_consume = stream_acks
        self._ack_batch_size = ack_batch_size
        self._ack_batch_delay = seconds(ack_batch_delay)
        self._executor = executor
        self._batched = batched
        self._handlers: Dict[str, _Entry] = {}
        self._middleware: List[Middleware] = []
        for m in middleware:
            self.use(m)
        self.stats = WorkerStats()
        self._transport: Optional[str] = None
        self._features: FrozenSet[str] = frozenset()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._stop_requested = False
        # The per-job machinery (run_async sets it up).
        self._ready: Deque[_Run] = deque()
        self._idle: "Deque[asyncio.Future[None]]" = deque()
        self._runners: "List[asyncio.Task[None]]" = []
        self._kick_armed = False
        self._burst = 1
        self._running: Set[_Run] = set()
        # ReportProgress (Subscribe), by (job id, lease token): the report
        # waiting while one is in flight (None: none waits).
        self._progress_next: Dict[Tuple[str, str], Optional[Tuple[float, str]]] = {}
        self._busy = 0
        self._quiet: "Optional[asyncio.Future[None]]" = None
        self._tasks: "Set[asyncio.Task[Any]]" = set()
        self._traced = False
        self._threads: Optional[_Threads] = None
        self._done_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._done: List[_Run] = []
        self._ticker: Optional[asyncio.TimerHandle] = None
        self._burst_mode = False
        #: Loop time of the last delivery (or of the stream's opening); None
        #: before a stream is open.
        self._last_delivery: Optional[float] = None
        if handler is not None:
            for q in queues or ():
                self.add_handler(q, handler)
        elif queues:
            raise ValueError("queues given without a handler")

    # --- registration

    def handler(self, queue: str, *, timeout: Optional[Seconds] = None) -> Callable[[H], H]:
        """Decorator: ``@worker.handler("emails", timeout=30)``."""

        def register(fn: H) -> H:
            self.add_handler(queue, fn, timeout=timeout)
            return fn

        return register

    def add_handler(self, queue: str, fn: Handler, *, timeout: Optional[Seconds] = None) -> None:
        """Runs ``fn(job)`` for jobs of ``queue``; ``timeout`` overrides the
        worker's."""
        if queue in self._handlers:
            raise ValueError(f"a handler for queue {queue!r} is already registered")
        is_async = _is_async(fn)
        t = timeout if timeout is not None else self._timeout
        self._handlers[queue] = _Entry(fn, is_async, None if t is None else seconds(t), fn)

    @overload
    def task(self, task: "Task[P]", *, timeout: Optional[Seconds] = None) -> "Callable[[TaskHandler[P]], Task[P]]": ...

    @overload
    def task(
        self, task: str, payload_type: "Type[P]", *, timeout: Optional[Seconds] = None
    ) -> "Callable[[TaskHandler[P]], Task[P]]": ...

    def task(
        self, task: "Union[Task[P], str]", payload_type: "Optional[Type[P]]" = None, *, timeout: Optional[Seconds] = None
    ) -> "Callable[[TaskHandler[P]], Task[P]]":
        """Decorator: a handler of typed payloads, and the producer bound to
        it. ``@worker.task("emails", Email)`` (or ``@worker.task(task)`` for
        a :class:`leaseq.Task` declared elsewhere) registers the function
        for the task's queue and returns the :class:`leaseq.Task`, whose
        ``enqueue(client, Email(...))`` sends one. The function takes the
        payload read into the type (``payload_type(**json)`` for a
        dataclass, ``model_validate`` for a pydantic model), and the
        :class:`leaseq.Job` too if it takes two arguments. A payload that
        does not decode never will: its job is dead-lettered with
        ``payload is not a valid <type>: <why>``."""
        from leaseq.task import Task

        if isinstance(task, str):
            if payload_type is None:
                raise TypeError("task: a payload type is needed with a queue name, e.g. worker.task('emails', Email)")
            t: Task[P] = Task(task, payload_type)
        else:
            if payload_type is not None:
                raise TypeError("task: the payload type is the Task's; give one or the other")
            t = task

        def register(fn: "TaskHandler[P]") -> "Task[P]":
            self.add_handler(t.queue, t._handler_for(fn), timeout=timeout)
            t.handler = fn
            return t

        return register

    def use(self, middleware: M) -> M:
        """Runs every job through ``middleware`` (also a decorator):
        logging, metrics, an error policy. It gets the job and ``next``, the
        rest of the chain; the first one added is the outermost. An ``async
        def`` middleware wraps ``async def`` handlers (``await next(job)``),
        a plain one plain handlers (``next(job)``, on the handler's thread);
        :meth:`run` refuses a worker whose middleware and handlers are of
        different kinds. What the chain raises decides the outcome as a
        handler's exception does: a middleware that catches and re-raises
        keeps it (a :class:`leaseq.Retry` stays a retry); one that returns
        acks the job."""
        self._middleware.append(middleware)
        return middleware

    def _compose(self) -> None:
        """Puts each handler inside the middleware (outermost first)."""
        for queue, entry in self._handlers.items():
            fn = entry.handler
            for m in reversed(self._middleware):
                m_async = _is_async(m)
                if m_async != entry.is_async:
                    kind = ("plain (def)", "async (async def)")
                    raise ValueError(
                        f"middleware {getattr(m, '__qualname__', m)!r} is {kind[m_async]} but the handler of "
                        f"queue {queue!r} is {kind[entry.is_async]}: a middleware wraps handlers of its own kind"
                    )
                fn = _wrap(m, fn)
            entry.fn = fn

    @property
    def queues(self) -> List[str]:
        return list(self._handlers)

    @property
    def transport(self) -> Optional[str]:
        """``"consume"`` (settles on the stream) or ``"subscribe"`` (the
        fallback) once a stream was opened; None before."""
        return self._transport

    @property
    def features(self) -> FrozenSet[str]:
        """What the broker of the last stream opened said it understands
        (``Heartbeat.features``); empty from a broker that predates it."""
        return self._features

    # --- running

    def run(self, *, handle_signals: bool = True, burst: bool = False) -> None:
        """Works until :meth:`stop` (or SIGTERM/SIGINT when
        ``handle_signals`` and on the main thread); returns after a graceful
        stop. Runs its own event loop: call it from plain (non-async) code.

        ``burst``: work what is waiting, then stop: once the stream is open,
        no job has been delivered for :attr:`BURST_IDLE` seconds and no
        handler runs (jobs scheduled for later are not waited for)."""
        asyncio.run(self.run_async(handle_signals=handle_signals, burst=burst))

    def stop(self) -> None:
        """Asks the worker to finish gracefully. Safe from any thread, from a
        signal handler, and more than once."""
        self._stop_requested = True
        loop, stopping = self._loop, self._stopping
        if loop is None or stopping is None:
            return
        try:
            if asyncio.get_running_loop() is loop:
                stopping.set()
                return
        except RuntimeError:
            pass
        try:
            loop.call_soon_threadsafe(stopping.set)
        except RuntimeError:  # the loop has closed: nothing to stop
            pass

    #: Burst mode's quiet time (seconds): see :meth:`run`.
    BURST_IDLE = 0.5

    async def run_async(self, *, handle_signals: bool = True, burst: bool = False) -> None:
        """:meth:`run` for code already on an event loop."""
        if not self._handlers:
            raise ValueError("no handlers: register one with @worker.handler(queue)")
        self._compose()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        self._ready, self._idle, self._running, self._busy = deque(), deque(), set(), 0
        if any(e.is_async for e in self._handlers.values()):
            self._runners = [asyncio.ensure_future(self._runner()) for _ in range(self._concurrency)]
        if self._executor is None and not all(e.is_async for e in self._handlers.values()):
            self._threads = _Threads(self._concurrency, self._in_thread)
        self._burst_mode, self._last_delivery = burst, None
        self._ticker = loop.call_later(min(self._lease / 8, self.BURST_IDLE / 4) if burst else self._lease / 8, self._tick)
        client = AsyncClient.from_connection(self._conn)
        batcher = _AckBatcher(client, self._ack_batch_size, self._ack_batch_delay)
        restore = self._install_signals() if handle_signals else (lambda: None)
        first = True
        try:
            while not self._stopping.is_set():
                if not first:
                    self.stats.reconnects += 1
                first = False
                session = await self._open(client, batcher)
                if session is not None:
                    await self._serve(session)
                if not self._stopping.is_set():
                    await self._pause(self._backoff.delay())
        except asyncio.CancelledError:
            # run itself cancelled: no grace, the handlers go too.
            self._abandon_all()
            raise
        finally:
            try:
                await self._finish_jobs()
                await self._settles_done()
                await batcher.drain()
            finally:
                restore()
                for runner in self._runners:
                    runner.cancel()
                self._runners = []
                if self._ticker is not None:
                    self._ticker.cancel()
                    self._ticker = None
                await client.close()
                if self._threads is not None:
                    self._threads.shutdown()
                    self._threads = None
                self._loop = None
                self._stop_requested = False  # run() may be called again

    def _install_signals(self) -> Callable[[], None]:
        loop = self._loop
        if loop is None or threading.current_thread() is not threading.main_thread():
            return lambda: None
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            prev = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed.append((sig, prev))

        def restore() -> None:
            for sig, prev in installed:
                loop.remove_signal_handler(sig)
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)

        return restore

    def _on_signal(self, sig: int) -> None:
        if self._stopping is not None and self._stopping.is_set():
            log.warning("%s again: cancelling the running handlers", signal.Signals(sig).name)
            self._abandon_all()
            return
        log.info("%s: stopping (grace %ss)", signal.Signals(sig).name, self._grace)
        self.stop()

    async def _until_stopped(self, aw: Awaitable[Any]) -> bool:
        """Awaits ``aw`` unless stop() comes first; True if it completed."""
        assert self._stopping is not None
        task = asyncio.ensure_future(aw)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            return False
        task.result()
        return True

    async def _open(self, client: AsyncClient, batcher: _AckBatcher) -> Optional[_Session]:
        opts: Dict[str, Any] = dict(
            consumer=self._consumer,
            max_in_flight=self._max_in_flight,
            lease=self._lease,
            idle_timeout=self._idle_timeout,
            batched=self._batched,
        )
        queues = list(self._handlers)
        if self._use_consume:
            stream = client.consume(queues, **opts)
            session: _Session = _ConsumeSession(self, client, stream)
            # Before the first await: the reader has not run yet.
            stream._sink = self._sink_for(session)
            stream._on_cancel = self._cancelled
            try:
                if not await self._until_stopped(stream.opened()):
                    stream.cancel()
                    return None
                self._backoff.reset()
                self._transport = "consume"
                self._features = stream.features
                return session
            except RpcError as e:
                stream.cancel()
                if e.status != grpc.StatusCode.UNIMPLEMENTED:
                    self._open_failed(e)
                    return None
                log.info("the broker does not serve Consume (UNIMPLEMENTED): using Subscribe and AckBatch")
                self._use_consume = False
        sub = client.subscribe(queues, **opts)
        session = _SubscribeSession(self, client, sub, batcher)
        sub._sink = self._sink_for(session)
        sub._on_cancel = self._cancelled
        try:
            if not await self._until_stopped(sub.opened()):
                sub.cancel()
                return None
        except RpcError as e:
            sub.cancel()
            self._open_failed(e)
            return None
        self._backoff.reset()
        self._transport = "subscribe"
        self._features = sub.features
        return session

    def _open_failed(self, e: RpcError) -> None:
        if e.status in FATAL_CODES:
            raise e
        log.warning("opening the stream failed (%s: %s); retrying", e.code_name, e.details())

    async def _serve(self, session: _Session) -> None:
        """Runs one stream until it ends, fails, or stop() is called."""
        assert self._stopping is not None and self._loop is not None
        if self._burst_mode and self._last_delivery is None:
            self._last_delivery = self._loop.time()
        ended = asyncio.ensure_future(session.stream._wait_reader())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({ended, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                # The stream stays open while running handlers finish, so
                # their settles still hold current leases; then half-close.
                await self._finish_jobs()
                await session.close()
                return
            # Ended by itself: what it delivered and was not started is
            # released by the broker.
            session.ended = True
            e = session.stream.error
            if e is not None:
                if e.status in FATAL_CODES:
                    raise e
                log.warning("%s stream failed (%s: %s); reconnecting", session.transport, e.code_name, e.details())
            else:
                log.warning("%s stream ended; reconnecting", session.transport)
        finally:
            session.ended = True  # its deliveries not started are skipped
            self.stats.stream_writes += getattr(session.stream, "writes", 0)
            ended.cancel()
            stopping.cancel()
            session.cancel()

    async def _pause(self, delay: float) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except asyncio.TimeoutError:
            pass

    # --- deliveries in, runners and threads

    def _sink_for(self, session: _Session) -> Callable[[List[Job]], None]:
        def sink(jobs: List[Job]) -> None:
            self._on_jobs(session, jobs)

        return sink

    def _on_jobs(self, session: _Session, jobs: List[Job]) -> None:
        """A message's deliveries, from the stream's reader."""
        assert self._stopping is not None and self._loop is not None
        if self._stopping.is_set():
            return  # left unsettled: released when the stream closes
        self.stats.delivered += len(jobs)
        self._traced = _tracing.recording()
        now = self._loop.time()
        self._last_delivery = now
        extend_at = now + self._lease / 2
        handlers, ready = self._handlers, self._ready
        queued = False
        plain: List[_Run] = []
        for job in jobs:
            entry = handlers.get(job.queue)
            run = _Run(self, job, session, entry, extend_at)
            if entry is None:
                self._settle(run, _Outcome("nack", f"no handler for queue {job.queue!r} in this worker"))
            elif entry.is_async:
                ready.append(run)
                queued = True
            else:
                plain.append(run)
        if queued:
            self._wake_runners()
        if plain:
            self._start_in_threads(plain)

    def _wake_runners(self) -> None:
        """Wakes one idle runner now, and checks on the next loop turn
        whether deliveries still wait: the runner then went on to a handler
        that did not finish at once, so more are woken (twice as many each
        turn that jobs wait). A no-op handler is all run by one runner, in
        one turn, with one wake-up per message."""
        if self._idle and not self._kick_armed:
            fut = self._idle.popleft()
            if not fut.done():
                fut.set_result(None)
        if not self._kick_armed:
            self._kick_armed = True
            assert self._loop is not None
            self._loop.call_soon(self._kick)

    def _kick(self) -> None:
        self._kick_armed = False
        ready, idle = self._ready, self._idle
        if not ready or not idle:
            self._burst = 1
            return
        n = min(len(ready), len(idle), self._burst)
        self._burst *= 2
        for _ in range(n):
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
        self._kick_armed = True
        assert self._loop is not None
        self._loop.call_soon(self._kick)

    async def _runner(self) -> None:
        """One of ``concurrency``: takes deliveries and awaits their
        (async) handlers, one at a time."""
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        ready, idle, running = self._ready, self._idle, self._running
        while True:
            if not ready:
                fut: "asyncio.Future[None]" = loop.create_future()
                idle.append(fut)
                await fut
                continue
            run = ready.popleft()
            if run.session.ended:
                continue  # released with its stream
            self._busy += 1
            running.add(run)
            run.runner = me
            entry = run.entry
            assert entry is not None
            if entry.timeout is not None:
                run.timer = loop.call_later(entry.timeout, self._time_out, run)
            try:
                outcome = await self._run_async(run, entry)
            finally:
                if run.timer is not None:
                    run.timer.cancel()
                running.discard(run)
                run.runner = None
                self._job_done()
            if outcome is not None:
                self._settle(run, outcome)

    async def _run_async(self, run: _Run, entry: _Entry) -> Optional[_Outcome]:
        """The handler's outcome; None when the worker abandoned it."""
        job = run.job
        if not self._traced and not _has_header(job, "traceparent"):
            try:
                result = await entry.fn(job)
            except asyncio.CancelledError:
                if run.stop is None:
                    return self._failed(job, asyncio.CancelledError(), None)
                return self._stopped(run, None)
            except Exception as exc:
                if run.stop is not None:
                    return self._stopped(run, None)
                return self._failed(job, exc, None)
            if run.stop is not None:
                return self._stopped(run, None)
            return _ACK if result is None else _ack_of(job, result)
        with _tracing.handler_span(job.queue, job.id, job.attempt, job.headers) as span:
            try:
                result = await entry.fn(job)
                outcome: Optional[_Outcome] = _ack_of(job, result) if run.stop is None else self._stopped(run, span)
            except asyncio.CancelledError:
                outcome = self._failed(job, asyncio.CancelledError(), span) if run.stop is None else self._stopped(run, span)
            except Exception as exc:
                outcome = self._failed(job, exc, span) if run.stop is None else self._stopped(run, span)
            if outcome is not None:
                _tracing.set_attribute(span, "leaseq.outcome", outcome.kind)
            return outcome

    def _stopped(self, run: _Run, span: Any) -> Optional[_Outcome]:
        """The outcome of a handler the worker gave up on (its cancellation
        is the worker's, not the handler's: uncancel its runner)."""
        if run.runner is not None and sys.version_info >= (3, 11):
            run.runner.uncancel()
        if run.stop == "cancel":
            self._count_cancelled(run, "handler stopped")
            _tracing.set_attribute(span, "leaseq.outcome", "cancelled")
        if run.stop != "timeout":
            return None
        assert run.entry is not None and run.entry.timeout is not None
        self.stats.timed_out += 1
        outcome = _Outcome("timeout", f"timeout: the handler ran longer than {run.entry.timeout:g}s")
        _tracing.mark_failed(span, outcome.error)
        return outcome

    def _failed(self, job: Job, exc: BaseException, span: Any) -> _Outcome:
        if isinstance(exc, Retry):
            o = _Outcome("retry", exc.reason, exc.after)
        elif isinstance(exc, DeadLetter):
            o = _Outcome("dead_letter", exc.reason)
        else:
            log.debug("job %s: handler failed", job.id, exc_info=exc)
            o = _Outcome("nack", str(exc) or type(exc).__name__)
        _tracing.mark_failed(span, o.error, exc)
        return o

    def _time_out(self, run: _Run) -> None:
        run.timer = None
        if run.runner is None:
            # A plain handler: its clock starts when a thread takes it (the
            # timer was armed when it was handed to the threads).
            assert self._loop is not None and run.entry is not None and run.entry.timeout is not None
            started = run.started
            left = run.entry.timeout if started is None else started + run.entry.timeout - time.monotonic()
            if left > 0:
                run.timer = self._loop.call_later(left, self._time_out, run)
                return
        run.stop = "timeout"
        run.job.cancelled.set()
        if run.runner is not None:
            run.runner.cancel()  # the runner nacks once the handler unwinds
            return
        # A plain handler: its thread keeps going (and its slot) until it
        # returns; the job is nacked now and the thread's result ignored.
        self._running.discard(run)
        outcome = self._stopped(run, None)
        self._job_done()
        if outcome is not None:
            self._settle(run, outcome)

    def _cancelled(self, c: Cancelled) -> None:
        """The broker cancelled a job of this worker's (``CancelJob``): its
        async handler is cancelled at its next await, a plain one flagged
        (``job.cancelled``) and its result ignored, a job not started yet
        dropped. Nothing is settled: the job is gone (an ack would be
        refused) and the stream's credit for it is back. A scan of the jobs
        held (at most ``max_in_flight``, running or waiting), so that the
        per-job path pays nothing for cancels."""
        for run in self._running:
            if run.job.id == c.job_id and run.job.lease_token == c.lease_token:
                break
        else:
            for run in self._ready:
                if run.job.id == c.job_id and run.job.lease_token == c.lease_token:
                    self._ready.remove(run)
                    run.stop = "cancel"
                    run.job.cancelled.set()
                    self._count_cancelled(run, "dropped before its handler started")
                    return
            # Settled already (the settle is refused), or not this worker's.
            log.debug("job %s: cancelled by the broker, no handler of it running", c.job_id)
            return
        if run.stop is not None:
            return  # given up on already (a timeout's nack will be refused)
        run.stop = "cancel"
        run.job.cancelled.set()
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        if run.runner is not None:
            run.runner.cancel()  # counted by the runner once the handler unwinds
            return
        # A plain handler (or one waiting for a thread, which then never
        # starts): its thread keeps going until it returns; its result is
        # ignored (_threads_done skips stopped runs).
        self._running.discard(run)
        self._count_cancelled(run, "handler flagged (job.cancelled)")
        self._job_done()

    def _count_cancelled(self, run: _Run, what: str) -> None:
        self.stats.cancelled += 1
        log.info("job %s: cancelled by the broker (CancelJob); %s, nothing settled", run.job.id, what)

    def _start_in_threads(self, runs: List[_Run]) -> None:
        """Hands plain handlers' jobs to the threads: in chunks that one
        thread runs one after the other, sized so that a chunk takes about
        _CHUNK_TIME by the handler's average so far (a job a thread for
        handlers that take a millisecond or more; one wake-up of a thread
        for dozens of jobs of a handler that takes microseconds)."""
        assert self._loop is not None
        loop, running = self._loop, self._running
        for run in runs:
            assert run.entry is not None
            running.add(run)
            if run.entry.timeout is not None:
                run.timer = loop.call_later(run.entry.timeout, self._time_out, run)
        self._busy += len(runs)
        assert runs[0].entry is not None
        size = max(1, int(_CHUNK_TIME / max(runs[0].entry.avg, 1e-7)))
        for i in range(0, len(runs), size):
            chunk = runs[i : i + size]
            if self._threads is not None:
                self._threads.submit(chunk)
            else:
                assert self._executor is not None
                self._executor.submit(self._in_thread, chunk)

    def _in_thread(self, runs: List[_Run]) -> None:
        """Plain handlers, one after the other on a handler thread; the runs
        go back to the loop with any others that finished meanwhile (one
        wake-up of the loop for them all)."""
        for run in runs:
            self._run_plain(run)
        with self._done_lock:
            done = self._done
            first = not done
            done.extend(runs)
        if first:
            loop = self._loop
            if loop is not None:
                try:
                    loop.call_soon_threadsafe(self._threads_done)
                except RuntimeError:  # the loop has closed
                    pass

    def _run_plain(self, run: _Run) -> None:
        job, entry = run.job, run.entry
        assert entry is not None
        with self._start_lock:  # against _drop_waiting: started, or dropped
            if run.stop is not None:
                return  # cancelled or dropped (stop) while it waited
            run.started = time.monotonic()
        t0 = time.perf_counter()
        if self._traced or _has_header(job, "traceparent"):
            with _tracing.handler_span(job.queue, job.id, job.attempt, job.headers) as span:
                try:
                    result = entry.fn(job)
                    outcome = _ACK if result is None else _ack_of(job, result)
                except Exception as exc:
                    outcome = self._failed(job, exc, span)
                if run.stop == "timeout":
                    _tracing.mark_failed(span, "timeout")
                kind = "cancelled" if run.stop == "cancel" else "timeout" if run.stop else outcome.kind
                _tracing.set_attribute(span, "leaseq.outcome", kind)
        else:
            try:
                result = entry.fn(job)
                outcome = _ACK if result is None else _ack_of(job, result)
            except Exception as exc:
                outcome = self._failed(job, exc, None)
        entry.avg += (time.perf_counter() - t0 - entry.avg) * 0.1
        run.outcome = outcome

    def _threads_done(self) -> None:
        with self._done_lock:
            done, self._done = self._done, []
        for run in done:
            if run.stop is not None:
                continue  # timed out (nacked) or abandoned: counted then
            if run.timer is not None:
                run.timer.cancel()
            self._running.discard(run)
            self._busy -= 1
            self._settle(run, run.outcome)
        self._check_quiet()

    def _job_done(self) -> None:
        self._busy -= 1
        self._check_quiet()

    def _check_quiet(self) -> None:
        if self._busy == 0 and self._quiet is not None and not self._quiet.done():
            self._quiet.set_result(None)

    async def _until_quiet(self, timeout: Optional[float]) -> bool:
        """Waits up to ``timeout`` for no handler to be running."""
        if self._busy == 0:
            return True
        assert self._loop is not None
        self._quiet = self._loop.create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._quiet), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._quiet = None

    def _abandon_all(self) -> None:
        """Gives up on every running handler: async ones are cancelled;
        plain ones are flagged (``job.cancelled``) and left to return. None
        of them is settled: their jobs are released with the stream."""
        self._ready.clear()
        for run in list(self._running):
            if run.stop is not None:
                continue
            run.stop = "abandon"
            run.job.cancelled.set()
            if run.timer is not None:
                run.timer.cancel()
            if run.runner is not None:
                run.runner.cancel()
            else:
                self._running.discard(run)
                self._busy -= 1
        self._check_quiet()

    def _drop_waiting(self) -> None:
        """Drops the jobs whose handlers have not started (waiting for a
        runner or a thread): not settled, released when the stream closes."""
        self._ready.clear()
        with self._start_lock:
            for run in list(self._running):
                if run.runner is None and run.started is None and run.stop is None:
                    run.stop = "abandon"
                    run.job.cancelled.set()
                    if run.timer is not None:
                        run.timer.cancel()
                        run.timer = None
                    self._running.discard(run)
                    self._busy -= 1
        self._check_quiet()

    async def _finish_jobs(self) -> None:
        """Waits up to the grace for running handlers, then cancels the rest."""
        self._drop_waiting()
        if await self._until_quiet(self._grace):
            return
        log.warning("%d handler(s) still running after the grace; cancelled", self._busy)
        self._abandon_all()
        await self._until_quiet(None)

    # --- settles and leases

    def _settle(self, run: _Run, outcome: _Outcome) -> None:
        if outcome.kind == "sql":
            self.stats.settled_in_sql += 1
            if outcome.follow_ups:
                # The job is gone already: nothing can carry them now.
                self.stats.follow_ups_refused += 1
                log.warning(
                    "job %s: settled in SQL by its handler, which also asked for %d follow-up job(s): "
                    "not enqueued (enqueue them in that transaction with leaseq.enqueue)",
                    run.job.id,
                    outcome.follow_ups,
                )
            else:
                log.debug("job %s: settled in SQL by its handler; nothing sent", run.job.id)
            return
        ack = outcome.ack
        if ack is not None:
            features = run.session.stream.features
            if ack.enqueue and ACK_ENQUEUE not in features:
                # Never an ack without its follow-ups: the job fails, and comes back.
                self.stats.follow_ups_refused += 1
                outcome = _Outcome("nack", _no_follow_ups(len(ack.enqueue)))
                log.warning("job %s: %s", run.job.id, outcome.error)
            elif ack.result and ACK_RESULT not in features:
                # Nor without its result.
                self.stats.results_refused += 1
                outcome = _Outcome("nack", _no_result(len(ack.result)))
                log.warning("job %s: %s", run.job.id, outcome.error)
        run.outcome = outcome
        run.session.settle(run, outcome)

    def _answered(self, run: _Run, r: Optional[pb.SettleResult], error: Optional[RpcError]) -> None:
        """A settle's result from the stream (or the stream's end)."""
        if r is not None:
            if r.code == _OK:
                if run.outcome.kind == "ack":
                    self.stats.acked += 1
                    if r.enqueued:
                        self._enqueued(run.job, r.enqueued)
                else:
                    self.stats.nacked += 1
                    self.stats.dead_lettered += int(r.dead_lettered)
                return
            error = RpcError(_status_of(r.code), r.message)
        assert error is not None
        self._settle_failed(run.session, run, run.outcome, error, _SETTLE_TRIES - 1)

    def _settle_failed(self, session: _Session, run: _Run, outcome: _Outcome, e: RpcError, tries: int) -> None:
        job = run.job
        if e.lease_lost:
            # Expired, taken over, released with its stream, or the job was
            # cancelled: it is (or will be) someone else's.
            self.stats.lease_lost += 1
            log.debug("job %s: lease lost before the %s (%s)", job.id, outcome.kind, e.details())
        elif e.status != grpc.StatusCode.UNAVAILABLE:
            log.warning("job %s: settling failed (%s: %s)", job.id, e.code_name, e.details())
        elif tries <= 0:
            log.warning("job %s: broker unavailable, not settled; it will be delivered again", job.id)
        else:
            self._settle_later(session, run, outcome, tries, Backoff(0.05, 1.0).delay())

    def _settle_later(self, session: _Session, run: _Run, outcome: _Outcome, tries: int, delay: float) -> None:
        self._spawn(self._settle_retry(session, run, outcome, tries, delay))

    async def _settle_retry(self, session: _Session, run: _Run, outcome: _Outcome, tries: int, delay: float) -> None:
        """The slow path: one settle awaited, retried on UNAVAILABLE."""
        backoff = Backoff(0.05, 1.0)
        if delay:
            backoff.delay()
            await asyncio.sleep(delay)
        job = run.job
        for left in range(tries - 1, -1, -1):
            try:
                if outcome.kind == "ack":
                    ids = await session.ack(job, outcome.ack)
                    self.stats.acked += 1
                    if ids:
                        self._enqueued(job, ids)
                else:
                    dead = await session.nack(job, outcome)
                    self.stats.nacked += 1
                    self.stats.dead_lettered += int(dead)
                return
            except RpcError as e:
                if e.status != grpc.StatusCode.UNAVAILABLE or left == 0:
                    self._settle_failed(session, run, outcome, e, 0)
                    return
                await asyncio.sleep(backoff.delay())

    def _progress(self, session: _Session, job: Job, fraction: float, message: str) -> None:
        """A handler's progress report, on the loop: on the Consume stream
        (coalesced there), else by ReportProgress, one call at a time per
        job with the latest report waiting."""
        if job.is_cancelled():
            return  # no longer the handler's job
        if isinstance(session, _ConsumeSession) and session.alive:
            try:
                session._consumer.progress(job, fraction, message)
                return
            except RpcError:
                pass  # half-closed or ended just now: a unary call
        key = (job.id, job.lease_token)
        busy = key in self._progress_next
        self._progress_next[key] = (fraction, message)
        if not busy:
            self._spawn(self._progress_unary(session, key))

    async def _progress_unary(self, session: _Session, key: Tuple[str, str]) -> None:
        pending = self._progress_next
        try:
            while True:
                report = pending.get(key)
                if report is None:
                    return
                pending[key] = None  # in flight: a newer report waits here
                try:
                    await session._unary.report_progress(key[0], key[1], *report)
                except RpcError as e:
                    self.stats.progress_failed += 1
                    log.debug("job %s: progress not written (%s: %s)", key[0], e.code_name, e.details())
        finally:
            pending.pop(key, None)

    def _enqueued(self, job: Job, ids: Sequence[str]) -> None:
        self.stats.follow_ups += len(ids)
        log.debug("job %s: acked with follow-up jobs %s", job.id, list(ids))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settles_done(self) -> None:
        """Waits for the settles being retried (and unary extends)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _tick(self) -> None:
        """The lease keeper of every running job: each lease is extended by
        a full ``lease`` from now once half of it has passed, so one lost
        call still leaves time to try again."""
        assert self._loop is not None
        now = self._loop.time()
        half = self._lease / 2
        for run in self._running:  # plain handlers' jobs waiting for a thread too
            if run.extend_at <= now and run.stop is None:
                run.extend_at = now + half
                run.session.extend(run, self._lease)
        for run in self._ready:  # async handlers' jobs waiting for a runner
            if run.extend_at <= now and not run.session.ended:
                run.extend_at = now + half
                run.session.extend(run, self._lease)
        tick = self._lease / 8
        if self._burst_mode:
            tick = min(tick, self.BURST_IDLE / 4)
            last = self._last_delivery
            if last is not None and now - last >= self.BURST_IDLE and self._busy == 0 and not self._ready:
                log.info("burst: nothing delivered for %ss and no handler running; stopping", self.BURST_IDLE)
                self.stop()
        self._ticker = self._loop.call_later(tick, self._tick)

    def _extend_failed(self, run: _Run, e: RpcError) -> None:
        if e.lease_lost:
            log.info("job %s: lease lost while its handler runs; it may be delivered again", run.job.id)
            run.extend_at = float("inf")
            return
        log.warning("job %s: extending the lease failed (%s); will retry", run.job.id, e.code_name)
