"""The operator API (``leaseq.v1.AdminService``): :class:`AdminClient`
(blocking) and :class:`AsyncAdminClient` (asyncio), with the same methods.
A broker with ``--auth-file`` needs a token with ``admin`` on ``*``."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
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
class KeyOverride:
    """What one named key of a queue gets instead of the queue's per-key
    settings (``update_queue(key_overrides=[...])``). A setting left at 0 is
    the queue's; give at least one. The broker checks the ranges
    (INVALID_ARGUMENT naming ``key_overrides[i].field``)."""

    #: 1 to 256 bytes.
    key: str
    #: Most jobs of this key leased at once (1 to 1000).
    concurrency: int = 0
    #: Jobs of this key started per second (0.001 to 1,000,000); its bucket
    #: holds ``max(1, ceil(rate_limit))`` tokens.
    rate_limit: float = 0.0
    #: Jobs of this key per turn in a fair round (1 to 100; 0 = 1).
    weight: int = 0

    def _to_pb(self) -> Any:
        return apb.KeyOverride(key=self.key, concurrency=self.concurrency, rate_limit=self.rate_limit, weight=self.weight)


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
    #: The jobs of one key are delivered in enqueue order, at most
    #: ``key_concurrency`` of a key leased at once; a retry keeps its place
    #: at the head of its key, a dead letter or a cancel lets the key go on.
    ordered_by_key: bool = False
    #: Most jobs of one key leased at once, across replicas; 0 = off. With
    #: ``ordered_by_key`` the first N of the key in order; without, any N.
    key_concurrency: int = 0
    #: Fair shares: each lease round serves the keys with jobs waiting in
    #: turn (up to a key's ``weight`` per turn), so one key's backlog does not
    #: delay another key's jobs.
    fair_by_key: bool = False
    #: Jobs of one key started per second, across replicas; 0 = no limit.
    key_rate_limit: float = 0.0
    #: Bucket size of ``key_rate_limit`` (0 when there is none).
    key_rate_burst: int = 0
    #: Named keys' own settings, in key order.
    key_overrides: Tuple[KeyOverride, ...] = ()


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
    #: Keys with jobs waiting (available or scheduled), counted up to
    #: 10,000: ``keys_waiting_capped`` then says there are at least that many.
    keys_waiting: int = 0
    #: Keys with jobs leased.
    keys_leased: int = 0
    keys_waiting_capped: bool = False


@dataclass(frozen=True)
class KeyInfo:
    """One key of a queue's live jobs (:meth:`AdminClient.list_keys`)."""

    key: str
    #: Jobs of the key available or scheduled.
    waiting: int
    leased: int
    #: How long its oldest deliverable job has waited; None when none is.
    oldest_available_age: Optional[dt.timedelta]


#: ``order`` of :meth:`AdminClient.list_keys`: by key (paged), or the keys
#: with the most jobs waiting first (one page).
KeyOrder = Literal["key", "waiting"]
_KEY_ORDERS = {"key": "KEY_ORDER_KEY", "waiting": "KEY_ORDER_WAITING"}


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
    #: The job's key inside its queue; "" if none.
    key: str = ""
    #: Completed jobs acked with a result (``Ack(result=...)``): the result.
    result: bytes = b""
    #: Live jobs whose handler reported progress (``job.progress``): the
    #: latest written report; ``progress_at`` None when none was.
    progress: float = 0.0
    progress_message: str = ""
    progress_at: Optional[dt.datetime] = None


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


#: A schedule's policy for a tick while its previous job is still live:
#: "allow" (enqueue anyway) or "skip" (enqueue nothing for that tick).
Overlap = Literal["allow", "skip"]
#: Which ticks missed while the broker was down (or the schedule paused)
#: are enqueued: "none", "one" (the latest) or "all" (the latest
#: ``catch_up_limit``).
CatchUp = Literal["none", "one", "all"]

_OVERLAP = {"allow": apb.OVERLAP_POLICY_ALLOW, "skip": apb.OVERLAP_POLICY_SKIP}
_OVERLAP_NAMES = {v: k for k, v in _OVERLAP.items()}
_CATCH_UP = {"none": apb.CATCH_UP_POLICY_NONE, "one": apb.CATCH_UP_POLICY_ONE, "all": apb.CATCH_UP_POLICY_ALL}
_CATCH_UP_NAMES = {v: k for k, v in _CATCH_UP.items()}


