"""Sharded pub/sub on a Redis Cluster: waiters SSUBSCRIBE on the node of their lock's slot.

Both server binaries of the suite (Valkey 9, Redis 7) have sharded pub/sub, so every cluster
test runs sharded.  Here: every kind's channel lives on its slot's node only (one server keeps
classic pub/sub); a client keeps one subscriber connection per node that has its waiters; a
slot that moves under parked waiters (the node drops them with an unrequested ``sunsubscribe``)
and a primary killed under them (its replica takes over) move their subscriptions to the new
owner, where the next release wakes them; and a Cluster without sharded pub/sub falls back to
one classic subscriber.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis import Redis
from redis.asyncio import ConnectionPool, RedisCluster
from redis.asyncio import Redis as AsyncRedis
from redis.crc import key_slot
from redis.exceptions import ResponseError

import aiolock
from aiolock._redis import cluster as _cluster
from aiolock._redis.entry import Entry
from aiolock._redis.subscriber import Subscriber
from aiolock.testing.embedded import EmbeddedCluster
from aiolock.testing.pytest_plugin import ServerInfo
from tests.conftest import SERVERS
from tests.helpers import (
    cluster_calls_of,
    cluster_clients,
    entries_of,
    eventually,
    keys_of,
    needs_sharded_pubsub,
    redis_version,
    services_of,
    settled,
    take_and_release_across_failover,
)
from tests.integration.topology.test_cluster import migrate_slot

pytestmark = pytest.mark.anyio

Make = Callable[..., aiolock.Client]


async def _clients(url: str) -> AsyncIterator[Make]:
    async with cluster_clients(url, f"aiolock-shard-{uuid.uuid4().hex[:8]}") as make:
        yield make


@pytest.fixture
async def clients(aiolock_cluster: ServerInfo) -> AsyncIterator[Make]:
    """Clients on the suite's cluster sharing one key prefix, closed after the test."""
    async for make in _clients(aiolock_cluster.url):
        yield make


def owner_port(url: str, key: bytes) -> int:
    """The port of the primary that serves ``key``'s slot, as the cluster says now."""
    with Redis.from_url(url) as redis:
        slot = key_slot(key)
        ranges = redis.execute_command("CLUSTER", "SLOTS")
        return next(int(r[2][1]) for r in ranges if r[0] <= slot <= r[1])


def subscribers(ports: list[int], channel: str, *, sharded: bool = True) -> dict[int, int]:
    """Each node's count of subscribers to ``channel`` (shard channels, or classic ones)."""
    counts = {}
    for port in ports:
        with Redis(port=port) as redis:
            kind = "SHARDNUMSUB" if sharded else "NUMSUB"
            counts[port] = int(redis.execute_command("PUBSUB", kind, channel)[1])
    return counts


def primary_ports(url: str) -> list[int]:
    with Redis.from_url(url) as redis:
        return sorted({int(r[2][1]) for r in redis.execute_command("CLUSTER", "SLOTS")})


WAITERS: dict[str, Callable[[aiolock.Client, str], Any]] = {
    "lock": lambda client, name: client.lock(name),
    "fair": lambda client, name: client.fair_lock(name),
    "write": lambda client, name: client.rw_lock(name).write_lock(),
}

Blocked = tuple[Callable[[], Awaitable[object]], Awaitable[bool]]


async def blocked(kind: str, holder: aiolock.Client, waiter: aiolock.Client, name: str) -> Blocked:
    """Block ``name`` of ``kind`` through ``holder``: how to unblock it, and a wait by
    ``waiter`` (true once it got through; the holder's lease outlasts the wait)."""
    if kind == "semaphore":
        permit = await holder.semaphore(name, 1).try_acquire(wait=0, lease=30)
        assert permit is not None

        async def take_permit() -> bool:
            got = await waiter.semaphore(name, 1).try_acquire(wait=10, lease=5)
            if got is None:
                return False
            await got.release()
            return True

        return permit.release, take_permit()
    if kind == "latch":
        assert await holder.countdown_latch(name).try_set_count(1)
        return holder.countdown_latch(name).count_down, waiter.countdown_latch(name).wait(10)
    rw = kind in ("read", "write")
    held = holder.rw_lock(name).write_lock() if rw else WAITERS[kind](holder, name)
    await held.lock(lease=30)
    wanted = waiter.rw_lock(name).read_lock() if kind == "read" else WAITERS[kind](waiter, name)
    return held.unlock, _take_and_release(wanted, wait=10)


