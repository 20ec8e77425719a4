"""The chaos run's last check, on a real server: what may stay once every worker has drained."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from aiolock.pytest_plugin import ServerInfo

from .run import PREFIX, leftovers_on

pytestmark = pytest.mark.anyio


async def test_a_permits_set_with_no_live_lease_is_not_left_behind(
    aiolock_server: ServerInfo, redis: Redis
) -> None:
    """A semaphore's fence marks keep its permits set alive a minute, with a permit whose
    lease ended still in it (the next call drops both): nothing is held there.  A live lease
    in it is a leftover."""
    server = aiolock_server.server
    if server is None:
        pytest.skip("reads every key of the embedded server")
    key = f"{PREFIX}:semaphore:{{leftover-check}}"
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    try:
        await redis.zadd(key, {"ended-permit": now - 4_000, "fenced/1": -(now + 60_000)})
        await redis.pexpire(key, 60_000)
        assert await leftovers_on(server, {}, grace=0) == []
        await redis.zadd(key, {"live-permit": now + 60_000})
        [found] = await leftovers_on(server, {}, grace=0)
        assert "live-permit" in found
    finally:
        await redis.delete(key)
