"""Helpers shared by the tests (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid

from leaseq import AsyncClient, RpcError


def run(coro, timeout: float = 30.0):
    """Runs one test's coroutine on a fresh loop, failing it after ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def queue_name(prefix: str = "py") -> str:
    """A queue of the test's own, so tests sharing a broker never meet."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def first_delivery(client: AsyncClient, queue: str, timeout: float = 10.0, lease: float = 30):
    """The first job a fresh raw Subscribe stream on ``queue`` receives (the
    stream is closed after, which releases the job)."""
    async with client.subscribe(queue, max_in_flight=1, lease=lease) as sub:
        return await asyncio.wait_for(sub.next_job(), timeout)


async def job_is_gone(c: AsyncClient, q: str, dedup_key: str) -> bool:
    """Whether the job enqueued with ``dedup_key`` was acked or dead-lettered:
    only then is its key free again (a waiting or leased job keeps it)."""
    again = await c.enqueue(q, b"probe", dedup_key=dedup_key)
    return not again.duplicate


async def retry_unavailable(call, limit: float = 15.0):
    """``await call()``, retried on UNAVAILABLE for up to ``limit`` seconds:
    what a producer does while a broker restarts (its channel fails calls at
    once until it has reconnected)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        try:
            return await call()
        except RpcError as e:
            if e.code_name != "UNAVAILABLE" or loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)


class LogEvent(logging.Handler):
    """Sets an asyncio.Event when a logger logs a message containing
    ``text`` (the worker logs from the event loop's thread); keeps records."""

    def __init__(self, text: str = "", level: int = logging.DEBUG) -> None:
        super().__init__(level)
        self.text, self.event = text, asyncio.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if self.text and self.text in record.getMessage():
            self.event.set()

    def at_least(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]