@pytest.mark.parametrize("kind", ["fair", "latch", "lock", "read", "semaphore", "write"])
async def test_every_kind_waits_on_its_slots_node_only(
    clients: Make, aiolock_cluster: ServerInfo, kind: str
) -> None:
    needs_sharded_pubsub(aiolock_cluster.url)
    holder_client, waiter_client = clients(), clients()
    ports = primary_ports(aiolock_cluster.url)
    unblock, wait = await blocked(kind, holder_client, waiter_client, f"job-{kind}")
    waiting = asyncio.ensure_future(wait)
    await eventually(
        lambda: [e.confirmed for e in entries_of(waiter_client).values()] == [True],
        what="subscribed",
    )
    [channel] = [key.decode() for key in entries_of(waiter_client)]
    owner = owner_port(aiolock_cluster.url, channel.encode())
    assert subscribers(ports, channel) == {port: int(port == owner) for port in ports}
    assert subscribers(ports, channel, sharded=False) == dict.fromkeys(ports, 0)
    await unblock()  # SPUBLISH: the waiter hears it on the slot's node
    assert await asyncio.wait_for(waiting, 15)
    assert cluster_calls_of(waiter_client).sharded


async def test_one_server_keeps_classic_pubsub(
    aiolock_client: aiolock.Client, make_client: Make, redis: AsyncRedis, aiolock_server: ServerInfo
) -> None:
    """Sharded pub/sub is for Clusters: on one server, waiters SUBSCRIBE as always."""
    holder = make_client().lock("classic", owner="holder")
    await holder.lock(lease=30)
    waiting = asyncio.ensure_future(_take_and_release(aiolock_client.lock("classic"), wait=10))
    await eventually(
        lambda: any(e.confirmed for e in entries_of(aiolock_client).values()), what="parked"
    )
    channel = keys_of(aiolock_client.lock("classic")).channel  # the waiter's client's
    assert await redis.execute_command("PUBSUB", "NUMSUB", channel) == [channel, 1]  # type: ignore[no-untyped-call]
    if redis_version(aiolock_server.url) >= (7, 0):  # Redis 6 has no shard channels at all
        assert await redis.execute_command("PUBSUB", "SHARDNUMSUB", channel) == [channel, 0]  # type: ignore[no-untyped-call]
    await holder.unlock()
    assert await asyncio.wait_for(waiting, 10)


def names_on(url: str, client: aiolock.Client, ports: list[int], count: int) -> list[str]:
    """``count`` lock names whose channels live on each of ``ports``."""
    found: dict[int, list[str]] = {port: [] for port in ports}
    i = 0
    while any(len(names) < count for names in found.values()):
        name = f"spread:{i}"
        i += 1
        port = owner_port(url, keys_of(client.lock(name)).channel.encode())
        if port in found and len(found[port]) < count:
            found[port].append(name)
    return [name for names in found.values() for name in names]


