"""``aiolock.sync``: every kind's calls, blocking, with the calling thread as the owner, over
the same locks as the async clients'."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

import aiolock
import aiolock.sync
from aiolock.testing.pytest_plugin import ServerInfo

T = TypeVar("T")


def in_thread(work: Callable[[], T]) -> T:
    """``work()`` run on a thread of its own (another owner), its outcome returned here."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(work).result(timeout=30)


@pytest.fixture
def client(aiolock_sync_client: aiolock.sync.Client) -> aiolock.sync.Client:
    return aiolock_sync_client


def test_the_owner_is_the_thread(client: aiolock.sync.Client) -> None:
    lock = client.lock("orders:42")
    with lock.acquire(wait=5, lease=5) as guard:
        assert guard.fencing_token >= 1
        assert not guard.lost
        assert 0 < guard.valid_for() <= 5
        assert lock.is_held()
        assert lock.is_locked()
        assert in_thread(lambda: lock.try_lock(0.05)) is False  # another thread: another owner
        assert in_thread(lock.is_held) is False
        with lock.acquire(wait=0) as again:  # the same thread: reentrant, one token
            assert again.fencing_token == guard.fencing_token
            assert lock.hold_count() == 2
        assert lock.hold_count() == 1
        with pytest.raises(aiolock.LockNotOwnedError):
            in_thread(lock.unlock)
    assert not lock.is_locked()
    assert lock.remaining_lease() is None
    assert in_thread(lambda: lock.try_lock(0)) is True
    assert lock.force_unlock() is True
    with lock as second:  # ``with lock:`` too
        assert second.fencing_token > guard.fencing_token


def test_threads_of_one_client_never_overlap(client: aiolock.sync.Client) -> None:
    inside = 0
    most = 0
    counted = threading.Lock()

    def job() -> None:
        nonlocal inside, most
        with client.lock("shared").acquire(wait=30):
            with counted:
                inside += 1
                most = max(most, inside)
            with counted:
                inside -= 1

    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(job) for _ in range(40)]:
            future.result(timeout=60)
    assert most == 1


def test_an_explicit_owner_lets_another_thread_release(client: aiolock.sync.Client) -> None:
    lock = client.lock("job", owner="job-17")
    lock.lock(lease=5)
    assert in_thread(lock.is_held)  # the same explicit owner, whatever the thread
    in_thread(lock.unlock)
    assert not lock.is_locked()


@pytest.mark.anyio
async def test_a_thread_and_a_task_of_another_client_exclude_each_other(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client
) -> None:
    sync = aiolock.sync.Client.from_url(aiolock_server.url, key_prefix=aiolock_client.key_prefix)
    try:
        from_thread = sync.lock("interop")
        from_task = aiolock_client.lock("interop")
        assert await asyncio.to_thread(lambda: from_thread.try_lock(0, lease=5))
        assert not await from_task.try_lock(0.05)  # the same lock, the same keys

        async def task_side() -> tuple[bool, bool]:
            granted = await from_task.try_lock(10)
            refused = not await asyncio.to_thread(lambda: from_thread.try_lock(0.05))
            await from_task.unlock()
            return granted, refused

        waiting = asyncio.create_task(task_side())
        await asyncio.to_thread(from_thread.unlock)  # wakes the waiting task: one protocol
        assert await waiting == (True, True)
        # One fencing counter per name across both faces.
        async with from_task.acquire(wait=5) as task_guard:
            pass
        assert await asyncio.to_thread(lambda: sync_guard_token(from_thread)) > (
            task_guard.fencing_token
        )
    finally:
        await asyncio.to_thread(sync.close)


def sync_guard_token(lock: aiolock.sync.Lock) -> int:
    with lock.acquire(wait=5) as guard:
        token: int = guard.fencing_token
        return token


@pytest.mark.parametrize("kind", ["fair_lock", "spin_lock"])
def test_the_other_single_locks(client: aiolock.sync.Client, kind: str) -> None:
    lock = getattr(client, kind)("k")
    with lock.acquire(wait=5) as guard:
        assert in_thread(lambda: lock.try_lock(0.05)) is False
        assert guard.fencing_token >= 1
    # A waiting thread is served at the release.
    lock.lock()
    waiter = ThreadPoolExecutor(1)
    try:
        got = waiter.submit(lambda: (lock.try_lock(10), lock.unlock()))
        lock.unlock()
        assert got.result(timeout=30)[0] is True
    finally:
        waiter.shutdown()
    assert not lock.is_locked()


