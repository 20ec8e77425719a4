"""A reply is waited for within its connection's ``socket_timeout``: kept by one timer per
runner (``aiolock/_redis/deadlines.py``), not by redis-py's timer per read, and raised as
redis-py's own ``TimeoutError``."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import services_of, stall_server

pytestmark = pytest.mark.anyio


async def test_a_reply_later_than_the_socket_timeout_raises_timeout_error(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    try:
        await redis.execute_command("DEBUG", "SLEEP", 0)  # type: ignore[no-untyped-call]
    except ResponseError:
        pytest.skip("this server does not allow DEBUG (enable-debug-command)")
    address = urlsplit(aiolock_server.url)
    slow = Redis(
        host=address.hostname or "127.0.0.1",
        port=address.port or 6379,
        socket_timeout=0.1,
        retry=Retry(NoBackoff(), 0),  # not resent: the caller sees the timeout
    )
    async with aiolock.Client(slow, key_prefix=aiolock_client.key_prefix) as client:
        calls = services_of(client).calls
        assert await calls.command("k", ("ECHO", "warm")) == b"warm"
        started = asyncio.Event()
        stall = asyncio.create_task(stall_server(aiolock_server.url, 2, started))
        await started.wait()
        with pytest.raises(RedisTimeoutError):
            await calls.command("k", ("ECHO", "late"))
        assert not stall.done()  # cut short by the timeout, not answered once the server woke
        await stall
        # The connection whose reply was late was closed; the next call connects again.
        assert await calls.command("k", ("ECHO", "again")) == b"again"
        # A reply that comes in time is read whole, however many calls go by.
        for n in range(50):
            assert await calls.command("k", ("ECHO", str(n))) == str(n).encode()
