"""A waiter that gives up while the server is out of reach still withdraws, once it is back.

The kinds that keep their waiters on the server (the fair lock's queue, the read-write lock's
waiting writers) withdraw a waiter that leaves without the lock.  When that call failed (the
server restarting, every reconnect refused), its entry held the others back until it expired,
``fair_wait_timeout`` after the waiter's last try; the chaos run's leftover check found one.
The withdraw is now sent again until it lands (or the entry surely ended).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock import _scripts
from tests.helpers import eventually, server_calls_of, services_of

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio

# kind -> (the lock, the server-side queue or set its waiters are in, by name)
KINDS: dict[str, tuple[Callable[[aiolock.Client, str], Any], str]] = {
    "fair": (lambda client, name: client.fair_lock(name), "{prefix}:fair:{{{name}}}:ql"),
    "write": (
        lambda client, name: client.rw_lock(name).write_lock(),
        "{prefix}:rw:{{{name}}}:writers",
    ),
}


async def _waiting(redis: Redis, key: str) -> int:
    """How many waiters ``key`` has: the fair lock's list, or the writers' sorted set."""
    return int(await (redis.llen(key) if key.endswith(":ql") else redis.zcard(key)))


WITHDRAWS = (_scripts.FAIR_WITHDRAW, _scripts.RW_WITHDRAW)


def failed_withdraws(client: aiolock.Client, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set when a withdraw call of ``client`` fails."""
    calls = services_of(client).calls
    run, failed = calls.run, asyncio.Event()

    async def watched(script: Any, *args: Any, **options: Any) -> Any:
        try:
            return await run(script, *args, **options)
        except RedisConnectionError:
            if script in WITHDRAWS:
                failed.set()
            raise

    monkeypatch.setattr(calls, "run", watched)
    return failed


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_waiter_that_gave_up_while_the_server_was_out_of_reach_withdraws(
    aiolock_client: aiolock.Client,
    proxied: Callable[..., aiolock.Client],
    proxy: FreezableProxy,
    redis: Redis,
    *,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make, waiting = KINDS[kind]
    name = f"withdrawn-{kind}"
    waiters = waiting.format(prefix=aiolock_client.key_prefix, name=name)
    # A long fair_wait_timeout: the entry would outlive the test unless withdrawn.
    client = proxied(
        fair_wait_timeout=60, retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError]
    )
    failed = failed_withdraws(client, monkeypatch)
    calls = server_calls_of(client)
    async with make(aiolock_client, name).acquire(wait=0, lease=30):
        waiter = asyncio.create_task(make(client, name).try_lock(wait=30))

        async def parked() -> bool:
            # Queued, and no try in flight (one whose outcome the reset left unknown would
            # be undone first, for as long as its lease).
            return bool(await _waiting(redis, waiters)) and len(calls.idle) == calls.connections

        await eventually(parked, what="the waiter parked")
        # The server goes out of reach, and the waiter gives up before it hears of it (its
        # subscription broke: it would try again).
        proxy.refuse = True
        proxy.reset()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await failed.wait()  # its withdraw found no way to the server
        assert await _waiting(redis, waiters) == 1
        proxy.refuse = False
        # Failed before the fix: the entry stayed for fair_wait_timeout.
        await eventually(lambda: _empty(redis, waiters), what="the waiter withdrawn")


async def _empty(redis: Redis, key: str) -> bool:
    return not await _waiting(redis, key)
