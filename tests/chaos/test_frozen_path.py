"""A holder behind a frozen TCP path: its lease runs out on the server while its renewal hangs.

Another client then gets the lock, so the frozen holder must learn of its loss at its lease's
end (``guard.lost``, and ``cancel_on_loss`` cancels its body), not when the path thaws.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import aiolock
from tests.helpers import eventually

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio


@pytest.fixture
def frozen(proxied: Callable[..., aiolock.Client]) -> aiolock.Client:
    """A client that talks to the server through ``proxy``, with a short watchdog lease."""
    return proxied(watchdog_timeout=0.6)


async def test_a_frozen_watchdog_hold_is_lost_when_its_lease_ends(
    aiolock_client: aiolock.Client, proxy: FreezableProxy, frozen: aiolock.Client
) -> None:
    try:
        async with frozen.lock("x").acquire(wait=1) as guard:
            proxy.freeze()  # the watchdog's next renewal never arrives, nor does any error
            assert await aiolock_client.lock("x").try_lock(wait=3, lease=5)
            # The other client holds the lock now: the frozen holder must know it.
            await eventually(lambda: guard.lost, timeout=0.5, what="guard.lost")
            proxy.thaw(reset=True)
    except aiolock.LockLostError:
        pass
    finally:
        proxy.thaw()
        await aiolock_client.lock("x").force_unlock()
    assert guard.lost


async def test_cancel_on_loss_cancels_a_frozen_body(
    aiolock_client: aiolock.Client, proxy: FreezableProxy, frozen: aiolock.Client
) -> None:
    taken = asyncio.Event()

    async def body() -> None:
        async with frozen.lock("y").acquire(wait=1, cancel_on_loss=True):
            proxy.freeze()
            await taken.wait()
            await asyncio.sleep(2)  # the loss must cut this short

    holder = asyncio.create_task(body())
    try:
        await eventually(lambda: proxy.frozen, what="the holder froze its path")
        assert await aiolock_client.lock("y").try_lock(wait=3, lease=5)
        taken.set()
        with pytest.raises(aiolock.LockLostError):
            async with asyncio.timeout(1.0):  # not the 2 s body, nor the thaw
                await holder
    finally:
        proxy.thaw(reset=True)
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        await aiolock_client.lock("y").force_unlock()
