"""The examples in examples/ run against the broker (they are the README's
code), and a worker process stops gracefully on SIGTERM."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from util import queue_name

from leaseq import AdminClient, Client

HERE = Path(__file__).resolve().parents[1]
EXAMPLES = HERE / "examples"


class Proc:
    """An example as a child process, its output read line by line."""

    def __init__(self, name: str, env: dict) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(EXAMPLES / name)],
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.seen: list = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, pattern: str, timeout: float = 20) -> "re.Match[str]":
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.p.kill()
                pytest.fail(f"no line matching {pattern!r} within {timeout}s; output: {self.seen}")
            if line is None:
                pytest.fail(f"exited ({self.p.wait()}) before {pattern!r}; output: {self.seen}")
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m

    def finish(self, timeout: float = 30) -> int:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"did not exit within {timeout}s; output: {self.seen}")
        while (line := self.lines.get(timeout=5)) is not None:
            self.seen.append(line)
        return rc


def run_example(name: str, addr: str, q: str, **env) -> list:
    p = Proc(name, {"LEASEQ_ADDR": addr, "LEASEQ_QUEUE": q, **env})
    rc = p.finish(60)
    assert rc == 0, "\n".join(p.seen)
    return p.seen


def test_produce_example(addr):
    q = queue_name()
    out = run_example("produce.py", addr, q)
    assert out[0].startswith("enqueued ")
    with AdminClient(addr) as admin:
        stats = admin.get_queue(q).stats
        assert (stats.available, stats.scheduled) == (7, 1)
        assert [j.key for j in admin.list_jobs(q).items if j.key] == ["customer-42"]


def test_worker_example_outcomes_and_graceful_stop_on_sigterm(addr):
    q = queue_name()
    with Client(addr) as c, AdminClient(addr) as admin:
        poison = c.enqueue(q, b"not json")
        busy = c.enqueue(q, json.dumps({"busy": True}))
        p = Proc("worker.py", {"LEASEQ_ADDR": addr, "LEASEQ_QUEUE": q})
        for _ in range(2):
            p.expect("^started ")
        slow = c.enqueue(q, json.dumps({"seconds": 1.5}), dedup_key="slow")
        p.expect(f"^started {slow.job_id}")
        p.p.send_signal(signal.SIGTERM)  # mid-handler: it finishes, then settles
        p.expect(f"^finished {slow.job_id}")
        stopped = p.expect("^stopped ")
        assert p.finish() == 0
        assert "acked=1" in stopped.string and "dead_lettered=1" in stopped.string
        assert not c.enqueue(q, b"probe", dedup_key="slow").duplicate  # acked
        assert [j.id for j in admin.list_dead_letters(q).items] == [poison.job_id]
        info = admin.get_job(busy.job_id)
        assert (info.state, info.last_error) == ("scheduled", "mail server busy")


def test_async_example(addr):
    out = run_example("async_app.py", addr, queue_name())
    assert out[-1] == "acked 2"


def test_cancel_example_stops_both_handlers_and_settles_nothing(addr):
    q = queue_name()
    out = run_example("cancel.py", addr, q)
    assert out == ["render stopped: film", "export stopped: archive", "cancelled 2 acked 0"]
    with AdminClient(addr) as admin:
        for name in (q, f"{q}-export"):
            stats = admin.get_queue(name).stats
            assert (stats.available, stats.leased) == (0, 0)  # gone, not released


def test_burst_example_works_what_waits_then_exits(addr):
    out = run_example("burst.py", addr, queue_name())
    assert out[-1] == "sent 3 acked 3"


def test_admin_example(addr):
    q = queue_name()
    out = run_example("admin.py", addr, q)
    assert out[0] == f"{q} 5 0 waiting"
    assert out[-3].startswith(f"next {q}-nightly ")
    ran = out[-2].split()[1]
    assert out[-1] == f"schedules ['{q}-nightly']"
    with AdminClient(addr) as admin:
        assert admin.get_job(ran).payload == b'{"report": "daily"}'
        assert f"{q}-nightly" not in [s.name for s in admin.list_schedules(page_size=1000).items]


def test_tracing_example(addr):
    pytest.importorskip("opentelemetry.sdk")
    out = run_example("tracing.py", addr, queue_name())
    (line,) = [x for x in out if x.startswith("trace ")]
    _, trace_id, _, traceparent = line.split()
    assert traceparent.split("-")[1] == trace_id


def test_readme_python_blocks_are_the_examples():
    """Every ```python block of the README is cut from a file in examples/
    (which the tests above run), so the README shows code that works."""
    readme = (HERE / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks
    sources = [f.read_text() for f in EXAMPLES.glob("*.py")]
    for block in blocks:
        assert any(block in src for src in sources), f"README block not found in examples/:\n{block}"


def test_tasks_example(addr):
    q = queue_name()
    out = run_example("tasks.py", addr, q)
    assert out[-3:-1] == ["sent welcome to ada@example.com", "sent welcome to bob@example.com"]
    assert out[-1] == "timed 3 acked 2 dead-lettered 1"
    with AdminClient(addr) as admin:
        (dead,) = admin.list_dead_letters(q).items
        assert dead.last_error.startswith("payload is not a valid Email: ") and "subject" in dead.last_error


def test_results_example(addr):
    q = queue_name()
    out = run_example("results.py", addr, q)
    assert out[-2:] == ["sum 5", "completed s3://thumbs/cat.png"]


def test_testing_example_as_a_script_and_under_pytest(tmp_path):
    out = run_example("testing.py", "unused", "unused")
    assert out[-1] == "ok ['ada@example.com']"
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / "testing.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


def test_exactly_once_example_ships_each_order_once(addr, db_dsn):
    q = queue_name()
    out = run_example("exactly_once.py", addr, q, DATABASE_URL=db_dsn)
    assert [line for line in out if line.startswith("shipped ")] == [f"shipped order-{i}" for i in range(3)]
    assert out[-1] == "settled in SQL 3 acked 2 follow-ups 2", out
    import psycopg

    with psycopg.connect(db_dsn) as db:
        (emails,) = db.execute("select count(*) from leaseq.jobs where queue = %s", (f"{q}.emails",)).fetchone()
    assert emails == 2


def test_exactly_once_example_killed_between_every_two_steps_ships_each_order_once(addr, db_dsn):
    """The example's worker is killed with SIGKILL (its own process, by its
    PID) after the effect, after the SQL ack, and after the commit, each
    time started again on the same jobs; then it runs to the end. Every
    order is shipped exactly once: an effect whose transaction did not
    commit was rolled back with its ack (and the job delivered again), one
    that committed took the job with it."""
    import psycopg

    q = queue_name()
    env = {"LEASEQ_ADDR": addr, "LEASEQ_QUEUE": q, "DATABASE_URL": db_dsn}
    for i, step in enumerate(["effect", "ack", "commit"]):
        p = Proc("exactly_once.py", {**env, "LEASEQ_EXAMPLE_PAUSE": step, "LEASEQ_EXAMPLE_ENQUEUE": "1" if i == 0 else "0"})
        p.expect(f"^paused after {step}$")
        p.p.kill()  # SIGKILL, to the process this test started
        p.p.wait(10)
    p = Proc("exactly_once.py", {**env, "LEASEQ_EXAMPLE_ENQUEUE": "0"})
    assert p.finish(60) == 0, "\n".join(p.seen)
    table = q.replace(".", "_").replace("-", "_") + "_shipments"
    with psycopg.connect(db_dsn) as db:
        rows = db.execute(f"select order_ref, count(*), count(distinct job_id) from {table} group by 1 order by 1").fetchall()
        (left,) = db.execute("select count(*) from leaseq.jobs where queue = %s", (f"{q}.orders",)).fetchone()
        (emails,) = db.execute("select count(*) from leaseq.jobs where queue = %s", (f"{q}.emails",)).fetchone()
        (shipping,) = db.execute("select count(*) from leaseq.jobs where queue = %s", (f"{q}.shipping",)).fetchone()
        (dead,) = db.execute("select count(*) from leaseq.dead_jobs where queue like %s", (f"{q}.%",)).fetchone()
    assert rows == [(f"order-{i}", 1, 1) for i in range(3)], rows
    assert left == 0 and dead == 0
    # The follow-ups exist iff their ack committed: an email per shipping
    # job gone. (A shipping job whose ack was on its way when its worker was
    # killed can stay leased until its lease ends, 10 s, past the last run:
    # when a client resets its Consume stream, the broker drops the settle
    # tasks under way with it (crates/server/src/api/consume.rs), so an ack
    # with follow-ups in flight is rolled back and its lease kept until it
    # runs out.)
    assert emails + shipping == 2, (emails, shipping, p.seen)