@dataclass(frozen=True)
class JobTemplate:
    """The job a schedule enqueues at each tick."""

    queue: str
    payload: Union[bytes, str] = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    #: 0 = the queue's default.
    max_attempts: int = 0
    #: None = never expires.
    ttl: Optional[Seconds] = None

    def _to_pb(self) -> Any:
        payload = self.payload.encode() if isinstance(self.payload, str) else self.payload
        t = apb.JobTemplate(
            queue=self.queue, payload=payload, headers=dict(self.headers), priority=self.priority,
            max_attempts=self.max_attempts,
        )  # fmt: skip
        if self.ttl is not None:
            t.ttl.CopyFrom(duration(self.ttl))
        return t


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule as stored (defaults filled in) and where it stands."""

    name: str
    cron: str
    #: IANA name; "" = UTC.
    time_zone: str
    #: The template; its ``payload`` is bytes and ``ttl`` a timedelta (None:
    #: never expires).
    job: JobTemplate
    overlap: Overlap
    catch_up: CatchUp
    catch_up_limit: int
    paused: bool
    #: The next tick (while paused: where it stood).
    next_run_at: Optional[dt.datetime]
    #: The last tick that enqueued a job (or run_schedule's), and that job.
    last_tick_at: Optional[dt.datetime]
    last_job_id: str
    created_at: Optional[dt.datetime]
    updated_at: Optional[dt.datetime]


@dataclass(frozen=True)
class ScheduleRun:
    """What ``run_schedule`` enqueued."""

    job_id: str
    #: The time the run is recorded under (its ``leaseq-schedule-tick`` header).
    tick_at: Optional[dt.datetime]


def _schedule_info(i: Any) -> ScheduleInfo:
    s, j = i.schedule, i.schedule.job
    template = JobTemplate(j.queue, j.payload, dict(j.headers), j.priority, j.max_attempts, _opt_timedelta(j, "ttl"))
    return ScheduleInfo(
        name=s.name, cron=s.cron, time_zone=s.time_zone, job=template,
        overlap=_OVERLAP_NAMES.get(s.overlap, "allow"),  # type: ignore[arg-type]
        catch_up=_CATCH_UP_NAMES.get(s.catch_up, "one"),  # type: ignore[arg-type]
        catch_up_limit=s.catch_up_limit, paused=s.paused,
        next_run_at=_opt_datetime(i, "next_run_at"), last_tick_at=_opt_datetime(i, "last_tick_at"),
        last_job_id=i.last_job_id, created_at=_opt_datetime(i, "created_at"),
        updated_at=_opt_datetime(i, "updated_at"),
    )  # fmt: skip


def _policy(name: str, value: Optional[str], codes: Mapping[str, Any]) -> Any:
    if value is None:
        return 0  # unspecified: the default (create), unchanged (update)
    if value not in codes:
        raise ValueError(f"{name}: must be one of {sorted(codes)}, not {value!r}")
    return codes[value]


def _create_schedule_request(
    name: str, cron: str, job: JobTemplate, time_zone: str, overlap: Optional[Overlap],
    catch_up: Optional[CatchUp], catch_up_limit: int, paused: bool,
) -> Any:  # fmt: skip
    return apb.CreateScheduleRequest(
        schedule=apb.Schedule(
            name=name, cron=cron, time_zone=time_zone, job=job._to_pb(),
            overlap=_policy("overlap", overlap, _OVERLAP), catch_up=_policy("catch_up", catch_up, _CATCH_UP),
            catch_up_limit=catch_up_limit, paused=paused,
        )
    )  # fmt: skip


def _update_schedule_request(
    name: str, cron: Optional[str], time_zone: Optional[str], job: Optional[JobTemplate], overlap: Optional[Overlap],
    catch_up: Optional[CatchUp], catch_up_limit: Optional[int], paused: Optional[bool],
) -> Any:  # fmt: skip
    req = apb.UpdateScheduleRequest(
        name=name, overlap=_policy("overlap", overlap, _OVERLAP), catch_up=_policy("catch_up", catch_up, _CATCH_UP)
    )
    if job is not None:
        req.job.CopyFrom(job._to_pb())
    for field_name, value in (("cron", cron), ("time_zone", time_zone), ("catch_up_limit", catch_up_limit), ("paused", paused)):
        if value is not None:
            setattr(req, field_name, value)
    return req


def _run_result(resp: Any) -> ScheduleRun:
    return ScheduleRun(resp.job_id, _opt_datetime(resp, "tick_at"))


def _schedules_page(resp: Any) -> Page[ScheduleInfo]:
    return Page([_schedule_info(i) for i in resp.schedules], resp.next_page_token)


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
            ordered_by_key=s.ordered_by_key,
            key_concurrency=s.key_concurrency,
            fair_by_key=s.fair_by_key,
            key_rate_limit=s.key_rate_limit,
            key_rate_burst=s.key_rate_burst,
            key_overrides=tuple(
                KeyOverride(o.key, o.concurrency, o.rate_limit, o.weight) for o in s.key_overrides
            ),
        ),
        stats=QueueStats(
            available=st.available,
            scheduled=st.scheduled,
            leased=st.leased,
            dead=st.dead,
            oldest_available_age=_opt_timedelta(st, "oldest_available_age"),
            streams=st.streams,
            consumers=st.consumers,
            keys_waiting=st.keys_waiting,
            keys_leased=st.keys_leased,
            keys_waiting_capped=st.keys_waiting_capped,
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
        key=j.key,
        result=bytes(j.result),
        progress=j.progress,
        progress_message=j.progress_message,
        progress_at=_opt_datetime(j, "progress_at"),
    )


def _jobs_page(resp: Any) -> Page[JobInfo]:
    return Page([_job_info(j) for j in resp.jobs], resp.next_page_token)


def _keys_page(resp: Any) -> Page[KeyInfo]:
    return Page(
        [
            KeyInfo(k.key, k.waiting, k.leased, _opt_timedelta(k, "oldest_available_age"))
            for k in resp.keys
        ],
        resp.next_page_token,
    )


def _list_keys_request(queue: str, order: KeyOrder, page_size: int, page_token: str) -> Any:
    if order not in _KEY_ORDERS:
        raise ValueError(f"order: must be one of {sorted(_KEY_ORDERS)}")
    return apb.ListKeysRequest(
        queue=queue, order=_KEY_ORDERS[order], page_size=page_size, page_token=page_token
    )


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
    ordered_by_key: Optional[bool] = None,
    key_concurrency: Optional[int] = None,
    fair_by_key: Optional[bool] = None,
    key_rate_limit: Optional[float] = None,
    key_rate_burst: Optional[int] = None,
    key_overrides: Optional[Sequence[KeyOverride]] = None,
) -> Any:
    req = apb.UpdateQueueRequest(queue=queue, create=create)
    if key_overrides is not None:
        # A str is a Sequence too: refuse it (and anything but KeyOverride)
        # here rather than send a list of something else.
        if isinstance(key_overrides, (str, bytes)) or not all(
            isinstance(o, KeyOverride) for o in key_overrides
        ):
            raise TypeError("key_overrides: expected a sequence of leaseq.KeyOverride")
        req.key_overrides.SetInParent()  # an empty list is sent: it clears them
        req.key_overrides.overrides.extend(o._to_pb() for o in key_overrides)
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
        ("ordered_by_key", ordered_by_key),
        ("key_concurrency", key_concurrency),
        ("fair_by_key", fair_by_key),
        ("key_rate_limit", key_rate_limit),
        ("key_rate_burst", key_rate_burst),
    ):
        if scalar is not None:
            setattr(req, name, scalar)
    return req


def _selector(queue: str, ids: Optional[Sequence[str]], all: bool) -> Any:
    return apb.DeadLettersSelector(queue=queue, ids=list(ids or ()), all=all)


def _list_jobs_request(
    queue: str,
    state: Optional[JobState],
    page_size: int,
    page_token: str,
    include_payload: bool,
    key: str = "",
) -> Any:
    if state is not None and state not in _STATE_CODES:
        raise ValueError(f"state: must be one of {sorted(_STATE_CODES)}")
    return apb.ListJobsRequest(
        queue=queue,
        state=_STATE_CODES[state or "unspecified"],
        page_size=page_size,
        page_token=page_token,
        include_payload=include_payload,
        key=key,
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
        ordered_by_key: Optional[bool] = None,
        key_concurrency: Optional[int] = None,
        fair_by_key: Optional[bool] = None,
        key_rate_limit: Optional[float] = None,
        key_rate_burst: Optional[int] = None,
        key_overrides: Optional[Sequence[KeyOverride]] = None,
    ) -> QueueInfo:
        """Changes the settings given (None: unchanged). ``create`` makes the
        queue if it does not exist instead of NOT_FOUND.

        Keys (see :class:`QueueSettings`): ``ordered_by_key`` True sets
        ``key_concurrency`` to 1 unless it is given, False clears it;
        ``key_concurrency`` 1 to 1000 (0 clears it), with or without order;
        ``key_rate_limit`` 0.001 to 1,000,000 per second per key (0 clears
        it and its burst); ``key_rate_burst`` 1 to 1,000,000 (0 = the
        default); ``key_overrides`` replaces the queue's whole list of
        :class:`KeyOverride` (at most 1000, keys unique; ``[]`` clears
        it)."""
        req = _update_request(
            queue, default_lease, max_attempts, backoff_base, backoff_cap, completed_retention,
            paused, create, concurrency_limit, rate_limit, rate_burst, ordered_by_key, key_concurrency,
            fair_by_key, key_rate_limit, key_rate_burst, key_overrides,
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
        key: str = "",
    ) -> Page[JobInfo]:
        """Jobs of ``queue`` ("" = every queue) in enqueue order. ``state``
        None: every live job; "dead"; "completed". ``key``: only the jobs
        of this key (exact match; "" = every job)."""
        req = _list_jobs_request(queue, state, page_size, page_token, include_payload, key)
        return _jobs_page(self._call(self._stub.ListJobs, req))

    def list_keys(
        self, queue: str, *, order: KeyOrder = "key", page_size: int = 0, page_token: str = ""
    ) -> Page[KeyInfo]:
        """The keys of ``queue``'s live jobs with their jobs waiting and
        leased: by key (paged), or ``order="waiting"``: the ``page_size``
        keys with the most jobs waiting (one page)."""
        req = _list_keys_request(queue, order, page_size, page_token)
        return _keys_page(self._call(self._stub.ListKeys, req))

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

    # --- schedules (docs/design/schedules.md)

    def create_schedule(
        self,
        name: str,
        cron: str,
        *,
        queue: str,
        payload: Union[bytes, str] = b"",
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        time_zone: str = "",
        overlap: Optional[Overlap] = None,
        catch_up: Optional[CatchUp] = None,
        catch_up_limit: int = 0,
        paused: bool = False,
    ) -> ScheduleInfo:
        """A schedule that enqueues a job to ``queue`` at each tick of
        ``cron`` (five fields, or six with seconds first; ``@hourly``...) in
        ``time_zone`` (IANA name; "" = UTC). ``overlap`` (default "allow"),
        ``catch_up`` (default "one") and ``catch_up_limit`` (with "all"; 0 =
        10) as :class:`ScheduleInfo`. INVALID_ARGUMENT names the field (a
        bad cron, time zone or template); ALREADY_EXISTS for a taken name."""
        job = JobTemplate(queue, payload, headers or {}, priority, max_attempts, ttl)
        req = _create_schedule_request(name, cron, job, time_zone, overlap, catch_up, catch_up_limit, paused)
        return _schedule_info(self._call(self._stub.CreateSchedule, req))

    def get_schedule(self, name: str) -> ScheduleInfo:
        return _schedule_info(self._call(self._stub.GetSchedule, apb.GetScheduleRequest(name=name)))

    def list_schedules(self, *, page_size: int = 0, page_token: str = "") -> Page[ScheduleInfo]:
        """Schedules in name order."""
        req = apb.ListSchedulesRequest(page_size=page_size, page_token=page_token)
        return _schedules_page(self._call(self._stub.ListSchedules, req))

    def update_schedule(
        self,
        name: str,
        *,
        cron: Optional[str] = None,
        time_zone: Optional[str] = None,
        job: Optional[JobTemplate] = None,
        overlap: Optional[Overlap] = None,
        catch_up: Optional[CatchUp] = None,
        catch_up_limit: Optional[int] = None,
        paused: Optional[bool] = None,
    ) -> ScheduleInfo:
        """Changes what is given (None: unchanged); ``job`` replaces the
        whole template."""
        req = _update_schedule_request(name, cron, time_zone, job, overlap, catch_up, catch_up_limit, paused)
        return _schedule_info(self._call(self._stub.UpdateSchedule, req))

    def pause_schedule(self, name: str) -> ScheduleInfo:
        """A paused schedule fires nothing (``run_schedule`` still enqueues)."""
        return _schedule_info(self._call(self._stub.PauseSchedule, apb.PauseScheduleRequest(name=name)))

    def resume_schedule(self, name: str) -> ScheduleInfo:
        return _schedule_info(self._call(self._stub.ResumeSchedule, apb.ResumeScheduleRequest(name=name)))

    def delete_schedule(self, name: str) -> None:
        """Deletes it (the jobs it enqueued stay); NOT_FOUND if there is none."""
        self._call(self._stub.DeleteSchedule, apb.DeleteScheduleRequest(name=name))

    def run_schedule(self, name: str) -> ScheduleRun:
        """Enqueues the schedule's job now, paused or not."""
        return _run_result(self._call(self._stub.RunSchedule, apb.RunScheduleRequest(name=name)))

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
        ordered_by_key: Optional[bool] = None,
        key_concurrency: Optional[int] = None,
        fair_by_key: Optional[bool] = None,
        key_rate_limit: Optional[float] = None,
        key_rate_burst: Optional[int] = None,
        key_overrides: Optional[Sequence[KeyOverride]] = None,
    ) -> QueueInfo:
        req = _update_request(
            queue, default_lease, max_attempts, backoff_base, backoff_cap, completed_retention,
            paused, create, concurrency_limit, rate_limit, rate_burst, ordered_by_key, key_concurrency,
            fair_by_key, key_rate_limit, key_rate_burst, key_overrides,
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
        key: str = "",
    ) -> Page[JobInfo]:
        req = _list_jobs_request(queue, state, page_size, page_token, include_payload, key)
        return _jobs_page(await self._call(self._stub.ListJobs, req))

    async def list_keys(
        self, queue: str, *, order: KeyOrder = "key", page_size: int = 0, page_token: str = ""
    ) -> Page[KeyInfo]:
        req = _list_keys_request(queue, order, page_size, page_token)
        return _keys_page(await self._call(self._stub.ListKeys, req))

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

    # --- schedules (docs/design/schedules.md)

    async def create_schedule(
        self,
        name: str,
        cron: str,
        *,
        queue: str,
        payload: Union[bytes, str] = b"",
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        time_zone: str = "",
        overlap: Optional[Overlap] = None,
        catch_up: Optional[CatchUp] = None,
        catch_up_limit: int = 0,
        paused: bool = False,
    ) -> ScheduleInfo:
        """A schedule that enqueues a job to ``queue`` at each tick of
        ``cron`` (five fields, or six with seconds first; ``@hourly``...) in
        ``time_zone`` (IANA name; "" = UTC). ``overlap`` (default "allow"),
        ``catch_up`` (default "one") and ``catch_up_limit`` (with "all"; 0 =
        10) as :class:`ScheduleInfo`. INVALID_ARGUMENT names the field (a
        bad cron, time zone or template); ALREADY_EXISTS for a taken name."""
        job = JobTemplate(queue, payload, headers or {}, priority, max_attempts, ttl)
        req = _create_schedule_request(name, cron, job, time_zone, overlap, catch_up, catch_up_limit, paused)
        return _schedule_info(await self._call(self._stub.CreateSchedule, req))

    async def get_schedule(self, name: str) -> ScheduleInfo:
        return _schedule_info(await self._call(self._stub.GetSchedule, apb.GetScheduleRequest(name=name)))

    async def list_schedules(self, *, page_size: int = 0, page_token: str = "") -> Page[ScheduleInfo]:
        """Schedules in name order."""
        req = apb.ListSchedulesRequest(page_size=page_size, page_token=page_token)
        return _schedules_page(await self._call(self._stub.ListSchedules, req))

    async def update_schedule(
        self,
        name: str,
        *,
        cron: Optional[str] = None,
        time_zone: Optional[str] = None,
        job: Optional[JobTemplate] = None,
        overlap: Optional[Overlap] = None,
        catch_up: Optional[CatchUp] = None,
        catch_up_limit: Optional[int] = None,
        paused: Optional[bool] = None,
    ) -> ScheduleInfo:
        """Changes what is given (None: unchanged); ``job`` replaces the
        whole template."""
        req = _update_schedule_request(name, cron, time_zone, job, overlap, catch_up, catch_up_limit, paused)
        return _schedule_info(await self._call(self._stub.UpdateSchedule, req))

    async def pause_schedule(self, name: str) -> ScheduleInfo:
        """A paused schedule fires nothing (``run_schedule`` still enqueues)."""
        return _schedule_info(await self._call(self._stub.PauseSchedule, apb.PauseScheduleRequest(name=name)))

    async def resume_schedule(self, name: str) -> ScheduleInfo:
        return _schedule_info(await self._call(self._stub.ResumeSchedule, apb.ResumeScheduleRequest(name=name)))

    async def delete_schedule(self, name: str) -> None:
        """Deletes it (the jobs it enqueued stay); NOT_FOUND if there is none."""
        await self._call(self._stub.DeleteSchedule, apb.DeleteScheduleRequest(name=name))

    async def run_schedule(self, name: str) -> ScheduleRun:
        """Enqueues the schedule's job now, paused or not."""
        return _run_result(await self._call(self._stub.RunSchedule, apb.RunScheduleRequest(name=name)))

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
