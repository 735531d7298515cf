"""Tasks: a queue and the type of its payloads, declared once, shared by the
producer (:meth:`Task.enqueue`) and the worker (:meth:`Worker.task`)."""

from __future__ import annotations

import datetime as dt
import inspect
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, Optional, Type, TypeVar, Union

from leaseq._types import (
    Ack,
    DeadLetter,
    EnqueueResult,
    Job,
    JobFailed,
    JobOutcome,
    NewJob,
    Seconds,
    from_json,
    to_json,
)

if TYPE_CHECKING:
    from leaseq.aio import AsyncClient
    from leaseq.client import Client

P = TypeVar("P")

#: A task's handler: ``f(payload)`` or ``f(payload, job)``, ``async def`` or
#: plain, as for :meth:`Worker.handler`.
TaskHandler = Union[Callable[[P], Any], Callable[[P, Job], Any]]


class Task(Generic[P]):
    """The jobs of ``queue``, whose payloads are ``payload_type`` in JSON: a
    dataclass, a pydantic model, or any callable that takes the parsed JSON
    value (``int``, ``dict``...).

    ::

        send_email = Task("emails", Email)          # once, in a module both import
        send_email.enqueue(client, Email("a@example.com", "hi"), priority=5)

        @worker.task(send_email)
        async def send(email: Email) -> None: ...

    ``@worker.task("emails", Email)`` makes the Task and registers the
    handler in one go, and returns the Task."""

    def __init__(self, queue: str, payload_type: Type[P]) -> None:
        self.queue = queue
        self.payload_type = payload_type
        #: The function registered with ``@worker.task``, if any (to call it
        #: directly, e.g. in a unit test).
        self.handler: Optional[TaskHandler[P]] = None

    def __repr__(self) -> str:
        return f"Task({self.queue!r}, {_type_name(self.payload_type)})"

    def job(
        self,
        payload: P,
        *,
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        delay: Optional[Seconds] = None,
        run_at: Optional[dt.datetime] = None,
        dedup_key: str = "",
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        key: str = "",
    ) -> NewJob:
        """The job for ``payload`` (for ``enqueue_batch``). Raises
        ``TypeError`` for a payload that is not a ``payload_type`` (when
        that is a class) or that JSON cannot write."""
        t = self.payload_type
        if isinstance(t, type) and not isinstance(payload, t):
            raise TypeError(f"payload: a {_type_name(t)} is needed for task {self.queue!r}, not {type(payload).__name__}")
        return NewJob(self.queue, to_json(payload), headers or {}, priority, delay, run_at, dedup_key, max_attempts, ttl, key)

    def enqueue(
        self,
        client: "Client",
        payload: P,
        *,
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        delay: Optional[Seconds] = None,
        run_at: Optional[dt.datetime] = None,
        dedup_key: str = "",
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        key: str = "",
    ) -> EnqueueResult:
        """Enqueues ``payload`` with a :class:`leaseq.Client`; the options
        as :meth:`Client.enqueue`."""
        j = self.job(payload,
            headers=headers, priority=priority, delay=delay, run_at=run_at,
            dedup_key=dedup_key, max_attempts=max_attempts, ttl=ttl, key=key,
        )  # fmt: skip
        return client.enqueue(
            j.queue, j.payload, headers=j.headers, priority=j.priority, delay=j.delay, run_at=j.run_at,
            dedup_key=j.dedup_key, max_attempts=j.max_attempts, ttl=j.ttl, key=j.key,
        )  # fmt: skip

    async def enqueue_async(
        self,
        client: "AsyncClient",
        payload: P,
        *,
        headers: Optional[Mapping[str, str]] = None,
        priority: int = 0,
        delay: Optional[Seconds] = None,
        run_at: Optional[dt.datetime] = None,
        dedup_key: str = "",
        max_attempts: int = 0,
        ttl: Optional[Seconds] = None,
        key: str = "",
    ) -> EnqueueResult:
        """:meth:`enqueue` with a :class:`leaseq.AsyncClient`."""
        j = self.job(payload,
            headers=headers, priority=priority, delay=delay, run_at=run_at,
            dedup_key=dedup_key, max_attempts=max_attempts, ttl=ttl, key=key,
        )  # fmt: skip
        return await client.enqueue(
            j.queue, j.payload, headers=j.headers, priority=j.priority, delay=j.delay, run_at=j.run_at,
            dedup_key=j.dedup_key, max_attempts=j.max_attempts, ttl=j.ttl, key=j.key,
        )  # fmt: skip

    def submit(self, client: "Client", payload: P, **options: Any) -> JobHandle:
        """Enqueues ``payload`` (``options`` as :meth:`enqueue`) and returns
        a :class:`JobHandle` to wait for its result::

            total = add.submit(client, Pair(2, 3)).result(timeout=30)

        The handler's returned value is the result (sent as JSON)."""
        r = self.enqueue(client, payload, **options)
        return JobHandle(client, r.job_id, r.duplicate)

    async def submit_async(self, client: "AsyncClient", payload: P, **options: Any) -> AsyncJobHandle:
        """:meth:`submit` with a :class:`leaseq.AsyncClient`:
        ``await (await task.submit_async(c, p)).result()``."""
        r = await self.enqueue_async(client, payload, **options)
        return AsyncJobHandle(client, r.job_id, r.duplicate)

    def decode(self, job: Job) -> P:
        """The job's payload as a ``payload_type``; raises
        :class:`leaseq.DeadLetter` (``payload is not a valid <type>: <why>``)
        when it is not one: retrying will not make it one."""
        try:
            value: P = from_json(job.payload, self.payload_type)
        except Exception as e:
            raise DeadLetter(f"payload is not a valid {_type_name(self.payload_type)}: {e}") from e
        return value

    def _handler_for(self, fn: TaskHandler[P]) -> Callable[[Job], Any]:
        """The job handler that decodes the payload and calls ``fn``: async
        if ``fn`` is, with the job as a second argument if it takes one."""
        with_job = _takes_two(fn)
        decode = self.decode
        call: Callable[..., Any] = fn
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):

            async def handle_async(job: Job) -> Any:
                payload = decode(job)
                # The handler's return value (an Ack) is the worker's to read.
                return _as_result(await (call(payload, job) if with_job else call(payload)))

            return handle_async

        def handle(job: Job) -> Any:
            payload = decode(job)
            return _as_result(call(payload, job) if with_job else call(payload))

        return handle


