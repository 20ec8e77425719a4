"""A reply is waited for within its connection's ``socket_timeout``: kept by one timer per
runner (``aiolock/_redis/deadlines.py``), not by redis-py's timer per read, and raised as
redis-py's own ``TimeoutError``.  The server is held still by ``CLIENT PAUSE WRITE`` (a lock's
scripts write): no reply comes until it is lifted, after the error."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import late_reply_times_out, paused

pytestmark = pytest.mark.anyio


async def test_a_reply_later_than_the_socket_timeout_raises_timeout_error(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    client = aiolock.Client.from_url(
        aiolock_server.url,
        key_prefix=aiolock_client.key_prefix,
        socket_timeout=0.2,
        retry=Retry(NoBackoff(), 0),  # not resent: the caller sees the timeout
    )
    async with client:
        await late_reply_times_out(client, *paused(redis))
