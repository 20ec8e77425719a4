"""Transactions on a Redis Cluster: the commands' keys go with the lock's slot.

One script runs on one node, so every key of a transaction must hash to the lock's slot: keys
built with ``lock.hash_tag`` do; any other is refused (``ValueError`` naming it) before anything
is sent.  The keys are found by the same parser redis-py's Cluster client routes by.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import cluster_clients
from tests.integration.concerns.test_transaction import (
    KINDS,
    RIVAL,
    held,
    lock_of,
    pause_the_next_transaction,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def clients(aiolock_cluster: ServerInfo) -> AsyncIterator[Callable[..., aiolock.Client]]:
    prefix = f"aiolock-tx-{uuid.uuid4().hex[:8]}"
    async with cluster_clients(aiolock_cluster.url, prefix) as make:
        yield make
    async with RedisCluster.from_url(aiolock_cluster.url) as redis:
        for node in redis.get_primaries():
            keys = [k async for k in redis.scan_iter(match=f"{prefix}*", target_nodes=node)]
            for key in keys:
                await redis.unlink(key)


@pytest.fixture
async def cluster(aiolock_cluster: ServerInfo) -> AsyncIterator[RedisCluster]:
    async with RedisCluster.from_url(aiolock_cluster.url, decode_responses=True) as redis:
        yield redis


async def calls_of(cluster: RedisCluster, command: str) -> int:
    """Calls of ``command`` (``evalsha``, ``command|getkeys``) so far, over every node."""
    stats: dict[str, Any] = await cluster.info("commandstats", target_nodes=cluster.ALL_NODES)
    return sum(
        int(node.get(f"cmdstat_{command}", {}).get("calls", 0))
        for node in stats.values()
        if isinstance(node, dict)
    )


@pytest.mark.parametrize("kind", KINDS)
async def test_keys_with_the_locks_hash_tag_transact_on_its_node(
    clients: Callable[..., aiolock.Client], cluster: RedisCluster, kind: str
) -> None:
    client = clients()
    names = [f"group:{i}" for i in range(4)]  # spread over the nodes
    for name in names:
        tag = lock_of(client, kind, name).hash_tag
        members, size = f"{client.key_prefix}-m:{tag}", f"{client.key_prefix}-n:{tag}"
        async with held(client, kind, name) as guard, guard.transaction() as tx:
            tx.sadd(members, "ann")
            tx.zunionstore(f"{members}:copy", [members])  # keys asked of the server
            tx.incr(size)
        assert tx.results == [1, 1, 1]  # ZUNIONSTORE counts a set as scores of 1
        assert await cluster.smembers(members) == {"ann"}
        assert key_slot(members.encode()) == key_slot(tag.encode())


@pytest.mark.parametrize("kind", ["lock", "write", "permit"])
async def test_a_key_outside_the_locks_slot_is_refused_before_any_io(
    clients: Callable[..., aiolock.Client], cluster: RedisCluster, kind: str
) -> None:
    client = clients()
    tag = lock_of(client, kind, "group").hash_tag
    inside = f"{client.key_prefix}-m:{tag}"
    # The prefix is random: one name in 16,384 would share the lock's slot, so take the first
    # that does not.
    outside = next(
        key
        for key in (f"{client.key_prefix}-elsewhere-{i}" for i in range(100))
        if key_slot(key.encode()) != key_slot(tag.encode())
    )
    async with held(client, kind, "group") as guard:
        async with guard.transaction() as tx:  # loads nothing more: the Cluster's own table
            tx.sadd(inside, "first")
        calls = await calls_of(cluster, "evalsha")
        asked = await calls_of(cluster, "command|getkeys")
        with pytest.raises(ValueError, match=repr(outside)):
            async with guard.transaction() as tx:
                tx.sadd(inside, "second")
                tx.zunionstore(f"{inside}:copy", [inside])  # its keys would be asked of a node
                tx.sadd(outside, "x")
        assert await calls_of(cluster, "evalsha") == calls
        assert await calls_of(cluster, "command|getkeys") == asked  # not even that
    assert await cluster.smembers(inside) == {"first"}
    assert await cluster.exists(outside) == 0


@pytest.mark.parametrize("kind", ["lock", "fair", "read", "write"])
async def test_a_forced_unlock_refuses_the_holders_write_on_a_cluster(
    clients: Callable[..., aiolock.Client], cluster: RedisCluster, kind: str
) -> None:
    holder, other = clients(), clients()
    tag = lock_of(holder, kind, "forced").hash_tag
    members = f"{holder.key_prefix}-m:{tag}"
    with pytest.raises(aiolock.LockLostError):
        async with held(holder, kind, "forced") as guard:
            assert await lock_of(other, kind, "forced").force_unlock()
            with pytest.raises(aiolock.LockLostError, match="ran none"):
                async with guard.transaction() as tx:
                    tx.sadd(members, "stale")
    assert await cluster.exists(members) == 0


async def test_a_reentered_hold_transacts_on_a_cluster(
    clients: Callable[..., aiolock.Client], cluster: RedisCluster
) -> None:
    client = clients()
    lock = client.lock("nested")
    members = f"{client.key_prefix}-m:{lock.hash_tag}"
    async with lock.acquire(wait=5), lock.acquire(wait=5) as inner, inner.transaction() as tx:
        tx.sadd(members, "inner")
    assert await cluster.smembers(members) == {"inner"}


@pytest.mark.parametrize(("kind", "lease"), [("lock", 0.4), ("read", 0.4), ("permit", None)])
async def test_a_holder_paused_past_its_lease_has_its_write_refused_on_a_cluster(
    aiolock_cluster: ServerInfo,
    clients: Callable[..., aiolock.Client],
    cluster: RedisCluster,
    *,
    kind: str,
    lease: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on one server (see concerns/test_transaction.py): the paused holder's event loop
    stands still while a client in another thread takes the lock on the lock's node."""
    holder = clients(watchdog_timeout=0.4)
    tag = lock_of(holder, kind, "group").hash_tag
    members = f"{holder.key_prefix}-m:{tag}"
    taken, done = threading.Event(), threading.Event()

    def another_process() -> None:
        async def take() -> None:
            async with aiolock.Client.from_url(
                aiolock_cluster.url, cluster=True, key_prefix=holder.key_prefix
            ) as other:
                async with held(other, RIVAL.get(kind, kind), "group", wait=10) as guard:
                    async with guard.transaction() as tx:
                        tx.sadd(members, "new holder")
                    taken.set()
                    await asyncio.to_thread(done.wait, 10)

        asyncio.run(take())

    rival = threading.Thread(target=another_process)
    refused = False
    with pytest.raises(aiolock.LockLostError):
        async with held(holder, kind, "group", lease=lease) as guard:
            async with guard.transaction() as tx:
                tx.sadd(members, "holder")
            pause_the_next_transaction(monkeypatch, rival, taken)
            try:
                async with guard.transaction() as tx:  # only the server can refuse it
                    tx.sadd(members, "stale holder")
            except aiolock.LockLostError:
                refused = True
    done.set()
    await asyncio.to_thread(rival.join, 10)
    assert refused
    assert await cluster.smembers(members) == {"holder", "new holder"}