def test_guard_transaction_and_loss(client: aiolock.sync.Client) -> None:
    lock = client.lock("tx")
    members = f"{lock.hash_tag}:members"
    with lock.acquire(wait=5, lease=5) as guard:
        with guard.transaction() as tx:
            tx.sadd(members, "ann")
            tx.scard(members)
        assert tx.results == [1, 1]
    with pytest.raises(aiolock.LockLostError), lock.acquire(wait=5, lease=5) as guard:
        assert in_thread(lock.force_unlock)  # taken from under the holder
        with pytest.raises(aiolock.LockLostError), guard.transaction() as tx:
            tx.sadd(members, "bob")  # never runs
    assert guard.lost
    assert guard.valid_for() == 0.0


def test_cancel_on_loss_is_refused_and_bad_arguments_name_the_parameter(
    client: aiolock.sync.Client,
) -> None:
    lock = client.lock("args")
    with pytest.raises(TypeError, match="cannot be cancelled"):
        lock.acquire(wait=1, cancel_on_loss=True)
    with pytest.raises(ValueError, match="wait"):
        lock.acquire(wait=-1)
    with pytest.raises(ValueError, match="lease"):
        lock.try_lock(0, lease=0)
    with pytest.raises(ValueError, match="name"):
        client.lock("")


def test_rw_lock(client: aiolock.sync.Client) -> None:
    rw = client.rw_lock("doc")
    with rw.read_lock().acquire(wait=5):
        assert in_thread(lambda: rw.read_lock().try_lock(0)) is True  # many readers
        assert in_thread(lambda: rw.write_lock().try_lock(0.05)) is False
        with pytest.raises(aiolock.LockError):  # a reader may not upgrade
            rw.write_lock().try_lock(0)
    assert in_thread(rw.read_lock().force_unlock)
    with rw.write_lock().acquire(wait=5):
        assert in_thread(lambda: rw.read_lock().try_lock(0.05)) is False


def test_semaphore(client: aiolock.sync.Client) -> None:
    sem = client.semaphore("exports", 2)
    with sem.acquire(wait=5) as permit:
        assert not permit.lost
        assert sem.available() == 1
        other = in_thread(lambda: sem.try_acquire(0))
        assert other is not None
        assert other.id != permit.id
        assert sem.try_acquire(0.05) is None  # both permits out
        with other.transaction() as tx:
            tx.set(f"{sem.hash_tag}:x", "1")
        other.release()  # any thread may give a permit back
        with pytest.raises(aiolock.LockNotOwnedError):
            other.release()
    assert sem.available() == 2
    with pytest.raises(aiolock.LockTimeoutError), sem.acquire(wait=0.05, lease=5):
        with sem.acquire(wait=0, lease=5):
            with sem.acquire(wait=0.05):
                pass  # pragma: no cover


def test_countdown_latch(client: aiolock.sync.Client) -> None:
    latch = client.countdown_latch("ready")
    assert latch.try_set_count(2)
    assert not latch.try_set_count(5)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: latch.wait(timeout=30))
        latch.count_down()
        assert latch.count() == 1
        latch.count_down()
        assert waiting.result(timeout=30) is True
    assert latch.wait(timeout=0) is True


def test_locked_decorates_plain_functions(client: aiolock.sync.Client) -> None:
    seen: list[tuple[int, bool]] = []

    @client.locked("orders:{order_id}", wait=5)
    def ship(order_id: int, note: str = "") -> int:
        seen.append((order_id, client.lock(f"orders:{order_id}").is_held()))
        return order_id * 2

    assert ship(7) == 14
    assert seen == [(7, True)]
    assert not client.lock("orders:7").is_locked()
    with pytest.raises(ValueError, match="names no parameter"):
        client.locked("orders:{missing}")(lambda order_id: None)

    async def not_plain(order_id: int) -> None: ...

    with pytest.raises(TypeError, match=r"aiolock\.Client\.locked"):
        client.locked("orders:{order_id}")(not_plain)


def test_multi_lock_over_two_clients(
    client: aiolock.sync.Client, aiolock_server: ServerInfo
) -> None:
    with aiolock.sync.Client.from_url(aiolock_server.url, key_prefix="aiolock-test-multi") as other:
        both = aiolock.sync.MultiLock(client.lock("a"), other.fair_lock("b"))
        with both.acquire(wait=5) as guard:
            assert len(guard.fencing_token) == 2
            assert both.is_held()
            assert other.fair_lock("b").is_held()  # every part's owner is this thread
            assert in_thread(lambda: client.lock("a").try_lock(0)) is False
        assert not both.is_locked()
        with pytest.raises(TypeError):
            aiolock.sync.MultiLock(object())  # type: ignore[arg-type]


