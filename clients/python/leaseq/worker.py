"""The Worker: handlers per queue, credits = concurrency, per-job timeout,
leases kept while handlers run, outcomes from exceptions, settles on the
Consume stream (or Subscribe + batched AckBatch on a broker without it),
reconnect with backoff, graceful stop on SIGTERM.

Everything runs on one asyncio event loop: one reader per stream and, per
delivery, a job task (wait for a slot, run the handler, settle) with a
lease-keeper task beside it. Plain (non-async) handlers run in a thread pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import random
import signal
import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import grpc

from leaseq import _tracing
from leaseq._connection import TLS, Connection
from leaseq._types import DeadLetter, Job, Retry, RpcError, Seconds, seconds
from leaseq.aio import AsyncClient, AsyncConsumer, AsyncSubscription
from leaseq.client import Client

log = logging.getLogger("leaseq.worker")

#: What a handler may be: ``async def f(job)`` (runs on the worker's loop) or
#: ``def f(job)`` (runs in the worker's thread pool). The return value is
#: ignored; raising decides the outcome (see :class:`Worker`).
Handler = Callable[[Job], Any]
H = TypeVar("H", bound=Callable[[Job], Any])

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
    #: Settles (acks and nacks) sent on a Consume stream...
    settled_on_stream: int = 0
    #: ... in AckBatch calls (Subscribe fallback) ...
    settled_batched: int = 0
    #: ... and with unary calls (nacks in the fallback; settles of jobs whose
    #: stream had ended).
    settled_unary: int = 0
    #: Streams opened after the first.
    reconnects: int = 0


@dataclass
class _Entry:
    fn: Handler
    is_async: bool
    timeout: Optional[float]


@dataclass
class _Outcome:
    #: "ack", "nack", "retry", "dead_letter" or "timeout".
    kind: str
    error: str = ""
    retry_after: Optional[Seconds] = None

    @property
    def dead_letter(self) -> bool:
        return self.kind == "dead_letter"


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


class _Session:
    """One stream and how settles of its jobs are sent."""

    transport = ""

    def __init__(self, worker: "Worker", unary: AsyncClient) -> None:
        self._w, self._unary = worker, unary

    async def next_job(self) -> Optional[Job]:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError

    async def ack(self, job: Job) -> None:
        self._w.stats.settled_unary += 1
        await self._unary.ack(job.id, job.lease_token)

    async def nack(self, job: Job, o: _Outcome) -> bool:
        self._w.stats.settled_unary += 1
        return await self._unary.nack(
            job.id, job.lease_token, o.error, retry_after=o.retry_after, dead_letter=o.dead_letter
        )

    async def extend(self, job: Job, lease: float) -> None:
        await self._unary.extend_lease(job.id, job.lease_token, lease)


class _ConsumeSession(_Session):
    transport = "consume"

    def __init__(self, worker: "Worker", unary: AsyncClient, stream: AsyncConsumer) -> None:
        super().__init__(worker, unary)
        self._stream = stream

    async def next_job(self) -> Optional[Job]:
        return await self._stream.next_job()

    @property
    def alive(self) -> bool:
        return not self._stream.done

    async def close(self) -> None:
        await self._stream.close(timeout=10.0)

    def cancel(self) -> None:
        self._stream.cancel()

    # A job whose stream has ended was released by the broker; its settle
    # goes by a unary call and fails quietly with FAILED_PRECONDITION.
    async def ack(self, job: Job) -> None:
        if not self.alive:
            return await super().ack(job)
        self._w.stats.settled_on_stream += 1
        await self._stream.ack(job)

    async def nack(self, job: Job, o: _Outcome) -> bool:
        if not self.alive:
            return await super().nack(job, o)
        self._w.stats.settled_on_stream += 1
        return await self._stream.nack(job, o.error, retry_after=o.retry_after, dead_letter=o.dead_letter)

    async def extend(self, job: Job, lease: float) -> None:
        if not self.alive:
            return await super().extend(job, lease)
        await self._stream.extend(job, lease)


class _SubscribeSession(_Session):
    transport = "subscribe"

    def __init__(
        self, worker: "Worker", unary: AsyncClient, stream: AsyncSubscription, batcher: _AckBatcher
    ) -> None:
        super().__init__(worker, unary)
        self._stream, self._batcher = stream, batcher

    async def next_job(self) -> Optional[Job]:
        return await self._stream.next_job()

    @property
    def alive(self) -> bool:
        return not self._stream.done

    async def close(self) -> None:
        # Acks first: closing a Subscribe stream releases what is unsettled.
        await self._batcher.drain()
        await self._stream.close()

    def cancel(self) -> None:
        self._stream.cancel()

    async def ack(self, job: Job) -> None:
        self._w.stats.settled_batched += 1
        await self._batcher.ack(job)


class _JobState:
    __slots__ = ("slot_held",)

    def __init__(self) -> None:
        self.slot_held = False


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

    - **Outcomes**: a handler that returns acks the job. Raising
      :class:`leaseq.Retry` nacks it with ``retry_after``; raising
      :class:`leaseq.DeadLetter` dead-letters it; any other exception nacks it
      with ``str(exception)`` as the error (the job's next ``last_error``),
      and the queue's backoff decides the retry.
    - **Concurrency**: at most ``max_in_flight`` handlers run at once; it is
      also the stream's credit, so the broker never pushes more than that.
    - **Timeout** (``timeout``, or per handler): an async handler is
      cancelled; a plain one cannot be (it runs in a thread): its job's
      ``cancelled`` event is set, its result is ignored, and its thread keeps
      the slot until it returns. Either way the job is nacked with a
      ``timeout`` error at once.
    - **Leases**: the stream asks for ``lease``; every delivery's lease is
      extended by ``lease`` every ``lease / 2`` while its handler runs.
    - **Settles** go on the Consume stream; on a broker that answers
      UNIMPLEMENTED to Consume (or with ``stream_acks=False``) the worker
      uses Subscribe, acks in batched AckBatch calls (``ack_batch_size``,
      ``ack_batch_delay``) and unary Nack/ExtendLease. A settle refused with
      FAILED_PRECONDITION (the lease was lost: expired, taken over, job
      cancelled) is logged at debug level and counted in ``stats``.
    - **Reconnect**: a failed or ended stream is reopened after exponential
      backoff with jitter (``backoff_initial`` to ``backoff_max`` seconds).
      Statuses in :data:`FATAL_CODES` end ``run()`` with
      :class:`leaseq.RpcError` instead. A stream with no message for
      ``idle_timeout`` seconds (it must exceed the broker's heartbeat
      interval) is taken for dead and reopened.
    - **Stop**: take no new jobs; running handlers get ``grace`` seconds to
      finish and settle, the rest are cancelled; then the stream is
      half-closed (the broker releases what was not settled). A second signal
      cancels the handlers at once.
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
    ) -> None:
        if isinstance(target, (Client, AsyncClient)):
            self._conn = target.connection
        elif isinstance(target, Connection):
            self._conn = target
        else:
            self._conn = Connection(target, token=token, tls=tls, options=options)
        if max_in_flight < 1:
            raise ValueError("max_in_flight: must be at least 1")
        self._max_in_flight = max_in_flight
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
        self._handlers: Dict[str, _Entry] = {}
        self.stats = WorkerStats()
        self._transport: Optional[str] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stopping: Optional[asyncio.Event] = None
        self._stop_requested = False
        self._slots: Optional[asyncio.Semaphore] = None
        self._jobs: Set["asyncio.Task[None]"] = set()
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
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)
        )
        self._handlers[queue] = _Entry(fn, is_async, None if timeout is None else seconds(timeout))

    @property
    def queues(self) -> List[str]:
        return list(self._handlers)

    @property
    def transport(self) -> Optional[str]:
        """``"consume"`` (settles on the stream) or ``"subscribe"`` (the
        fallback) once a stream was opened; None before."""
        return self._transport

    # --- running

    def run(self, *, handle_signals: bool = True) -> None:
        """Works until :meth:`stop` (or SIGTERM/SIGINT when
        ``handle_signals`` and on the main thread); returns after a graceful
        stop. Runs its own event loop: call it from plain (non-async) code."""
        asyncio.run(self.run_async(handle_signals=handle_signals))

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

    async def run_async(self, *, handle_signals: bool = True) -> None:
        """:meth:`run` for code already on an event loop."""
        if not self._handlers:
            raise ValueError("no handlers: register one with @worker.handler(queue)")
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        self._slots = asyncio.Semaphore(self._max_in_flight)
        client = AsyncClient.from_connection(self._conn)
        batcher = _AckBatcher(client, self._ack_batch_size, self._ack_batch_delay)
        own_executor = self._executor is None
        executor = self._executor or ThreadPoolExecutor(self._max_in_flight, thread_name_prefix="leaseq-handler")
        restore = self._install_signals() if handle_signals else (lambda: None)
        first = True
        try:
            while not self._stopping.is_set():
                if not first:
                    self.stats.reconnects += 1
                first = False
                session = await self._open(client, batcher)
                if session is not None:
                    await self._serve(session, executor)
                if not self._stopping.is_set():
                    await self._pause(self._backoff.delay())
        except asyncio.CancelledError:
            # run itself cancelled: no grace, the handlers go too.
            for task in self._jobs:
                task.cancel()
            raise
        finally:
            try:
                await self._finish_jobs()
                await batcher.drain()
            finally:
                restore()
                await client.close()
                if own_executor:
                    executor.shutdown(wait=False)
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
            for task in self._jobs:
                task.cancel()
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
        )
        queues = list(self._handlers)
        if self._use_consume:
            stream = client.consume(queues, **opts)
            try:
                if not await self._until_stopped(stream.opened()):
                    stream.cancel()
                    return None
                self._backoff.reset()
                self._transport = "consume"
                return _ConsumeSession(self, client, stream)
            except RpcError as e:
                stream.cancel()
                if e.status != grpc.StatusCode.UNIMPLEMENTED:
                    self._open_failed(e)
                    return None
                log.info("the broker does not serve Consume (UNIMPLEMENTED): using Subscribe and AckBatch")
                self._use_consume = False
        sub = client.subscribe(queues, **opts)
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
        return _SubscribeSession(self, client, sub, batcher)

    def _open_failed(self, e: RpcError) -> None:
        if e.status in FATAL_CODES:
            raise e
        log.warning("opening the stream failed (%s: %s); retrying", e.code_name, e.details())

    async def _serve(self, session: _Session, executor: Executor) -> None:
        """Reads one stream until it ends, fails, or stop() is called."""
        assert self._stopping is not None
        reader = asyncio.ensure_future(self._read(session, executor))
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                # The stream stays open while running handlers finish, so
                # their settles still hold current leases; then half-close.
                await self._finish_jobs()
                await session.close()
            reader.cancel()
            try:
                await reader
            except asyncio.CancelledError:
                pass
            except RpcError as e:
                if e.status in FATAL_CODES:
                    raise
                if not self._stopping.is_set():
                    log.warning("%s stream failed (%s: %s); reconnecting", session.transport, e.code_name, e.details())
        finally:
            stopping.cancel()
            session.cancel()

    async def _read(self, session: _Session, executor: Executor) -> None:
        assert self._stopping is not None
        while True:
            job = await session.next_job()
            if job is None:
                break
            if self._stopping.is_set():
                continue  # left unsettled: released when the stream closes
            self.stats.delivered += 1
            task = asyncio.ensure_future(self._job(session, job, executor))
            self._jobs.add(task)
            task.add_done_callback(self._jobs.discard)
        if not self._stopping.is_set():
            log.warning("%s stream ended; reconnecting", session.transport)

    async def _finish_jobs(self) -> None:
        """Waits up to the grace for job tasks, then cancels the rest."""
        if not self._jobs:
            return
        _, late = await asyncio.wait(set(self._jobs), timeout=self._grace)
        for task in late:
            task.cancel()
        if late:
            log.warning("%d handler(s) still running after the grace; cancelled", len(late))
            await asyncio.wait(late)

    async def _pause(self, delay: float) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except asyncio.TimeoutError:
            pass

    # --- one job

    async def _job(self, session: _Session, job: Job, executor: Executor) -> None:
        assert self._slots is not None and self._stopping is not None
        entry = self._handlers.get(job.queue)
        state = _JobState()
        keeper = asyncio.ensure_future(self._keep_lease(session, job))
        try:
            await self._slots.acquire()
            state.slot_held = True
            if self._stopping.is_set():
                return  # not started: released when the stream closes
            if entry is None:
                outcome = _Outcome("nack", f"no handler for queue {job.queue!r} in this worker")
            else:
                outcome = await self._run_handler(job, entry, executor, state)
        finally:
            keeper.cancel()
            if state.slot_held:
                self._slots.release()
        await self._settle(session, job, outcome)

    async def _run_handler(self, job: Job, entry: _Entry, executor: Executor, state: _JobState) -> _Outcome:
        timeout = entry.timeout if entry.timeout is not None else self._timeout
        with _tracing.handler_span(job.queue, job.id, job.attempt, job.headers) as span:
            if entry.is_async:
                fut: "asyncio.Future[Any]" = asyncio.ensure_future(entry.fn(job))
            else:
                ctx = contextvars.copy_context()  # the span, for the handler's own spans
                fut = asyncio.wrap_future(executor.submit(ctx.run, entry.fn, job))
            try:
                done, _ = await asyncio.wait({fut}, timeout=timeout)
            except asyncio.CancelledError:
                self._abandon(job, fut, entry, state)
                raise
            if not done:
                self._abandon(job, fut, entry, state)
                if entry.is_async:
                    # Let it unwind (finally blocks) before the nack.
                    await asyncio.wait({fut})
                self.stats.timed_out += 1
                outcome = _Outcome("timeout", f"timeout: the handler ran longer than {timeout:g}s")
                _tracing.mark_failed(span, outcome.error)
            else:
                outcome = self._outcome(job, fut, span)
            _tracing.set_attribute(span, "leaseq.outcome", outcome.kind)
            return outcome

    def _abandon(self, job: Job, fut: "asyncio.Future[Any]", entry: _Entry, state: _JobState) -> None:
        """Gives up on a running handler: cancel it (async), or leave its
        thread running with the slot until it returns (plain)."""
        job.cancelled.set()
        if entry.is_async:
            fut.cancel()
            return
        assert self._slots is not None
        slots = self._slots
        state.slot_held = False

        def finished(f: "asyncio.Future[Any]") -> None:
            slots.release()
            if not f.cancelled() and f.exception() is not None:
                log.debug("job %s: abandoned handler raised", job.id, exc_info=f.exception())

        fut.add_done_callback(finished)

    def _outcome(self, job: Job, fut: "asyncio.Future[Any]", span: Any) -> _Outcome:
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is None:
            return _Outcome("ack")
        if isinstance(exc, Retry):
            o = _Outcome("retry", exc.reason, exc.after)
        elif isinstance(exc, DeadLetter):
            o = _Outcome("dead_letter", exc.reason)
        else:
            log.debug("job %s: handler failed", job.id, exc_info=exc)
            o = _Outcome("nack", str(exc) or type(exc).__name__)
        _tracing.mark_failed(span, o.error, exc)
        return o

    async def _keep_lease(self, session: _Session, job: Job) -> None:
        # Counted from the delivery; each extension is a full lease from now,
        # so one lost call still leaves half a lease to try again.
        while True:
            await asyncio.sleep(self._lease / 2)
            try:
                await session.extend(job, self._lease)
            except RpcError as e:
                if e.lease_lost:
                    log.info("job %s: lease lost while its handler runs; it may be delivered again", job.id)
                    return
                log.warning("job %s: extending the lease failed (%s); will retry", job.id, e.code_name)

    async def _settle(self, session: _Session, job: Job, outcome: _Outcome) -> None:
        backoff = Backoff(0.05, 1.0)
        for _ in range(_SETTLE_TRIES):
            try:
                if outcome.kind == "ack":
                    await session.ack(job)
                    self.stats.acked += 1
                else:
                    dead = await session.nack(job, outcome)
                    self.stats.nacked += 1
                    self.stats.dead_lettered += int(dead)
                return
            except RpcError as e:
                if e.lease_lost:
                    # Expired, taken over, released with its stream, or the
                    # job was cancelled: it is (or will be) someone else's.
                    self.stats.lease_lost += 1
                    log.debug("job %s: lease lost before the %s (%s)", job.id, outcome.kind, e.details())
                    return
                if e.status != grpc.StatusCode.UNAVAILABLE:
                    log.warning("job %s: settling failed (%s: %s)", job.id, e.code_name, e.details())
                    return
                await asyncio.sleep(backoff.delay())
        log.warning("job %s: broker unavailable, not settled; it will be delivered again", job.id)
