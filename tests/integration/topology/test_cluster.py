"""Every lock kind on a real Redis Cluster: three primaries started by the suite.

Calls go to the node of each lock's slot (see ``aiolock/_cluster.py``), waiters park on sharded
pub/sub (a subscriber per node, see ``test_cluster_pubsub.py``), the watchdog renews per slot,
and the fencing counters are one per slot.  Locks are spread over every node by their names.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from redis import Redis
from redis.asyncio import RedisCluster
from redis.crc import key_slot

import aiolock
from aiolock._core.holds import Hold
from aiolock._redis.cluster import ClusterCalls
from aiolock.testing.embedded import EmbeddedCluster
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import cluster_clients, eventually, keys_of, services_of, use_once

pytestmark = pytest.mark.anyio

Kind = aiolock.AsyncRLock | aiolock.AsyncFairLock | aiolock.AsyncSpinLock


@pytest.fixture
async def clients(aiolock_cluster: ServerInfo) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """Clients on the cluster sharing one key prefix; closed, and their keys deleted, after."""
    prefix = f"aiolock-cluster-{uuid.uuid4().hex[:8]}"
    async with cluster_clients(aiolock_cluster.url, prefix) as make:
        yield make
    async with RedisCluster.from_url(aiolock_cluster.url) as redis:
        for node in redis.get_primaries():
            keys = [key async for key in redis.scan_iter(match=f"{prefix}:*", target_nodes=node)]
            for key in keys:
                await redis.unlink(key)


def node_name(url: str) -> str:
    """``host:port`` of the node a ``redis://host:port/0`` URL names."""
    return url.removeprefix("redis://").removesuffix("/0")


async def keys_on_cluster(url: str, prefix: str) -> list[str]:
    async with RedisCluster.from_url(url, decode_responses=True) as redis:
        found: list[str] = []
        for node in redis.get_primaries():
            found += [k async for k in redis.scan_iter(match=f"{prefix}:*", target_nodes=node)]
        return sorted(found)