@pytest.fixture
def three_clients(aiolock_server: ServerInfo) -> Iterator[list[aiolock.sync.Client]]:
    # Three databases of one server stand in for three independent masters.
    base = (
        aiolock_server.url.rsplit("/", 1)[0]
        if aiolock_server.url.count("/") > 2
        else (aiolock_server.url)
    )
    clients = [aiolock.sync.Client.from_url(f"{base}/{db}") for db in (1, 2, 3)]
    for db in (1, 2, 3):
        with redis.Redis.from_url(f"{base}/{db}") as plain:
            plain.flushdb()
    yield clients
    for made in clients:
        made.close()


def test_redlock(three_clients: list[aiolock.sync.Client]) -> None:
    quorum = aiolock.sync.RedLock(three_clients, "q")
    with quorum.acquire(wait=5, lease=5) as guard:
        assert guard.fencing_token >= 1
        assert not guard.lost
        assert in_thread(lambda: quorum.try_lock(0.05)) is False
    assert not quorum.is_locked()


def test_statistics_and_repr(client: aiolock.sync.Client) -> None:
    lock = client.lock("seen")
    assert repr(lock) == "<aiolock.sync <AsyncRLock 'seen' [unlocked]>>"
    with lock.acquire(wait=5) as guard:
        assert lock.statistics().held == 1
        assert "held" in repr(guard)
        assert "AsyncRLock 'seen'" in repr(lock)
    assert "open" in repr(client)
    stats = client.statistics()
    assert (stats.holds, stats.waiters) == (0, 0)
    with client.lock("counted").acquire(wait=5):
        assert client.statistics().holds == 1


def test_the_constructors_check_the_options_at_once(aiolock_server: ServerInfo) -> None:
    with pytest.raises(ValueError, match="watchdog_timeout"):
        aiolock.sync.Client.from_url(aiolock_server.url, watchdog_timeout=-1)
    with pytest.raises(TypeError, match="connect"):
        aiolock.sync.Client(aiolock_server.url)  # type: ignore[arg-type]
    made: list[AsyncRedis] = []

    def connect() -> AsyncRedis:
        made.append(AsyncRedis.from_url(aiolock_server.url))
        return made[-1]

    with pytest.raises(ValueError, match="key_prefix"):
        aiolock.sync.Client(connect, key_prefix="")
    with aiolock.sync.Client(connect, key_prefix="aiolock-test-connect") as client:
        lock = client.lock("made")
        assert lock.try_lock(0, lease=5)
        lock.unlock()
    assert len(made) == 2  # one per constructor call: the rejected options' and this client's


def test_semaphore_count_and_permit_extend(client: aiolock.sync.Client) -> None:
    sem = client.semaphore("counted", 1)
    permit = sem.try_acquire(0, lease=1)
    assert permit is not None
    permit.extend(30)  # a fixed lease made longer, on the server
    assert permit.valid_for() > 20
    with pytest.raises(ValueError, match="1 permits on the server"):
        client.semaphore("counted", 3).try_acquire(0)
    sem.set_permits(3)  # for everyone
    assert client.semaphore("counted", 3).available() == 2
    with pytest.raises(TypeError, match="permits"):
        sem.set_permits(True)
    permit.release()


def test_guard_extend(client: aiolock.sync.Client) -> None:
    with client.lock("extended").acquire(wait=0, lease=1) as guard:
        guard.extend(30)
        assert guard.valid_for() > 20
        with pytest.raises(ValueError, match="lease"):
            guard.extend(0)


def test_redis_py_habits_are_taught_in_the_blocking_face_too(
    client: aiolock.sync.Client,
) -> None:
    lock = client.lock("taught")
    with pytest.raises(TypeError, match=r"Lock\.try_lock\(\) got redis-py's keyword") as error:
        lock.try_lock(blocking_timeout=5)  # type: ignore[call-arg]
    assert "wait=" in str(error.value)
    with pytest.raises(TypeError, match="owner is the calling thread"):
        client.lock("taught", thread_local=False)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="lease="):
        client.semaphore("taught", 2).acquire(timeout=5)  # type: ignore[call-arg]
