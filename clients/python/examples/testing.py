"""Handlers tested against a throwaway broker: ``leaseq.testing`` starts
``leaseq serve`` ($LEASEQ_BIN, else on PATH) with its embedded PostgreSQL
in a temporary directory, and ``drain`` runs a worker until nothing waits.
Run by pytest (the fixtures) or as a script (TestBroker by hand)."""

from dataclasses import dataclass
from typing import List

from leaseq import Client, Task, Worker
from leaseq.testing import TestBroker, drain

# In your conftest.py: the session's broker, as fixtures.
pytest_plugins = ["leaseq.testing"]


@dataclass
class Signup:
    email: str


welcome = Task("welcome", Signup)
sent: List[str] = []


def make_worker(addr: str) -> Worker:
    worker = Worker(addr)

    @worker.task(welcome)
    def send_welcome(signup: Signup) -> None:
        sent.append(signup.email)

    return worker


def test_welcome_is_sent(leaseq_addr: str) -> None:
    with Client(leaseq_addr) as client:
        welcome.enqueue(client, Signup("ada@example.com"))
    stats = drain(make_worker(leaseq_addr))  # burst mode: returns when idle
    assert stats.acked == 1 and sent[-1] == "ada@example.com"


if __name__ == "__main__":
    with TestBroker() as broker:  # without pytest
        test_welcome_is_sent(broker.addr)
    print("ok", sent)