def _as_result(value: Any) -> Any:
    """A task handler's return value as the worker reads it: None and an
    :class:`Ack` as they are, anything else the job's result in JSON."""
    if value is None or isinstance(value, Ack):
        return value
    return Ack(result=to_json(value))


class JobHandle:
    """A job enqueued by :meth:`Task.submit`: :meth:`result` waits for its
    outcome (``WaitJob``, no polling), as Celery's ``AsyncResult.get``."""

    def __init__(self, client: "Client", job_id: str, duplicate: bool = False) -> None:
        self.client, self.job_id, self.duplicate = client, job_id, duplicate

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"

    def wait(self, timeout: Seconds = 3600) -> JobOutcome:
        """How the job ended (:meth:`leaseq.Client.wait`)."""
        return self.client.wait(self.job_id, timeout)

    def result(self, timeout: Seconds = 3600, into: Optional[Type[Any]] = None) -> Any:
        """Waits for the job and returns its result parsed as JSON (with
        ``into``, made into that type, as :meth:`leaseq.Job.json`); None
        when it completed without one. Raises :class:`leaseq.JobFailed`
        when it ended otherwise (dead, cancelled, unknown) and
        :class:`leaseq.RpcError` DEADLINE_EXCEEDED past ``timeout``."""
        outcome = self.wait(timeout)
        if not outcome.completed:
            raise JobFailed(outcome)
        return outcome.json(into) if into is not None else outcome.json()


class AsyncJobHandle:
    """:class:`JobHandle` for an :class:`leaseq.AsyncClient`
    (:meth:`Task.submit_async`)."""

    def __init__(self, client: "AsyncClient", job_id: str, duplicate: bool = False) -> None:
        self.client, self.job_id, self.duplicate = client, job_id, duplicate

    def __repr__(self) -> str:
        return f"AsyncJobHandle({self.job_id!r})"

    async def wait(self, timeout: Seconds = 3600) -> JobOutcome:
        return await self.client.wait(self.job_id, timeout)

    async def result(self, timeout: Seconds = 3600, into: Optional[Type[Any]] = None) -> Any:
        outcome = await self.wait(timeout)
        if not outcome.completed:
            raise JobFailed(outcome)
        return outcome.json(into) if into is not None else outcome.json()


def _takes_two(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _type_name(t: Any) -> str:
    return getattr(t, "__qualname__", None) or repr(t)


__all__ = ["AsyncJobHandle", "JobHandle", "Task", "TaskHandler"]

