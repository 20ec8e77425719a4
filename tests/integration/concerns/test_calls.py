"""The client's own call path (``aiolock._redis.calls``): its connections, their limit, reuse."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock import _scripts
from aiolock._redis.calls import NotSent
from aiolock._redis.redispy import has_data
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import assert_clean, eventually, keys_of, server_calls_of, stall_server

pytestmark = pytest.mark.anyio


async def client_connections(redis: Redis, name: str) -> int:
    """Connections on the server whose client name is ``name``."""
    return sum(1 for entry in await redis.client_list() if entry.get("name") == name)


async def test_connections_stay_within_the_pool_limit(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    client = make_client(max_connections=3, client_name="limited")
    held = [client.lock(f"limit-{i}") for i in range(40)]

    async def cycle(lock: aiolock.AsyncRLock) -> None:
        async with lock.acquire(wait=5):
            assert await client_connections(redis, "limited") <= 3

    await asyncio.gather(*(cycle(lock) for lock in held))
    assert server_calls_of(client).connections == 3
    assert len(server_calls_of(client).idle) == 3  # every connection came back
    await assert_clean(redis, client)


async def test_idle_connections_killed_by_the_server_are_replaced(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # from_url sets no Retry: without the idle check the first call after a kill would fail.
    client = make_client(client_name="killed")
    lock = client.lock("killed")
    await lock.lock()
    await lock.unlock()
    assert await redis.client_kill_filter(_type="normal", skipme=True) >= 1

    async def eof_seen(conn: AbstractConnection) -> bool:
        try:
            return await has_data(conn)
        except RedisConnectionError:
            return True  # redis-py before 8 reports the EOF as an error

    async def noticed() -> bool:  # the EOF has reached the idle connection
        return all([await eof_seen(conn) for conn in server_calls_of(client).idle])

    await eventually(noticed, what="EOF seen on the idle connection")
    await lock.lock()
    assert await lock.is_held()
    await lock.unlock()
    await assert_clean(redis, client)


async def test_a_cancelled_call_reports_its_outcome_to_the_orphan_handler(
    aiolock_server: ServerInfo, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    client = make_client()
    calls = server_calls_of(client)
    keys = keys_of(client.lock("orphaned"))
    owner = f"{client.id}:x:orphan"
    await client.lock("warm-up").lock()  # one connection, connected and idle
    await client.lock("warm-up").unlock()
    started = asyncio.Event()
    stall = asyncio.ensure_future(stall_server(aiolock_server.url, 0.2, started))
    await started.wait()
    outcomes: list[asyncio.Future[object]] = []
    call = asyncio.ensure_future(
        calls.run(
            _scripts.LOCK_ACQUIRE,
            (keys.lock, keys.meta, keys.fence),
            (30000, owner, 1),
            orphan=outcomes.append,
        )
    )
    # Taken from the idle list, the connection is written to at once: the call is then waiting
    # for its reply, which the stalled server holds back.
    await eventually(lambda: not calls.idle, what="call in flight")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (outcome,) = outcomes
    reply = await outcome
    assert isinstance(reply, list)
    assert reply[1] == 1  # granted: the handler could undo it
    assert await redis.hget(keys.lock, owner) == "1"
    assert calls.idle  # the connection came back once the reply was read
    await stall
    await redis.delete(keys.lock)


async def test_a_call_cancelled_in_the_queue_is_not_sent_and_leaves_nothing(
    aiolock_server: ServerInfo, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    client = make_client(max_connections=1)
    calls = server_calls_of(client)
    keys = keys_of(client.lock("unsent"))
    await client.lock("warm-up").lock()
    await client.lock("warm-up").unlock()
    started = asyncio.Event()
    stall = asyncio.ensure_future(stall_server(aiolock_server.url, 0.2, started))
    await started.wait()
    blocker_lock = client.lock("blocker", owner="blocker")
    blocker = asyncio.ensure_future(blocker_lock.lock())  # holds the only connection
    outcomes: list[asyncio.Future[object]] = []
    call = asyncio.ensure_future(
        calls.run(
            _scripts.LOCK_ACQUIRE,
            (keys.lock, keys.meta, keys.fence),
            (30000, "o", 1),
            orphan=outcomes.append,
        )
    )
    await eventually(lambda: calls.queued == 1, what="second call queued")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    (outcome,) = outcomes
    assert isinstance(outcome.exception(), NotSent)
    await blocker
    await stall
    await blocker_lock.unlock()
    assert not await redis.exists(keys.lock)
    assert not calls.queued
    assert len(calls.idle) == calls.connections == 1
    await assert_clean(redis, client)


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
async def test_names_go_to_the_server_in_the_clients_encoding(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, encoding: str
) -> None:
    # UTF-8 is packed by hiredis, any other encoding by redis-py: the same bytes either way.
    raw = Redis.from_url(aiolock_server.url, encoding=encoding)
    client = aiolock.Client(raw, key_prefix=aiolock_client.key_prefix)
    try:
        async with client.lock("café").acquire(wait=5) as guard:
            assert guard.fencing_token > 0
            found = [key async for key in raw.scan_iter(match=b"*caf*")]
            assert found
            assert all("café".encode(encoding) in key for key in found)
    finally:
        await client.aclose()
        await raw.aclose()
