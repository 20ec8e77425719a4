"""Replica-synced grants: ``sync_replicas`` makes every grant wait until replicas have it.

A primary and a replica of each server binary are started per test.  A grant that fewer
replicas than asked confirm within ``sync_timeout`` is undone and raises ``LockSyncError``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

import aiolock
from aiolock.testing.embedded import EmbeddedServer
from tests.conftest import SERVERS
from tests.helpers import eventually, keys_of

pytestmark = pytest.mark.anyio


@dataclass
class Pair:
    primary: EmbeddedServer
    replica: EmbeddedServer


@pytest.fixture(params=SERVERS)
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    # No pause before the first (diskless) sync: by default the primary waits 5 s for more.
    with EmbeddedServer(binary=request.param, config={"repl-diskless-sync-delay": 0}) as primary:
        config = {"replicaof": f"{primary.host} {primary.port}"}
        with EmbeddedServer(binary=request.param, config=config) as replica:
            with SyncRedis(host=replica.host, port=replica.port, decode_responses=True) as r:
                deadline = time.monotonic() + 30
                while (link := r.info("replication").get("master_link_status")) != "up":
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the replica did not sync: {link}")
                    time.sleep(0.01)  # a synchronous fixture: no event loop to wait on
            yield Pair(primary, replica)


@pytest.fixture
async def clients(pair: Pair) -> AsyncIterator[Callable[..., aiolock.Client]]:
    made: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        client = aiolock.Client.from_url(pair.primary.url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


LOCKS: dict[str, Callable[[aiolock.Client, str], Any]] = {
    "lock": lambda client, name: client.lock(name),
    "fair": lambda client, name: client.fair_lock(name),
    "spin": lambda client, name: client.spin_lock(name),
    "write": lambda client, name: client.rw_lock(name).write_lock(),
    "read": lambda client, name: client.rw_lock(name).read_lock(),
}


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_a_synced_grant_is_on_the_replica_when_it_returns(
    clients: Callable[..., aiolock.Client], pair: Pair, kind: str
) -> None:
    client = clients(sync_replicas=1, sync_timeout=5.0)
    lock = LOCKS[kind](client, "synced")
    async with Redis.from_url(pair.replica.url) as replica:
        async with lock.acquire(wait=0):
            assert await replica.exists(keys_of(lock).lock)  # no wait: WAIT confirmed it


async def test_a_synced_permit_is_on_the_replica(
    clients: Callable[..., aiolock.Client], pair: Pair
) -> None:
    client = clients(sync_replicas=1, sync_timeout=5.0)
    semaphore = client.semaphore("pool", 2)
    async with Redis.from_url(pair.replica.url) as replica:
        permit = await semaphore.try_acquire(wait=0)
        assert permit is not None
        assert await replica.zscore(keys_of(semaphore).lock, permit.id) is not None
        await permit.release()
    strict = clients(sync_replicas=2, sync_timeout=0.05).semaphore("pool", 1)
    with pytest.raises(aiolock.LockSyncError):
        await strict.try_acquire(wait=0)
    assert await strict.available() == 1


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_a_grant_too_few_replicas_confirm_is_undone(
    clients: Callable[..., aiolock.Client], pair: Pair, kind: str
) -> None:
    client = clients(sync_replicas=2, sync_timeout=0.05)  # there is one replica
    lock = LOCKS[kind](client, "unsynced")
    with pytest.raises(aiolock.LockSyncError, match=r"[01] of the 2 replica"):
        await lock.try_lock(wait=0)
    assert not await lock.is_locked()
    assert client.statistics().holds == 0
    other = LOCKS[kind](clients(), "unsynced")
    assert await other.try_lock(wait=0)  # nothing was left behind
    await other.unlock()


async def test_a_stopped_replica_fails_synced_grants(
    clients: Callable[..., aiolock.Client], pair: Pair
) -> None:
    # Long enough for the first grant on a loaded machine; the failing ones wait it out.
    client = clients(sync_replicas=1, sync_timeout=2.0)
    held = client.lock("one")
    await held.lock()
    pair.replica.stop()
    async with Redis.from_url(pair.primary.url, decode_responses=True) as primary:

        async def replica_gone() -> bool:
            info = await primary.info("replication")
            return int(info["connected_slaves"]) == 0

        await eventually(replica_gone, timeout=10, what="the primary saw its replica go")
    with pytest.raises(aiolock.LockSyncError, match="0 of the 1 replica"):
        await client.lock("two").try_lock(wait=0)
    assert not await client.lock("two").is_locked()
    # A re-entry that no replica confirms is undone too; the hold before it stays.
    with pytest.raises(aiolock.LockSyncError):
        await held.lock()
    assert await held.hold_count() == 1
    await held.unlock()
    assert not await held.is_locked()


async def test_renewals_the_replica_does_not_confirm_do_not_extend_a_hold(
    clients: Callable[..., aiolock.Client], pair: Pair
) -> None:
    """A watched hold's renewals wait for the replicas as its grant did.  A renewal the replica
    never had is forgotten by a failover to it, where the hold then ends when the last one it
    had says: so must it for the holder, or another client could be granted the lock on the
    promoted replica while the holder still believes in it."""
    # The default sync_timeout (1 s): each renewal the stopped replica cannot confirm waits it
    # out, and the 1.5 s lease still ends first.
    client = clients(sync_replicas=1, watchdog_timeout=1.5)
    lock = client.lock("renewed")
    # Its lease ran out for the client, while the primary took every renewal: before, the
    # holder was never told.
    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        async with lock.acquire(wait=0) as guard:
            os.kill(_pid(pair.replica), signal.SIGSTOP)  # it keeps the grant's expiry
            try:
                await eventually(lambda: guard.lost, timeout=10, what="the hold reported lost")
            finally:
                os.kill(_pid(pair.replica), signal.SIGCONT)

    # A lost hold is not released (see LockGuard): the primary's copy runs out within a lease.
    async def expired() -> bool:
        return not await lock.is_locked()

    await eventually(expired, timeout=5, what="the primary's copy ran out")
    # Confirmed again, renewals keep a hold as usual: two leases' worth of them.
    renewals = client.statistics().renewals
    async with lock.acquire(wait=0) as guard:
        await eventually(
            lambda: client.statistics().renewals >= renewals + 6, timeout=15, what="renewals"
        )
        assert not guard.lost


def _pid(server: EmbeddedServer) -> int:
    assert server.pid is not None
    return server.pid


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"sync_replicas": -1}, ValueError),
        ({"sync_replicas": "1"}, TypeError),
        ({"sync_replicas": True}, TypeError),
        ({"sync_timeout": 0}, ValueError),
        ({"sync_timeout": "1"}, TypeError),
    ],
)
def test_sync_options_are_checked(options: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(options))):
        aiolock.Client.from_url("redis://127.0.0.1:1/0", **options)


async def warm(clients: Callable[..., aiolock.Client], kind: str) -> None:
    """Load ``kind``'s scripts on the server: a synced client's first EVALSHA would otherwise
    answer NOSCRIPT and wait in its WAIT before the EVAL that grants."""
    lock = LOCKS[kind](clients(), "warm")
    assert await lock.try_lock(wait=0)
    await lock.unlock()


async def waiting_clients(primary: Redis) -> list[int]:
    """The ids of the primary's clients blocked in WAIT."""
    listed = await primary.client_list()
    return [int(client["id"]) for client in listed if client.get("cmd") == "wait"]


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_an_acquire_cancelled_in_its_wait_for_replicas_leaves_nothing(
    clients: Callable[..., aiolock.Client], pair: Pair, kind: str
) -> None:
    # Two replicas asked for, one there: WAIT blocks for the whole sync_timeout, after the
    # script granted.  The caller cancelled then must not leave the grant on the server.
    await warm(clients, kind)
    client = clients(sync_replicas=2, sync_timeout=2.0)
    lock = LOCKS[kind](client, "cancelled-in-wait")
    async with Redis.from_url(pair.primary.url, decode_responses=True) as primary:
        attempt = asyncio.create_task(lock.try_lock(wait=0))

        async def in_wait() -> bool:  # granted by the script, then blocked in WAIT
            return bool(await primary.exists(keys_of(lock).lock)) and bool(
                await waiting_clients(primary)
            )

        await eventually(in_wait, timeout=15, what="the grant waiting for replicas")
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt

        async def given_back() -> bool:
            return not await primary.exists(keys_of(lock).lock)

        await eventually(given_back, timeout=3, what="the grant undone (not its 30 s lease)")
    assert client.statistics().holds == 0


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_an_acquire_cancelled_anywhere_leaves_nothing(
    clients: Callable[..., aiolock.Client], pair: Pair, kind: str
) -> None:
    # Cancelled after 0, 1, 2... steps of the loop: before the send, with the script or the
    # WAIT in flight, or after; whatever it got is settled.
    client = clients(sync_replicas=1, sync_timeout=2.0)
    lock = LOCKS[kind](client, "cancelled-anywhere")
    async with Redis.from_url(pair.primary.url, decode_responses=True) as primary:
        for steps in range(12):
            attempt = asyncio.create_task(lock.try_lock(wait=5))
            for _ in range(steps):
                await asyncio.sleep(0)
            attempt.cancel()
            # Cancelled, its grant is undone; granted before the cancellation landed, its task
            # ends holding it, and the client releases it.
            await asyncio.gather(attempt, return_exceptions=True)

            async def clean() -> bool:
                return not await primary.exists(keys_of(lock).lock)

            await eventually(clean, timeout=3, what=f"nothing left after {steps} steps")
    assert client.statistics().holds == 0


