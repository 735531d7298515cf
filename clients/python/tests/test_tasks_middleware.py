"""Tasks (a typed payload declared once: producer and handler), middleware
around handlers, and leaseq.testing (a throwaway broker, drain), against
the real broker."""

import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from util import queue_name, run

from leaseq import AdminClient, AsyncClient, Client, Job, Retry, Task, Worker
from leaseq.testing import TestBroker, drain, drain_async


@dataclass
class Email:
    to: str
    subject: str = "hello"


def test_task_enqueue_and_typed_handler_and_dead_letter_of_a_bad_payload(addr):
    q = queue_name("task")
    worker = Worker(addr, max_in_flight=4)
    got = []

    @worker.task(q, Email)
    def send(email: Email, job: Job) -> None:
        got.append((email, job.queue))

    assert isinstance(send, Task) and send.queue == q and send.handler is not None
    with Client(addr) as c, AdminClient(addr) as admin:
        ok = send.enqueue(c, Email("a@example.com"), priority=3)
        assert admin.get_job(ok.job_id).payload == b'{"to":"a@example.com","subject":"hello"}'
        bad = c.enqueue(q, b'{"to": "b@example.com", "cc": "x"}')
        not_json = c.enqueue(q, b"not json")
        with pytest.raises(TypeError, match="Email is needed"):
            send.enqueue(c, {"to": "c@example.com"})  # type: ignore[arg-type]
        stats = drain(worker)
        assert got == [(Email("a@example.com"), q)]
        assert (stats.acked, stats.dead_lettered) == (1, 2)
        dead = {j.id: j.last_error for j in admin.list_dead_letters(q).items}
        assert dead[bad.job_id].startswith("payload is not a valid Email: ") and "cc" in dead[bad.job_id]
        assert dead[not_json.job_id].startswith("payload is not a valid Email: Expecting value")


def test_task_declared_once_async_handler_of_the_payload_only(addr):
    task = Task(queue_name("task"), Email)
    worker = Worker(addr)
    got = []

    @worker.task(task)
    async def send(email: Email) -> None:
        got.append(email.to)

    async def main():
        async with AsyncClient(addr) as c:
            for i in range(3):
                await task.enqueue_async(c, Email(f"{i}@example.com"))
        return await drain_async(worker)

    assert run(main()).acked == 3
    assert sorted(got) == ["0@example.com", "1@example.com", "2@example.com"]
    with pytest.raises(TypeError, match="payload type"):
        worker.task("other")  # type: ignore[call-overload]


def test_async_middleware_outermost_first_keeps_the_outcome(addr):
    q = queue_name("mw")
    trail = []

    async def outer(job, next):
        trail.append("outer in")
        try:
            return await next(job)
        except Exception as e:
            trail.append(f"outer saw {type(e).__name__}")
            raise  # keeps the handler's outcome
        finally:
            trail.append("outer out")

    worker = Worker(addr, middleware=[outer])

    @worker.use
    async def inner(job, next):
        trail.append("inner in")
        await next(job)
        trail.append("inner out")

    @worker.handler(q)
    async def handle(job):
        trail.append("handler")
        if job.text == "again":
            raise Retry("later, please", after=3600)

    with Client(addr) as c, AdminClient(addr) as admin:
        c.enqueue(q, b"fine")
        stats = drain(worker)
        assert trail == ["outer in", "inner in", "handler", "inner out", "outer out"]
        trail.clear()
        again = c.enqueue(q, b"again")
        stats = drain(worker)
        assert trail == ["outer in", "inner in", "handler", "outer saw Retry", "outer out"]
        info = admin.get_job(again.job_id)  # a Retry stays a retry: scheduled an hour on
        assert (info.state, info.last_error, stats.nacked, stats.dead_lettered) == ("scheduled", "later, please", 1, 0)
        assert info.run_at is not None and info.enqueued_at is not None


def test_plain_middleware_can_decide_the_outcome(addr):
    q = queue_name("mw")
    seen = []

    def swallow(job, next):
        try:
            next(job)
        except ValueError as e:
            seen.append(str(e))  # returns: the job is acked

    worker = Worker(addr, [q], lambda job: (_ for _ in ()).throw(ValueError(job.text)), middleware=[swallow])
    with Client(addr) as c:
        c.enqueue(q, b"boom")
        stats = drain(worker)
    assert seen == ["boom"] and (stats.acked, stats.nacked) == (1, 0)


def test_middleware_of_the_other_kind_is_refused_at_run(addr):
    worker = Worker(addr)

    @worker.handler(queue_name("mw"))
    async def handle(job):
        pass

    worker.use(lambda job, next: next(job))
    with pytest.raises(ValueError, match="is plain .* but the handler of queue .* is async"):
        worker.run(handle_signals=False, burst=True)


def test_test_broker_starts_serves_and_stops_what_it_started(tmp_path):
    with TestBroker() as broker:
        pid, q = broker.pid, queue_name("tb")
        assert pid is not None and broker.addr.startswith("127.0.0.1:")
        data_dir = broker._dir
        assert data_dir is not None and os.path.isdir(data_dir)
        with Client(broker.addr) as c:
            c.enqueue(q, b"1")
            c.enqueue(q, b"2")
        got = []
        stats = drain(lambda job: got.append(job.text), q, broker.addr)
        assert sorted(got) == ["1", "2"] and stats.acked == 2
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # (reaped by wait(): the PID is free)
    assert not os.path.exists(data_dir)
    with pytest.raises(RuntimeError, match="not running"):
        broker.addr


def test_test_broker_reports_a_broker_that_cannot_start():
    with pytest.raises(RuntimeError, match="exit code 2"):
        TestBroker(args=["--no-such-flag"]).start()


def test_the_pytest_plugin_gives_a_session_broker(tmp_path):
    """What a user's suite does: `pytest_plugins = ["leaseq.testing"]` in
    its conftest.py; the two tests share one broker."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["leaseq.testing"]\n')
    (tmp_path / "test_user.py").write_text(textwrap.dedent('''
        from leaseq import Client
        from leaseq.testing import drain

        seen = []

        def test_one(leaseq_addr):
            with Client(leaseq_addr) as c:
                c.enqueue("emails", b"hi")
            assert drain(lambda job: seen.append(job.text), "emails", leaseq_addr).acked == 1
            seen.append(leaseq_addr)

        def test_two(leaseq_broker):
            assert seen == ["hi", leaseq_broker.addr]
    '''))
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout
