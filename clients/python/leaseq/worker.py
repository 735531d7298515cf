"""A worker: Subscribe with reconnect, one handler per job, leases kept while
handlers run, Ack on success, Nack with the error text on failure.

Everything runs on one asyncio event loop. Per subscription there is one
reader task (the stream) and, per delivery, one job task (wait for a slot, run
the handler, settle) with a lease-keeper task beside it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from typing import Awaitable, Callable, Optional, Sequence, Union

import grpc

from leaseq.client import Client, Job, Seconds

log = logging.getLogger("leaseq.worker")

Handler = Callable[[Job], Union[Awaitable[None], None]]

#: Subscribe failures that retrying cannot fix: bad input or configuration.
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

# Settling is retried this many times on transient errors; after that the
# lease runs out and the job is redelivered (at-least-once).
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


def _seconds(value: Seconds) -> float:
    return value if isinstance(value, (int, float)) else value.total_seconds()


class Worker:
    """Runs ``handler(job)`` for every job delivered from ``queues``.

    - At most ``max_in_flight`` handlers run at once; it is also the stream's
      credit, so the broker never pushes more than that.
    - Every delivery's lease is extended by ``lease`` every ``lease / 2``
      until the handler returns.
    - A handler that returns acks the job; one that raises nacks it with
      ``str(exception)`` as the error (the job's next ``last_error``), and the
      queue's backoff decides the retry.
    - ``handler`` may be a coroutine function, or a plain function, which then
      runs in a thread (``asyncio.to_thread``).
    - The stream is reopened after any retryable failure, with exponential
      backoff and jitter between ``backoff_initial`` and ``backoff_max``
      seconds (reset once a stream is established). ``run()`` raises
      ``grpc.aio.AioRpcError`` for the codes in :data:`FATAL_CODES`.
    - A stream with no message (delivery or heartbeat) for ``idle_timeout``
      seconds is taken for dead and reopened; it must exceed the broker's
      ``--heartbeat-interval`` (15 s by default). None disables the check.
    - ``stop()``: take no new jobs, let running handlers finish for up to
      ``grace`` seconds (cancelling the rest), then close the stream, which
      makes the broker release every job this worker has not settled.
    """

    def __init__(
        self,
        client: Client,
        queues: Sequence[str],
        handler: Handler,
        *,
        max_in_flight: int = 16,
        lease: Seconds = 30.0,
        consumer: str = "",
        grace: Seconds = 30.0,
        backoff_initial: Seconds = 0.1,
        backoff_max: Seconds = 10.0,
        idle_timeout: Optional[Seconds] = 60.0,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight: must be at least 1")
        self._client = client
        self._queues = list(queues)
        self._handler = handler
        self._max_in_flight = max_in_flight
        self._lease = _seconds(lease)
        self._consumer = consumer
        self._grace = _seconds(grace)
        self._backoff = Backoff(_seconds(backoff_initial), _seconds(backoff_max))
        self._idle_timeout = None if idle_timeout is None else _seconds(idle_timeout)
        # Set by stop(); everything that takes new work checks it.
        self._stopping = asyncio.Event()
        # Bounds running handlers to max_in_flight. Credit alone would not:
        # after a reconnect the new stream has full credit while handlers of
        # the old stream (whose jobs the broker already released) may still
        # be running. Deliveries wait here, their leases kept meanwhile.
        self._slots: Optional[asyncio.Semaphore] = None
        # Job tasks of every stream; run() waits for them when stopping.
        self._jobs: set[asyncio.Task] = set()

    def stop(self) -> None:
        """Asks ``run()`` to finish gracefully. Safe to call more than once,
        and from a signal handler installed with ``loop.add_signal_handler``."""
        self._stopping.set()

    async def run(self) -> None:
        """Works until ``stop()``; returns once the stream is closed."""
        self._slots = asyncio.Semaphore(self._max_in_flight)
        try:
            while not self._stopping.is_set():
                call = self._client.subscribe(
                    self._queues,
                    consumer=self._consumer,
                    max_in_flight=self._max_in_flight,
                    lease=self._lease,
                )
                try:
                    await self._serve(call)
                finally:
                    call.cancel()
                if not self._stopping.is_set():
                    await self._pause(self._backoff.delay())
        except asyncio.CancelledError:
            # run() itself cancelled: no grace, the handlers go too.
            for task in self._jobs:
                task.cancel()
            raise
        finally:
            await self._finish_jobs()

    async def _serve(self, call) -> None:
        """Reads one stream until it ends, fails, or stop() is called."""
        reader = asyncio.create_task(self._read(call))
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                # The stream stays open while running handlers finish, so
                # that their Acks still hold current leases; it is closed by
                # run() after that. Deliveries meanwhile are left unsettled.
                await self._finish_jobs()
            reader.cancel()
            try:
                await reader
            except asyncio.CancelledError:
                pass
            except grpc.aio.AioRpcError as e:
                if e.code() in FATAL_CODES:
                    raise
                if not self._stopping.is_set():
                    log.warning("subscribe stream failed (%s: %s); reconnecting", e.code().name, e.details())
        finally:
            stopping.cancel()

    async def _read(self, call) -> None:
        while True:
            try:
                msg = await asyncio.wait_for(call.read(), self._idle_timeout)
            except asyncio.TimeoutError:
                # Heartbeats stopped: a hung broker or a silently dropped
                # connection. The timeout cancelled the call; start afresh.
                log.warning("no message on the stream for %ss; reconnecting", self._idle_timeout)
                return
            if msg is grpc.aio.EOF:
                break
            # The broker's first message is a heartbeat sent once the
            # subscription is registered: the stream is up.
            self._backoff.reset()
            if msg.WhichOneof("kind") != "delivery" or self._stopping.is_set():
                continue
            task = asyncio.create_task(self._job(Job.from_delivery(msg.delivery)))
            self._jobs.add(task)
            task.add_done_callback(self._jobs.discard)
        if not self._stopping.is_set():
            log.warning("subscribe stream ended; reconnecting")

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

    async def _pause(self, seconds: float) -> None:
        """Sleeps, waking early if stop() is called."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    async def _job(self, job: Job) -> None:
        keeper = asyncio.create_task(self._keep_lease(job))
        try:
            async with self._slots:
                if self._stopping.is_set():
                    return  # not started: released when the stream closes
                error = await self._run_handler(job)
        finally:
            keeper.cancel()
        await self._settle(job, error)

    async def _run_handler(self, job: Job) -> Optional[str]:
        """The handler's error text, or None if it succeeded."""
        try:
            if inspect.iscoroutinefunction(self._handler):
                await self._handler(job)
            else:
                await asyncio.to_thread(self._handler, job)
            return None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any handler failure is a Nack
            log.debug("handler failed for job %s", job.id, exc_info=True)
            return str(e) or type(e).__name__

    async def _keep_lease(self, job: Job) -> None:
        # Counted from the delivery; each extension is a full lease from now,
        # so one lost call still leaves half a lease to try again.
        while True:
            await asyncio.sleep(self._lease / 2)
            try:
                await self._client.extend_lease(job.id, job.lease_token, self._lease)
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    log.warning("job %s: lease lost; it will be redelivered", job.id)
                    return
                log.warning("job %s: extending the lease failed (%s); will retry", job.id, e.code().name)

    async def _settle(self, job: Job, error: Optional[str]) -> None:
        backoff = Backoff(0.05, 1.0)
        for _ in range(_SETTLE_TRIES):
            try:
                if error is None:
                    await self._client.ack(job.id, job.lease_token)
                else:
                    await self._client.nack(job.id, job.lease_token, error)
                return
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    # FAILED_PRECONDITION: the lease was lost (expired, or the
                    # stream closed); the job is or will be redelivered.
                    log.warning("job %s: settling failed (%s: %s)", job.id, e.code().name, e.details())
                    return
                await asyncio.sleep(backoff.delay())
        log.warning("job %s: broker unavailable, not settled; it will be redelivered", job.id)
