"""Holds reported lost that were not (issue 28).

A watchdog renewal that reaches the server after its owner's own release: the release ends
the hold on the server; a renewal sent before its reply came finds the lock gone and answers
"not held".  Read before the release's reply, that answer was taken for a loss, and the
owner's block ended in ``LockLostError`` although nobody else ever held the lock.

The proxy holds the release's reply back once the server has applied it; meanwhile a renewal
round runs on another connection and is answered first.  That is the order the race needs,
made certain instead of likely.

A grant (or a renewal) whose call waited for a reconnect before it was written: the lease the
reply reports runs from when the server ran it, so the client counts it from the write, not
from the call.  Counted from the call, a retry's backoff longer than the lease made the hold
look expired the moment it was granted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff

import aiolock
from aiolock.lock import ReentrantKind
from tests.helpers import eventually, services_of

from .proxy import FreezableProxy, HeldReply

pytestmark = pytest.mark.anyio


def _lock(client: aiolock.Client) -> Any:
    return client.lock("race")


def _fair(client: aiolock.Client) -> Any:
    return client.fair_lock("race")


def _spin(client: aiolock.Client) -> Any:
    return client.spin_lock("race")


def _read(client: aiolock.Client) -> Any:
    return client.rw_lock("race").read_lock()


def _write(client: aiolock.Client) -> Any:
    return client.rw_lock("race").write_lock()


def _permit(client: aiolock.Client) -> Any:
    return client.semaphore("race", 2)


KINDS: dict[str, Callable[[aiolock.Client], Any]] = {
    "lock": _lock,
    "fair": _fair,
    "spin": _spin,
    "read": _read,
    "write": _write,
    "permit": _permit,
}


@pytest.fixture
async def client(proxied: Callable[..., aiolock.Client]) -> aiolock.Client:
    # A long period: the only renewals are the ones the test runs.
    return proxied(watchdog_timeout=30)


async def renew_once_released(client: aiolock.Client, held: HeldReply) -> None:
    """Once the server has applied the held release, run a renewal round, then let the
    release's reply go on: the renewal's answer is read first."""
    try:
        await held.arrived
        await services_of(client).watchdog.renew_once()
    finally:
        held.let_go()


async def release_with_a_renewal_inside(
    client: aiolock.Client, proxy: FreezableProxy, lock: Any, before: Any = None
) -> Any:
    """Hold ``lock`` and leave the block with a renewal round inside its release; the guard."""
    # A first cycle loads the kind's scripts: a held NOSCRIPT reply would prove nothing.
    async with lock.acquire():
        pass
    renewer: asyncio.Task[None] | None = None
    try:
        async with lock.acquire() as guard:
            if before is not None:
                await before()
            # The release that ends the block: the plain and spin locks' is a plain HDEL.
            plain = isinstance(lock, ReentrantKind)
            held = proxy.hold_next_reply(b"HDEL" if plain else b"EVALSHA")
            renewer = asyncio.create_task(renew_once_released(client, held))
    finally:
        if renewer is not None:
            await renewer
    return guard


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_renewal_answered_before_the_release_is_no_loss(
    client: aiolock.Client, proxy: FreezableProxy, kind: str
) -> None:
    # Failed before the fix: the renewal's "not held" marked the hold lost, and the block's
    # exit raised LockLostError.
    guard = await release_with_a_renewal_inside(client, proxy, KINDS[kind](client))
    assert not guard.lost, guard
    assert len(services_of(client).holds) == 0


async def test_a_loss_found_by_a_renewal_during_a_release_is_still_reported(
    client: aiolock.Client, proxy: FreezableProxy, aiolock_client: aiolock.Client
) -> None:
    """The lock was forced before the release: the release's own reply tells the loss."""

    async def force() -> None:
        assert await aiolock_client.lock("race").force_unlock()

    lock = client.lock("race")
    with pytest.raises(aiolock.LockLostError, match="no longer held by its owner at release"):
        await release_with_a_renewal_inside(client, proxy, lock, before=force)
    assert lock.statistics().losses == 1


async def test_short_watched_holds_under_contention_are_never_lost(
    aiolock_server: Any, aiolock_client: aiolock.Client
) -> None:
    """The loop that found the race, on a fault-free server: tasks of two clients take eight
    names in turn with ``lease=None`` and a renewal round every 100 ms, so that renewals keep
    meeting releases in flight.  Before the fix some 1 in 5,000 holds ended in LockLostError."""
    clients = [
        aiolock.Client.from_url(
            aiolock_server.url, key_prefix=aiolock_client.key_prefix, watchdog_timeout=0.3
        )
        for _ in range(2)
    ]
    lost: list[str] = []
    holds = 0
    blocked = 0.0  # the longest the event loop was blocked (a 0.3 s lease can truly run out)

    async def probe(until: float) -> None:
        nonlocal blocked
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            before = loop.time()
            await asyncio.sleep(0.01)
            blocked = max(blocked, loop.time() - before - 0.01)

    async def worker(client: aiolock.Client, i: int, until: float) -> None:
        nonlocal holds
        loop = asyncio.get_running_loop()
        while loop.time() < until:
            try:
                async with client.lock(f"n{i % 8}").acquire(wait=5):
                    await asyncio.sleep(0.002)  # the critical section's work
            except aiolock.LockLostError as error:
                lost.append(str(error))
            holds += 1

    try:
        until = asyncio.get_running_loop().time() + 4
        async with asyncio.TaskGroup() as group:
            group.create_task(probe(until))
            for client in clients:
                for i in range(32):
                    group.create_task(worker(client, i, until))
        renewals = sum(services_of(client).watchdog.renewals for client in clients)
    finally:
        for client in clients:
            await client.aclose()
    # The race's signature is the watchdog's reason; a lease that ran out for the client's
    # timer is a true loss only if the loop was blocked long enough for it (a loaded machine).
    raced = [reason for reason in lost if "the watchdog found it" in reason]
    assert raced == [], f"{len(raced)} of {holds} holds reported lost: {raced[:3]}"
    assert lost == [] or blocked > 0.1, f"{lost[:3]}, the loop never blocked {blocked:.3f}s"
    assert renewals > 0  # the watchdog did renew, so renewals did meet releases


async def test_a_grant_written_after_a_reconnect_counts_its_lease_from_the_write(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy
) -> None:
    # The first connection is refused; redis-py's retry connects again after its backoff, which
    # is longer than the lease asked for.
    client = proxied(watchdog_timeout=30, retry=Retry(ConstantBackoff(0.6), 3))
    lock = client.lock("late-write")
    proxy.refuse = True
    entered = asyncio.Event()

    async def hold() -> aiolock.LockGuard[int]:
        async with lock.acquire(wait=5, lease=0.5) as guard:
            entered.set()
            await asyncio.sleep(0)  # a timer already due would fire here
        return guard

    holder = asyncio.create_task(hold())
    await eventually(lambda: proxy.refused > 0, what="the first connection refused")
    proxy.refuse = False
    # Failed before the fix: the hold was taken for lost at once, and the block raised
    # LockLostError.
    guard = await holder
    assert entered.is_set()
    assert not guard.lost
    assert lock.statistics().losses == 0
