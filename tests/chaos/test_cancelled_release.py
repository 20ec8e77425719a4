"""A release whose caller is cancelled while it is in flight still wakes the client's waiters.

The plain lock's release publishes only for a waiter that this incarnation of the lock
refused; this client's other parked waiters (refused by an earlier incarnation, or parked
behind their own client's waiters without a try) are woken by the client itself once its
release deleted the lock.  When the caller was cancelled with the release on its way, the
reply is read in the background (a settlement): that path skipped the wake-up, and the
waiters slept until their pause ran out (a watchdog lease) or their wait did.  Found as a
random-cancellation test that failed about once in 150 runs (``LockTimeoutError``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import _scripts
from tests.helpers import eventually, keys_of, settled

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio

WAIT = 5.0


async def test_a_release_cancelled_in_flight_wakes_the_clients_parked_waiter(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy, redis: Redis
) -> None:
    client = proxied(watchdog_timeout=30)  # a parked waiter's own pause: up to 30 s
    lock = client.lock("woken")
    # Loads the scripts, a held NOSCRIPT reply would prove nothing: the inner release is the
    # release script (an uncontended last release is a plain HDEL).
    async with lock.acquire(), lock.acquire():
        pass
    held_it, go = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        await lock.lock()
        held_it.set()
        await go.wait()
        await lock.unlock()

    holder_task = asyncio.create_task(holder())
    await held_it.wait()

    async def wait_for_it() -> bool:
        acquired = await lock.try_lock(wait=WAIT)
        if acquired:
            await lock.unlock()
        return acquired

    waiter = asyncio.create_task(wait_for_it())
    # Parked for good: its SUBSCRIBE confirmed, and the one more try the confirmation brings
    # back (that try would set ':w' again, and its reply could be the one held below).
    await eventually(lambda: settled(client, lock), what="the waiter parked, its channel confirmed")
    # The waiter was refused by an earlier incarnation of the lock, as far as the server knows:
    # the release publishes nothing, and only its own client can wake it.
    await redis.hdel(keys_of(lock).lock, ":w")

    reply = proxy.hold_next_reply(_scripts.LOCK_RELEASE.sha.encode())  # the release's
    go.set()
    await reply.arrived  # the server has applied it: the lock is gone

    async def deleted() -> bool:
        return not await redis.exists(keys_of(lock).lock)

    await eventually(deleted, what="the release applied")
    holder_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder_task
    loop = asyncio.get_running_loop()
    started = loop.time()
    reply.let_go()
    # Woken by its client once the release's reply is read in the background: well before
    # its wait (or its pause) runs out.
    assert await waiter
    assert loop.time() - started < WAIT / 2
