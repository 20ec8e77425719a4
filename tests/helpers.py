"""What tests share: waiting on conditions (never on fixed sleeps), and the one place that
knows how to reach a client's services, a lock's keys and its pub/sub entry.

A lock's internals are asked through the internal names every kind declares (its ``keys``,
``services``, ``current_owner()``, ``held()``... see :mod:`aiolock._core.kind`), and a
client's pub/sub entries through ``PubSub.entries`` (reading one takes no reference);
the few things no interface offers (a client's services, a latch's keys) are read here, once,
so that a change inside the library meets one function rather than every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock._core.keys import LockKeys
from aiolock._core.kind import HoldKind, LockKind
from aiolock._core.services import Services
from aiolock._redis.calls import Calls
from aiolock._redis.cluster import ClusterCalls
from aiolock._redis.entry import Entry
from aiolock._redis.wire import write
from aiolock.rw import RWKeys
from aiolock.semaphore import permits_of


def services_of(of: Any) -> Services:
    """The services of a client (the one reach into ``Client._services``), or of a lock."""
    if isinstance(of, aiolock.Client):
        return of._services
    assert isinstance(of, HoldKind), of
    return of.services


def server_calls_of(client: aiolock.Client) -> Calls:
    """A single-server client's call path (a Cluster client's, routing by slot, has no pool)."""
    calls = services_of(client).calls
    assert isinstance(calls, Calls), calls
    return calls


def cluster_calls_of(client: aiolock.Client) -> ClusterCalls:
    """A Cluster client's call path, routing by slot."""
    calls = services_of(client).calls
    assert isinstance(calls, ClusterCalls), calls
    return calls


def keys_of(lock: Any) -> LockKeys:
    """A lock's Redis keys: a semaphore's are its permits lock's; a latch, not a lock kind, has
    no ``keys`` of its own to offer and is read directly."""
    if isinstance(lock, aiolock.AsyncSemaphore):
        return permits_of(lock).keys
    if isinstance(lock, aiolock.AsyncCountDownLatch):
        return lock._keys
    assert isinstance(lock, HoldKind), lock
    return lock.keys


def rw_keys_of(lock: aiolock.AsyncReadLock | aiolock.AsyncWriteLock) -> RWKeys:
    """A read or write lock's keys, with the readers' and writers' keys and both channels."""
    found = keys_of(lock)
    assert isinstance(found, RWKeys), found
    return found


def entries_of(client: aiolock.Client) -> Mapping[bytes, Entry]:
    """``client``'s pub/sub entries by channel (read only: taking one adds no reference)."""
    return services_of(client).pubsub.entries


def entry_of(client: aiolock.Client, channel: Any) -> Entry | None:
    """``client``'s pub/sub entry for ``channel`` (a channel name, or a lock or latch whose
    channel it is), without taking a reference on it; ``None`` if it has none."""
    name = channel if isinstance(channel, str) else keys_of(channel).channel
    return entries_of(client).get(name.encode())


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], *, timeout: float = 5.0, what: str = ""
) -> None:
    """Wait until ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {what or predicate}")
        await asyncio.sleep(0.005)


async def lock_keys(redis: Redis, client: aiolock.Client) -> list[str]:
    """The lock hashes under ``client``'s prefix: not the meta hashes (resend markers that
    expire a while after their lock) nor the prefix's fencing counter."""
    keys = [key async for key in redis.scan_iter(match=f"{client.key_prefix}:*")]
    fence = f"{client.key_prefix}:fence"
    return sorted(str(key) for key in keys if not str(key).endswith(":meta") and key != fence)


async def command_calls(redis: Redis) -> dict[str, int]:
    """How many times the server has run each command so far (its own count, by name)."""
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


async def counted(redis: Redis, work: Callable[[], Awaitable[object]]) -> dict[str, int]:
    """The commands the server ran for ``work()`` (the probe's own INFO left out)."""
    before = await command_calls(redis)
    await work()
    after = await command_calls(redis)
    delta = {name: calls - before.get(name, 0) for name, calls in after.items()}
    delta["info"] -= 1
    return {name: calls for name, calls in delta.items() if calls}


