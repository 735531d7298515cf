"""Testing helpers: a throwaway broker and a way to run handlers until the
queue is drained.

- :class:`TestBroker`: ``leaseq serve`` from ``$LEASEQ_BIN`` (else ``leaseq``
  on ``PATH``) as a child process on 127.0.0.1 and a port of its own
  choosing, with its embedded PostgreSQL in a fresh temporary directory
  (``DATABASE_URL`` and the ``PG*`` variables are removed from its
  environment); stopped with SIGTERM to the process it started, and the
  directory removed.
- :func:`drain` / :func:`drain_async`: a worker (or one handler) in burst
  mode: it works what is waiting, then returns its stats.
- With pytest: ``pytest_plugins = ["leaseq.testing"]`` in a ``conftest.py``
  gives the ``leaseq_broker`` fixture (one broker for the session: starting
  one takes seconds, the first time much more as it initialises its
  cluster) and ``leaseq_addr`` (its address).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from leaseq._types import RpcError
from leaseq.worker import Handler, Worker, WorkerStats

__all__ = ["TestBroker", "drain", "drain_async"]

# Variables that would point the broker at another database.
_DB_VARS = ("DATABASE_URL", "LEASEQ_DATABASE_URL", "LEASEQ_DATA_DIR")


class TestBroker:
    """A throwaway ``leaseq serve`` (see the module's doc). Use it as a
    context manager, or :meth:`start` and :meth:`stop`::

        with TestBroker() as broker:
            Client(broker.addr).enqueue("emails", b"hi")

    ``args``: more ``leaseq serve`` arguments. ``binary``: the broker's
    path (default ``$LEASEQ_BIN``, else ``leaseq`` on ``PATH``).
    ``timeout``: seconds to wait for it to serve."""

    __test__ = False  # (not a test class, whatever pytest's patterns say)

    def __init__(self, *, binary: Optional[str] = None, args: Sequence[str] = (), timeout: float = 120.0) -> None:
        self._binary = binary
        self._args = list(args)
        self._timeout = timeout
        self._proc: Optional["subprocess.Popen[str]"] = None
        self._dir: Optional[str] = None
        self._addr: Optional[str] = None
        self._log: List[str] = []

    @property
    def addr(self) -> str:
        """``127.0.0.1:PORT``, for any client's ``target``."""
        if self._addr is None:
            raise RuntimeError("the broker is not running: start() it first")
        return self._addr

    @property
    def pid(self) -> Optional[int]:
        return None if self._proc is None else self._proc.pid

    def __enter__(self) -> "TestBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Starts the broker and returns once it answers calls."""
        if self._proc is not None:
            raise RuntimeError("already started")
        binary = self._binary or os.environ.get("LEASEQ_BIN") or shutil.which("leaseq")
        if not binary or not os.access(binary, os.X_OK):
            raise FileNotFoundError("no leaseq binary: set LEASEQ_BIN or put `leaseq` on PATH")
        self._dir = tempfile.mkdtemp(prefix="leaseq-test-")
        # As root the embedded cluster runs as `postgres`, which must be able
        # to enter the directory (mkdtemp makes it 0700).
        os.chmod(self._dir, 0o755)
        env = {k: v for k, v in os.environ.items() if k not in _DB_VARS and not k.startswith("PG")}
        # Its "leaseq serving" line (info) says the port it bound.
        env["RUST_LOG"] = "warn,leaseq_server::server=info,leaseq::server=info"
        # Port 0: the broker binds a free port and logs it; a port picked
        # here and bound later could be taken meanwhile.
        self._proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--log-format", "json",
             "--data-dir", os.path.join(self._dir, "pg"), *self._args],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        bound: "Dict[str, Optional[str]]" = {}
        ready = threading.Event()
        threading.Thread(target=self._read_log, args=(self._proc, bound, ready), daemon=True).start()
        try:
            if not ready.wait(self._timeout):
                raise RuntimeError(self._failure(f"did not start serving within {self._timeout}s"))
            if bound.get("addr") is None:  # its log ended: it exited
                self._proc.wait(10)
                raise RuntimeError(self._failure("exited before serving"))
            self._addr = bound["addr"]
            self._wait_answering()
        except BaseException:
            self.stop()
            raise

    def _read_log(self, proc: "subprocess.Popen[str]", bound: Dict[str, Optional[str]], ready: threading.Event) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self._log.append(line.rstrip("\n"))
            del self._log[:-50]
            try:
                event = json.loads(line)
            except ValueError:
                continue
            fields = event.get("fields", {}) if isinstance(event, dict) else {}
            if fields.get("message") == "leaseq serving" and not ready.is_set():
                bound["addr"] = fields.get("addr")
                ready.set()
        ready.set()  # exited (addr stays unset)

    def _wait_answering(self) -> None:
        from leaseq.admin import AdminClient

        deadline = time.monotonic() + self._timeout
        with AdminClient(self.addr, timeout=5.0) as admin:
            while True:
                try:
                    admin.list_queues(page_size=1)
                    return
                except RpcError as e:
                    if e.code_name != "UNAVAILABLE" or time.monotonic() > deadline:
                        raise RuntimeError(self._failure(f"does not answer: {e.code_name}: {e.details()}")) from e
                assert self._proc is not None
                if self._proc.poll() is not None:
                    raise RuntimeError(self._failure("exited"))
                time.sleep(0.1)  # a process we do not control: nothing to await

    def _failure(self, what: str) -> str:
        rc = None if self._proc is None else self._proc.poll()
        tail = "\n".join(self._log[-20:])
        return f"leaseq serve {what} (exit code {rc}); its last log lines:\n{tail}"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the broker's process (it drains and stops its
        cluster), SIGKILL if it has not exited after ``timeout``; then the
        directory is removed. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        self._addr = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _worker_for(target: Union[Worker, Handler], queue: Optional[str], addr: Optional[str], kw: Dict[str, Any]) -> Worker:
    if isinstance(target, Worker):
        if queue is not None or addr is not None or kw:
            raise TypeError("drain(worker): the worker has its queues and address already")
        return target
    if queue is None or addr is None:
        raise TypeError("drain(handler, queue, addr): a handler needs a queue and the broker's address")
    return Worker(addr, [queue], target, **kw)