async def test_one_subscriber_connection_per_node_with_waiters(
    clients: Make, aiolock_cluster: ServerInfo
) -> None:
    """Waiters on two of the three primaries: two subscriber connections, closed once idle."""
    needs_sharded_pubsub(aiolock_cluster.url)
    holder_client, waiter_client = clients(), clients()
    pubsub = services_of(waiter_client).pubsub
    pubsub._ping_interval = 1.0  # an idle sharded subscriber closes after one ping interval
    ports = primary_ports(aiolock_cluster.url)
    names = names_on(aiolock_cluster.url, waiter_client, ports[:2], 3)
    for name in names:
        await holder_client.lock(name).lock(lease=30)
    waiters = [waiter_client.lock(name, owner="waiter") for name in names]
    waiting = [asyncio.create_task(lock.try_lock(wait=10, lease=5)) for lock in waiters]
    await eventually(lambda: pubsub.statistics().waiters == len(names), what="all parked")
    await eventually(
        lambda: all(e.confirmed for e in entries_of(waiter_client).values()), what="all confirmed"
    )
    assert pubsub.statistics().subscribers == 2
    assert len(pubsub.subscriber_homes) == 2
    for name in names:
        await holder_client.lock(name).unlock()
    assert all(await asyncio.wait_for(asyncio.gather(*waiting), 10))
    for lock in waiters:
        await lock.unlock()
    await eventually(lambda: pubsub.statistics().subscribers == 0, what="idle connections closed")
    assert pubsub.statistics().channels == 0


@pytest.mark.parametrize("kind", sorted(WAITERS))
async def test_a_slot_move_resubscribes_parked_waiters_on_the_new_owner(
    clients: Make, aiolock_cluster: ServerInfo, kind: str
) -> None:
    """The node drops the moved slot's subscribers with an unrequested ``sunsubscribe``: the
    waiters' client subscribes again on the new owner (no reconnect: the drop is not taken as
    a reply of ours), and the release made there wakes them."""
    needs_sharded_pubsub(aiolock_cluster.url)
    if aiolock_cluster.server is None:
        pytest.skip("moves a slot of the embedded cluster")
    holder_client, waiter_client = clients(), clients()
    name = f"moving-{kind}-{uuid.uuid4().hex[:6]}"
    holder = WAITERS[kind](holder_client, name)
    waiters = [WAITERS[kind](waiter_client, name) for _ in range(3)]
    await holder.lock(lease=30)
    waiting = [asyncio.create_task(_take_and_release(waiter)) for waiter in waiters]
    pubsub = services_of(waiter_client).pubsub
    await eventually(lambda: pubsub.statistics().waiters == 3, what="parked")
    [channel] = [entry.channel for entry in entries_of(waiter_client).values()]
    await eventually(lambda: entries_of(waiter_client)[channel].confirmed, what="subscribed")
    source = owner_port(aiolock_cluster.url, channel)
    await asyncio.to_thread(migrate_slot, aiolock_cluster.server, key_slot(channel))
    target = owner_port(aiolock_cluster.url, channel)
    assert target != source

    def on_the_new_owner() -> bool:
        counts = subscribers([source, target], channel.decode())
        return counts == {source: 0, target: 1}

    await eventually(on_the_new_owner, timeout=10, what="resubscribed on the new owner")
    assert pubsub.statistics().reconnects == 0
    await holder.unlock()  # on the new owner (MOVED), which publishes there
    assert await asyncio.wait_for(asyncio.gather(*waiting), 20) == [True] * 3


async def _take_and_release(lock: Any, wait: float = 20) -> bool:
    # The holder's lease outlasts ``wait``: only a wake-up by the release gets the lock.
    if not await lock.try_lock(wait=wait, lease=5):
        return False
    await lock.unlock()
    return True


async def test_a_latch_waiter_follows_its_slot(clients: Make, aiolock_cluster: ServerInfo) -> None:
    needs_sharded_pubsub(aiolock_cluster.url)
    if aiolock_cluster.server is None:
        pytest.skip("moves a slot of the embedded cluster")
    one, two = clients(), clients()
    latch = one.countdown_latch(f"parts-{uuid.uuid4().hex[:6]}")
    assert await latch.try_set_count(1)
    done = asyncio.create_task(two.countdown_latch(latch.name).wait(timeout=20))
    await eventually(lambda: any(e.confirmed for e in entries_of(two).values()), what="waiting")
    [channel] = list(entries_of(two))
    await asyncio.to_thread(migrate_slot, aiolock_cluster.server, key_slot(channel))
    target = owner_port(aiolock_cluster.url, channel)
    await eventually(
        lambda: subscribers([target], channel.decode()) == {target: 1}, what="resubscribed"
    )
    await latch.count_down()
    assert await asyncio.wait_for(done, 10)


