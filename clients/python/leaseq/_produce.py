"""``enqueue``'s transport: one Produce stream per client, opened by the
first enqueue, each job a message with an id and each answer matched to its
caller by it. A unary Enqueue costs grpcio a call (a new HTTP/2 stream,
headers both ways, the call object); a message on an open stream costs a
write and a read.

When the stream breaks (the broker restarted or drained, the connection
dropped), the jobs awaiting an answer raise its status (``UNAVAILABLE``:
each may or may not be enqueued, as with a unary call whose answer was
lost), and the next enqueue opens a new stream. A broker from before
Produce answers ``UNIMPLEMENTED``: nothing was enqueued, so the jobs are
sent again with the unary Enqueue, as every later one is.

The asyncio client's only: the call's ``write`` and a reader task. The sync
:class:`leaseq.Client` keeps the unary Enqueue: grpcio reads a sync
stream's requests in a thread of its own and its answers need another, and
those hand-overs cost more than the call they save (measured: 1,255-1,348
enqueues a second over a stream against 1,420-1,530 unary;
docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional

import grpc

from leaseq._types import RpcError, _from_grpc, _status_of
from leaseq.v1 import queue_pb2 as pb


class Unsupported(Exception):
    """The broker has no Produce: send the job with Enqueue."""


def _answer(r: Any) -> Any:
    """The EnqueueResponse of an answer, or the RpcError it carries."""
    if r.code == 0:
        return r.enqueued
    return RpcError(_status_of(r.code), r.message)


def _ended(e: Optional[BaseException]) -> BaseException:
    """What the jobs waiting on a stream that ended get."""
    if e is None:
        return RpcError(grpc.StatusCode.UNAVAILABLE, "the Produce stream ended before answering")
    if isinstance(e, grpc.RpcError):
        err = _from_grpc(e)
        if err.status == grpc.StatusCode.UNIMPLEMENTED:
            return Unsupported()
        return err
    return RpcError(grpc.StatusCode.UNAVAILABLE, f"the Produce stream failed: {e}")


class _AsyncStream:
    def __init__(self, call: Any) -> None:
        self.call = call
        self.pending: Dict[int, "asyncio.Future[Any]"] = {}
        self.next_id = 0
        self.ended = False
        # grpc.aio takes one write at a time on a call.
        self.writing = asyncio.Lock()
        self.connected = False
        self.reader: Optional["asyncio.Future[None]"] = None


class AsyncProducer:
    """Single enqueues on a Produce stream (:class:`leaseq.AsyncClient`)."""

    def __init__(self, stub: Any, metadata: Any) -> None:
        self._stub = stub
        self._metadata = metadata
        self._stream: Optional[_AsyncStream] = None
        self.unsupported = False

    def _open(self) -> _AsyncStream:
        s = _AsyncStream(self._stub.Produce(metadata=self._metadata))
        self._stream = s
        s.reader = asyncio.ensure_future(self._read(s))
        return s

    async def _read(self, s: _AsyncStream) -> None:
        err: Optional[BaseException] = None
        try:
            async for r in s.call:
                fut = s.pending.pop(r.id, None)
                if fut is not None and not fut.done():
                    a = _answer(r)
                    if isinstance(a, RpcError):
                        fut.set_exception(a)
                    else:
                        fut.set_result(a)
        except BaseException as e:  # noqa: BLE001 (the call's end, whatever it is)
            err = e
        s.ended = True
        if self._stream is s:
            self._stream = None
        ended = _ended(err)
        # A write racing the broker's UNIMPLEMENTED fails the iteration
        # with INTERNAL; the call's own status says what the broker said.
        if err is not None and not isinstance(ended, Unsupported) and not isinstance(err, asyncio.CancelledError):
            try:
                if await s.call.code() == grpc.StatusCode.UNIMPLEMENTED:
                    ended = Unsupported()
            except BaseException:  # noqa: BLE001
                pass
        if isinstance(ended, Unsupported):
            self.unsupported = True
        for fut in s.pending.values():
            if not fut.done():
                fut.set_exception(ended)
        s.pending.clear()
        if isinstance(err, asyncio.CancelledError):
            raise err

    async def enqueue(self, req: Any, timeout: Optional[float]) -> Any:
        """The job's EnqueueResponse; raises RpcError, or Unsupported."""
        if self.unsupported:
            raise Unsupported()
        s = self._stream or self._open()
        s.next_id += 1
        rid = s.next_id
        fut: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        s.pending[rid] = fut
        try:
            async with s.writing:
                if not s.connected:
                    # The broker's answer to the call (its headers) before
                    # the first write: a write racing an UNIMPLEMENTED
                    # ends the call with INTERNAL instead. One round trip
                    # per stream.
                    await s.call.initial_metadata()
                    if s.call.done():
                        raise asyncio.InvalidStateError("the Produce call ended at once")
                    s.connected = True
                await s.call.write(pb.ProduceRequest(id=rid, job=req))
        except asyncio.CancelledError:
            s.pending.pop(rid, None)
            raise
        except Exception:  # noqa: BLE001 (the call ended, or cannot go on)
            # The reader answers every job left when the call ends: end it
            # if it has not ended yet, and wait for that answer.
            if not s.call.done():
                s.call.cancel()
        try:
            if timeout is None:
                return await fut
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            s.pending.pop(rid, None)
            raise RpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer within {timeout} s (the job may or may not be enqueued)",
            ) from None
        finally:
            if not fut.done():
                s.pending.pop(rid, None)

    async def close(self) -> None:
        s, self._stream = self._stream, None
        if s is None:
            return
        try:
            async with s.writing:
                await s.call.done_writing()
        except BaseException:  # noqa: BLE001 (already ended)
            pass
        try:
            if s.reader is not None:
                await asyncio.wait_for(asyncio.shield(s.reader), 5)
        except BaseException:  # noqa: BLE001
            if s.reader is not None:
                s.reader.cancel()