MAKERS: dict[str, Callable[[aiolock.Client, str], Kind]] = {
    "lock": lambda client, name: client.lock(name),
    "fair": lambda client, name: client.fair_lock(name),
    "spin": lambda client, name: client.spin_lock(name),
    "write": lambda client, name: client.rw_lock(name).write_lock(),  # type: ignore[dict-item,return-value]
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
async def test_a_release_hands_the_lock_to_a_waiter_of_another_client(
    clients: Callable[..., aiolock.Client], kind: str
) -> None:
    first, second = clients(), clients()
    names = [f"job:{i}" for i in range(6)]  # spread over the nodes
    assert len({key_slot(f"{{{name}}}".encode()) // 5462 for name in names}) > 1
    for name in names:
        holder = MAKERS[kind](first, name)
        waiter = MAKERS[kind](second, name)
        held, release = asyncio.Event(), asyncio.Event()
        tokens: list[int] = []

        async def hold(
            holder: Kind = holder, held: asyncio.Event = held, tokens: list[int] = tokens
        ) -> None:
            async with holder.acquire(wait=0, lease=30) as guard:
                tokens.append(guard.fencing_token)
                held.set()
                await release.wait()  # noqa: B023

        async def release_when_parked(waiter: Kind = waiter) -> None:
            await eventually(lambda: waiter.statistics().waiters == 1, what="parked")
            release.set()  # noqa: B023

        holding = asyncio.create_task(hold())
        await held.wait()
        releasing = asyncio.create_task(release_when_parked())
        # Woken by the release: the holder's lease had 30 s left, the wait is 10 s.
        async with waiter.acquire(wait=10, lease=5) as guard:
            assert guard.fencing_token > tokens[0]
        await asyncio.gather(holding, releasing)
        assert not await waiter.is_locked()


async def test_read_locks_semaphores_and_latches(clients: Callable[..., aiolock.Client]) -> None:
    one, two, three = clients(), clients(), clients()
    rw = one.rw_lock("doc:1")
    async with rw.read_lock().acquire(wait=0), two.rw_lock("doc:1").read_lock().acquire(wait=0):
        assert not await three.rw_lock("doc:1").write_lock().try_lock(wait=0)
    async with two.rw_lock("doc:1").write_lock().acquire(wait=1):
        pass
    semaphore = one.semaphore("pool:1", 2)
    first = await semaphore.try_acquire(wait=0, lease=5)
    second = await two.semaphore("pool:1", 2).try_acquire(wait=0, lease=5)
    assert first is not None
    assert second is not None
    third = asyncio.create_task(two.semaphore("pool:1", 2).try_acquire(wait=10, lease=5))
    await eventually(lambda: two.semaphore("pool:1", 2).statistics().waiters == 1)
    await first.release()
    permit = await asyncio.wait_for(third, 5)
    assert permit is not None
    await permit.release()
    await second.release()
    latch = one.countdown_latch("parts:1")
    assert await latch.try_set_count(2)
    done = asyncio.create_task(two.countdown_latch("parts:1").wait(timeout=10))
    await latch.count_down()
    await latch.count_down()
    assert await asyncio.wait_for(done, 5)


async def test_extend_and_set_permits_run_in_the_locks_slot(
    clients: Callable[..., aiolock.Client],
) -> None:
    """Each kind's extend script and the semaphore's set_permits name keys of one slot (the
    hash tag's), and set_permits' wake-up reaches a waiter of another client."""
    one, two = clients(), clients()
    rw = one.rw_lock("doc:2")
    for lock in (one.lock("e:1"), one.fair_lock("e:2"), rw.read_lock(), rw.write_lock()):
        async with lock.acquire(wait=5, lease=1) as guard:
            await guard.extend(20)
            assert 19 < guard.valid_for() <= 20
            assert 19 < (await lock.remaining_lease() or 0) <= 20
    semaphore = one.semaphore("pool:2", 1)
    held = await semaphore.try_acquire(wait=0, lease=30)
    assert held is not None
    await held.extend(40)
    assert 39 < held.valid_for() <= 40
    other = two.semaphore("pool:2", 2)
    with pytest.raises(ValueError, match="has 1 permits on the server; this caller asked for 2"):
        await other.try_acquire(wait=0)
    waiting = asyncio.create_task(one.semaphore("pool:2", 1).try_acquire(wait=10, lease=5))
    await eventually(lambda: one.semaphore("pool:2", 1).statistics().waiters == 1)
    await other.set_permits(2)
    with pytest.raises(ValueError, match="has 2 permits on the server; this caller asked for 1"):
        await waiting  # woken by the raise, it finds the count it disagrees with
    admitted = await other.try_acquire(wait=0, lease=5)
    assert admitted is not None
    await admitted.release()
    await held.release()


async def test_the_watchdog_renews_holds_on_every_slot(
    clients: Callable[..., aiolock.Client],
) -> None:
    """One renewal call may not span slots: the watchdog batches per slot.  A 1.5 s lease (a
    round every 0.5 s): 0.6 s left a loaded CI machine too little slack to take 60 locks on
    three nodes and renew them twice within the test's bound."""
    client = clients(watchdog_timeout=1.5)
    locks = [client.lock(f"order:{i}") for i in range(60)]
    guards = [await lock.acquire(wait=0).__aenter__() for lock in locks]
    renewals = client.statistics().renewals
    await eventually(lambda: client.statistics().renewals >= renewals + 2 * len(locks), timeout=10)
    assert not any(guard.lost for guard in guards)
    for lock in locks:
        await lock.unlock()


async def test_a_renewal_round_reads_the_holds_once_whatever_the_groups(
    clients: Callable[..., aiolock.Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round renews per slot, so on a Cluster about as many groups as holds: it reads the
    registry once and hands each group its own holds.  A group that read every hold again
    (as each did once) made a round cost the square of the holds (the figures:
    ``benchmarks/watchdog_round.py``).  A long lease: the watchdog's own rounds stay away."""
    client = clients(watchdog_timeout=600)
    locks = [client.lock(f"round:{i}", owner="one-owner") for i in range(300)]
    for start in range(0, len(locks), 100):
        await asyncio.gather(*(lock.lock() for lock in locks[start : start + 100]))
    slots = {key_slot(keys_of(lock).lock.encode()) for lock in locks}
    assert len(slots) > 250  # nearly a group per hold: the case that was quadratic
    services = services_of(client)
    reads = 0
    watched = services.holds.watched

    def counted() -> list[Hold]:
        nonlocal reads
        reads += 1
        return watched()

    monkeypatch.setattr(services.holds, "watched", counted)
    renewals = client.statistics().renewals
    await services.watchdog.renew_once()
    assert client.statistics().renewals == renewals + len(locks)  # every hold, once
    assert reads == 1
    for lock in locks:
        await lock.unlock()


async def test_keys_left_are_at_most_one_per_slot(
    clients: Callable[..., aiolock.Client], aiolock_cluster: ServerInfo
) -> None:
    client = clients()
    names = [f"orders:{i}" for i in range(1000)]
    tokens: dict[int, list[int]] = {}

    async def use(name: str) -> None:
        async with client.lock(name).acquire(wait=0, lease=1) as guard:
            slot = key_slot(f"{{{name}}}".encode())
            tokens.setdefault(slot, []).append(guard.fencing_token)

    for start in range(0, len(names), 100):
        await asyncio.gather(*(use(name) for name in names[start : start + 100]))

    async def only_counters() -> bool:
        left = await keys_on_cluster(aiolock_cluster.url, client.key_prefix)
        return all(key.startswith(f"{client.key_prefix}:fence{{") for key in left)

    await eventually(only_counters, timeout=2.0, what="only the fencing counters left")
    left = await keys_on_cluster(aiolock_cluster.url, client.key_prefix)
    assert len(left) == len(tokens) <= 1000  # one counter per slot that was used
    assert len({key_slot(key.encode()) for key in left}) == len(left)


@pytest.mark.parametrize("kind", ["fair", "spin", "read", "write", "semaphore", "latch"])
async def test_every_kind_leaves_at_most_one_key_per_slot(
    clients: Callable[..., aiolock.Client], aiolock_cluster: ServerInfo, kind: str
) -> None:
    """Fault-free use of 500 names of each kind, with the default lease (the watchdog's):
    within two seconds of the last release only fencing counters are left, at most one per
    slot (the latch takes no token: none at all)."""
    client = clients()
    names = [f"{kind}:{i}" for i in range(500)]
    for start in range(0, len(names), 100):
        await asyncio.gather(*(use_once(client, kind, name) for name in names[start : start + 100]))

    async def only_counters() -> bool:
        left = await keys_on_cluster(aiolock_cluster.url, client.key_prefix)
        return all(key.startswith(f"{client.key_prefix}:fence{{") for key in left)

    await eventually(only_counters, timeout=2.0, what=f"no {kind} key per name left")
    left = await keys_on_cluster(aiolock_cluster.url, client.key_prefix)
    assert len({key_slot(key.encode()) for key in left}) == len(left) <= 500


async def test_cancellation_leaves_nothing_behind(
    clients: Callable[..., aiolock.Client], aiolock_cluster: ServerInfo
) -> None:
    client = clients()
    rng = random.Random(20261123)
    holder = client.lock("contended", owner="holder")
    for _ in range(60):
        await holder.lock(lease=5)
        lock = client.lock("contended")

        async def attempt(lock: aiolock.AsyncRLock = lock) -> None:
            if await lock.try_lock(wait=5):
                await lock.unlock()

        task = asyncio.create_task(attempt())
        for _ in range(rng.randrange(30)):
            await asyncio.sleep(0)
        if rng.random() < 0.5:
            await holder.unlock()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if await holder.is_held():
            await holder.unlock()
        await eventually(lambda: client.statistics().pending == 0, what="settled")
        assert not await lock.is_locked()
    assert client.statistics().holds == 0


def migrate_slot(cluster: EmbeddedCluster, slot: int) -> None:
    """Move ``slot`` to the next primary, keys and all (:meth:`EmbeddedCluster.move_slot`), and
    check that its keys went along."""
    new = cluster.move_slot(slot)
    with Redis(host=new.host, port=new.port) as target:
        assert target.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0


async def test_a_slot_that_moves_keeps_its_hold_and_wakes_its_waiter(
    clients: Callable[..., aiolock.Client], aiolock_cluster: ServerInfo
) -> None:
    """A held lock's slot moves to another primary: the hold stays valid (MIGRATE keeps the
    TTL), renewals and the release follow it (MOVED), and the parked waiter is woken."""
    if aiolock_cluster.server is None:
        pytest.skip("moves a slot of the embedded cluster")
    holder_client, waiter_client = clients(watchdog_timeout=0.9), clients()
    holder = holder_client.lock("moving")
    waiter = waiter_client.lock("moving")
    slot = key_slot(keys_of(holder).lock.encode())
    async with holder.acquire(wait=0) as guard:

        async def wait_for_it() -> bool:
            if not await waiter.try_lock(wait=20):
                return False
            await waiter.unlock()
            return True

        waiting = asyncio.create_task(wait_for_it())
        await eventually(lambda: waiter.statistics().waiters == 1, what="parked")
        await asyncio.to_thread(migrate_slot, aiolock_cluster.server, slot)
        renewals = holder_client.statistics().renewals
        await eventually(
            lambda: holder_client.statistics().renewals > renewals, timeout=5, what="renewed"
        )
        assert not guard.lost
        assert await holder.is_held()
    assert await asyncio.wait_for(waiting, 10)


async def test_the_subscriber_has_a_node_before_the_topology_is_known(
    aiolock_cluster: ServerInfo,
) -> None:
    """The reader may connect while the first call is still learning the topology."""
    redis = RedisCluster.from_url(aiolock_cluster.url)  # not entered: entering initializes it
    calls = ClusterCalls(redis)
    try:
        assert [node.node.name for node in calls.nodes()] == [node_name(aiolock_cluster.url)]
        await calls.initialize()
        assert len(calls.nodes()) == 3
    finally:
        await calls.aclose(grace=0)
        await redis.aclose()


async def test_a_clients_address_is_the_one_it_was_given(
    aiolock_cluster: ServerInfo, clients: Callable[..., aiolock.Client]
) -> None:
    """Learning the topology (at the first call, as at a failover) does not rename the client."""
    client = clients()
    given = "redis-cluster://" + node_name(aiolock_cluster.url)
    assert repr(client).split()[2] == given
    lock = client.lock("named")
    assert await lock.try_lock(wait=0)
    await lock.unlock()
    assert len(client.redis.get_nodes()) > 1  # type: ignore[union-attr]
    assert repr(client).split()[2] == given


@pytest.mark.parametrize("swapped", [False, True])
async def test_multilocks_order_their_parts_alike_across_clients(
    aiolock_cluster: ServerInfo, clients: Callable[..., aiolock.Client], swapped: bool
) -> None:
    """Two MultiLocks over the same two locks, their parts made through two clients whose URLs
    name different nodes of the Cluster, take the parts in one order.

    An order by where each part's client connects would differ between the two MultiLocks,
    and with ``wait=None`` they would deadlock: ``first`` queues on the fair lock ``a`` behind
    a holder; ``second`` takes ``b`` (if its order says so) and queues on ``a`` behind
    ``first``; the hand-off gives ``a`` to ``first``, which then waits for ``b`` for ever.
    Both arrangements of the two clients are run, since which one such an order would put
    first depends on how the nodes' addresses compare.
    """
    async with RedisCluster.from_url(aiolock_cluster.url) as redis:
        primaries = [node.name for node in redis.get_primaries()]
    [elsewhere, *_] = [name for name in primaries if name != node_name(aiolock_cluster.url)]
    here, there, holder_client = clients(), clients(at=elsewhere), clients()
    one, other = (there, here) if swapped else (here, there)
    first = aiolock.MultiLock(one.fair_lock("a", owner="first"), other.lock("b", owner="first"))
    second = aiolock.MultiLock(other.fair_lock("a", owner="second"), one.lock("b", owner="second"))
    entered: list[str] = []

    async def take(multi: aiolock.MultiLock, label: str) -> None:
        await multi.lock()
        entered.append(label)
        await multi.unlock()

    def waiting(multi: aiolock.MultiLock) -> bool:
        return any(part.statistics().waiters for part in multi.locks)

    holder = holder_client.fair_lock("a", owner="holder")
    assert await holder.try_lock(wait=0)
    tasks = [asyncio.create_task(take(first, "first"))]
    try:
        await eventually(lambda: waiting(first), what="first queued")
        tasks.append(asyncio.create_task(take(second, "second")))
        await eventually(lambda: waiting(second), what="second queued")
        await holder.unlock()
        done, _ = await asyncio.wait(tasks, timeout=10)
        assert len(done) == 2, f"deadlocked: entered {entered}"
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert entered == ["first", "second"]