async def test_without_sharded_pubsub_one_classic_subscriber_serves(
    clients: Make, aiolock_cluster: ServerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cluster of Redis 6 (no SPUBLISH): scripts PUBLISH, one subscriber on any node."""

    async def no_sharded_pubsub(node: object) -> bool:
        return False

    monkeypatch.setattr(_cluster, "_has_sharded_pubsub", no_sharded_pubsub)
    holder_client, waiter_client = clients(), clients()
    ports = primary_ports(aiolock_cluster.url)
    names = ["classic:1", "classic:2", "classic:3", "classic:4"]
    for name in names:
        await holder_client.lock(name).lock(lease=30)
    waiters = [waiter_client.lock(name, owner="waiter") for name in names]
    waiting = [asyncio.create_task(lock.try_lock(wait=10, lease=5)) for lock in waiters]
    pubsub = services_of(waiter_client).pubsub
    await eventually(
        lambda: (
            all(e.confirmed for e in entries_of(waiter_client).values())
            and len(entries_of(waiter_client)) == len(names)
        ),
        what="subscribed",
    )
    assert not cluster_calls_of(waiter_client).sharded
    assert pubsub.statistics().subscribers == 1
    for waiter in waiters:
        counts = subscribers(ports, keys_of(waiter).channel, sharded=False)
        assert sorted(counts.values()) == [0, 0, 1]
    for name in names:
        await holder_client.lock(name).unlock()
    assert all(await asyncio.wait_for(asyncio.gather(*waiting), 10))
    for lock in waiters:
        await lock.unlock()


@pytest.fixture(params=SERVERS)
def replicated(request: pytest.FixtureRequest) -> Iterator[EmbeddedCluster]:
    """A cluster of 3 primaries with a replica each, of its own: a test kills a primary."""
    with EmbeddedCluster(replicas=1, binary=request.param) as cluster:
        yield cluster


@pytest.fixture
async def replicated_clients(replicated: EmbeddedCluster) -> AsyncIterator[Make]:
    async for make in _clients(replicated.url):
        yield make


@pytest.mark.slow
async def test_a_waiter_on_a_killed_primary_moves_to_its_replica(
    replicated: EmbeddedCluster, replicated_clients: Make
) -> None:
    """The node under a parked waiter dies and its replica takes over: the subscriber cannot
    reconnect, finds the new owner in the refreshed topology, and resubscribes there, where
    the next release wakes the waiter."""
    needs_sharded_pubsub(replicated.url)
    holder_client = replicated_clients(sync_replicas=1)  # the hold survives the failover
    waiter_client = replicated_clients()
    holder, waiter = holder_client.lock("failover"), waiter_client.lock("failover")
    await holder.lock(lease=60)
    waiting = asyncio.create_task(take_and_release_across_failover(waiter, 45, lease=5))
    # Not before the try that the SUBSCRIBE's confirmation wakes is back: a try in flight when
    # the primary dies raises, and the waiter leaves (a clean-clone CI run saw it).
    await eventually(lambda: settled(waiter_client, waiter), what="parked, subscribed")
    channel = keys_of(waiter).channel.encode()
    dead = owner_port(replicated.url, channel)
    [primary] = [node for node in replicated.primaries if node.port == dead]
    primary.kill()
    survivor = next(node for node in replicated.primaries if node.port != dead)
    await eventually(
        lambda: owner_port(survivor.url, channel) != dead, timeout=30, what="a replica took over"
    )
    new_owner = owner_port(survivor.url, channel)
    await eventually(
        lambda: subscribers([new_owner], channel.decode()) == {new_owner: 1},
        timeout=15,
        what="resubscribed on the new primary",
    )
    # A client that knows the new topology ends the hold; its message wakes the waiter.
    async with aiolock.Client.from_url(
        survivor.url, cluster=True, key_prefix=holder_client.key_prefix
    ) as other:
        assert await other.lock("failover").force_unlock()
    assert await asyncio.wait_for(waiting, 50)  # woken: the holder's lease had 60 s left


class Heard:
    """A subscriber's listener that writes down what it is told."""

    def __init__(self) -> None:
        self.moves: list[bytes] = []
        self.refusals: list[bytes] = []

    def moved(self, subscriber: Subscriber, entry: Entry) -> None:
        self.moves.append(entry.channel)

    def refused(self, entry: Entry, error: ResponseError) -> None:
        self.refusals.append(entry.channel)

    def lost(self, subscriber: Subscriber) -> None:
        pass


def channels_on(url: str, port: int, count: int) -> list[bytes]:
    """``count`` channels of distinct slots served by the primary at ``port``."""
    found: dict[int, bytes] = {}
    i = 0
    while len(found) < count:
        channel = f"aiolock-twin:{{{uuid.uuid4().hex[:8]}-{i}}}:channel".encode()
        i += 1
        if owner_port(url, channel) == port:
            found.setdefault(key_slot(channel), channel)
    return list(found.values())


async def test_an_unrequested_sunsubscribe_is_never_taken_for_a_reply(
    aiolock_cluster: ServerInfo,
) -> None:
    """The node drops a moved slot's channels with ``sunsubscribe`` replies nobody asked for.

    Twice, with the order on the wire fixed (the loop is kept from the reader while the slot
    moves): a drop that arrives while another command is due is a move, not that command's
    answer; and a drop of a channel whose SUNSUBSCRIBE is on its way is taken for its answer,
    after which the command's own answer (MOVED) is pinned on nothing else.  Either way the
    connection stays in step: no reconnect, and the next SSUBSCRIBE is confirmed.
    """
    needs_sharded_pubsub(aiolock_cluster.url)
    cluster = aiolock_cluster.server
    if cluster is None:
        pytest.skip("moves slots of the embedded cluster")
    port = primary_ports(aiolock_cluster.url)[0]
    moving, leaving, staying, joining = channels_on(aiolock_cluster.url, port, 4)
    heard = Heard()
    async with RedisCluster.from_url(aiolock_cluster.url) as redis:
        # The node's own connection settings, as aiolock's subscribers use: before redis-py 6
        # only they parse MOVED as a redirection (a plain pool's parser sees an error).
        await redis.initialize()
        node = redis.get_node(host="127.0.0.1", port=port)
        assert node is not None
        pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
        subscriber = Subscriber(lambda: pool, heard, sharded=True)
        for channel in (moving, leaving):  # migrate_slot moves a slot with keys in it
            await redis.set(channel + b":key", 1)
        try:
            entries = {channel: Entry(channel) for channel in (moving, leaving, staying)}
            for entry in entries.values():
                await subscriber.subscribe(entry)
            # 1. The drop of ``moving`` arrives while the SSUBSCRIBE of ``joining`` is due.
            migrate_slot(cluster, key_slot(moving))  # blocking: the reader cannot read yet
            joined = asyncio.ensure_future(subscriber.subscribe(Entry(joining)))
            await asyncio.wait_for(joined, 5)
            await eventually(lambda: heard.moves == [moving], what="the drop heard as a move")
            # 2. The drop of ``leaving`` arrives while its own SUNSUBSCRIBE is due, followed by
            # the MOVED that answers it, and the SSUBSCRIBE of ``moving`` is due after them.
            migrate_slot(cluster, key_slot(leaving))
            await subscriber.unsubscribe(entries[leaving])  # written at once, no yield
            again = asyncio.ensure_future(subscriber.subscribe(Entry(staying + b":2")))
            await asyncio.wait_for(again, 5)
            assert heard.moves == [moving]  # ``leaving`` left: its drop was no move
            assert subscriber.reconnects == 0
            assert sorted(subscriber.entries) == sorted([staying, joining, staying + b":2"])
            published = await redis.execute_command("SPUBLISH", staying, "released")
            assert published == 1
            await eventually(lambda: subscriber.messages == 1, what="still delivering")
        finally:
            await subscriber.aclose()
            await pool.aclose()
            for channel in (moving, leaving):
                await redis.delete(channel + b":key")