def drain(
    target: Union[Worker, Handler], queue: Optional[str] = None, addr: Optional[str] = None, **worker_options: Any
) -> WorkerStats:
    """Runs ``target`` in burst mode (:meth:`Worker.run` with ``burst=True``,
    no signal handlers): it works what is waiting, then returns the
    worker's stats. ``target`` is a :class:`leaseq.Worker`, or a handler with
    the ``queue`` it handles and the broker's ``addr`` (``worker_options``
    go to the Worker). Jobs due later (a delay, a retry's backoff) are not
    waited for: call it again, or read ``stats``."""
    w = _worker_for(target, queue, addr, worker_options)
    w.run(handle_signals=False, burst=True)
    return w.stats


async def drain_async(
    target: Union[Worker, Handler], queue: Optional[str] = None, addr: Optional[str] = None, **worker_options: Any
) -> WorkerStats:
    """:func:`drain` for code on an event loop."""
    w = _worker_for(target, queue, addr, worker_options)
    await w.run_async(handle_signals=False, burst=True)
    return w.stats


# --- the pytest plugin (pytest_plugins = ["leaseq.testing"])

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pass
else:

    @pytest.fixture(scope="session")
    def leaseq_broker() -> Iterator[TestBroker]:
        """One throwaway broker for the test session."""
        with TestBroker() as broker:
            yield broker

    @pytest.fixture(scope="session")
    def leaseq_addr(leaseq_broker: TestBroker) -> str:
        """The session broker's address."""
        return leaseq_broker.addr

    __all__ += ["leaseq_broker", "leaseq_addr"]