@pytest.mark.parametrize("kind", sorted(LOCKS))
async def test_a_wait_unblocked_by_the_server_is_a_sync_error_and_undone(
    clients: Callable[..., aiolock.Client], pair: Pair, kind: str
) -> None:
    # A failover unblocks WAIT with an error (UNBLOCKED ... master -> replica); CLIENT UNBLOCK
    # ERROR answers the same error to the same WAIT.
    await warm(clients, kind)
    client = clients(sync_replicas=2, sync_timeout=2.0)
    lock = LOCKS[kind](client, "unblocked")
    async with Redis.from_url(pair.primary.url, decode_responses=True) as primary:
        attempt = asyncio.create_task(lock.try_lock(wait=0))

        async def blocked() -> list[int]:
            if not await primary.exists(keys_of(lock).lock):
                return []  # not granted yet (a first EVALSHA's NOSCRIPT waits too)
            return await waiting_clients(primary)

        async def in_wait() -> bool:
            return bool(await blocked())

        await eventually(in_wait, timeout=15, what="the grant waiting for replicas")
        for client_id in await blocked():
            await primary.client_unblock(client_id, error=True)
        with pytest.raises(aiolock.LockSyncError):
            await attempt
        assert not await primary.exists(keys_of(lock).lock)
    assert client.statistics().holds == 0
