"""The read-write lock's own rules, across clients, against a real server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

import aiolock
from tests.helpers import assert_clean, eventually, services_of

pytestmark = pytest.mark.anyio


async def publishes(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


async def test_many_readers_of_many_clients_read_at_once(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client(), make_client()]
    all_in = asyncio.Event()
    inside = 0

    async def reader(client: aiolock.Client) -> None:
        nonlocal inside
        async with client.rw_lock("cache").read_lock().acquire(wait=5):
            inside += 1
            if inside == 9:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 5)  # nobody leaves before all are in

    await asyncio.gather(*(reader(client) for client in clients * 3))
    for client in clients:
        await assert_clean(redis, client)


async def test_a_writer_excludes_readers_and_readers_exclude_a_writer(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    rw, other = aiolock_client.rw_lock("doc"), make_client().rw_lock("doc")
    async with rw.write_lock().acquire() as guard:
        assert await rw.write_lock().is_locked()
        assert not await other.read_lock().try_lock(wait=0.1)
        assert not await other.write_lock().try_lock(wait=0)
        assert guard.fencing_token >= 1
    async with rw.read_lock().acquire():
        assert await other.read_lock().is_locked()
        assert not await other.write_lock().is_locked()
        assert not await other.write_lock().try_lock(wait=0.1)


async def test_a_reader_asking_to_write_is_refused_at_once(aiolock_client: aiolock.Client) -> None:
    rw = aiolock_client.rw_lock("upgrade")
    async with rw.read_lock().acquire():
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(aiolock.LockError, match="deadlock"):
            await rw.write_lock().try_lock(wait=5)
        assert loop.time() - started < 1
        assert await rw.read_lock().hold_count() == 1


async def test_a_writer_downgrades_by_reading_then_releasing_the_write_hold(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    rw = aiolock_client.rw_lock("downgrade")
    other = make_client().rw_lock("downgrade")
    write = rw.write_lock()
    await write.lock()
    await rw.read_lock().lock()  # the writer may read
    await write.unlock()  # ... and keep reading
    assert await rw.read_lock().is_held()
    assert not await write.is_locked()
    assert await other.read_lock().try_lock(wait=1)  # other readers may join now
    # A writer of a third owner (a task of its own) may not.
    assert not await asyncio.create_task(other.write_lock().try_lock(wait=0))
    await other.read_lock().unlock()
    await rw.read_lock().unlock()
    assert not await rw.read_lock().is_locked()
    await assert_clean(redis, aiolock_client)


async def test_a_writer_is_not_starved_by_a_stream_of_readers(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    readers_client, writer_client = aiolock_client, make_client()
    stop = asyncio.Event()
    hold = 0.2

    async def stream() -> None:  # a new reader every 50 ms, each reading 200 ms: never a gap
        async def read() -> None:
            async with readers_client.rw_lock("hot").read_lock().acquire(wait=30):
                await asyncio.sleep(hold)

        tasks = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(read()))
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)

    streaming = asyncio.create_task(stream())
    await eventually(
        lambda: readers_client.rw_lock("hot").read_lock().statistics().held >= 3,
        what="overlapping readers",
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with writer_client.rw_lock("hot").write_lock().acquire(wait=10):
        waited = loop.time() - started
    stop.set()
    await streaming
    assert waited < hold + 1.0, waited  # about one read hold, not until the stream ends


async def test_a_write_release_wakes_the_readers_of_every_client_at_once(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [make_client() for _ in range(3)]
    write = aiolock_client.rw_lock("news").write_lock()
    await write.lock()
    # Owners of their own: their tasks end holding the read locks, which then stay held.
    readers = [
        client.rw_lock("news").read_lock(owner=f"reader-{i}")
        for client in clients
        for i in range(2)
    ]
    waiting = [asyncio.create_task(reader.try_lock(wait=10)) for reader in readers]
    await eventually(
        lambda: sum(r.statistics().waiters for r in readers[::2]) == 6, what="all parked"
    )
    before = await publishes(redis)
    loop = asyncio.get_running_loop()
    released = loop.time()
    await write.unlock()
    assert await asyncio.gather(*waiting) == [True] * 6
    assert loop.time() - released < 1
    assert await publishes(redis) - before <= 2  # one to the readers (and one to writers)


async def test_a_read_release_that_frees_the_lock_wakes_a_writer(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    read = aiolock_client.rw_lock("freed").read_lock()
    await read.lock()
    writer = make_client().rw_lock("freed").write_lock()
    waiting = asyncio.create_task(writer.try_lock(wait=10))
    await eventually(lambda: writer.statistics().waiters == 1, what="the writer parked")
    loop = asyncio.get_running_loop()
    released = loop.time()
    await read.unlock()
    assert await waiting
    assert loop.time() - released < 1  # woken, not waiting out a pause


async def test_each_reader_has_its_own_lease_and_the_lock_lives_as_long_as_the_longest(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    short = make_client().rw_lock("leases").read_lock()
    long = aiolock_client.rw_lock("leases").read_lock()
    assert await short.try_lock(lease=0.3)
    assert await long.try_lock()  # the watchdog's lease
    writer = make_client().rw_lock("leases").write_lock()
    await eventually(lambda: short.statistics().lost, what="the short read hold expired")
    assert await long.is_locked()
    assert not await writer.try_lock(wait=0.2)  # the long reader still reads
    await long.unlock()
    assert await writer.try_lock(wait=1)
    await writer.unlock()


async def test_readers_of_a_client_that_died_expire_within_their_lease(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    doomed = make_client(watchdog_timeout=0.6)
    assert await asyncio.create_task(doomed.rw_lock("zombie").read_lock().try_lock())
    await doomed.aclose()  # the client dies holding the read lock: no release, no renewal
    writer = aiolock_client.rw_lock("zombie").write_lock()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await writer.try_lock(wait=5)
    assert loop.time() - started < 0.6 + 1.0
    await writer.unlock()


async def test_a_short_read_hold_beside_a_long_one_is_lost_on_time(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    long = aiolock_client.rw_lock("own-lease").read_lock()
    short = make_client().rw_lock("own-lease").read_lock()
    assert await long.try_lock(lease=5)
    loop = asyncio.get_running_loop()
    with pytest.raises(aiolock.LockLostError):
        async with short.acquire(lease=0.3) as guard:
            started = loop.time()
            lease = await short.remaining_lease()
            assert lease is not None
            assert lease > 4  # the lock lives as long as its longest hold
            await eventually(lambda: guard.lost, timeout=2, what="the short hold lost")
            assert loop.time() - started < 1.0  # its own lease, not the long reader's
    assert await long.is_held()
    await long.unlock()


async def test_a_write_hold_has_its_own_lease(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    write = aiolock_client.rw_lock("own-write").write_lock()
    assert await write.remaining_lease() is None
    assert await write.try_lock(lease=0.5)
    lease = await write.remaining_lease()
    assert lease is not None
    assert lease <= 0.5
    other = make_client().rw_lock("own-write").write_lock()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await other.try_lock(wait=5)
    assert loop.time() - started < 1.5  # when that lease ended, not a longer one
    await other.unlock()
    assert await write.remaining_lease() is None


async def test_a_downgraded_writer_loses_its_short_write_hold_but_keeps_reading(
    aiolock_client: aiolock.Client,
) -> None:
    rw = aiolock_client.rw_lock("short-write")
    write, read = rw.write_lock(), rw.read_lock()
    assert await write.try_lock(lease=0.3)
    assert await read.try_lock(lease=5)
    await eventually(lambda: write.statistics().lost, what="the write hold lost")

    async def not_written() -> bool:
        return not await write.is_locked()

    await eventually(not_written, what="the server dropped the write hold too")
    assert await read.is_held()
    await read.unlock()
    assert not await read.is_locked()


async def test_fresh_read_holds_get_increasing_tokens(aiolock_client: aiolock.Client) -> None:
    read = aiolock_client.rw_lock("tokens").read_lock()
    write = aiolock_client.rw_lock("tokens").write_lock()
    tokens = []
    for lock in (read, write, read, read):
        async with lock.acquire() as guard:
            tokens.append(guard.fencing_token)
            if lock is read:
                async with read.acquire() as again:
                    assert again.fencing_token == guard.fencing_token  # re-entered: shared
    assert tokens == sorted(set(tokens)), tokens


async def test_read_holds_the_client_does_not_know_of_do_not_refuse_the_tasks_write(
    aiolock_client: aiolock.Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The server has read holds of this task that its client does not know of (a settlement
    that failed): they are a bug signal, released and logged, and the task's write goes
    ahead instead of being refused as an upgrade."""
    rw = aiolock_client.rw_lock("unknown-reads")
    reader, writer = rw.read_lock(), rw.write_lock()
    owner, _ = reader.current_owner()
    services = services_of(aiolock_client)
    for _ in range(2):  # two read holds, as late copies of two read acquires would leave
        reply = await services.calls.run(
            *reader.attempt_call(owner, services.owners.next_request(), 30_000)
        )
        assert isinstance(reply, list)
    assert await reader.hold_count() == 2
    assert await writer.try_lock()
    assert await writer.hold_count() == 1
    assert await reader.hold_count() == 0
    assert "did not know of" in caplog.text
    await writer.unlock()
    assert not await writer.is_locked()


