"""Errors that teach (SPEC "Errors"), where a server is involved: each message carries the
words a user needs, for every kind it applies to, on every test server.

- a release by another task of the same client than the one that holds the lock;
- a client used from a second event loop (refused before any I/O, and still usable on its own);
- a server (or a Cluster) that asks for a password the client did not give.

The messages that need no server are in ``tests/unit/test_messages.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis as redis_sync
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, RedisClusterException, ResponseError

import aiolock
from aiolock.testing.embedded import EmbeddedCluster, EmbeddedServer
from tests.conftest import SERVERS
from tests.helpers import counted, keys_of

pytestmark = pytest.mark.anyio

# Every kind whose lock object has ``unlock()``.
KINDS = ["lock", "fair", "spin", "read", "write", "multi", "redlock"]

MakeLock = Callable[[aiolock.Client, str, str], Any]


@pytest.fixture
async def make_lock() -> AsyncIterator[MakeLock]:
    """A maker of a lock of a kind on a client; a RedLock's is over that client and two that
    share its connections under prefixes of their own (as in test_contract.py), closed after
    the test."""
    extra: list[aiolock.Client] = []

    def make(client: aiolock.Client, kind: str, name: str) -> Any:
        if kind == "redlock":
            others = [
                aiolock.Client(client.redis, key_prefix=f"{client.key_prefix}-r{n}") for n in (1, 2)
            ]
            extra.extend(others)
            return aiolock.RedLock([client, *others], name)
        makers: dict[str, Callable[[], Any]] = {
            "lock": lambda: client.lock(name),
            "fair": lambda: client.fair_lock(name),
            "spin": lambda: client.spin_lock(name),
            "read": lambda: client.rw_lock(name).read_lock(),
            "write": lambda: client.rw_lock(name).write_lock(),
            "multi": lambda: aiolock.MultiLock(client.lock(name), client.fair_lock(name)),
        }
        return makers[kind]()

    try:
        yield make
    finally:
        for client in extra:
            await client.aclose()


# -- a release by another task of the same client -------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_release_by_another_task_says_the_lock_is_the_task_s(
    aiolock_client: aiolock.Client, make_lock: MakeLock, kind: str
) -> None:
    lock = make_lock(aiolock_client, kind, "handed-over")
    await lock.lock()
    with pytest.raises(aiolock.LockNotOwnedError) as refused:
        await asyncio.create_task(lock.unlock())
    text = str(refused.value)
    for words in ("held by another task of this client", "belongs to the task that acquired it"):
        assert words in text, text
    assert "owner=" in text, text
    assert await lock.is_held()  # the holder's hold is untouched
    await lock.unlock()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stranger_s_lock_keeps_the_plain_message(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    make_lock: MakeLock,
    kind: str,
) -> None:
    held = make_lock(make_client(), kind, "a-stranger-s")
    await held.lock()
    try:
        with pytest.raises(aiolock.LockNotOwnedError) as refused:
            await make_lock(aiolock_client, kind, "a-stranger-s").unlock()
        assert "not held by this owner" in str(refused.value)
        assert "another task" not in str(refused.value)
    finally:
        await held.unlock()


async def test_owner_lets_another_task_release(aiolock_client: aiolock.Client) -> None:
    """What the message recommends works: a lock made with ``owner=`` in both tasks."""
    await aiolock_client.lock("job", owner="job-17").lock()
    await asyncio.create_task(aiolock_client.lock("job", owner="job-17").unlock())
    assert not await aiolock_client.lock("job").is_locked()


# -- a second event loop --------------------------------------------------------------------


def in_another_loop(work: Callable[[], Awaitable[object]]) -> BaseException | None:
    """Run ``work()`` on a new event loop (call it in a thread of its own): what it raised."""

    async def run() -> BaseException | None:
        try:
            await work()
        except Exception as exc:
            return exc
        return None

    return asyncio.run(run())


async def test_a_second_event_loop_is_refused_before_any_io(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    client = aiolock_client
    lock = client.lock("one-loop")
    assert await lock.try_lock()  # the client's loop is the test's
    await lock.unlock()
    semaphore = client.semaphore("one-loop-sem", 2)
    permit = await semaphore.try_acquire()
    assert permit is not None
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "try_lock": lock.try_lock,
        "lock": lambda: lock.lock(lease=5),
        "acquire": lambda: lock.acquire(wait=1).__aenter__(),
        "fair": lambda: client.fair_lock("one-loop").try_lock(),
        "spin": lambda: client.spin_lock("one-loop").try_lock(),
        "write": lambda: client.rw_lock("one-loop").write_lock().try_lock(),
        "multi": lambda: aiolock.MultiLock(lock, client.fair_lock("x")).try_lock(),
        "is_locked": lock.is_locked,
        "unlock": lock.unlock,
        "force_unlock": lock.force_unlock,
        "try_acquire": semaphore.try_acquire,
        "permit.release": permit.release,
        "latch": lambda: client.countdown_latch("one-loop").count(),
        "aclose": client.aclose,
    }
    refused: dict[str, BaseException | None] = {}

    async def refuse_all() -> None:
        for name, call in calls.items():
            refused[name] = await asyncio.to_thread(in_another_loop, call)

    ran = await counted(redis, refuse_all)
    assert ran == {}, ran  # nothing reached the server
    for name, error in refused.items():
        assert isinstance(error, RuntimeError), (name, error)
        text = str(error)
        assert "belongs to the event loop that first used it" in text, (name, text)
        assert "one client per event loop" in text, (name, text)
    # Its own loop: as usable as before.
    assert not client.closed
    async with lock.acquire(wait=1) as guard:
        assert not guard.lost
        assert await lock.is_held()
    await permit.release()
    assert await semaphore.available() == 2
    assert not await redis.exists(keys_of(lock).lock)


# -- a server that asks for a password ------------------------------------------------------

PASSWORD = "a-password-the-client-does-not-give"


@pytest.fixture(scope="module", params=SERVERS)
def locked_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """A server that asks every new connection for a password (set once it runs: the
    launcher's readiness check PINGs without one)."""
    with EmbeddedServer(binary=request.param) as server:
        with redis_sync.Redis.from_url(server.url) as admin:
            admin.config_set("requirepass", PASSWORD)
        yield server


@pytest.fixture
async def unauthenticated(
    locked_server: EmbeddedServer,
) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """A maker of clients on ``locked_server``, each closed after the test."""
    made: list[aiolock.Client] = []
    wrapped: list[Redis] = []

    def make(how: str, **options: Any) -> aiolock.Client:
        url = locked_server.url
        if how == "from_url":
            client = aiolock.Client.from_url(url, **options)
        else:
            wrapped.append(Redis.from_url(url, **options))
            client = aiolock.Client(wrapped[-1])
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            await client.aclose()
        for redis in wrapped:
            await redis.aclose()


@pytest.mark.parametrize("protocol", [3, 2], ids=["resp3-hello", "resp2-noauth"])
@pytest.mark.parametrize("how", ["from_url", "wrapped"])
async def test_a_missing_password_is_named(
    unauthenticated: Callable[..., aiolock.Client], how: str, protocol: int
) -> None:
    client = unauthenticated(how, protocol=protocol)
    with pytest.raises(AuthenticationError) as refused:  # redis-py's own class, as SPEC says
        await client.lock("needs-a-password").try_lock()
    text = str(refused.value)
    for words in ("asks for a password", "redis://:PASSWORD@host:port/0", "USERNAME:PASSWORD"):
        assert words in text, text
    original = refused.value.__cause__
    # Chained from redis-py's error: NOAUTH, or the protocol error a server answers a long
    # call (more than 10 words) with before authentication.
    assert isinstance(original, AuthenticationError | ResponseError), original
    assert str(original) in text  # and the server's words kept


async def test_the_right_password_works_and_a_wrong_one_is_not_told_as_missing(
    locked_server: EmbeddedServer,
) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{locked_server.port}/0"
    async with aiolock.Client.from_url(url) as client:
        assert await client.lock("with-a-password").try_lock()
        await client.lock("with-a-password").unlock()
    wrong = f"redis://:wrong@127.0.0.1:{locked_server.port}/0"
    async with aiolock.Client.from_url(wrong) as client:
        with pytest.raises(AuthenticationError) as refused:
            await client.lock("with-a-password").try_lock()
        assert "asks for a password" not in str(refused.value)


@pytest.fixture(scope="module", params=SERVERS)
def locked_cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    """A one-node Cluster that asks every new connection for a password."""
    with EmbeddedCluster(primaries=1, binary=request.param) as cluster:
        with redis_sync.Redis.from_url(cluster.url) as admin:
            admin.config_set("requirepass", PASSWORD)
        yield cluster


async def test_a_cluster_s_missing_password_is_named(locked_cluster: EmbeddedCluster) -> None:
    async with aiolock.Client.from_url(locked_cluster.url, cluster=True) as client:
        with pytest.raises(RedisClusterException) as refused:  # what redis-py raises there
            await client.lock("needs-a-password").try_lock()
    text = str(refused.value)
    for words in ("the Cluster at", "asks for a password", "redis://:PASSWORD@host:port/0"):
        assert words in text, text
    assert isinstance(refused.value.__cause__, RedisClusterException)
    assert isinstance(refused.value.__cause__.__cause__, AuthenticationError)
