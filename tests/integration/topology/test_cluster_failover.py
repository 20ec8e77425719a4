"""A Cluster primary killed (SIGKILL) while its locks are held and waited for; its replica takes
over after the cluster's node timeout.

Each test has a cluster of its own (3 primaries, 1 replica each, a 1.5 s node timeout) of each
server binary.  The locks used live on the second primary, so the node the clients were given
(the first) stays up.  What the client does about a dead node is in ``aiolock/_cluster.py``:
calls that never reached it are resent once the topology names the promoted replica; the
watchdog's renewals of other nodes' holds are not held up meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from redis import Redis
from redis.crc import key_slot

import aiolock
from aiolock.testing.embedded import EmbeddedCluster, EmbeddedServer
from tests.conftest import SERVERS
from tests.helpers import cluster_clients, eventually, keys_of, settled

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

Make = Callable[..., aiolock.Client]


@pytest.fixture(params=SERVERS)
def cluster(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(replicas=1, binary=request.param, node_timeout=1500) as cluster:
        yield cluster


@pytest.fixture
async def clients(cluster: EmbeddedCluster) -> AsyncIterator[Make]:
    async with cluster_clients(cluster.url, f"aiolock-failover-{uuid.uuid4().hex[:8]}") as make:
        yield make


def _node(server: EmbeddedServer) -> Redis:
    return Redis(host=server.host, port=server.port, decode_responses=True)


def names_on(cluster: EmbeddedCluster, primary: EmbeddedServer, count: int) -> list[str]:
    """``count`` lock names whose slot ``primary`` serves."""
    with _node(primary) as redis:
        ranges = [
            (int(entry[0]), int(entry[1]))
            for entry in redis.execute_command("CLUSTER", "SLOTS")
            if int(entry[2][1]) == primary.port
        ]
    found: list[str] = []
    i = 0
    while len(found) < count:
        slot = key_slot(f"{{failover:{i}}}".encode())
        if any(start <= slot <= end for start, end in ranges):
            found.append(f"failover:{i}")
        i += 1
    return found


def replica_of(cluster: EmbeddedCluster, primary: EmbeddedServer) -> EmbeddedServer:
    for node in cluster.replicas:
        with _node(node) as redis:
            if redis.info("replication").get("master_port") == primary.port:
                return node
    raise AssertionError(f"no replica of {primary!r}")


def cut_replication(primary: EmbeddedServer, replica: EmbeddedServer) -> None:
    """Stop ``replica`` from receiving ``primary``'s writes while both stay up: it now sends a
    password the primary does not have, so its reconnection fails, and its link is dropped."""
    with _node(replica) as redis:
        redis.config_set("masterauth", "not-the-password")
    with _node(primary) as redis:
        redis.execute_command("CLIENT", "KILL", "TYPE", "replica")


def link_down(replica: EmbeddedServer) -> bool:
    with _node(replica) as redis:
        return bool(redis.info("replication")["master_link_status"] == "down")


def on_replica(replica: EmbeddedServer, key: str) -> bool:
    with _node(replica) as redis:
        redis.execute_command("READONLY")
        return bool(redis.exists(key))


async def take_and_release(lock: aiolock.AsyncRLock, wait: float) -> int | None:
    """Wait for ``lock``; its fencing token, given back at once (``None``: the wait ran out)."""
    try:
        async with lock.acquire(wait=wait, lease=5) as guard:
            return guard.fencing_token
    except aiolock.LockTimeoutError:
        return None


async def test_a_synced_hold_survives_its_primary(cluster: EmbeddedCluster, clients: Make) -> None:
    """``sync_replicas=1``: the grant is on the replica when it returns, so the promoted
    replica has it; the watchdog's renewals follow it there (confirmed once the killed node is
    back as its replica), the release too, the parked waiter is served after it, and an
    acquire sent while the primary is dead waits out the failover."""
    # The lease outlasts the failover (1.5 s of node timeout, then an election) and the rejoin:
    # else the hold would end before a confirmed renewal could reach the new primary.
    holder_client = clients(sync_replicas=1, watchdog_timeout=20)
    waiter_client, late_client = clients(), clients()
    primary = cluster.primaries[1]
    name, other = names_on(cluster, primary, 2)
    holder = holder_client.lock(name)
    async with holder.acquire(wait=0) as guard:
        waiter = waiter_client.lock(name)
        waiting = asyncio.create_task(take_and_release(waiter, wait=60))
        # Not while the try its SUBSCRIBE's confirmation wakes is in flight: it would raise.
        await eventually(lambda: settled(waiter_client, waiter), what="parked, subscribed")
        failover = asyncio.create_task(asyncio.to_thread(cluster.failover, primary))
        await eventually(lambda: not primary.running, what="the primary killed")
        late = asyncio.create_task(take_and_release(late_client.lock(other), wait=60))
        new = await failover
        renewals = holder_client.statistics().renewals
        # The new primary has no replica to confirm renewals until the killed node rejoins.
        await asyncio.to_thread(cluster.rejoin, primary)
        await eventually(
            lambda: holder_client.statistics().renewals > renewals,
            timeout=15,
            what="renewed on the new primary",
        )
        assert not guard.lost
        with _node(new) as redis:
            assert redis.exists(keys_of(holder).lock)
        assert not waiting.done()
        assert await asyncio.wait_for(late, 30) is not None
    token = await asyncio.wait_for(waiting, 30)
    assert token is not None
    assert token > guard.fencing_token
    with _node(new) as redis:
        assert not redis.exists(keys_of(holder).lock)


async def test_a_grant_the_replica_never_got_is_reported_lost(
    cluster: EmbeddedCluster, clients: Make, caplog: pytest.LogCaptureFixture
) -> None:
    """Without ``sync_replicas`` a grant the replica had not received when the primary died is
    gone on the promoted replica: the watchdog's first renewal there finds it missing, the
    holder learns of the loss (its guard is lost, leaving raises ``LockLostError``), and the
    parked waiter is served."""
    # The lease outlasts the failover: the loss is found by a renewal, not by the lease.
    holder_client, waiter_client = clients(watchdog_timeout=10), clients()
    primary = cluster.primaries[1]
    replica = replica_of(cluster, primary)
    (name,) = names_on(cluster, primary, 1)
    holder = holder_client.lock(name)
    await asyncio.to_thread(cut_replication, primary, replica)
    await eventually(lambda: asyncio.to_thread(link_down, replica), what="the link cut")
    with pytest.raises(aiolock.LockLostError):
        async with holder.acquire(wait=0) as guard:
            assert not await asyncio.to_thread(on_replica, replica, keys_of(holder).lock)
            waiter = waiter_client.lock(name)
            waiting = asyncio.create_task(take_and_release(waiter, wait=60))
            await eventually(lambda: settled(waiter_client, waiter), what="parked, subscribed")
            new = await asyncio.to_thread(cluster.failover, primary)
            assert new is replica
            await eventually(lambda: guard.lost, timeout=20, what="the hold reported lost")
    assert holder.statistics().losses == 1
    assert "the watchdog found it expired or held by another owner" in caplog.text
    assert await asyncio.wait_for(waiting, 30) is not None
    await eventually(lambda: holder_client.statistics().pending == 0, what="settled")
    with _node(new) as redis:
        assert not redis.exists(keys_of(holder).lock)


async def test_other_nodes_holds_are_renewed_while_a_primary_is_down(
    cluster: EmbeddedCluster, clients: Make
) -> None:
    """The watchdog's renewals for the dead node retry on their own: holds on the live nodes
    keep being renewed meanwhile, and none of them is lost."""
    client = clients(watchdog_timeout=1.5)
    dead, live = cluster.primaries[1], cluster.primaries[2]
    doomed = [client.lock(name) for name in names_on(cluster, dead, 3)]
    kept = [client.lock(name) for name in names_on(cluster, live, 3)]
    for lock in doomed + kept:
        assert await lock.try_lock(wait=0)
    await asyncio.to_thread(dead.kill)
    renewals = [lock.statistics().renewals for lock in kept]
    await eventually(
        lambda: all(
            lock.statistics().renewals >= before + 3
            for lock, before in zip(kept, renewals, strict=True)
        ),
        timeout=15,
        what="the live node's holds renewed",
    )
    assert all(lock.statistics().held == 1 for lock in kept)
    await asyncio.to_thread(cluster.failover, dead)  # already dead: waits for the takeover
    for lock in kept:
        await lock.unlock()
    for lock in doomed:  # not synced: whether the replica got them is up to timing
        with contextlib.suppress(aiolock.LockNotOwnedError):
            await lock.unlock()
    await eventually(lambda: client.statistics().holds == 0, what="nothing held")


async def test_a_synced_call_to_a_rejoined_old_primary_follows_its_moved(
    cluster: EmbeddedCluster, clients: Make
) -> None:
    """A client that made no call while the primary was replaced still sends to its address;
    the killed node, back as a replica, answers MOVED to the script and refuses the WAIT: the
    MOVED is followed (not the WAIT's error raised), and the grant is confirmed by that very
    replica."""
    client = clients(sync_replicas=1)
    primary = cluster.primaries[1]
    (name,) = names_on(cluster, primary, 1)
    lock = client.lock(name)
    async with lock.acquire(wait=0, lease=5):
        pass
    new = await asyncio.to_thread(cluster.failover, primary)
    await asyncio.to_thread(cluster.rejoin, primary)
    async with lock.acquire(wait=0, lease=5):
        with _node(new) as redis:
            assert redis.exists(keys_of(lock).lock)
        assert await asyncio.to_thread(on_replica, primary, keys_of(lock).lock)


async def test_a_synced_grant_cancelled_or_unblocked_in_its_wait_is_undone(
    cluster: EmbeddedCluster, clients: Make
) -> None:
    """With ``sync_replicas=1`` a grant waits (WAIT) for the replica: a caller cancelled then
    leaves nothing behind, and a WAIT that the server unblocks with an error (a failover does:
    ``UNBLOCKED ... master -> replica``; CLIENT UNBLOCK ERROR answers the same) is a
    ``LockSyncError`` whose grant is undone."""
    client = clients(sync_replicas=1, sync_timeout=10.0)
    primary = cluster.primaries[0]
    replica = replica_of(cluster, primary)
    first, second, warm = names_on(cluster, primary, 3)
    async with client.lock(warm).acquire(wait=0, lease=5):
        pass  # the node has the script: the next EVALSHA there grants at once
    await asyncio.to_thread(cut_replication, primary, replica)
    await eventually(lambda: link_down(replica), timeout=10, what="replication cut")
    with _node(primary) as redis:

        def blocked(name: str) -> list[int]:
            if not redis.exists(keys_of(client.lock(name)).lock):
                return []
            return [int(c["id"]) for c in redis.client_list() if c.get("cmd") == "wait"]

        cancelled = asyncio.create_task(client.lock(first).try_lock(wait=0, lease=30))
        await eventually(lambda: bool(blocked(first)), timeout=10, what="the grant in its WAIT")
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        key = keys_of(client.lock(first)).lock
        await eventually(lambda: not redis.exists(key), timeout=5, what="the cancelled undone")

        unblocked = asyncio.create_task(client.lock(second).try_lock(wait=0, lease=30))
        await eventually(lambda: bool(blocked(second)), timeout=10, what="the grant in its WAIT")
        for client_id in blocked(second):
            redis.client_unblock(client_id, error=True)
        with pytest.raises(aiolock.LockSyncError):
            await unblocked
        assert not redis.exists(keys_of(client.lock(second)).lock)
    assert client.statistics().holds == 0
