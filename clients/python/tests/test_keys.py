"""Keys inside a queue (issue 33): ``key=`` on every way to enqueue,
``job.key`` on deliveries and ``JobInfo.key``, the queue settings
``ordered_by_key``, ``key_concurrency`` (with and without order),
``fair_by_key``, ``key_rate_limit``/``key_rate_burst`` and
``key_overrides``, against the real broker."""

import asyncio

import pytest
from util import queue_name, run

from leaseq import (
    AdminClient,
    AsyncAdminClient,
    AsyncClient,
    Client,
    Job,
    KeyOverride,
    NewJob,
    RpcError,
    Task,
    Worker,
)

# How long a held-back job must stay undelivered: the broker hands a
# deliverable job to an open stream with free credit within milliseconds.
QUIET = 0.6


async def nothing_within(sub, seconds: float) -> None:
    try:
        job = await asyncio.wait_for(sub.next_job(), seconds)
    except asyncio.TimeoutError:
        return
    pytest.fail(f"delivered while it should wait: {job.payload!r} (key {job.key!r})")


def test_an_ordered_queue_delivers_a_keys_next_job_once_the_one_before_is_acked(addr):
    async def body():
        q = queue_name("keys")
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            s = (await admin.update_queue(q, create=True, ordered_by_key=True)).settings
            assert (s.ordered_by_key, s.key_concurrency) == (True, 1)  # 1 when not given
            a1 = await c.enqueue(q, "a1", key="alice")
            a2, b1, free = await c.enqueue_batch([NewJob(q, "a2", key="alice"), NewJob(q, "b1", key="bob"), NewJob(q, "free")])
            async with c.subscribe(q, max_in_flight=10, lease=30) as sub:
                first = [await asyncio.wait_for(sub.next_job(), 10) for _ in range(3)]
                # Another key's job and a job without a key are not held back.
                assert sorted((j.text, j.key) for j in first) == [("a1", "alice"), ("b1", "bob"), ("free", "")]
                await nothing_within(sub, QUIET)  # a2 waits for a1
                assert (await admin.get_job(a2.job_id)).state == "available"
                (j_a1,) = [j for j in first if j.id == a1.job_id]
                await c.ack(j_a1.id, j_a1.lease_token)
                j_a2 = await asyncio.wait_for(sub.next_job(), 10)
                assert (j_a2.id, j_a2.text, j_a2.key) == (a2.job_id, "a2", "alice")
            assert {b1.job_id, free.job_id} == {j.id for j in first if j.key != "alice"}

    run(body())


def test_a_retry_keeps_its_place_at_the_head_of_its_key(addr):
    async def body():
        q = queue_name("keys")
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await admin.update_queue(q, create=True, ordered_by_key=True, key_concurrency=1)
            await c.enqueue_batch([NewJob(q, "k1", key="k"), NewJob(q, "k2", key="k")])
            async with c.subscribe(q, max_in_flight=10, lease=30) as sub:
                j = await asyncio.wait_for(sub.next_job(), 10)
                assert (j.text, j.attempt) == ("k1", 1)
                await c.nack(j.id, j.lease_token, "again", retry_after=1.0)
                await nothing_within(sub, QUIET)  # k2 waits behind k1's retry
                # Due in 1 s; the broker's wake-up at the retry is the Rust
                # suite's to check (tests/keys.rs): this waits out even its
                # 10 s fallback poll, since it checks the order.
                j = await asyncio.wait_for(sub.next_job(), 15)
                assert (j.text, j.attempt, j.last_error, j.key) == ("k1", 2, "again", "k")
                # A dead letter lets the key go on.
                assert await c.nack(j.id, j.lease_token, "poison", dead_letter=True)
                j = await asyncio.wait_for(sub.next_job(), 10)
                assert j.text == "k2"
            (dead,) = (await admin.list_dead_letters(q)).items
            assert (dead.key, dead.last_error) == ("k", "poison")

    run(body())


def test_the_key_travels_from_every_producer_to_handlers_and_job_info(addr):
    q = queue_name("keys")
    task = Task(q, dict)
    with Client(addr) as c, AdminClient(addr) as admin:
        plain = c.enqueue(q, "plain", key="acct-1")
        (batched,) = c.enqueue_batch([NewJob(q, "batched", key="acct-2")])
        typed = task.enqueue(c, {"n": 3}, key="acct-3")
        (many,) = c.enqueue_batch([task.job({"n": 4}, key="acct-4")])
        none = c.enqueue(q, "none")
        assert admin.get_job(plain.job_id).key == "acct-1"
        assert [(j.id, j.key) for j in admin.list_jobs(q).items] == [
            (plain.job_id, "acct-1"), (batched.job_id, "acct-2"), (typed.job_id, "acct-3"),
            (many.job_id, "acct-4"), (none.job_id, ""),
        ]  # fmt: skip

        w = Worker(addr, max_in_flight=5, lease=10)
        got: list = []

        @w.handler(q)
        def handle(job: Job) -> None:
            got.append((job.id, job.key))

        w.run(handle_signals=False, burst=True)
        assert sorted(got) == sorted(
            [(plain.job_id, "acct-1"), (batched.job_id, "acct-2"), (typed.job_id, "acct-3"),
             (many.job_id, "acct-4"), (none.job_id, "")]
        )  # fmt: skip

    async def with_asyncio() -> None:
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            r = await task.enqueue_async(c, {"n": 5}, key="acct-5")
            assert (await admin.get_job(r.job_id)).key == "acct-5"

    run(with_asyncio())


