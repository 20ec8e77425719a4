"""A channel the server refuses to subscribe (ACL): its waiters hear the refusal at once.

A SUBSCRIBE answered with an error must neither leave an entry that its waiters trust (they
would wait out the holder's lease) nor take down the subscriber connection that the client's
other waiters share.
"""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import assert_clean, eventually, hold_as_stranger, keys_of, parked

pytestmark = pytest.mark.anyio


async def test_a_refused_channel_fails_its_waiters_and_spares_the_others(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    prefix = aiolock_client.key_prefix
    user, password = f"waiter-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    # Every key and command, but only the channels of locks named "allowed...".
    channels = f"&{prefix}:{{allowed*"
    acl = ("ACL", "SETUSER", user, "on", f">{password}", "~*", "resetchannels", channels)
    await redis.execute_command(*acl, "+@all")  # type: ignore[no-untyped-call]
    address = urlsplit(aiolock_server.url).netloc
    client = aiolock.Client.from_url(f"redis://{user}:{password}@{address}/0", key_prefix=prefix)
    try:
        allowed, refused = client.lock("allowed"), client.lock("refused")
        await hold_as_stranger(redis, allowed, 30_000)
        await hold_as_stranger(redis, refused, 30_000)

        async def wait_for_allowed() -> bool:
            acquired = await allowed.try_lock(wait=30)
            await allowed.unlock()
            return acquired

        waiter = asyncio.create_task(wait_for_allowed())
        await eventually(lambda: parked(client, allowed) == 1)
        with pytest.raises(NoPermissionError):
            await asyncio.wait_for(refused.try_lock(wait=30), 5)  # not after the 30 s lease
        assert refused.statistics().waiters == 0
        # The subscriber connection survived the refusal: a release still wakes the other.
        await redis.delete(keys_of(allowed).lock)
        await redis.publish(keys_of(allowed).channel, "released")
        assert await asyncio.wait_for(waiter, 5)
        await redis.delete(keys_of(refused).lock)
        await assert_clean(redis, client)
    finally:
        await client.aclose()
        await redis.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
