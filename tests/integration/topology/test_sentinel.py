"""Sentinel: ``aiolock.Client(sentinel.master_for(name))`` against real processes.

Each group is a primary, replicas and three Sentinels of one server binary
(:class:`~aiolock.testing.embedded.EmbeddedSentinel`).  The locks work through the Sentinel-managed
pool, their waiters are woken by pub/sub, and grants synced to a replica (``sync_replicas=1``)
outlive a failover: the primary killed, or a forced ``SENTINEL FAILOVER``.  After a forced
failover the old primary takes writes for about ten seconds, until the Sentinels make it a
replica and close its clients; the test of that (marked slow) waits it out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

import aiolock
from aiolock.testing.embedded import EmbeddedSentinel, EmbeddedServer
from tests.conftest import SERVERS
from tests.helpers import (
    eventually,
    keys_of,
    services_of,
    settled,
    take_and_release_across_failover,
)

pytestmark = pytest.mark.anyio

Make = Callable[..., aiolock.Client]


@pytest.fixture(scope="module", params=SERVERS)
def shared_group(request: pytest.FixtureRequest) -> Iterator[EmbeddedSentinel]:
    """One group per binary for the tests that do not fail it over."""
    with EmbeddedSentinel(binary=request.param) as group:
        yield group


@pytest.fixture(params=SERVERS)
def group(request: pytest.FixtureRequest) -> Iterator[EmbeddedSentinel]:
    """A group of its own, with two replicas: after a failover the new primary keeps one."""
    with EmbeddedSentinel(binary=request.param, replicas=2) as group:
        yield group


@contextlib.asynccontextmanager
async def _clients(group: EmbeddedSentinel) -> AsyncIterator[Make]:
    """Clients on ``sentinel.master_for(...)``, each with a Sentinel of its own (as separate
    processes would have); closed at the end, with the Redis objects they were given."""
    made: list[tuple[aiolock.Client, Redis, Sentinel]] = []

    def make(**options: Any) -> aiolock.Client:
        sentinel = Sentinel(group.sentinels)  # type: ignore[no-untyped-call]
        redis = sentinel.master_for(group.service)
        client = aiolock.Client(redis, **options)
        made.append((client, redis, sentinel))
        return client

    try:
        yield make
    finally:
        for client, redis, sentinel in made:
            await client.aclose()
            await redis.aclose()
            for connection in sentinel.sentinels:
                await connection.aclose()


@pytest.fixture
async def shared_clients(shared_group: EmbeddedSentinel) -> AsyncIterator[Make]:
    async with _clients(shared_group) as make:
        yield make


@pytest.fixture
async def clients(group: EmbeddedSentinel) -> AsyncIterator[Make]:
    async with _clients(group) as make:
        yield make


async def _take_and_release(lock: aiolock.AsyncRLock, wait: float) -> bool:
    """Wait for ``lock`` and give it back (a lock's owner is the task that took it)."""
    if not await lock.try_lock(wait=wait):
        return False
    await lock.unlock()
    return True


def _server(server: EmbeddedServer) -> Redis:
    return Redis(host=server.host, port=server.port, decode_responses=True)


async def _demote(old: Redis, new: EmbeddedServer) -> None:
    """Turn ``old`` into a replica of ``new`` as a Sentinel reconfigures a node: in one
    transaction, with its clients' connections closed (which closes this one too)."""
    pipe = old.pipeline(transaction=True)
    pipe.replicaof(new.host, new.port)
    pipe.client_kill_filter(_type="normal")
    pipe.client_kill_filter(_type="pubsub")
    with contextlib.suppress(ConnectionError):
        await pipe.execute()


LOCKS: dict[str, Callable[[aiolock.Client, str], Any]] = {
    "lock": lambda client, name: client.lock(name),
    "fair": lambda client, name: client.fair_lock(name),
    "spin": lambda client, name: client.spin_lock(name),
    "write": lambda client, name: client.rw_lock(name).write_lock(),
}


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_locks_through_sentinel(
    shared_clients: Make, shared_group: EmbeddedSentinel, kind: str
) -> None:
    client, other = shared_clients(), shared_clients()
    lock, rival = LOCKS[kind](client, f"s-{kind}"), LOCKS[kind](other, f"s-{kind}")
    async with _server(shared_group.primary) as primary:
        async with lock.acquire(wait=0):
            assert await primary.exists(keys_of(lock).lock)  # on the primary the Sentinels name
            assert not await rival.try_lock(wait=0)
        assert not await primary.exists(keys_of(lock).lock)
    assert await rival.try_lock(wait=0)
    await rival.unlock()


async def test_a_semaphore_and_a_latch_through_sentinel(shared_clients: Make) -> None:
    client = shared_clients()
    semaphore = client.semaphore("s-pool", 1)
    permit = await semaphore.try_acquire(wait=0)
    assert permit is not None
    assert await semaphore.try_acquire(wait=0) is None
    await permit.release()
    assert await semaphore.available() == 1
    latch = client.countdown_latch("s-latch")
    await latch.try_set_count(1)
    waiting = asyncio.ensure_future(latch.wait(timeout=10))
    await latch.count_down()
    assert await waiting


async def test_a_waiter_is_woken_by_pub_sub(shared_clients: Make) -> None:
    client, other = shared_clients(), shared_clients()
    lock, rival = client.lock("s-wake"), other.lock("s-wake")
    await lock.lock()
    waiting = asyncio.ensure_future(_take_and_release(rival, 30))
    await eventually(lambda: settled(other, rival), what="the waiter parked, subscribed")
    before = services_of(other).pubsub.statistics().messages
    await lock.unlock()
    assert await asyncio.wait_for(waiting, 5)
    assert services_of(other).pubsub.statistics().messages > before  # the release's message


async def test_synced_holds_survive_the_primary_killed(
    clients: Make, group: EmbeddedSentinel
) -> None:
    holder = clients(sync_replicas=1, sync_timeout=2.0)
    contender = clients()
    locks = [LOCKS[kind](holder, f"k-{kind}") for kind in sorted(LOCKS)]
    for lock in locks:
        assert await lock.try_lock(wait=0)
    rival = contender.lock("k-lock")
    waiting = asyncio.ensure_future(take_and_release_across_failover(rival, 60))
    # Not before its subscription is confirmed and the try that wakes is back: a try in flight
    # when the primary dies raises (a clean-clone CI run saw it).
    await eventually(lambda: settled(contender, rival), what="the waiter parked, subscribed")

    new = await asyncio.to_thread(group.failover, kill=True)

    async with _server(new) as primary:
        for lock in locks:  # synced: on the replica that became the primary
            assert await primary.exists(keys_of(lock).lock)
    assert not await contender.fair_lock("k-fair").try_lock(wait=0)  # through Sentinel
    for lock in locks:
        await lock.unlock()  # the holder's connections reconnect to the new primary
    assert await asyncio.wait_for(waiting, 10)  # woken: the subscriber reconnected there too
    again = holder.lock("k-after")
    assert await again.try_lock(wait=0)  # a synced grant on the new primary and its replica
    await again.unlock()
    async with _server(new) as primary:
        assert [key async for key in primary.scan_iter(match=f"{holder.key_prefix}:k-*")] == []


@pytest.mark.slow  # a few seconds a binary: a failover, and a replica's sync
async def test_synced_holds_survive_a_forced_failover(
    clients: Make, group: EmbeddedSentinel
) -> None:
    holder = clients(sync_replicas=1, sync_timeout=0.5)
    locks = [LOCKS[kind](holder, f"f-{kind}") for kind in sorted(LOCKS)]
    for lock in locks:
        assert await lock.try_lock(wait=0)
    old = group.primary

    new = await asyncio.to_thread(group.failover)

    async with _server(new) as primary:
        for lock in locks:
            assert await primary.exists(keys_of(lock).lock)
    contender = clients()  # a new client asks the Sentinels: it reaches the new primary
    for kind in sorted(LOCKS):
        assert not await LOCKS[kind](contender, f"f-{kind}").try_lock(wait=0)
    # Until the Sentinels demote it, the holder's connections still reach the old primary,
    # which has no replica left: a synced grant there is refused and undone, not lost later.
    with pytest.raises(aiolock.LockSyncError, match="0 of the 1 replica"):
        await holder.lock("f-window").try_lock(wait=0)
    async with _server(old) as stale:
        assert not await stale.exists(keys_of(holder.lock("f-window")).lock)
        # What the Sentinels do at their next look at it, up to ten seconds later (their INFO
        # period), the way they do it: the window is over, so the test does not wait for them.
        await _demote(stale, new)

    await asyncio.to_thread(group.wait_ready)  # the old primary is a replica of the new one

    for lock in locks:
        await lock.unlock()  # reconnected through Sentinel: released on the new primary
    async with _server(new) as primary:
        for lock in locks:
            assert not await primary.exists(keys_of(lock).lock)
    again = holder.lock("f-after")
    assert await again.try_lock(wait=0)
    async with _server(new) as primary:
        assert await primary.exists(keys_of(again).lock)
    async with _server(old) as replica:  # the old primary now replicates the new one

        async def replicated() -> bool:
            return bool(await replica.exists(keys_of(again).lock))

        # Not at once: a clean-clone CI run read it absent right after a synced grant (the
        # demoted node may still have been resyncing; see the issue note).
        await eventually(replicated, timeout=10, what="the grant replicated to the old primary")
    await again.unlock()
