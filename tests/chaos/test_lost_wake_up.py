"""A release by a bare command whose reply is lost still wakes the waiters it owed a wake-up.

The fault-free last release of the plain lock is one ``HDEL``; it also deletes the mark of a
waiter refused since the grant, and the client publishes that waiter's wake-up once it reads
the reply.  When the reply is lost (the connection cut after the server ran it), the resend
that settles it finds nothing held: the wake-up must go out all the same, or the waiters of
every client sit out the lease they were refused by (30 s with the watchdog).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from tests.helpers import eventually

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


async def test_a_release_whose_reply_was_lost_wakes_the_waiter_it_owed(
    proxy: FreezableProxy,
    proxied: Callable[..., aiolock.Client],
    aiolock_client: aiolock.Client,
) -> None:
    holder = proxied().lock("owed")
    await holder.lock()  # lease=None: a refused waiter parks for the watchdog's 30 s lease
    waiter = aiolock_client.lock("owed")
    waiting = asyncio.create_task(waiter.try_lock(wait=25))
    await eventually(lambda: waiter.statistics().waiters == 1, what="the waiter parked")
    cut = proxy.cut_next_request(b"HDEL")  # the release runs; its reply never comes back
    with contextlib.suppress(RedisConnectionError):
        await holder.unlock()
    assert await cut  # the server answered it
    # Within the settlement's resend, not at the end of the 30 s lease the waiter met.
    assert await asyncio.wait_for(waiting, 5)
