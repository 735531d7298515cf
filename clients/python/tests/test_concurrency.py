"""A credit (``max_in_flight``) above the handlers at once (``concurrency``),
against a real broker: jobs delivered and waiting for a handler in the
worker, as RabbitMQ's prefetch against a consumer's threads."""

import asyncio
import threading
import time

import pytest
from util import queue_name, run

from leaseq import AsyncAdminClient, AsyncClient, Job, NewJob, Worker


def start(worker: Worker) -> "asyncio.Task[None]":
    return asyncio.ensure_future(worker.run_async(handle_signals=False))


async def until(cond, timeout: float = 10.0) -> None:
    """Polls ``cond()`` every 10 ms until it holds (fails after ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


class Gauge:
    """Handlers running now and at most, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.started = self.finished = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.started += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1
            self.finished += 1


def sleeper(kind: str, gauge: Gauge, secs: float):
    """A handler of ``kind`` ("async" or "plain") that sleeps ``secs``."""
    if kind == "async":

        async def handle(job: Job) -> None:
            gauge.enter()
            try:
                await asyncio.sleep(secs)
            finally:
                gauge.leave()

        return handle

    def handle_plain(job: Job) -> None:
        gauge.enter()
        try:
            time.sleep(secs)
        finally:
            gauge.leave()

    return handle_plain


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_concurrency_bounds_the_handlers_and_the_credit_the_deliveries(addr, kind):
    async def body():
        q = queue_name()
        total = 20
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(total)])
            gauge = Gauge()
            w = Worker(addr, [q], sleeper(kind, gauge, 0.3), max_in_flight=8, concurrency=2, lease=30)
            task = start(w)
            leased = []
            while gauge.finished < total:
                leased.append((await admin.get_queue(q)).stats.leased)
                await asyncio.sleep(0.05)
            w.stop()
            await task
            # Both bounds reached, neither passed: 2 handlers at once, 8 jobs
            # held by the broker for the worker (6 of them waiting). The
            # broker's leased count also has the jobs whose acks are on
            # their way (an ack's credit comes back as it arrives, before it
            # commits: README, "Flow control"): at most one a handler, so
            # 8 + 2 (a clean-checkout CI run saw 10).
            assert gauge.peak == 2
            assert 8 <= max(leased) <= 8 + 2, leased
            assert (w.stats.delivered, w.stats.acked, w.stats.lease_lost) == (total, total, 0)

    run(body())


def test_concurrency_is_checked_against_the_credit():
    with pytest.raises(ValueError, match="^concurrency: must be at least 1"):
        Worker("127.0.0.1:1", max_in_flight=8, concurrency=0)
    with pytest.raises(ValueError, match=r"^concurrency: must be at most max_in_flight \(8\)"):
        Worker("127.0.0.1:1", max_in_flight=8, concurrency=9)
    # The default is the credit; equal is allowed.
    Worker("127.0.0.1:1", max_in_flight=8, concurrency=8)
    Worker("127.0.0.1:1", max_in_flight=8)


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_jobs_waiting_for_a_handler_keep_their_leases(addr, kind):
    """One handler at a time, 4 jobs of 0.8 s held with a 1 s lease: the
    last ones wait 1.6 and 2.4 s. Had their leases lapsed while they waited,
    the watching stream would get them back (attempt 2) and the worker's
    acks would be refused."""

    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(4)])
            gauge = Gauge()
            w = Worker(addr, [q], sleeper(kind, gauge, 0.8), max_in_flight=4, concurrency=1, lease=1)
            task = start(w)
            await until(lambda: w.stats.delivered == 4)
            async with c.subscribe(q, max_in_flight=4, lease=30) as watcher:
                stolen = asyncio.ensure_future(watcher.next_job())
                await until(lambda: gauge.finished == 4 and w.stats.acked + w.stats.lease_lost == 4, timeout=15)
                assert not stolen.done(), "a waiting job's lease lapsed: it went to another stream"
                stolen.cancel()
            w.stop()
            await task
            assert (w.stats.acked, w.stats.lease_lost, gauge.peak) == (4, 0, 1)

    run(body())


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_the_timeout_counts_from_the_handlers_start_not_its_wait(addr, kind):
    """4 jobs of 0.3 s, one at a time, timeout 0.5 s: each handler is within
    its timeout though the last waits 0.9 s for its turn."""

    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(4)])
            gauge = Gauge()
            w = Worker(addr, [q], sleeper(kind, gauge, 0.3), max_in_flight=4, concurrency=1, lease=30, timeout=0.5)
            task = start(w)
            await until(lambda: w.stats.acked + w.stats.nacked == 4)
            w.stop()
            await task
            assert (w.stats.acked, w.stats.timed_out, w.stats.nacked, gauge.started) == (4, 0, 0, 4)

    run(body())


@pytest.mark.parametrize("kind", ["async", "plain"])
def test_stop_starts_no_waiting_job_and_releases_them(addr, kind):
    async def body():
        q = queue_name()
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await c.enqueue_batch([NewJob(q, str(i)) for i in range(6)])
            gauge = Gauge()
            w = Worker(addr, [q], sleeper(kind, gauge, 0.5), max_in_flight=6, concurrency=1, lease=30, grace=10)
            task = start(w)
            await until(lambda: w.stats.delivered == 6 and gauge.started == 1)
            w.stop()
            await task
            # The running one finished and was acked; the 5 waiting never
            # started, and closing the stream gave them back.
            assert (gauge.started, w.stats.acked, w.stats.nacked) == (1, 1, 0)
            stats = (await admin.get_queue(q)).stats
            assert (stats.available, stats.leased) == (5, 0)

    run(body())
