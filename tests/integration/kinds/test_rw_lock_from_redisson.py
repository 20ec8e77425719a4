"""Read-write lock scenarios drawn from what Redisson's own RReadWriteLock tests exercise.

Each test names the Redisson test it was modelled on; the scenarios are rewritten for our API
(owner = task, explicit owners, leases in seconds) and check more than the original did.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, eventually

pytestmark = pytest.mark.anyio

State = tuple[bool, bool, bool, bool]


async def view(rw: aiolock.AsyncReadWriteLock) -> State:
    """(read locked, write locked, read held, write held) as the calling task sees them."""
    read, write = rw.read_lock(), rw.write_lock()
    locked = (await read.is_locked(), await write.is_locked())
    return (*locked, await read.is_held(), await write.is_held())


async def test_many_read_holds_of_one_owner_need_as_many_unlocks(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testHoldCount, testReentrancy.
    read = aiolock_client.rw_lock("reentrant").read_lock()
    writer = make_client().rw_lock("reentrant").write_lock()
    assert await read.hold_count() == 0
    tokens = set()
    for expected in range(1, 6):
        assert await read.try_lock()  # a hold kept ...
        assert await read.hold_count() == expected
        async with read.acquire(wait=0) as guard:  # ... and one more for the block
            tokens.add(guard.fencing_token)
            assert await read.hold_count() == expected + 1
        assert await read.hold_count() == expected
    assert len(tokens) == 1  # every block re-entered the first hold: they share its token
    assert read.statistics().held == 5
    for left in range(4, 0, -1):
        await read.unlock()
        assert await read.hold_count() == left
        assert await read.is_locked()
        assert not await writer.try_lock(wait=0)  # one hold left still keeps writers out
    await read.unlock()
    assert await read.hold_count() == 0
    assert not await read.is_locked()
    with pytest.raises(aiolock.LockNotOwnedError):
        await read.unlock()
    assert await writer.try_lock(wait=1)
    await writer.unlock()
    await assert_clean(redis, aiolock_client)


async def test_the_writer_reads_and_stops_reading_while_it_keeps_writing(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testWR, testWriteReadReentrancy.
    rw = aiolock_client.rw_lock("wr")
    write, read = rw.write_lock(), rw.read_lock()
    other = make_client().rw_lock("wr")
    await write.lock()
    await write.lock()
    await read.lock()
    await read.lock()
    assert (await write.hold_count(), await read.hold_count()) == (2, 2)
    assert await view(rw) == (True, True, True, True)
    assert not await other.read_lock().try_lock(wait=0)
    await read.unlock()
    await read.unlock()
    assert await view(rw) == (False, True, False, True)  # still writing, no longer reading
    assert not await other.read_lock().try_lock(wait=0.1)
    await write.unlock()
    assert await view(rw) == (False, True, False, True)  # one write hold left
    assert not await other.write_lock().try_lock(wait=0)
    await write.unlock()
    assert await view(rw) == (False, False, False, False)
    with pytest.raises(aiolock.LockNotOwnedError):
        await write.unlock()
    assert await other.write_lock().try_lock(wait=1)
    await other.write_lock().unlock()
    await assert_clean(redis, aiolock_client)


async def test_is_locked_and_is_held_as_seen_by_the_holder_other_tasks_and_other_clients(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testIsLocked, testIsLockedOtherThread, testIsHeldByCurrentThread(OtherThread),
    # testReadLockIsLocked.
    rw = aiolock_client.rw_lock("seen")
    other = make_client().rw_lock("seen")
    nothing = (False, False, False, False)

    async def elsewhere() -> tuple[State, State]:
        """The view of another task of this client, and of a task of another client."""
        return await asyncio.create_task(view(rw)), await asyncio.create_task(view(other))

    assert await view(rw) == nothing
    assert await elsewhere() == (nothing, nothing)

    await rw.read_lock().lock()
    assert await view(rw) == (True, False, True, False)
    assert await elsewhere() == ((True, False, False, False),) * 2
    await rw.read_lock().unlock()
    assert await elsewhere() == (nothing, nothing)

    await rw.write_lock().lock()
    assert await view(rw) == (False, True, False, True)
    assert await elsewhere() == ((False, True, False, False),) * 2
    await rw.read_lock().lock()
    assert await view(rw) == (True, True, True, True)
    assert await elsewhere() == ((True, True, False, False),) * 2
    await rw.write_lock().unlock()  # the downgrade
    assert await view(rw) == (True, False, True, False)
    assert await elsewhere() == ((True, False, False, False),) * 2
    await rw.read_lock().unlock()
    assert await view(rw) == nothing
    assert await elsewhere() == (nothing, nothing)
    await assert_clean(redis, aiolock_client)


async def test_unlock_by_an_owner_that_does_not_hold_it_leaves_the_holder_alone(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testUnlockFail.
    rw = aiolock_client.rw_lock("not-mine")
    holder = rw.read_lock(owner="holder")
    await holder.lock()
    await holder.lock()
    for stranger in (
        rw.read_lock(),
        rw.write_lock(),
        make_client().rw_lock("not-mine").read_lock(),
    ):
        with pytest.raises(aiolock.LockNotOwnedError):
            await stranger.unlock()
    with pytest.raises(aiolock.LockNotOwnedError):
        await asyncio.create_task(rw.read_lock().unlock())
    assert await holder.hold_count() == 2
    await holder.unlock()
    await holder.unlock()
    assert not await holder.is_locked()


async def test_each_modes_force_unlock_ends_only_that_modes_holds(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testForceUnlock, testMultiRead (its forceUnlock of a free lock).  SPEC: each
    # mode's force_unlock removes only that mode's holds (False if it had none); the other
    # mode's holders keep theirs.
    holders = make_client(watchdog_timeout=0.6)  # its watchdog notices a force quickly
    rw = holders.rw_lock("forced")
    outsider = aiolock_client.rw_lock("forced")
    assert not await outsider.read_lock().force_unlock()
    assert not await outsider.write_lock().force_unlock()

    readers = [rw.read_lock(owner=f"reader-{i}") for i in range(2)]
    for reader in readers:
        assert await reader.try_lock()
    counters = rw.read_lock().statistics()
    assert not await outsider.write_lock().force_unlock()  # nobody writes: readers untouched
    assert await outsider.read_lock().is_locked()
    # Both read holds are renewed after the force (the watchdog would find them gone).
    await eventually(
        lambda: rw.read_lock().statistics().renewals >= counters.renewals + 4,
        what="the read holds renewed twice each",
    )
    assert rw.read_lock().statistics().losses == 0
    for reader in readers:
        assert await reader.hold_count() == 1
    assert await outsider.read_lock().force_unlock()  # the read mode's object: every reader
    assert not await outsider.read_lock().is_locked()
    assert not await outsider.read_lock().force_unlock()  # nothing left
    await eventually(lambda: rw.read_lock().statistics().losses == 2, what="2 readers lost")
    for reader in readers:
        with pytest.raises(aiolock.LockNotOwnedError):
            await reader.unlock()

    # A writer that also reads: the read force ends its read hold only, the write force the rest.
    writer, its_reads = rw.write_lock(owner="w"), rw.read_lock(owner="w")
    with pytest.raises(aiolock.LockLostError, match="forced"):
        async with writer.acquire() as guard:
            assert await its_reads.try_lock()
            assert await outsider.read_lock().force_unlock()
            assert not await outsider.read_lock().is_locked()
            assert await outsider.write_lock().is_locked()
            await eventually(lambda: its_reads.statistics().losses == 3, what="its read lost")
            assert not guard.lost
            assert await writer.hold_count() == 1
            assert await outsider.write_lock().force_unlock()
            assert not await outsider.write_lock().force_unlock()
            await eventually(lambda: guard.lost, what="the writer lost")
    assert not await outsider.write_lock().is_locked()
    async with outsider.write_lock().acquire(wait=0) as after:  # free for anyone now
        assert after.fencing_token > guard.fencing_token
    await assert_clean(redis, holders)
    await assert_clean(redis, aiolock_client)


async def test_force_unlock_wakes_a_writer_behind_readers_and_readers_behind_a_writer(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testForceUnlock (which never checks the waiters).  Long leases everywhere, and a
    # writer that tries again only every 10 s: only the force's message can let them in fast.
    loop = asyncio.get_running_loop()
    forcer = make_client().rw_lock("wake")
    assert await aiolock_client.rw_lock("wake").read_lock(owner="stuck").try_lock()
    writer = make_client(fair_wait_timeout=30.0).rw_lock("wake").write_lock(owner="w")
    waiting = asyncio.create_task(writer.try_lock(wait=10))
    await eventually(lambda: writer.statistics().waiters == 1, what="the writer parked")
    forced = loop.time()
    assert await forcer.read_lock().force_unlock()
    assert await waiting
    assert loop.time() - forced < 1

    readers_client = make_client()
    readers = [readers_client.rw_lock("wake").read_lock(owner=f"r{i}") for i in range(3)]
    waiting_readers = [asyncio.create_task(reader.try_lock(wait=10)) for reader in readers]
    await eventually(lambda: readers[0].statistics().waiters == 3, what="the readers parked")
    forced = loop.time()
    assert await forcer.write_lock().force_unlock()
    assert await asyncio.gather(*waiting_readers) == [True] * 3
    assert loop.time() - forced < 1
    for reader in readers:
        await reader.unlock()
    assert not await forcer.read_lock().is_locked()


@pytest.mark.parametrize("holder_mode", ["read", "write"])
async def test_a_hold_whose_lease_ran_out_is_taken_over_and_its_unlock_is_refused(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    holder_mode: str,
) -> None:
    # Redisson: testExpireRead, testExpireWrite.
    rw = aiolock_client.rw_lock("expiring")
    stale = rw.read_lock() if holder_mode == "read" else rw.write_lock()
    await stale.lock(lease=0.5)
    taker = make_client().rw_lock("expiring").write_lock()
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):  # (not wait_for: on 3.11 it runs the call in a new task)
        await taker.lock()  # no release: only the lease frees it
    waited = loop.time() - started
    assert 0.35 <= waited < 1.5, waited
    await eventually(lambda: stale.statistics().lost, what="the stale hold reported lost")
    with pytest.raises(aiolock.LockNotOwnedError):
        await stale.unlock()
    assert await taker.hold_count() == 1  # the refused unlock took nothing from the new writer
    assert await stale.is_locked() is (holder_mode == "write")  # the write mode: someone writes
    await taker.unlock()
    assert not await taker.is_locked()
    await assert_clean(redis, aiolock_client)


async def test_readers_of_many_tasks_and_clients_enter_when_a_write_lease_runs_out(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testReadLockLeaseTimeoutDiffThreadsWRR.
    write = aiolock_client.rw_lock("wrr").write_lock()
    await write.lock(lease=0.5)
    clients = [make_client(), make_client()]
    readers = [client.rw_lock("wrr").read_lock(owner=f"r{i}") for client in clients for i in (1, 2)]
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await asyncio.gather(*(reader.try_lock(wait=5) for reader in readers))
    assert results == [True] * 4
    assert 0.35 <= loop.time() - started < 1.5
    await eventually(lambda: write.statistics().lost, what="the writer's hold reported lost")
    assert not await write.is_locked()
    for reader in readers:
        await reader.unlock()


async def test_readers_of_several_owners_with_their_own_leases_keep_out_a_writer_until_the_last(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testReadLockExpiration, testReadLockLeaseTimeoutDiffThreadsRRW.
    clients = [aiolock_client, make_client(), make_client()]
    leases = [0.4, 0.8, 1.2]  # shortest first; the reverse order is tested below
    readers = [
        client.rw_lock("leases").read_lock(owner=f"reader-{i}") for i, client in enumerate(clients)
    ]
    loop = asyncio.get_running_loop()
    for reader, lease in zip(readers, leases, strict=True):
        assert await reader.try_lock(lease=lease)
    granted = loop.time()
    remaining = await readers[0].remaining_lease()
    assert remaining is not None
    assert 0.9 < remaining <= 1.2  # the lock lives as long as its longest read hold
    writer = make_client().rw_lock("leases").write_lock(owner="writer")
    waiting = asyncio.create_task(writer.try_lock(wait=5))
    await eventually(
        lambda: readers[0].statistics().lost and readers[1].statistics().lost,
        what="the two shorter read holds expired",
    )
    assert not readers[2].statistics().lost
    assert not waiting.done()  # the longest read hold still keeps the writer out
    assert await readers[2].is_held()

    async def middle_gone() -> bool:  # the client's timer fires a little before the server
        return not await readers[1].is_held()

    await eventually(middle_gone, what="the server ended the middle read hold")
    assert not waiting.done()
    assert await waiting
    assert 1.0 <= loop.time() - granted < 1.2 + 1.0
    assert readers[2].statistics().lost
    for reader in readers:
        with pytest.raises(aiolock.LockNotOwnedError):
            await reader.unlock()
    await writer.unlock()
    for client in clients:
        await assert_clean(redis, client)


async def test_the_watchdog_renews_the_read_hold_the_writer_keeps_after_a_downgrade(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testReadWriteTTL (lease checked while writing and reading, then reading only).
    client = make_client(watchdog_timeout=0.6)
    rw = client.rw_lock("ttl")
    write, read = rw.write_lock(), rw.read_lock()
    await write.lock()
    await read.lock()
    await eventually(
        lambda: write.statistics().renewals >= 3 and read.statistics().renewals >= 3,
        what="both holds renewed three times",
    )
    lease = await read.remaining_lease()
    assert lease is not None
    assert 0 < lease <= 0.6
    await write.unlock()
    renewed = read.statistics().renewals
    await eventually(
        lambda: read.statistics().renewals >= renewed + 3, what="three more read renewals"
    )
    assert not read.statistics().lost
    assert await read.is_held()
    outsider = aiolock_client.rw_lock("ttl").write_lock()
    assert not await outsider.try_lock(wait=0)  # well past the first lease: still reading
    await read.unlock()
    assert await outsider.try_lock(wait=1)
    await outsider.unlock()


async def test_readers_holding_longer_than_the_watchdog_lease_are_never_lost(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testReadLockExpirationRenewal (50 readers, each holding past the lease).
    clients = [make_client(watchdog_timeout=0.45), make_client(watchdog_timeout=0.45)]
    all_in = asyncio.Event()
    inside = 0

    async def reader(i: int) -> bool:
        nonlocal inside
        read = clients[i % 2].rw_lock("renewed").read_lock()
        async with read.acquire(wait=5) as guard:
            inside += 1
            if inside == 20:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 5)
            await asyncio.sleep(1.0)  # more than twice the lease
            return guard.lost

    assert await asyncio.gather(*(reader(i) for i in range(20))) == [False] * 20
    for client in clients:
        assert client.rw_lock("renewed").read_lock().statistics().losses == 0
        await assert_clean(redis, client)


async def test_readers_never_see_a_half_written_value_among_random_readers_and_writers(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Redisson: testConcurrency_SingleInstance, testConcurrency(Loop)_MultiInstance, testName.
    clients = [aiolock_client, make_client(), make_client()]
    rng = random.Random(11)
    plan = [[rng.random() < 0.3 for _ in range(12)] for _ in range(12)]  # True: write
    data = [0, 0]  # a writer updates both cells with a pause between: readers must never see it
    readers_inside = writers_inside = peak_readers = 0
    seen: list[int] = []

    async def worker(i: int) -> None:
        nonlocal readers_inside, writers_inside, peak_readers
        rw = clients[i % 3].rw_lock("counter")
        for writes in plan[i]:
            if writes:
                async with rw.write_lock().acquire(wait=30):
                    assert (readers_inside, writers_inside) == (0, 0)
                    writers_inside += 1
                    data[0] += 1
                    await asyncio.sleep(0.002)
                    data[1] += 1
                    writers_inside -= 1
            else:
                async with rw.read_lock().acquire(wait=30):
                    assert writers_inside == 0
                    readers_inside += 1
                    peak_readers = max(peak_readers, readers_inside)
                    first = data[0]
                    await asyncio.sleep(0.002)
                    assert data == [first, first], data
                    seen.append(first)
                    readers_inside -= 1

    await asyncio.gather(*(worker(i) for i in range(12)))
    writes = sum(sum(row) for row in plan)
    assert data == [writes, writes]
    assert len(seen) == 12 * 12 - writes
    assert peak_readers > 1  # readers did share the lock
    for client in clients:
        await assert_clean(redis, client)


async def test_a_short_read_hold_is_reported_lost_when_its_own_lease_ends(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testReadLockExpiration (readers of several owners, the shorter one second).
    # The client must time a read hold by its own lease, not by the lock's longest.
    long = aiolock_client.rw_lock("short").read_lock(owner="long")
    assert await long.try_lock()  # the watchdog's lease, 30 s
    short = make_client().rw_lock("short").read_lock(owner="short")
    writer = make_client().rw_lock("short").write_lock()
    with pytest.raises(aiolock.LockLostError):
        async with short.acquire(lease=0.3) as guard:

            async def dropped() -> bool:
                return not await short.is_held()

            await eventually(dropped, what="the server ended the short read hold")
            await long.unlock()
            assert await writer.try_lock(wait=1)  # a writer holds it now: the reader must know
            await eventually(lambda: guard.lost, timeout=1, what="the short read hold lost")
    await writer.unlock()


async def test_a_leased_write_hold_ends_with_its_lease_even_if_its_owner_reads(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testWriteLockExpiration / testExpireWrite, with the writer also reading: the
    # owner's read hold must not keep its leased write hold alive.
    rw = aiolock_client.rw_lock("downgraded")
    write, read = rw.write_lock(), rw.read_lock()
    await write.lock(lease=0.3)
    await read.lock()  # the watchdog's lease, 30 s
    await eventually(lambda: write.statistics().lost, what="the write lease ran out")
    other = make_client().rw_lock("downgraded")

    async def write_ended() -> bool:
        return not await other.write_lock().is_locked()

    await eventually(write_ended, timeout=1, what="the server ended the write hold")
    assert await other.read_lock().try_lock(wait=1)  # readers may join the remaining reader
    await other.read_lock().unlock()
    await read.unlock()


@pytest.mark.parametrize("mode", ["read", "write"])
async def test_a_forced_hold_is_reported_lost_even_if_its_owner_acquired_again_meanwhile(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], mode: str
) -> None:
    # Redisson: testForceUnlock, with the holder acquiring again after the force: the new
    # grant must not be taken for a re-entry of the forced hold.
    rw = aiolock_client.rw_lock("reforced")
    lock = rw.read_lock() if mode == "read" else rw.write_lock()
    outsider = make_client().rw_lock("reforced")
    forcer = outsider.read_lock() if mode == "read" else outsider.write_lock()
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire() as guard:
            assert await forcer.force_unlock()
            async with lock.acquire():  # a fresh hold on the server, not a re-entry
                pass
            # This block still runs: a writer may get in only if the guard says it was lost.
            if await outsider.write_lock().try_lock(wait=0):
                assert guard.lost, "another owner writes while this guard says it holds"
                await outsider.write_lock().unlock()
    assert not await lock.is_locked()


async def test_remaining_lease_follows_the_read_holds_that_are_left(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # Redisson: testReadWriteTTL (remainTimeToLive), with readers of two owners: a reader
    # that leaves takes its lease with it.
    short = aiolock_client.rw_lock("ttl-left").read_lock(owner="short")
    long = make_client().rw_lock("ttl-left").read_lock(owner="long")
    assert await short.try_lock(lease=0.5)
    assert await long.try_lock()  # the watchdog's lease, 30 s
    await long.unlock()
    remaining = await short.remaining_lease()
    assert remaining is not None
    assert remaining <= 0.5  # only the short read hold is left

    async def free() -> bool:
        return not await short.is_locked()

    await eventually(free, what="the short read hold expired")
    assert await short.remaining_lease() is None