async def test_an_explicit_owners_unknown_read_holds_still_refuse_its_write(
    aiolock_client: aiolock.Client,
) -> None:
    """An explicit owner may be used by several tasks of the client at once: a read hold it
    does not track may be one being granted to another of them, so it is not released."""
    rw = aiolock_client.rw_lock("unknown-reads-explicit")
    reader, writer = rw.read_lock(owner="job"), rw.write_lock(owner="job")
    owner, _ = reader.current_owner()
    services = services_of(aiolock_client)
    reply = await services.calls.run(
        *reader.attempt_call(owner, services.owners.next_request(), 30_000)
    )
    assert isinstance(reply, list)
    with pytest.raises(aiolock.LockError, match="deadlock"):
        await writer.try_lock()
    assert await reader.hold_count() == 1
    assert await rw.read_lock().force_unlock()


async def test_an_upgrade_is_refused_at_once_while_writers_of_the_client_wait(
    aiolock_client: aiolock.Client,
) -> None:
    # The reader's write try must reach the server (which refuses the upgrade) rather than
    # queue behind this client's writers, who wait for its own read hold: a deadlock that
    # lasted as long as the watchdog kept the read alive (a chaos run on a Cluster).
    rw = aiolock_client.rw_lock("upgrade")
    read = rw.read_lock()
    await read.lock()  # lease=None: renewed for as long as this task holds it
    writers = [
        asyncio.create_task(aiolock_client.rw_lock("upgrade").write_lock().lock()) for _ in range(2)
    ]
    await eventually(lambda: rw.write_lock().statistics().waiters >= 1, what="writers parked")
    with pytest.raises(aiolock.LockError, match="could deadlock"):
        async with asyncio.timeout(5):
            async with rw.write_lock().acquire():
                pass  # pragma: no cover
    await read.unlock()
    for writer in writers:  # each gets its turn, and ends holding it: released by the client
        await asyncio.wait_for(writer, 10)


async def test_a_writer_reads_at_once_while_readers_of_the_client_wait(
    aiolock_client: aiolock.Client,
) -> None:
    rw = aiolock_client.rw_lock("downgrade")
    write = rw.write_lock()
    await write.lock()
    readers = [asyncio.create_task(aiolock_client.rw_lock("downgrade").read_lock().lock())]
    await eventually(lambda: rw.read_lock().statistics().waiters >= 1, what="a reader parked")
    async with asyncio.timeout(5):  # not the 30 s watchdog lease a queued try parks for
        async with rw.read_lock().acquire():
            pass
    await write.unlock()
    await asyncio.wait_for(readers[0], 10)