def test_the_key_settings_round_trip_and_are_validated(addr):
    q = queue_name("keys")
    with AdminClient(addr) as admin:
        s = admin.update_queue(q, create=True).settings
        assert (s.ordered_by_key, s.key_concurrency) == (False, 0)
        s = admin.update_queue(q, ordered_by_key=True, key_concurrency=3).settings
        assert (s.ordered_by_key, s.key_concurrency) == (True, 3)
        s = admin.get_queue(q).settings
        assert (s.ordered_by_key, s.key_concurrency) == (True, 3)
        s = admin.update_queue(q, max_attempts=4).settings  # not given: unchanged
        assert (s.ordered_by_key, s.key_concurrency, s.max_attempts) == (True, 3, 4)
        for kwargs in ({"key_concurrency": 1001}, {"key_concurrency": -1}):
            with pytest.raises(RpcError) as e:
                admin.update_queue(q, **kwargs)
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert e.value.details().startswith("key_concurrency"), e.value.details()
        s = admin.update_queue(q, ordered_by_key=False).settings  # clears key_concurrency
        assert (s.ordered_by_key, s.key_concurrency) == (False, 0)
        s = admin.update_queue(q, key_concurrency=2).settings  # a per-key limit without order
        assert (s.ordered_by_key, s.key_concurrency) == (False, 2)


def test_per_key_limits_overrides_and_fairness_round_trip_and_are_validated(addr):
    q = queue_name("keylim")
    vip, slow = KeyOverride("vip", concurrency=5, weight=3), KeyOverride("slow", rate_limit=0.5)
    with AdminClient(addr) as admin:
        s = admin.update_queue(q, create=True).settings
        assert (s.fair_by_key, s.key_rate_limit, s.key_rate_burst, s.key_overrides) == (False, 0.0, 0, ())
        s = admin.update_queue(
            q, fair_by_key=True, key_concurrency=2, key_rate_limit=2.5, key_overrides=[vip, slow]
        ).settings
        assert (s.fair_by_key, s.key_concurrency, s.key_rate_limit, s.key_rate_burst) == (True, 2, 2.5, 3)
        assert s.key_overrides == (slow, vip)  # in key order
        assert admin.get_queue(q).settings == s
        for kwargs, field in (
            ({"key_overrides": [KeyOverride("x")]}, "key_overrides[0].key"),  # sets nothing
            ({"key_overrides": [KeyOverride("a", weight=1), KeyOverride("b", weight=101)]}, "key_overrides[1].weight"),
            ({"key_overrides": [KeyOverride("a", concurrency=1), KeyOverride("a", weight=2)]}, "key_overrides[1].key"),
            ({"key_overrides": [KeyOverride("k" * 257, concurrency=1)]}, "key_overrides[0].key"),
            ({"key_rate_limit": -1.0}, "key_rate_limit"),
            ({"key_rate_burst": 2_000_000}, "key_rate_burst"),
        ):
            with pytest.raises(RpcError) as e:
                admin.update_queue(q, **kwargs)  # type: ignore[arg-type]
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert e.value.details().startswith(f"{field}:"), e.value.details()
        for bad in ("vip", [("vip", 1)]):
            with pytest.raises(TypeError):
                admin.update_queue(q, key_overrides=bad)  # type: ignore[arg-type]
        assert admin.get_queue(q).settings == s  # nothing changed
        s = admin.update_queue(q, key_rate_burst=10).settings
        assert (s.key_rate_limit, s.key_rate_burst) == (2.5, 10)

    async def body():
        async with AsyncAdminClient(addr) as admin:
            s = (await admin.update_queue(q, key_overrides=[], key_rate_limit=0)).settings
            assert (s.key_overrides, s.key_rate_limit, s.key_rate_burst, s.fair_by_key) == ((), 0.0, 0, True)
            s = (await admin.update_queue(q, fair_by_key=False, key_overrides=[vip])).settings
            assert (s.fair_by_key, s.key_overrides) == (False, (vip,))

    run(body())


