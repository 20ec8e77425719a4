"""Transactions and ``valid_for()`` behind a faulty path.

A transaction is never resent: its commands are not idempotent, so a connection that fails
with it written leaves its outcome to the caller (applied once or not at all), as a MULTI/EXEC
does.  ``valid_for()`` behind a frozen path runs down with the lease the server counts, and is
0.0 once the hold is taken for lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock import _scripts
from tests.helpers import eventually
from tests.integration.concerns.test_transaction import below_the_servers

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


async def test_a_transaction_whose_reply_is_lost_is_not_resent(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy, redis: Redis
) -> None:
    # Cached up front: the cut EVALSHA must be answered by the script, not by NOSCRIPT.
    await redis.script_load(_scripts.LOCK_TRANSACT.source)
    client = proxied(retry=Retry(NoBackoff(), 3))  # the lock scripts would be resent
    lock = client.lock("once")
    counter = f"{client.key_prefix}-counter:{lock.hash_tag}"
    async with lock.acquire(wait=5) as guard:
        reply = proxy.cut_next_request(_scripts.LOCK_TRANSACT.sha.encode())
        with pytest.raises(RedisConnectionError):
            async with guard.transaction() as tx:
                tx.incr(counter)
        async with asyncio.timeout(5):
            assert await reply  # the server ran it; the client never saw the reply
        assert await redis.get(counter) == "1"  # once, not once per resend
        assert tx.results is None
        assert not guard.lost  # the hold is untouched
        async with guard.transaction() as tx:
            tx.incr(counter)
        assert tx.results == [2]


async def test_valid_for_behind_a_frozen_path_runs_down_with_the_servers_lease(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy, redis: Redis
) -> None:
    client = proxied(watchdog_timeout=0.6)
    lock = client.lock("frozen")
    try:
        async with lock.acquire(wait=5) as guard:
            await eventually(lambda: lock.statistics().renewals >= 1, what="a renewal")
            proxy.freeze()  # renewals hang from now on: nothing errors, nothing closes
            samples = []
            while not guard.lost:
                samples.append(await below_the_servers(redis, "lock", lock, guard))
                await asyncio.sleep(0.01)
            assert guard.valid_for() == 0.0
            assert len(samples) > 10
            assert samples == sorted(samples, reverse=True)  # no renewal moved it on
            proxy.thaw(reset=True)
    except aiolock.LockLostError:
        pass
    finally:
        proxy.thaw()
    assert guard.lost
