"""Helpers shared by the tests (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import uuid


def run(coro, timeout: float = 30.0):
    """Runs one test's coroutine on a fresh loop, failing it after ``timeout``."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def queue_name(prefix: str = "py") -> str:
    """A queue of the test's own, so tests sharing a broker never meet."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def first_delivery(client, queue: str, timeout: float = 10.0):
    """The first job a fresh raw Subscribe stream on ``queue`` receives."""
    from leaseq import deliveries

    call = client.subscribe([queue], max_in_flight=1)
    try:
        return await asyncio.wait_for(deliveries(call).__anext__(), timeout)
    finally:
        call.cancel()


async def retry_unavailable(call, limit: float = 15.0):
    """``await call()``, retried on UNAVAILABLE for up to ``limit`` seconds:
    what a producer does while a broker restarts (its channel fails calls at
    once until it has reconnected)."""
    import grpc

    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or loop.time() > deadline:
                raise
            await asyncio.sleep(0.1)