async def evalsha_calls(redis: Redis) -> int:
    """How many EVALSHA calls the server has run so far (its own count)."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def channels(redis: Redis, client: aiolock.Client) -> list[str]:
    found = await redis.pubsub_channels(f"{client.key_prefix}:*")
    return sorted(str(channel) for channel in found)


async def assert_clean(redis: Redis, client: aiolock.Client) -> None:
    """No lock held, no subscription left, nothing pending: on the server and in the client."""
    await services_of(client).pubsub.drain()
    await eventually(lambda: client.statistics().pending == 0, what="pending settlements")
    await services_of(client).pubsub.drain()

    async def no_keys() -> bool:  # a fair keep-alive deletes its alive key after the last waiter
        return await lock_keys(redis, client) == []

    await eventually(no_keys, what="no keys left")

    async def unsubscribed() -> bool:  # UNSUBSCRIBE is sent; the server may not have run it yet
        return await channels(redis, client) == []

    await eventually(unsubscribed, what="no channels left")
    stats = client.statistics()
    assert (stats.holds, stats.waiters, stats.subscriptions) == (0, 0, 0), stats


async def stall_server(url: str, seconds: float, started: asyncio.Event) -> None:
    """Block the server for ``seconds`` (DEBUG SLEEP); ``started`` is set once it is written."""
    staller = Redis.from_url(url)
    # A connection of its own, not the pool's: get_connection() needs a command name before
    # redis-py 5.3 and warns about one after.
    conn = staller.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.connect()
        await write(conn, ("DEBUG", "SLEEP", seconds))  # in the socket before the event is set
        started.set()
        await conn.read_response(timeout=math.inf)
    finally:
        await conn.disconnect()
        await staller.aclose()


async def hold_as_stranger(redis: Redis, lock: aiolock.AsyncRLock, lease_ms: int) -> None:
    """Make ``lock`` held by a foreign owner for ``lease_ms``; it never publishes a release."""
    await redis.hset(keys_of(lock).lock, "someone-else", 1)
    await redis.pexpire(keys_of(lock).lock, lease_ms)


@contextlib.asynccontextmanager
async def held_by_another_task(lock: Any) -> AsyncIterator[None]:
    """``lock`` (a lock object of its own, or a read or write lock) held by a task of its own,
    so by another owner than the caller, until the block ends; then released."""
    holding, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with lock.acquire(wait=5):
            holding.set()
            await done.wait()

    task = asyncio.create_task(holder())
    try:
        await asyncio.wait_for(holding.wait(), 5)
        yield
    finally:
        done.set()
        await task


async def take_and_release_across_failover(
    lock: Any, wait: float, lease: float | None = None
) -> bool:
    """Wait for ``lock`` (``try_lock``), then give it back; after a connection error, try again
    until ``wait`` runs out, as a caller must while a failover is under way: a try in flight
    when the primary dies, or one that outlasts the redirect budget of a Cluster call, raises
    (documented).  The tests that kill a primary under a parked waiter use it, after waiting
    until no try is in flight (:func:`settled`): the waiter still tries whenever it is woken
    during the failover (its channel moved to the promoted replica, or its subscriber
    reconnected), and such a try may meet a node that is going or not yet ready."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            if not await lock.try_lock(wait=max(deadline - loop.time(), 0.0), lease=lease):
                return False
        except (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError):
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0)  # the next try gets a fresh connection and topology
            continue
        await lock.unlock()
        return True


def parked(client: aiolock.Client, lock: aiolock.AsyncRLock) -> int:
    """How many of ``client``'s tasks are parked on ``lock``'s channel."""
    found = entry_of(client, lock)
    return 0 if found is None else found.parked


def settled(client: aiolock.Client, lock: aiolock.AsyncRLock, count: int = 1) -> bool:
    """Whether ``count`` of ``client``'s tasks are parked on ``lock``'s channel, its SUBSCRIBE
    confirmed, and no call of theirs is in flight.

    A waiter parks after its first try, before the server confirms the SUBSCRIBE; the
    confirmation then wakes it for one more try (a release may have come in between), and it
    parks again once that try is back.  ``parked() == 1`` holds in both parks: a test that
    kills the server, or counts the messages a release brings, must wait for the second.
    """
    found = entry_of(client, lock)
    return found is not None and found.confirmed and found.parked == count


