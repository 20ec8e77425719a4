"""AsyncCountDownLatch across clients, against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, entry_of, eventually, keys_of

pytestmark = pytest.mark.anyio


async def commands(redis: Redis, name: str) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


async def test_counts_down_to_zero_and_leaves_no_key(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    latch = aiolock_client.countdown_latch("job")
    assert await latch.count() == 0
    assert await latch.try_set_count(2)
    assert not await latch.try_set_count(5)  # a count is set already
    assert await latch.count() == 2
    await latch.count_down()
    assert await latch.count() == 1
    await latch.count_down()
    assert await latch.count() == 0
    await latch.count_down()  # at zero: nothing happens
    assert await latch.count() == 0
    assert await latch.wait(timeout=0)
    assert await redis.keys(f"{aiolock_client.key_prefix}:*") == []
    assert await latch.try_set_count(1)  # a latch at zero can be set again


async def test_every_waiter_of_every_client_wakes_at_zero_without_polling(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client(), make_client()]
    latch = aiolock_client.countdown_latch("parts")
    assert await latch.try_set_count(3)
    waiters = [
        asyncio.create_task(client.countdown_latch("parts").wait()) for client in clients * 3
    ]

    def parked() -> bool:  # confirmed, looked at the count again, and parked once more
        entries = [entry_of(c, latch) for c in clients]
        return all(e is not None and e.confirmed and e.parked == 3 for e in entries)

    await eventually(parked, what="every waiter parked on a confirmed subscription")
    numsub = await redis.pubsub_numsub(keys_of(latch).channel)
    assert int(numsub[0][1]) == 3  # one subscription per client for its 3 waiting tasks
    gets = await commands(redis, "get")
    await asyncio.sleep(0.3)  # waiting: no command is sent meanwhile
    assert await commands(redis, "get") == gets
    await latch.count_down()
    await latch.count_down()
    assert not any(waiter.done() for waiter in waiters)
    await latch.count_down()
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True] * 9
    for client in clients:
        await assert_clean(redis, client)


async def test_wait_times_out_and_cancels_cleanly(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    latch = aiolock_client.countdown_latch("never")
    assert await latch.try_set_count(1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await latch.wait(timeout=0.2)
    assert 0.15 <= loop.time() - started < 2
    waiter = asyncio.create_task(latch.wait())
    await eventually(lambda: aiolock_client.statistics().waiters == 1, what="parked")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert repr(latch) == "<AsyncCountDownLatch 'never' [waiters:0]>"
    await latch.count_down()
    await assert_clean(redis, aiolock_client)


async def test_bad_arguments_fail_before_any_io() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(TypeError, match="name"):
            client.countdown_latch(3)  # type: ignore[arg-type]
        latch = client.countdown_latch("x")
        with pytest.raises(ValueError, match="count"):
            await latch.try_set_count(0)
        with pytest.raises(TypeError, match="count"):
            await latch.try_set_count(True)
        with pytest.raises(ValueError, match="timeout"):
            await latch.wait(timeout=-1)
    finally:
        await client.aclose()
