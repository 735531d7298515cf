"""Test harness: a real leaseq broker process over real PostgreSQL.

- ``LEASEQ_ADDR`` (set by clients/run-tests.sh): the broker most tests use.
  Without it, one is started for the session.
- Brokers started here run ``LEASEQ_BIN`` (default: the repository's
  target/debug/leaseq) on 127.0.0.1 and a free port, against ``DATABASE_URL``
  if set, else the embedded cluster in ``LEASEQ_DATA_DIR`` (a fresh temporary
  directory if unset). A second broker on the same directory reuses the
  running cluster, so the restart test does not initialise another one.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[3]
SERVICE = "leaseq.v1.QueueService"

# The suite tests the package a user installs: clients/setup.sh builds the
# sdist and the wheel with `python -m build` and installs the wheel into the
# venv (clients/run-tests.sh runs pytest so that the sources beside it are
# not on sys.path). LEASEQ_TEST_SOURCES=1 lets a developer run it against
# an editable install instead.
import leaseq as _leaseq  # noqa: E402

_SOURCES = Path(__file__).resolve().parents[1] / "leaseq"
if not os.environ.get("LEASEQ_TEST_SOURCES") and Path(_leaseq.__file__).resolve().parent == _SOURCES:
    raise RuntimeError(
        f"leaseq is imported from the sources ({_SOURCES}), not from the installed wheel: "
        "run the suite with clients/run-tests.sh (or set LEASEQ_TEST_SOURCES=1)"
    )


def health(addr: str, timeout: float = 1.0, creds=None):
    """The broker's health status for the queue service, or None if unreachable."""
    ch = grpc.secure_channel(addr, creds) if creds else grpc.insecure_channel(addr)
    with ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout
            )
            return resp.status
        except grpc.RpcError:
            return None


class Broker:
    """The real ``leaseq serve`` as a child process.

    The first start binds port 0 and reads the port from the broker's own
    "leaseq serving" log line: a port picked here and bound later could be
    taken meanwhile by a broker of a parallel test run, whose health check
    would then answer for ours. A restart binds the same port again.
    """

    def __init__(self, db_env: dict[str, str], extra_args=(), health_creds=None) -> None:
        self.db_env = db_env
        self.extra_args = list(extra_args)
        # TLS brokers answer health checks over TLS only.
        self.health_creds = health_creds
        self.addr: str | None = None
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> None:
        binary = os.environ.get("LEASEQ_BIN") or str(REPO / "target/debug/leaseq")
        if not os.access(binary, os.X_OK):
            pytest.fail(f"no broker binary at {binary}: run `cargo build` or set LEASEQ_BIN")
        env = {**os.environ, **self.db_env, "RUST_LOG": "warn,leaseq_server::server=info,leaseq::server=info"}
        if "DATABASE_URL" not in self.db_env:
            env.pop("DATABASE_URL", None)
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", self.addr or "127.0.0.1:0", "--log-format", "json",
             "--heartbeat-interval", "1s", "--reap-interval", "200ms",
             "--health-interval", "200ms", "--drain-grace", "5s", *self.extra_args],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )
        bound: queue.Queue = queue.Queue()
        threading.Thread(target=self._read_log, args=(self.proc, bound), daemon=True).start()
        try:
            self.addr = bound.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            pytest.fail(f"broker did not start serving within {timeout}s")
        if self.addr is None:
            pytest.fail(f"broker exited with {self.proc.wait()} before serving")
        deadline = time.monotonic() + timeout
        while health(self.addr, creds=self.health_creds) != health_pb2.HealthCheckResponse.SERVING:
            if self.proc.poll() is not None:
                pytest.fail(f"broker exited with {self.proc.returncode} before serving")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"broker at {self.addr} not SERVING within {timeout}s")
            time.sleep(0.1)  # polling a process we do not control: no event to await

    @staticmethod
    def _read_log(proc: subprocess.Popen, bound: queue.Queue) -> None:
        """Reports the bound address (None at EOF); passes warnings on to stderr."""
        for line in proc.stderr:
            try:
                event = json.loads(line)
            except ValueError:
                sys.stderr.write(line)
                continue
            fields = event.get("fields", {})
            if fields.get("message") == "leaseq serving":
                bound.put(fields["addr"])
            elif event.get("level") in ("WARN", "ERROR"):
                sys.stderr.write(line)
        bound.put(None)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (drain), then waits for the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"broker did not exit within {timeout}s of SIGTERM")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def db_env():
    if os.environ.get("DATABASE_URL"):
        yield {"DATABASE_URL": os.environ["DATABASE_URL"]}
        return
    if os.environ.get("LEASEQ_DATA_DIR"):
        yield {"LEASEQ_DATA_DIR": os.environ["LEASEQ_DATA_DIR"]}
        return
    tmp = tempfile.mkdtemp(prefix="leaseq-py-")
    # As root the cluster runs as `postgres`, which must be able to enter it.
    os.chmod(tmp, 0o755)
    yield {"LEASEQ_DATA_DIR": os.path.join(tmp, "pg")}
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def addr(db_env):
    if os.environ.get("LEASEQ_ADDR"):
        yield os.environ["LEASEQ_ADDR"]
        return
    broker = Broker(db_env)
    broker.start()
    yield broker.addr
    broker.stop()


@pytest.fixture
def private_broker(db_env, addr):
    # Depends on `addr` so that, without LEASEQ_ADDR, the session broker owns
    # the embedded cluster and this one's SIGTERM leaves it running.
    broker = Broker(db_env)
    broker.start()
    yield broker
    if broker.proc and broker.proc.poll() is None:
        broker.stop()


@pytest.fixture(scope="session")
def db_dsn(db_env, addr):
    """A libpq connection string (psycopg) for the broker's database: the
    ``DATABASE_URL`` it runs on, else its embedded cluster's Unix socket
    (``<LEASEQ_DATA_DIR>/run``, user and database ``leaseq``: src/embedded.rs).
    Depends on ``addr``: the broker has created the database and run its
    migrations by then."""
    if "DATABASE_URL" in db_env:
        return db_env["DATABASE_URL"]
    return f"host={Path(db_env['LEASEQ_DATA_DIR']) / 'run'} user=leaseq dbname=leaseq"