@contextlib.asynccontextmanager
async def cluster_clients(url: str, prefix: str) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """A maker of clients on the Cluster at ``url`` (or at the node ``at``, ``host:port``) that
    share the key ``prefix`` (unless given one); every client made is closed on the way out."""
    made: list[aiolock.Client] = []

    def make(at: str | None = None, **options: Any) -> aiolock.Client:
        options.setdefault("key_prefix", prefix)
        where = url if at is None else f"redis://{at}/0"
        client = aiolock.Client.from_url(where, cluster=True, **options)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            await client.aclose()


async def use_once(client: aiolock.Client, kind: str, name: str) -> None:
    """One fault-free use of ``name`` as ``kind``, as a new user would: the default lease (the
    watchdog's), taken and released."""
    if kind == "semaphore":
        async with client.semaphore(name, 2).acquire(wait=0):
            pass
    elif kind == "latch":
        latch = client.countdown_latch(name)
        await latch.try_set_count(1)
        await latch.count_down()
    else:
        makers: dict[str, Callable[[str], LockKind]] = {
            "lock": client.lock,
            "fair": client.fair_lock,
            "spin": client.spin_lock,
            "write": lambda n: client.rw_lock(n).write_lock(),
            "read": lambda n: client.rw_lock(n).read_lock(),
        }
        lock = makers[kind](name)
        async with lock.acquire(wait=0):
            pass


def redis_version(url: str) -> tuple[int, int]:
    """The Redis version the server at ``url`` reports (Valkey 7 and later report 7.2, the
    Redis they are compatible with)."""
    with SyncRedis.from_url(url, decode_responses=True) as redis:
        major, minor, *_ = str(redis.info("server")["redis_version"]).split(".")
    return int(major), int(minor)


def needs_sharded_pubsub(url: str) -> None:
    """Skip a test of sharded pub/sub on a server without it (Redis 6; the classic pub/sub
    that aiolock uses there instead is tested in versions/test_server_versions.py)."""
    if redis_version(url) < (7, 0):
        pytest.skip("no sharded pub/sub before Redis 7.0 (classic pub/sub is used instead)")


def documented_acl_commands() -> str:
    """The plain lock's commands as ``docs/deployment.md``'s ACL row lists them (``+evalsha
    ...``): the tests run as exactly that user, so the docs cannot drift from what works."""
    text = (Path(__file__).parent.parent / "docs" / "deployment.md").read_text()
    block = text[text.index("ACL SETUSER aiolock") :].split("```")[0]
    return " ".join(word for word in block.split() if word.startswith("+"))


class Interrupted(BaseException):
    """What a test's signal handler raises in a thread (as Ctrl-C raises ``KeyboardInterrupt``),
    without touching pytest's own handling of Ctrl-C."""


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """:func:`eventually` for a thread: block until ``predicate()`` is true, or fail."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(0.002)


async def late_reply_times_out(
    client: aiolock.Client,
    stall: Callable[[], Awaitable[object]],
    resume: Callable[[], Awaitable[object]],
) -> None:
    """A lock call made while ``stall()`` holds the server still raises ``TimeoutError`` before
    ``resume()`` (within 10 s, whatever the stall's length); the client goes on after it."""
    lock = client.lock("late")
    assert await lock.try_lock()  # connected, scripts loaded
    await lock.unlock()
    await stall()
    try:
        with pytest.raises(RedisTimeoutError):
            async with asyncio.timeout(10):
                await lock.try_lock()
    finally:
        await resume()
    # That call's outcome was unknown: settled (the grant undone) before the next call of the
    # owner, which connects again; at once, not once its lease would have ended (30 s).
    async with asyncio.timeout(10):
        assert await lock.try_lock()
    await lock.unlock()
    assert not await lock.is_locked()


def paused(admin: Redis) -> tuple[Callable[[], Awaitable[object]], Callable[[], Awaitable[object]]]:
    """Stall and resume for :func:`late_reply_times_out`: ``CLIENT PAUSE WRITE`` for 60 s (a
    lock's scripts write), lifted by ``CLIENT UNPAUSE``."""

    async def stall() -> None:
        await admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")  # type: ignore[no-untyped-call]

    async def resume() -> None:
        await admin.execute_command("CLIENT", "UNPAUSE")  # type: ignore[no-untyped-call]

    return stall, resume
