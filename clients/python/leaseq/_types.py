"""The types every client shares: jobs, results, outcomes, errors, and the
conversions between them and the generated protobuf messages."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json as _json
import threading
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
    overload,
)

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from leaseq import _tracing
from leaseq.v1 import queue_pb2 as pb

#: A length of time: seconds as a number, or a ``datetime.timedelta``.
Seconds = Union[int, float, dt.timedelta]


def seconds(value: Seconds) -> float:
    """Seconds as a float, from a number or a timedelta."""
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def duration(value: Seconds) -> duration_pb2.Duration:
    """A protobuf Duration from seconds or a timedelta."""
    total = seconds(value)
    whole = int(total)
    return duration_pb2.Duration(seconds=whole, nanos=round((total - whole) * 1e9))


def _timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    if value.tzinfo is None:
        # A naive datetime is ambiguous; refusing it beats guessing local time.
        raise ValueError("run_at: must be a timezone-aware datetime")
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(dt.timezone.utc))
    return ts


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _datetime(ts: timestamp_pb2.Timestamp) -> dt.datetime:
    # Timestamp.ToDatetime(tzinfo=) is newer than the protobuf floor.
    return _EPOCH + dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _opt_datetime(msg: Any, name: str) -> Optional[dt.datetime]:
    return _datetime(getattr(msg, name)) if msg.HasField(name) else None


def _opt_timedelta(msg: Any, name: str) -> Optional[dt.timedelta]:
    if not msg.HasField(name):
        return None
    d = getattr(msg, name)
    return dt.timedelta(seconds=d.seconds, microseconds=d.nanos // 1000)


# --- errors


class RpcError(grpc.RpcError):  # type: ignore[misc,unused-ignore]
    """A call the broker refused or could not answer.

    ``code`` is the gRPC status name (``"INVALID_ARGUMENT"`` with a message
    naming the field, ``"FAILED_PRECONDITION"`` for a lease token that is not
    current, ``"UNAVAILABLE"``: retry, ``"UNAUTHENTICATED"``,
    ``"PERMISSION_DENIED"``, ``"NOT_FOUND"``, ``"RESOURCE_EXHAUSTED"``...);
    ``details`` is the broker's message. It is also a ``grpc.RpcError``, whose
    ``code()``/``details()`` methods are :attr:`status` and :attr:`details`.
    """

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{status.name}: {details}")
        self.status = status
        self.code_name: str = status.name
        self._details = details

    @property
    def lease_lost(self) -> bool:
        """True for FAILED_PRECONDITION: the lease token is not current (the
        lease expired, was released, or the job was settled or cancelled)."""
        return self.status == grpc.StatusCode.FAILED_PRECONDITION

    # grpc.RpcError's call interface, so `except grpc.RpcError as e: e.code()`
    # keeps working.
    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self._details


def _from_grpc(e: grpc.RpcError) -> RpcError:
    """Wraps a grpc (sync or aio) error."""
    if isinstance(e, RpcError):
        return e
    try:
        status, details = e.code(), e.details() or ""
    except Exception:  # a bare grpc.RpcError without a call attached
        status, details = grpc.StatusCode.UNKNOWN, str(e)
    err = RpcError(status, details)
    err.__cause__ = e
    return err


def _status_of(code: int) -> grpc.StatusCode:
    for s in grpc.StatusCode:
        if s.value[0] == code:
            return s
    return grpc.StatusCode.UNKNOWN


# --- outcomes a handler raises


class Retry(Exception):
    """Raise from a handler to nack the job and have it retried ``after`` this
    long (None: the queue's backoff policy; 0: at once). ``reason`` becomes
    the job's ``last_error``."""

    def __init__(self, reason: str = "retry", *, after: Optional[Seconds] = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.after = after


class DeadLetter(Exception):
    """Raise from a handler to move the job to the dead letters now, with
    ``reason`` as its ``last_error``."""

    def __init__(self, reason: str = "dead-lettered by the handler") -> None:
        super().__init__(reason)
        self.reason = reason


class Ack:
    """Return from a handler to say more than "done" (returning anything
    else, ``None`` included, is a plain ack):

    - ``Ack([job, ...])``: **follow-up jobs** (:class:`NewJob`, e.g.
      ``task.job(payload)``), enqueued in the transaction that acks this
      one (``AckRequest.enqueue``): they exist if and only if the ack
      committed. A handler that raises enqueues none. A broker that did not
      list ``"ack.enqueue"`` in its first heartbeat would drop them: the
      worker then *nacks* the job with an error saying so
      (``WorkerStats.follow_ups_refused``), never acks it without them.
      Their ids are not handed back to the handler (the ack is sent after
      it returns); the worker logs them at DEBUG.
    - ``Ack.settled_in_sql()``: the handler settled its job itself, with
      ``select leaseq.ack(%s, %s)`` (``job.id``, ``job.lease_token``) or
      ``leaseq.nack`` in the transaction of its effect, and that
      transaction committed: the worker sends nothing and frees the
      handler's slot (``WorkerStats.settled_in_sql``); the broker gives the
      stream's credit back when the commit's NOTIFY reaches it. Follow-ups
      cannot go with it (insert them in that transaction with
      ``leaseq.enqueue``).

    - ``Ack(result=b"...")``: the job's **result** (bytes, at most the
      broker's ``--max-result-bytes``, 64 KiB by default), kept with its
      completed record and read back by ``client.wait(job_id)`` and
      ``AdminClient.get_job`` (``JobInfo.result``). A broker that did not
      list ``"ack.result"`` would drop it: the worker then nacks the job
      with an error saying so (``WorkerStats.results_refused``). It goes
      with follow-ups too (``Ack([...], result=...)``). A :class:`Task`
      handler's returned value (not None, not an ``Ack``) is sent as a JSON
      result.

    A middleware must return what ``next(job)`` returned, or the follow-ups
    and the result are lost."""

    __slots__ = ("enqueue", "in_sql", "result")

    def __init__(
        self, enqueue: Iterable["NewJob"] = (), *, result: Optional[bytes] = None, in_sql: bool = False
    ) -> None:
        if result is not None and not isinstance(result, (bytes, bytearray, memoryview)):
            raise TypeError(f"result: bytes are needed, not {type(result).__name__} (to_json(value) makes JSON bytes)")
        if result is not None and in_sql:
            raise ValueError("result: a job settled in SQL cannot carry a result (leaseq.ack in SQL takes none)")
        self.enqueue: Tuple["NewJob", ...] = tuple(enqueue)
        self.in_sql = in_sql
        self.result: Optional[bytes] = bytes(result) if result is not None else None

    @classmethod
    def settled_in_sql(cls) -> "Ack":
        """The job was acked (or nacked) in SQL by the handler: send nothing."""
        return cls(in_sql=True)

    def then(self, job: "NewJob") -> "Ack":
        """This ack with one more follow-up job."""
        return Ack((*self.enqueue, job), result=self.result, in_sql=self.in_sql)

    def __repr__(self) -> str:
        return f"Ack(enqueue={list(self.enqueue)!r}, result={self.result!r}, in_sql={self.in_sql})"


# --- jobs


@dataclass(frozen=True)
class EnqueueResult:
    job_id: str
    #: True when ``dedup_key`` matched a live job (or one holding it after
    #: completing: ``unique_for``); ``job_id`` is that job's.
    duplicate: bool
    #: True when the waiting job ``job_id`` took this enqueue's payload
    #: (``on_duplicate="replace"``).
    replaced: bool = False


@dataclass(frozen=True)
class AckResult:
    """One entry of ``ack_batch``: ``code`` is ``"OK"`` when the job was
    acked, ``"FAILED_PRECONDITION"`` when the token was not current."""

    job_id: str
    code: str
    message: str

    @property
    def ok(self) -> bool:
        return self.code == "OK"


@dataclass(frozen=True)
class Job:
    """One delivery: the job and the lease under which it is held."""

    id: str
    queue: str
    payload: bytes
    headers: Mapping[str, str]
    priority: int
    #: 1 on first delivery.
    attempt: int
    enqueued_at: dt.datetime
    #: The error text of the previous failed attempt, "" if none.
    last_error: str
    lease_token: str
    #: By the broker's (database's) clock.
    lease_expires_at: dt.datetime
    #: The job's key inside its queue (``enqueue(key=...)``), "" if none.
    key: str = ""
    #: Set by a Worker when the job is no longer its handler's to finish:
    #: the broker cancelled it (``AdminService.CancelJob``), the handler
    #: timed out, or the stop's grace ran out. A plain (thread) handler
    #: cannot be interrupted, so long-running ones should check
    #: ``job.cancelled.is_set()`` (or :meth:`is_cancelled`) and return;
    #: whatever they return then is not settled (a timeout is nacked).
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)

    def is_cancelled(self) -> bool:
        """``job.cancelled.is_set()``, without making the Event of a job
        whose handler was never cancelled."""
        ev = self.__dict__.get("cancelled")
        return ev is not None and bool(ev.is_set())

    def progress(self, fraction: float, message: str = "") -> None:
        """Says how far the handler is (advice, read back by
        ``AdminClient.get_job``: ``JobInfo.progress``/``progress_message``):
        ``fraction`` 0 to 1, ``message`` at most 256 bytes of UTF-8 without
        NUL (``ValueError`` naming the field otherwise). Returns at once,
        from an ``async def`` handler or a plain one's thread: on a Consume
        stream the report goes with the stream's next write, and only the
        latest one per job is kept until then (the broker writes a stream's
        at most once a second); on Subscribe, a ``ReportProgress`` call,
        one at a time per job, the latest waiting. A report the broker
        refuses (the lease is lost) is logged at DEBUG.

        Only for jobs a :class:`leaseq.Worker` runs (``RuntimeError``
        otherwise); raises :class:`RpcError` UNIMPLEMENTED, sending nothing,
        when the broker did not list ``"progress"`` in its first heartbeat."""
        check_progress(fraction, message)
        to = self.__dict__.get("_progress_to")
        if to is None:
            raise RuntimeError("job.progress: only for jobs delivered by a leaseq.Worker")
        to.report_progress(self, float(fraction), message)

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode()

    @overload
    def json(self) -> Any: ...

    @overload
    def json(self, into: Type[T]) -> T: ...

    def json(self, into: Optional[Type[Any]] = None) -> Any:
        """The payload parsed as JSON; with ``into``, made into that type: a
        pydantic model (``model_validate``), a dataclass (its fields as
        keywords) or any callable that takes the parsed value. Raises
        ``ValueError`` (``json.JSONDecodeError``) for a payload that is not
        JSON, and what the type raises for one that does not fit it; in a
        handler, raise :class:`DeadLetter` for those (retrying will not
        help)."""
        return from_json(self.payload, into)

    @classmethod
    def from_delivery(cls, d: pb.Delivery) -> "Job":
        # The hot path of every worker: the fields read on every job are
        # filled in at once; `headers`, the two datetimes and `cancelled`
        # (a threading.Event, so a Condition and a lock) when first read
        # (_lazy_field). Same values, same dataclass: only when they are made.
        j = d.job
        self = object.__new__(cls)
        self.__dict__.update(
            id=j.id,
            queue=j.queue,
            payload=j.payload,
            priority=j.priority,
            attempt=j.attempt,
            last_error=j.last_error,
            key=j.key,
            lease_token=d.lease_token,
            _delivery=d,
        )
        return self

    if not TYPE_CHECKING:  # (a __getattr__ would hide typos from mypy)

        def __getattr__(self, name: str) -> Any:
            return _lazy_field(self, name)


def _has_header(job: Job, name: str) -> bool:
    """``name in job.headers``, without making the headers' dict."""
    d = job.__dict__.get("_delivery")
    return name in (d.job.headers if d is not None else job.headers)


def _lazy_field(job: Job, name: str) -> Any:
    """A field of a Job made by ``from_delivery``, made on first read. Safe
    from any thread: ``dict.setdefault`` keeps the first value made, so
    every reader sees one ``cancelled`` Event."""
    fields = job.__dict__
    if name == "cancelled":
        return fields.setdefault(name, threading.Event())
    d = fields.get("_delivery")
    if d is None:
        raise AttributeError(name)
    if name == "headers":
        value: Any = dict(d.job.headers)
    elif name == "enqueued_at":
        value = _datetime(d.job.enqueued_at)
    elif name == "lease_expires_at":
        value = _datetime(d.lease_expires_at)
    else:
        raise AttributeError(name)
    return fields.setdefault(name, value)


T = TypeVar("T")


def to_json(value: Any) -> bytes:
    """A payload in JSON (UTF-8) from a pydantic model, a dataclass, or
    anything ``json.dumps`` takes: the producer's half of
    :meth:`Job.json`."""
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        value = dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return _json.dumps(value, separators=(",", ":")).encode()


def from_json(payload: Union[bytes, str], into: Optional[Type[Any]] = None) -> Any:
    """:meth:`Job.json` for a payload."""
    value = _json.loads(payload)
    if into is None:
        return value
    validate = getattr(into, "model_validate", None)
    if callable(validate):
        return validate(value)
    if dataclasses.is_dataclass(into):
        if not isinstance(value, dict):
            raise TypeError(f"a JSON object is needed for {into.__name__}, not {type(value).__name__}")
        return into(**value)
    return into(value)


#: What an enqueue whose ``dedup_key`` matches a live job does
#: (``EnqueueRequest.on_duplicate``).
OnDuplicate = Literal["keep", "replace"]
_ON_DUPLICATE = {"keep": pb.ON_DUPLICATE_KEEP, "replace": pb.ON_DUPLICATE_REPLACE}


@dataclass
class NewJob:
    """A job to enqueue; the fields mirror ``EnqueueRequest`` in queue.proto."""

    queue: str
    payload: Union[bytes, str] = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    delay: Optional[Seconds] = None
    run_at: Optional[dt.datetime] = None
    dedup_key: str = ""
    max_attempts: int = 0
    ttl: Optional[Seconds] = None
    #: The job's key inside its queue (at most 256 bytes; "" = none): in a
    #: queue with ``ordered_by_key`` the jobs of one key are delivered in
    #: enqueue order, at most the queue's ``key_concurrency`` at once.
    key: str = ""
    #: Unique for a window: once this job completes (is acked), its
    #: ``dedup_key`` stays held this many seconds (at most 366 days), so an
    #: enqueue with the key in that time returns this job (``duplicate``).
    #: A dead-lettered, cancelled or expired job holds nothing. Needs
    #: ``dedup_key``.
    unique_for: Optional[Seconds] = None
    #: ``"replace"`` (debounce): a waiting job (not leased) with the same
    #: ``dedup_key`` takes this payload, headers, priority and delay (counted
    #: from this enqueue) and keeps its id (``replaced``); a leased one is
    #: left as it is. ``"keep"`` (the default): nothing changes. Needs
    #: ``dedup_key`` when ``"replace"``.
    on_duplicate: OnDuplicate = "keep"

    def to_request(self, extra_headers: Optional[Mapping[str, str]] = None) -> pb.EnqueueRequest:
        payload = self.payload.encode() if isinstance(self.payload, str) else self.payload
        headers: Dict[str, str] = dict(extra_headers or {})
        headers.update(self.headers)  # the caller's own headers win
        req = pb.EnqueueRequest(
            queue=self.queue,
            payload=payload,
            headers=headers,
            priority=self.priority,
            dedup_key=self.dedup_key,
            max_attempts=self.max_attempts,
            key=self.key,
            on_duplicate=_ON_DUPLICATE[self.on_duplicate],
        )
        # Optional messages are set only when given: an absent `delay` and a
        # zero one are different requests to the broker.
        if self.delay is not None:
            req.delay.CopyFrom(duration(self.delay))
        if self.run_at is not None:
            req.run_at.CopyFrom(_timestamp(self.run_at))
        if self.ttl is not None:
            req.ttl.CopyFrom(duration(self.ttl))
        if self.unique_for is not None:
            req.unique_for.CopyFrom(duration(self.unique_for))
        return req


@dataclass(frozen=True)
class SettleResult:
    """The broker's answer to one ack, nack or extend sent on a Consume
    stream. ``op`` is ``"ack"``, ``"nack"`` or ``"extend"``; ``code`` the
    status name the unary call would have returned (``"OK"``,
    ``"FAILED_PRECONDITION"``, ``"INVALID_ARGUMENT"``, ``"UNAVAILABLE"``)."""

    job_id: str
    op: str
    code: str
    message: str = ""
    #: nack with code OK: the job went to the dead letters.
    dead_lettered: bool = False
    #: extend with code OK: the new expiry.
    lease_expires_at: Optional[dt.datetime] = None
    #: ack with code OK: the ids of its follow-up jobs, in order.
    enqueued: Tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    @property
    def lease_lost(self) -> bool:
        return self.code == "FAILED_PRECONDITION"

    def error(self) -> RpcError:
        return RpcError(_status_of(_CODES[self.code]), self.message)

    @classmethod
    def from_pb(cls, r: pb.SettleResult) -> "SettleResult":
        return cls(
            job_id=r.job_id,
            op=_OPS.get(r.op, "unspecified"),
            code=_status_of(r.code).name,
            message=r.message,
            dead_lettered=r.dead_lettered,
            lease_expires_at=_opt_datetime(r, "lease_expires_at"),
            enqueued=tuple(r.enqueued),
        )


@dataclass(frozen=True)
class Cancelled:
    """A stream's notice that a job it delivered was cancelled
    (``AdminService.CancelJob``) while this lease was current: the job is
    gone, the stream's credit for it is back, and an ack of it would be
    refused FAILED_PRECONDITION. Stop its handler and settle nothing. The
    raw streams hand it to their ``on_cancel`` callback; a
    :class:`leaseq.Worker` acts on it by itself."""

    job_id: str
    lease_token: str

    def matches(self, job: "Job") -> bool:
        """Whether this notice is about ``job`` (this delivery of it)."""
        return job.id == self.job_id and job.lease_token == self.lease_token

    @classmethod
    def from_pb(cls, c: pb.Cancelled) -> "Cancelled":
        return cls(c.job_id, c.lease_token)


#: The callback of a raw stream's :class:`Cancelled` notices.
CancelCallback = Callable[[Cancelled], None]


_OPS = {pb.SETTLE_OP_ACK: "ack", pb.SETTLE_OP_NACK: "nack", pb.SETTLE_OP_EXTEND: "extend"}
_CODES = {s.name: s.value[0] for s in grpc.StatusCode}


# --- request builders shared by the sync and async clients


#: What the clients can read (``SubscribeRequest.accept``): several
#: deliveries in one message. A broker that predates it ignores the field
#: and sends one delivery a message; both are read alike.
ACCEPT = ("deliveries",)


def subscribe_request(
    queues: Union[str, Sequence[str]],
    consumer: str,
    max_in_flight: int,
    lease: Optional[Seconds],
    batched: bool = True,
) -> pb.SubscribeRequest:
    qs = [queues] if isinstance(queues, str) else list(queues)
    req = pb.SubscribeRequest(
        queues=qs, consumer=consumer, max_in_flight=max_in_flight, accept=ACCEPT if batched else ()
    )
    if lease is not None:
        req.lease.CopyFrom(duration(lease))
    return req


def nack_request(
    job_id: str,
    lease_token: str,
    error: str,
    retry_after: Optional[Seconds],
    dead_letter: bool,
) -> pb.NackRequest:
    req = pb.NackRequest(job_id=job_id, lease_token=lease_token, error=error, dead_letter=dead_letter)
    if retry_after is not None:
        req.retry_after.CopyFrom(duration(retry_after))
    return req


def extend_request(job_id: str, lease_token: str, lease: Seconds) -> pb.ExtendLeaseRequest:
    return pb.ExtendLeaseRequest(job_id=job_id, lease_token=lease_token, lease=duration(lease))


AckItem = Union[Job, Tuple[str, str]]


#: The feature a broker lists in a stream's first heartbeat when it takes
#: follow-up jobs with an ack (``AckRequest.enqueue``).
ACK_ENQUEUE = "ack.enqueue"
NO_ACK_ENQUEUE = (
    'ack.enqueue: the broker did not list "ack.enqueue" in its first heartbeat (it predates '
    "follow-up jobs): it cannot enqueue follow-up jobs with an ack"
)


#: ... and when it keeps an ack's result (``AckRequest.result``).
ACK_RESULT = "ack.result"
NO_ACK_RESULT = (
    'ack.result: the broker did not list "ack.result" in its first heartbeat (it predates '
    "results): it would ack the job and drop its result"
)
#: ... and when it takes progress reports (``ConsumeRequest.progress``,
#: ``ReportProgress``).
PROGRESS = "progress"
NO_PROGRESS = (
    'progress: the broker did not list "progress" in its first heartbeat (it predates '
    "progress reports): nothing was sent"
)
#: ``Progress.message``'s limit, in bytes of UTF-8.
MAX_PROGRESS_MESSAGE = 256


def check_progress(fraction: float, message: str) -> None:
    """Raises ``ValueError`` naming the field for a report the broker would
    refuse."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ValueError(f"fraction: a number from 0 to 1 is needed, not {type(fraction).__name__}")
    if not 0.0 <= fraction <= 1.0:  # NaN fails both
        raise ValueError(f"fraction: must be 0 to 1, not {fraction}")
    if not isinstance(message, str):
        raise ValueError(f"message: a str is needed, not {type(message).__name__}")
    n = len(message.encode())
    if n > MAX_PROGRESS_MESSAGE:
        raise ValueError(f"message: is {n} bytes, the limit is {MAX_PROGRESS_MESSAGE} bytes")
    if "\0" in message:
        raise ValueError("message: must not contain NUL")


def ack_request(
    job_id: str, lease_token: str, enqueue: Iterable[NewJob] = (), result: Optional[bytes] = None
) -> pb.AckRequest:
    req = pb.AckRequest(job_id=job_id, lease_token=lease_token)
    if result:
        req.result = result
    if enqueue:
        # The caller's trace context (the handler's span), as an enqueue
        # from the handler would carry.
        trace = _tracing.inject()
        req.enqueue.extend(j.to_request(trace) for j in enqueue)
    return req


def ack_batch_request(acks: "List[AckItem]") -> pb.AckBatchRequest:
    entries = []
    for a in acks:
        if isinstance(a, Job):
            entries.append(pb.AckRequest(job_id=a.id, lease_token=a.lease_token))
        else:
            entries.append(pb.AckRequest(job_id=a[0], lease_token=a[1]))
    return pb.AckBatchRequest(acks=entries)


def ack_results(resp: pb.AckBatchResponse) -> List[AckResult]:
    return [AckResult(r.job_id, _status_of(r.code).name, r.message) for r in resp.results]


# --- waiting for a job


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended (``client.wait(job_id)``): ``state`` is
    ``"completed"`` (acked; ``result`` is its ack's result, ``b""`` when it
    had none), ``"dead"`` (in the dead letters: ``last_error``,
    ``dead_reason`` ``max_attempts``/``nacked``/``expired``),
    ``"cancelled"`` (deleted by CancelJob) or ``"unknown"`` (neither live
    nor recorded: acked without a result in a queue that keeps no
    completed records, purged, expired, or never enqueued)."""

    job_id: str
    state: str
    result: bytes = b""
    last_error: str = ""
    dead_reason: str = ""
    #: When it ended (database time); None for "unknown".
    finished_at: Optional[dt.datetime] = None

    @property
    def completed(self) -> bool:
        return self.state == "completed"

    @overload
    def json(self) -> Any: ...

    @overload
    def json(self, into: Type[T]) -> T: ...

    def json(self, into: Optional[Type[Any]] = None) -> Any:
        """The result parsed as JSON (as :meth:`Job.json`); ``None`` for an
        empty result."""
        if not self.result:
            return None
        return from_json(self.result, into)

    @classmethod
    def from_pb(cls, r: pb.WaitJobResponse) -> "JobOutcome":
        state = pb.WaitState.Name(r.state).removeprefix("WAIT_STATE_").lower() if r.state in _FINAL else "unknown"
        finished = _datetime(r.finished_at) if r.HasField("finished_at") else None
        return cls(r.job_id, state, bytes(r.result), r.last_error, r.dead_reason, finished)


_FINAL = frozenset({pb.WAIT_STATE_COMPLETED, pb.WAIT_STATE_DEAD, pb.WAIT_STATE_CANCELLED, pb.WAIT_STATE_UNKNOWN})


class JobFailed(Exception):
    """A job waited for with ``.result()`` did not complete: ``outcome``
    says how it ended (dead, cancelled or unknown)."""

    def __init__(self, outcome: JobOutcome) -> None:
        what = {
            "dead": f"is dead ({outcome.dead_reason}): {outcome.last_error}",
            "cancelled": "was cancelled",
        }.get(outcome.state, "is unknown (no live job and no record)")
        super().__init__(f"job {outcome.job_id} {what}")
        self.outcome = outcome


def _wait_outcome(r: pb.WaitJobResponse) -> Optional[JobOutcome]:
    """The outcome a WaitJob message carries; None for a live state."""
    return JobOutcome.from_pb(r) if r.state in _FINAL else None


def wait_request(job_id: str, timeout: Seconds) -> pb.WaitJobRequest:
    req = pb.WaitJobRequest(job_id=job_id)
    req.timeout.CopyFrom(duration(timeout))
    return req