def test_key_concurrency_without_order_holds_each_key_at_n(addr):
    async def body():
        q = queue_name("keylim")
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await admin.update_queue(q, create=True, key_concurrency=2)
            await c.enqueue_batch([NewJob(q, f"a{i}", key="a") for i in range(5)] + [NewJob(q, "b0", key="b")])
            async with c.subscribe(q, max_in_flight=10, lease=30) as sub:
                first = [await asyncio.wait_for(sub.next_job(), 10) for _ in range(3)]
                assert sorted(j.key for j in first) == ["a", "a", "b"]  # b is not held back by a
                await nothing_within(sub, QUIET)  # a's other 3 wait: 2 of a are leased
                a = next(j for j in first if j.key == "a")
                await c.ack(a.id, a.lease_token)
                nxt = await asyncio.wait_for(sub.next_job(), 10)
                assert nxt.key == "a"
                await nothing_within(sub, QUIET)  # 2 of a leased again
            st = (await admin.get_queue(q)).stats
            assert st.available + st.scheduled + st.leased == 5  # all but the one acked

    run(body())


def test_a_fair_queue_lets_a_small_key_through_a_big_backlog(addr):
    async def body():
        q = queue_name("fair")
        async with AsyncClient(addr) as c, AsyncAdminClient(addr) as admin:
            await admin.update_queue(q, create=True, fair_by_key=True)
            for chunk in range(3):
                await c.enqueue_batch([NewJob(q, f"a{chunk}-{i}", key="A") for i in range(100)])
            await c.enqueue_batch([NewJob(q, f"b{i}", key="B") for i in range(3)])
            a_before = b_seen = 0
            async with c.subscribe(q, max_in_flight=5, lease=30) as sub:
                while b_seen < 3:
                    j = await asyncio.wait_for(sub.next_job(), 10)
                    if j.key == "A":
                        a_before += 1
                    else:
                        b_seen += 1
                    await c.ack(j.id, j.lease_token)
            assert a_before <= 30, f"{a_before} of A's jobs before B's 3"

    run(body())


def test_a_key_longer_than_256_bytes_is_invalid_argument(addr):
    q = queue_name("keys")
    with Client(addr) as c, AdminClient(addr) as admin:
        admin.update_queue(q, create=True)
        for field, call in (
            ("key", lambda: c.enqueue(q, "x", key="k" * 257)),
            # 258 bytes in 129 characters: the limit is in bytes.
            ("jobs[1].key", lambda: c.enqueue_batch([NewJob(q, "ok"), NewJob(q, "x", key="é" * 129)])),
        ):
            with pytest.raises(RpcError) as e:
                call()
            assert e.value.code_name == "INVALID_ARGUMENT"
            assert e.value.details().startswith(f"{field}: must be at most 256 bytes"), e.value.details()
        assert admin.get_queue(q).stats.available == 0  # nothing enqueued, the batch neither
        c.enqueue(q, "fits", key="k" * 256)
        assert admin.list_jobs(q).items[0].key == "k" * 256


def test_admin_shows_the_keys_and_lists_a_keys_jobs(addr):
    q = queue_name("keysvis")
    with Client(addr) as c, AdminClient(addr) as admin:
        x1 = c.enqueue(q, "x1", key="x").job_id
        c.enqueue(q, "y1", key="y")
        c.enqueue(q, "y2", key="y")
        c.enqueue(q, "plain")
        st = admin.get_queue(q).stats
        assert (st.keys_waiting, st.keys_leased, st.keys_waiting_capped) == (2, 0, False)
        page = admin.list_jobs(q, key="x")
        assert [j.id for j in page.items] == [x1]
        keys = admin.list_keys(q)
        assert [(k.key, k.waiting, k.leased) for k in keys.items] == [("x", 1, 0), ("y", 2, 0)]
        assert keys.next_page_token == ""
        first = admin.list_keys(q, page_size=1)
        assert [k.key for k in first.items] == ["x"] and first.next_page_token
        rest = admin.list_keys(q, page_size=1, page_token=first.next_page_token)
        assert [k.key for k in rest.items] == ["y"]
        top = admin.list_keys(q, order="waiting", page_size=1)
        assert [(k.key, k.waiting) for k in top.items] == [("y", 2)]
        with pytest.raises(RpcError) as e:
            admin.list_jobs(q, key="k" * 257)
        assert e.value.code_name == "INVALID_ARGUMENT" and "key" in e.value.details()
        with pytest.raises(ValueError):
            admin.list_keys(q, order="size")  # type: ignore[arg-type]

    async def body():
        async with AsyncAdminClient(addr) as admin:
            keys = await admin.list_keys(q, order="waiting")
            assert [k.key for k in keys.items] == ["y", "x"]
            page = await admin.list_jobs(q, key="y")
            assert [j.payload for j in page.items] == [b"", b""]  # no payloads by default

    run(body())
