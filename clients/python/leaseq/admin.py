"""The operator API (``leaseq.v1.AdminService``): :class:`AdminClient`
(blocking) and :class:`AsyncAdminClient` (asyncio), with the same methods.
A broker with ``--auth-file`` needs a token with ``admin`` on ``*``."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Generic,
    Iterator,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

import grpc

from leaseq._connection import TLS, Connection
from leaseq._types import Seconds, _from_grpc, _opt_datetime, _opt_timedelta, duration
from leaseq.v1 import admin_pb2 as apb
from leaseq.v1 import admin_pb2_grpc as apb_grpc


#: A job's state, as ``GetJob``/``ListJobs`` report it.
JobState = Literal["available", "scheduled", "leased", "dead", "completed", "unspecified"]

_STATES = {
    apb.JOB_STATE_UNSPECIFIED: "unspecified",
    apb.JOB_STATE_AVAILABLE: "available",
    apb.JOB_STATE_SCHEDULED: "scheduled",
    apb.JOB_STATE_LEASED: "leased",
    apb.JOB_STATE_DEAD: "dead",
    apb.JOB_STATE_COMPLETED: "completed",
}
_STATE_CODES = {v: k for k, v in _STATES.items()}

T = TypeVar("T")


@dataclass(frozen=True)
class QueueSettings:
    default_lease: Optional[dt.timedelta]
    max_attempts: int
    backoff_base: Optional[dt.timedelta]
    backoff_cap: Optional[dt.timedelta]
    #: None: acked jobs are not kept.
    completed_retention: Optional[dt.timedelta]
    paused: bool
    #: 0 = no limit.
    concurrency_limit: int
    #: Jobs per second; 0 = no limit.
    rate_limit: float
    rate_burst: int


@dataclass(frozen=True)
class QueueStats:
    available: int
    scheduled: int
    leased: int
    dead: int
    #: None when nothing is available.
    oldest_available_age: Optional[dt.timedelta]
    streams: int
    consumers: int


@dataclass(frozen=True)
class QueueInfo:
    name: str
    settings: QueueSettings
    stats: QueueStats
    created_at: Optional[dt.datetime]


@dataclass(frozen=True)
class JobInfo:
    id: str
    queue: str
    state: JobState
    #: Empty in lists unless include_payload was set.
    payload: bytes
    headers: Mapping[str, str]
    priority: int
    attempt: int
    max_attempts: int
    dedup_key: str
    enqueued_at: Optional[dt.datetime]
    run_at: Optional[dt.datetime]
    expires_at: Optional[dt.datetime]
    last_error: str
    leased_by: str
    lease_expires_at: Optional[dt.datetime]
    #: Dead jobs: "max_attempts", "nacked" or "expired".
    dead_reason: str
    died_at: Optional[dt.datetime]
    completed_at: Optional[dt.datetime]
    completed_by: str


@dataclass(frozen=True)
class Page(Generic[T]):
    items: List[T]
    #: Pass as ``page_token`` for the next page; "" on the last page.
    next_page_token: str


@dataclass(frozen=True)
class PurgeQueueResult:
    purged: int
    purged_completed: int


@dataclass(frozen=True)
class RequeueResult:
    requeued: int
    #: Left in the dead letters: a live job of the queue has the same dedup_key.
    skipped_duplicates: int


@dataclass(frozen=True)
class QueuesSnapshot:
    """One push of ``watch_queues``."""

    queues: List[QueueInfo]
    sent_at: Optional[dt.datetime]


def _queue_info(q: Any) -> QueueInfo:
    s, st = q.settings, q.stats
    return QueueInfo(
        name=q.name,
        settings=QueueSettings(
            default_lease=_opt_timedelta(s, "default_lease"),
            max_attempts=s.max_attempts,
            backoff_base=_opt_timedelta(s, "backoff_base"),
            backoff_cap=_opt_timedelta(s, "backoff_cap"),
            completed_retention=_opt_timedelta(s, "completed_retention"),
            paused=s.paused,
            concurrency_limit=s.concurrency_limit,
            rate_limit=s.rate_limit,
            rate_burst=s.rate_burst,
        ),
        stats=QueueStats(
            available=st.available,
            scheduled=st.scheduled,
            leased=st.leased,
            dead=st.dead,
            oldest_available_age=_opt_timedelta(st, "oldest_available_age"),
            streams=st.streams,
            consumers=st.consumers,
        ),
        created_at=_opt_datetime(q, "created_at"),
    )


def _job_info(j: Any) -> JobInfo:
    return JobInfo(
        id=j.id,
        queue=j.queue,
        state=_STATES.get(j.state, "unspecified"),  # type: ignore[arg-type]
        payload=j.payload,
        headers=dict(j.headers),
        priority=j.priority,
        attempt=j.attempt,
        max_attempts=j.max_attempts,
        dedup_key=j.dedup_key,
        enqueued_at=_opt_datetime(j, "enqueued_at"),
        run_at=_opt_datetime(j, "run_at"),
        expires_at=_opt_datetime(j, "expires_at"),
        last_error=j.last_error,
        leased_by=j.leased_by,
        lease_expires_at=_opt_datetime(j, "lease_expires_at"),
        dead_reason=j.dead_reason,
        died_at=_opt_datetime(j, "died_at"),
        completed_at=_opt_datetime(j, "completed_at"),
        completed_by=j.completed_by,
    )


def _jobs_page(resp: Any) -> Page[JobInfo]:
    return Page([_job_info(j) for j in resp.jobs], resp.next_page_token)


def _snapshot(resp: Any) -> QueuesSnapshot:
    return QueuesSnapshot([_queue_info(q) for q in resp.queues], _opt_datetime(resp, "sent_at"))


def _update_request(
    queue: str,
    default_lease: Optional[Seconds],
    max_attempts: Optional[int],
    backoff_base: Optional[Seconds],
    backoff_cap: Optional[Seconds],
    completed_retention: Optional[Seconds],
    paused: Optional[bool],
    create: bool,
    concurrency_limit: Optional[int],
    rate_limit: Optional[float],
    rate_burst: Optional[int],
) -> Any:
    req = apb.UpdateQueueRequest(queue=queue, create=create)
    for name, value in (
        ("default_lease", default_lease),
        ("backoff_base", backoff_base),
        ("backoff_cap", backoff_cap),
        ("completed_retention", completed_retention),
    ):
        if value is not None:
            getattr(req, name).CopyFrom(duration(value))
    for name, scalar in (
        ("max_attempts", max_attempts),
        ("paused", paused),
        ("concurrency_limit", concurrency_limit),
        ("rate_limit", rate_limit),
        ("rate_burst", rate_burst),
    ):
        if scalar is not None:
            setattr(req, name, scalar)
    return req


def _selector(queue: str, ids: Optional[Sequence[str]], all: bool) -> Any:
    return apb.DeadLettersSelector(queue=queue, ids=list(ids or ()), all=all)


def _list_jobs_request(
    queue: str, state: Optional[JobState], page_size: int, page_token: str, include_payload: bool
) -> Any:
    if state is not None and state not in _STATE_CODES:
        raise ValueError(f"state: must be one of {sorted(_STATE_CODES)}")
    return apb.ListJobsRequest(
        queue=queue,
        state=_STATE_CODES[state or "unspecified"],
        page_size=page_size,
        page_token=page_token,
        include_payload=include_payload,
    )


class AdminClient:
    """Blocking AdminService client. Connection arguments as
    :class:`leaseq.Client`; every call raises :class:`leaseq.RpcError`
    (INVALID_ARGUMENT naming the field, NOT_FOUND for an unknown queue or
    job, PERMISSION_DENIED without ``admin``)."""

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
        self._stub = apb_grpc.AdminServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, metadata=self._conn.metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None

    def list_queues(self, *, page_size: int = 0, page_token: str = "") -> Page[QueueInfo]:
        resp = self._call(self._stub.ListQueues, apb.ListQueuesRequest(page_size=page_size, page_token=page_token))
        return Page([_queue_info(q) for q in resp.queues], resp.next_page_token)

    def get_queue(self, queue: str) -> QueueInfo:
        return _queue_info(self._call(self._stub.GetQueue, apb.GetQueueRequest(queue=queue)))

    def update_queue(
        self,
        queue: str,
        *,
        default_lease: Optional[Seconds] = None,
        max_attempts: Optional[int] = None,
        backoff_base: Optional[Seconds] = None,
        backoff_cap: Optional[Seconds] = None,
        completed_retention: Optional[Seconds] = None,
        paused: Optional[bool] = None,
        create: bool = False,
        concurrency_limit: Optional[int] = None,
        rate_limit: Optional[float] = None,
        rate_burst: Optional[int] = None,
    ) -> QueueInfo:
        """Changes the settings given (None: unchanged). ``create`` makes the
        queue if it does not exist instead of NOT_FOUND."""
        req = _update_request(
            queue, default_lease, max_attempts, backoff_base, backoff_cap, completed_retention,
            paused, create, concurrency_limit, rate_limit, rate_burst,
        )  # fmt: skip
        return _queue_info(self._call(self._stub.UpdateQueue, req))

    def pause_queue(self, queue: str) -> QueueInfo:
        return _queue_info(self._call(self._stub.PauseQueue, apb.PauseQueueRequest(queue=queue)))

    def resume_queue(self, queue: str) -> QueueInfo:
        return _queue_info(self._call(self._stub.ResumeQueue, apb.ResumeQueueRequest(queue=queue)))

    def purge_queue(self, queue: str) -> PurgeQueueResult:
        resp = self._call(self._stub.PurgeQueue, apb.PurgeQueueRequest(queue=queue))
        return PurgeQueueResult(resp.purged, resp.purged_completed)

    def get_job(self, job_id: str) -> JobInfo:
        return _job_info(self._call(self._stub.GetJob, apb.GetJobRequest(job_id=job_id)))

    def list_jobs(
        self,
        queue: str = "",
        *,
        state: Optional[JobState] = None,
        page_size: int = 0,
        page_token: str = "",
        include_payload: bool = False,
    ) -> Page[JobInfo]:
        """Jobs of ``queue`` ("" = every queue) in enqueue order. ``state``
        None: every live job; "dead"; "completed"."""
        req = _list_jobs_request(queue, state, page_size, page_token, include_payload)
        return _jobs_page(self._call(self._stub.ListJobs, req))

    def cancel_job(self, job_id: str) -> bool:
        """Deletes a live job; True if it was leased (its holder's settle
        then fails with FAILED_PRECONDITION)."""
        return bool(self._call(self._stub.CancelJob, apb.CancelJobRequest(job_id=job_id)).was_leased)

    def list_dead_letters(
        self, queue: str = "", *, page_size: int = 0, page_token: str = "", include_payload: bool = False
    ) -> Page[JobInfo]:
        req = apb.ListDeadLettersRequest(
            queue=queue, page_size=page_size, page_token=page_token, include_payload=include_payload
        )
        return _jobs_page(self._call(self._stub.ListDeadLetters, req))

    def requeue_dead_letters(
        self, queue: str = "", *, ids: Optional[Sequence[str]] = None, all: bool = False
    ) -> RequeueResult:
        """Moves dead letters back to their queue (attempt 0): the ``ids``,
        or every one of ``queue`` with ``all=True``."""
        resp = self._call(self._stub.RequeueDeadLetters, _selector(queue, ids, all))
        return RequeueResult(resp.requeued, resp.skipped_duplicates)

    def purge_dead_letters(self, queue: str = "", *, ids: Optional[Sequence[str]] = None, all: bool = False) -> int:
        """Deletes dead letters for good; returns how many."""
        return int(self._call(self._stub.PurgeDeadLetters, _selector(queue, ids, all)).purged)

    def watch_queues(self, queues: Sequence[str] = (), *, interval: Optional[Seconds] = None) -> Iterator[QueuesSnapshot]:
        """Queue statistics at once, then on every change (and at least every
        ``interval``). Closing the generator ends the stream."""
        req = apb.WatchQueuesRequest(queues=list(queues))
        if interval is not None:
            req.interval.CopyFrom(duration(interval))
        call = self._stub.WatchQueues(req, metadata=self._conn.metadata)
        try:
            for resp in call:
                yield _snapshot(resp)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None
        finally:
            call.cancel()


class AsyncAdminClient:
    """asyncio AdminService client, with the methods of :class:`AdminClient`."""

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
        self._stub = apb_grpc.AdminServiceStub(self._channel)  # type: ignore[no-untyped-call,unused-ignore]

    async def __aenter__(self) -> "AsyncAdminClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._conn.metadata, timeout=self._timeout)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None

    async def list_queues(self, *, page_size: int = 0, page_token: str = "") -> Page[QueueInfo]:
        req = apb.ListQueuesRequest(page_size=page_size, page_token=page_token)
        resp = await self._call(self._stub.ListQueues, req)
        return Page([_queue_info(q) for q in resp.queues], resp.next_page_token)

    async def get_queue(self, queue: str) -> QueueInfo:
        return _queue_info(await self._call(self._stub.GetQueue, apb.GetQueueRequest(queue=queue)))

    async def update_queue(
        self,
        queue: str,
        *,
        default_lease: Optional[Seconds] = None,
        max_attempts: Optional[int] = None,
        backoff_base: Optional[Seconds] = None,
        backoff_cap: Optional[Seconds] = None,
        completed_retention: Optional[Seconds] = None,
        paused: Optional[bool] = None,
        create: bool = False,
        concurrency_limit: Optional[int] = None,
        rate_limit: Optional[float] = None,
        rate_burst: Optional[int] = None,
    ) -> QueueInfo:
        req = _update_request(
            queue, default_lease, max_attempts, backoff_base, backoff_cap, completed_retention,
            paused, create, concurrency_limit, rate_limit, rate_burst,
        )  # fmt: skip
        return _queue_info(await self._call(self._stub.UpdateQueue, req))

    async def pause_queue(self, queue: str) -> QueueInfo:
        return _queue_info(await self._call(self._stub.PauseQueue, apb.PauseQueueRequest(queue=queue)))

    async def resume_queue(self, queue: str) -> QueueInfo:
        return _queue_info(await self._call(self._stub.ResumeQueue, apb.ResumeQueueRequest(queue=queue)))

    async def purge_queue(self, queue: str) -> PurgeQueueResult:
        resp = await self._call(self._stub.PurgeQueue, apb.PurgeQueueRequest(queue=queue))
        return PurgeQueueResult(resp.purged, resp.purged_completed)

    async def get_job(self, job_id: str) -> JobInfo:
        return _job_info(await self._call(self._stub.GetJob, apb.GetJobRequest(job_id=job_id)))

    async def list_jobs(
        self,
        queue: str = "",
        *,
        state: Optional[JobState] = None,
        page_size: int = 0,
        page_token: str = "",
        include_payload: bool = False,
    ) -> Page[JobInfo]:
        req = _list_jobs_request(queue, state, page_size, page_token, include_payload)
        return _jobs_page(await self._call(self._stub.ListJobs, req))

    async def cancel_job(self, job_id: str) -> bool:
        resp = await self._call(self._stub.CancelJob, apb.CancelJobRequest(job_id=job_id))
        return bool(resp.was_leased)

    async def list_dead_letters(
        self, queue: str = "", *, page_size: int = 0, page_token: str = "", include_payload: bool = False
    ) -> Page[JobInfo]:
        req = apb.ListDeadLettersRequest(
            queue=queue, page_size=page_size, page_token=page_token, include_payload=include_payload
        )
        return _jobs_page(await self._call(self._stub.ListDeadLetters, req))

    async def requeue_dead_letters(
        self, queue: str = "", *, ids: Optional[Sequence[str]] = None, all: bool = False
    ) -> RequeueResult:
        resp = await self._call(self._stub.RequeueDeadLetters, _selector(queue, ids, all))
        return RequeueResult(resp.requeued, resp.skipped_duplicates)

    async def purge_dead_letters(
        self, queue: str = "", *, ids: Optional[Sequence[str]] = None, all: bool = False
    ) -> int:
        return int((await self._call(self._stub.PurgeDeadLetters, _selector(queue, ids, all))).purged)

    async def watch_queues(
        self, queues: Sequence[str] = (), *, interval: Optional[Seconds] = None
    ) -> AsyncIterator[QueuesSnapshot]:
        req = apb.WatchQueuesRequest(queues=list(queues))
        if interval is not None:
            req.interval.CopyFrom(duration(interval))
        call = self._stub.WatchQueues(req, metadata=self._conn.metadata)
        try:
            async for resp in call:
                yield _snapshot(resp)
        except grpc.RpcError as e:
            raise _from_grpc(e) from None
        finally:
            call.cancel()


__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "JobInfo",
    "JobState",
    "Page",
    "PurgeQueueResult",
    "QueueInfo",
    "QueueSettings",
    "QueueStats",
    "QueuesSnapshot",
    "RequeueResult",
]
