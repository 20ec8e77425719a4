"""The fair lock's own behaviour: FIFO across clients, one named message per hand-off that
grants the next waiter the lock with no call of its own, a queue that waiters leave at once
when they give up (taking back a grant they never took), vanished waiters dropped after
``fair_wait_timeout``, live waiters never dropped, and nothing left behind."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock import _scripts
from aiolock.fair.entry import NamedEntry
from aiolock.fair.queue import FairKeys
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import (
    assert_clean,
    channels,
    command_calls,
    counted,
    entry_of,
    evalsha_calls,
    eventually,
    keys_of,
    services_of,
)

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[3]


def fair_keys(lock: aiolock.AsyncFairLock) -> FairKeys:
    keys = keys_of(lock)
    assert isinstance(keys, FairKeys)
    return keys


def member_owner(member: str) -> str:
    """The owner of a member of a fair lock's queue, '<lease ms> <request n> <wait ms>
    <deadline> <owner>' (scripts/fair/_queue.lua)."""
    return member.split(" ", 4)[4]


async def queue(redis: Redis, lock: aiolock.AsyncFairLock) -> list[str]:
    """The owners waiting for ``lock``, first in line first."""
    return [member_owner(str(m)) for m in await redis.lrange(fair_keys(lock).queue, 0, -1)]


async def queued(redis: Redis, lock: aiolock.AsyncFairLock, count: int) -> None:
    """Wait until exactly ``count`` owners are in ``lock``'s queue."""

    async def reached() -> bool:
        return int(await redis.llen(fair_keys(lock).queue)) == count

    await eventually(reached, what=f"{count} owner(s) queued")


async def no_queue_keys(redis: Redis, lock: aiolock.AsyncFairLock) -> bool:
    return int(await redis.exists(fair_keys(lock).queue)) == 0


async def deadlines(redis: Redis, lock: aiolock.AsyncFairLock) -> dict[str, int]:
    """Each waiter's deadline (server ms), the fourth field of its member of the queue."""
    members = [str(m) for m in await redis.lrange(fair_keys(lock).queue, 0, -1)]
    return {member_owner(m): int(m.split(" ", 4)[3]) for m in members}


async def publish_calls(redis: Redis) -> int:
    """PUBLISH calls the server has run, those made inside scripts included."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_publish", {}).get("calls", 0))


def messages(clients: list[aiolock.Client]) -> int:
    """Messages the clients' subscriber connections have received in total."""
    return sum(services_of(client).pubsub.statistics().messages for client in clients)


def parked_on(client: aiolock.Client, lock: aiolock.AsyncFairLock) -> int:
    entry = entry_of(client, fair_keys(lock).channel)
    return 0 if entry is None or not entry.confirmed else entry.parked


async def test_a_hand_off_costs_a_queued_try_and_a_release_11_commands(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """The contended acquisition's cost on the server, counted by it: a try that takes a place
    is 4 commands, the release that grants the next waiter 7, and one grant from the queue in
    four re-arms the queue's expiry (one more `PEXPIRE`; benchmarks/notes/hand-off.md, "The
    queue a list", says what each is for).  The subscriber's idle PING is no part of it."""
    warm = aiolock_client.fair_lock("counted-warm")  # the scripts loaded on the server
    await warm.lock()
    await warm.unlock()
    holder = aiolock_client.fair_lock("counted", owner="holder")
    await holder.lock(lease=60)
    client = make_client(fair_wait_timeout=60)  # no keep-alive call within the test
    lock = client.fair_lock("counted")
    granted = [asyncio.Event() for _ in range(3)]
    release, done = asyncio.Event(), asyncio.Event()

    async def waiter(i: int) -> None:
        await lock.lock(lease=60)
        granted[i].set()
        await (release if i == 0 else done).wait()
        await lock.unlock()

    # Two waiters parked; the first holds, and samples the server's clock with its try.
    tasks = [asyncio.create_task(waiter(0))]
    await queued(redis, holder, 1)
    await eventually(lambda: parked_on(client, lock) == 1, what="the first waiter parked")
    tasks.append(asyncio.create_task(waiter(1)))
    await queued(redis, holder, 2)
    await eventually(lambda: parked_on(client, lock) == 2, what="the second parked")
    await holder.unlock()
    await granted[0].wait()

    async def take_a_place() -> None:
        tasks.append(asyncio.create_task(waiter(2)))
        await queued(redis, holder, 2)
        await eventually(lambda: parked_on(client, lock) == 2, what="the third parked")

    async def hand_over() -> None:
        release.set()
        await granted[1].wait()

    def without_probes(ran: dict[str, int]) -> dict[str, int]:
        return {name: n for name, n in ran.items() if name not in ("llen", "ping")}

    try_ran = without_probes(await counted(redis, take_a_place))
    assert try_ran == {"evalsha": 1, "pttl": 1, "hmget": 1, "rpush": 1}
    release_ran = without_probes(await counted(redis, hand_over))
    assert release_ran.pop("pexpire") in (1, 2)  # the hold's lease; and the queue's, 1 in 4
    assert release_ran == {
        "evalsha": 1,
        "hdel": 1,
        "lpop": 1,
        "incr": 1,
        "hset": 1,
        "publish": 1,
    }
    done.set()
    await asyncio.gather(*tasks)
    await assert_clean(redis, client)


async def server_ms(redis: Redis) -> int:
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_release_stamps_its_grant_with_a_lower_bound_of_the_servers_clock(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """The owner's last release stamps the grant it makes with its client's lower bound of the
    server's time (no TIME): never later than the server's clock when it granted, and close to
    it.  The waiter counts its lease from that moment, so it must not be later."""
    holder = aiolock_client.fair_lock("stamped", owner="holder")
    await holder.lock()
    client = make_client()
    lock = client.fair_lock("stamped")
    granted = [asyncio.Event(), asyncio.Event()]
    release = asyncio.Event()

    async def waiter(i: int) -> None:
        async with lock.acquire(wait=30):
            granted[i].set()
            if i == 0:
                await release.wait()

    tasks = [asyncio.create_task(waiter(0))]
    await queued(redis, holder, 1)
    tasks.append(asyncio.create_task(waiter(1)))
    await queued(redis, holder, 2)
    await eventually(lambda: parked_on(client, lock) == 2, what="both parked")
    await holder.unlock()
    await granted[0].wait()  # the first holds; its try sampled the server's clock
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(fair_keys(lock).channel)
        before = await server_ms(redis)
        release.set()
        await granted[1].wait()
        after = await server_ms(redis)
        grants = []
        while (message := await pubsub.get_message(timeout=1.0)) is not None:
            if message["type"] == "message" and str(message["data"]).startswith("="):
                grants.append(int(str(message["data"]).split()[2]))
    assert len(grants) == 1
    assert before - 100 <= grants[0] <= after
    await asyncio.gather(*tasks)
    await assert_clean(redis, client)


async def test_a_resent_try_keeps_one_place(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A first try pushes its member without looking for one; its resend (the same call again,
    with the resend mark) looks, and replaces it in place, whichever copy lands first: the
    owner never has two places.  A first copy that lands after the resend was voided by it."""
    holder = aiolock_client.fair_lock("resent-try", owner="holder")
    await holder.lock()
    client = make_client()
    for order in ("first copy first", "resend first"):
        lock = client.fair_lock("resent-try", owner=order.replace(" ", "-"))
        owner = lock.current_owner()[0]
        services = lock.services
        script, keys, args = lock.attempt_call(owner, services.owners.next_request(), 30_000)
        copy = (*args, "fresh", "first") if "first" not in args else args
        resend = (*copy, services.resend_window_ms)  # as Calls.run marks a resend
        calls = [copy, resend] if order == "first copy first" else [resend, copy]
        for call in calls:
            assert not isinstance(await services.calls.run(script, keys, call), list)
        assert await queue(redis, holder) == [owner]
        withdraw = lock.withdraw_call(owner)
        assert withdraw is not None
        assert await services.calls.run(*withdraw) == 1
        assert await queue(redis, holder) == []
    await holder.unlock()
    await assert_clean(redis, client)


async def test_waiters_find_their_places_by_value_not_by_a_search(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A call's first try pushes its member; its client keeps it, so its later tries (the
    one the subscription's confirmation wakes, say) and its withdraw name it (LPOS, LREM from
    the head) instead of reading the whole queue into the script: many waiters giving up at
    once cost O(n) each in C, not in Lua."""
    holder = aiolock_client.fair_lock("by-value", owner="holder")
    await holder.lock()
    clients = [make_client(), make_client()]
    before = await command_calls(redis)
    quitters = [
        asyncio.create_task(client.fair_lock("by-value").try_lock(wait=0.5))
        for client in clients
        for _ in range(5)
    ]
    assert not any(await asyncio.gather(*quitters))
    await eventually(lambda: no_queue_keys(redis, holder), what="every waiter withdrawn")
    calls = await command_calls(redis)
    ran = {name: calls.get(name, 0) - before.get(name, 0) for name in ("lrange", "lrem", "rpush")}
    assert ran == {"lrange": 0, "lrem": 10, "rpush": 10}
    await holder.unlock()
    for client in clients:
        await assert_clean(redis, client)


async def test_fifo_across_clients(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client(), make_client(), make_client()]
    holder = aiolock_client.fair_lock("fifo", owner="holder")
    await holder.lock()
    # Interleaved unevenly across the clients, so no client's waiters are contiguous.
    picks = [0, 1, 2, 3, 3, 1, 0, 2, 2, 0, 1, 3, 1, 1, 0, 3, 2, 0, 3, 2]
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with clients[picks[i]].fair_lock("fifo").acquire(wait=30):
            served.append(i)

    tasks: list[asyncio.Task[None]] = []
    for i in range(len(picks)):
        tasks.append(asyncio.create_task(waiter(i)))
        await queued(redis, holder, i + 1)  # its predecessor is in line before it starts
    await holder.unlock()
    await asyncio.gather(*tasks)
    assert served == list(range(len(picks)))
    for client in clients:
        await assert_clean(redis, client)
    assert await no_queue_keys(redis, holder)


async def test_one_wake_up_message_per_hand_off(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, *(make_client() for _ in range(5))]
    holder = aiolock_client.fair_lock("herd", owner="holder")
    await holder.lock()
    per_client = 2
    served: list[int] = []

    async def waiter(i: int) -> None:
        async with clients[i % len(clients)].fair_lock("herd").acquire(wait=30):
            served.append(i)

    waiters = len(clients) * per_client
    tasks = [asyncio.create_task(waiter(i)) for i in range(waiters)]
    await queued(redis, holder, waiters)
    # Every client subscribed, its subscription confirmed, and its waiters parked again after
    # the confirmation's wake-up: no message can be lost, and no try is in flight.
    locks = [client.fair_lock("herd") for client in clients]
    await eventually(
        lambda: all(
            parked_on(client, lock) == per_client
            for client, lock in zip(clients, locks, strict=True)
        ),
        what="every waiter parked on a confirmed subscription",
    )
    for lock in locks:
        numsub = dict(await redis.pubsub_numsub(fair_keys(lock).channel))
        assert numsub[fair_keys(lock).channel] == 1

    published, delivered = await publish_calls(redis), messages(clients)
    await holder.unlock()
    await asyncio.gather(*tasks)
    # One hand-off per waiter: the holder's release and that of every waiter but the last,
    # whose release finds the queue empty.  Each is one message to one client, not one per
    # client (6 * waiters).
    assert sorted(served) == list(range(waiters))
    assert await publish_calls(redis) - published == waiters
    assert messages(clients) - delivered == waiters
    for client in clients:
        await assert_clean(redis, client)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_a_waiter_that_gives_up_leaves_the_queue_at_once(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    how: str,
) -> None:
    holder = aiolock_client.fair_lock("leaving", owner="holder")
    await holder.lock()
    quitter_client, next_client = make_client(), make_client()
    quitter_lock = quitter_client.fair_lock("leaving")
    loop = asyncio.get_running_loop()

    if how == "timeout":
        quitter = asyncio.create_task(quitter_lock.try_lock(wait=0.2))
    else:
        quitter = asyncio.create_task(quitter_lock.try_lock(wait=30))
    await queued(redis, holder, 1)
    [quitter_owner] = await queue(redis, holder)

    async def next_in_line() -> float:
        lock = next_client.fair_lock("leaving")
        assert await lock.try_lock(wait=30)
        granted = loop.time()
        await lock.unlock()
        return granted

    follower = asyncio.create_task(next_in_line())

    async def behind() -> bool:
        return len(await queue(redis, holder)) == 2 or quitter.done()

    await eventually(behind, what="the next waiter queued behind")
    if how == "timeout":
        assert await quitter is False
    else:
        await eventually(lambda: parked_on(quitter_client, quitter_lock) == 1, what="parked")
        quitter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await quitter

    async def left() -> bool:
        return quitter_owner not in await queue(redis, holder)

    # Far sooner than fair_wait_timeout (5 s), after which a silent waiter would be dropped.
    await eventually(left, timeout=1.0, what="the waiter that gave up left the queue")
    assert len(await queue(redis, holder)) == 1  # the follower keeps its place
    released = loop.time()
    await holder.unlock()
    granted = await follower
    # Woken by the hand-off message (its next try is 1.7 s away, the quitter's deadline 5 s).
    assert granted - released < 1.0
    for client in (aiolock_client, quitter_client, next_client):
        await assert_clean(redis, client)
    assert await no_queue_keys(redis, holder)


async def test_a_vanished_waiter_delays_the_next_by_at_most_the_wait_timeout(
    aiolock_server: ServerInfo,
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
) -> None:
    fair_wait_timeout = 0.5
    holder = make_client(fair_wait_timeout=fair_wait_timeout).fair_lock("gone", owner="holder")
    await holder.lock()
    loop = asyncio.get_running_loop()
    code = textwrap.dedent(
        f"""
        import asyncio, sys
        import aiolock

        async def main():
            client = aiolock.Client.from_url(
                sys.argv[1], key_prefix=sys.argv[2], fair_wait_timeout={fair_wait_timeout}
            )
            await client.fair_lock("gone").lock()

        asyncio.run(main())
        """
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        aiolock_server.url,
        aiolock_client.key_prefix,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:

        async def subprocess_queued() -> bool:
            assert process.returncode is None, "the waiter process exited early"
            return int(await redis.llen(fair_keys(holder).queue)) == 1

        await eventually(subprocess_queued, timeout=30, what="the other process queued")
        [dead_owner] = await queue(redis, holder)
        waiter_lock = make_client(fair_wait_timeout=fair_wait_timeout).fair_lock("gone")

        async def waiter() -> float:
            assert await waiter_lock.try_lock(wait=30)
            granted = loop.time()
            await waiter_lock.unlock()
            return granted

        task = asyncio.create_task(waiter())
        await queued(redis, holder, 2)
        assert (await queue(redis, holder))[0] == dead_owner  # the waiter is behind it
        process.send_signal(signal.SIGKILL)
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    released = loop.time()
    await holder.unlock()
    granted = await asyncio.wait_for(task, 10)
    assert granted - released < fair_wait_timeout + 1.5
    assert dead_owner not in await queue(redis, holder)
    assert await no_queue_keys(redis, holder)


async def test_a_live_waiter_is_never_dropped(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    fair_wait_timeout = 0.3
    first_client = make_client(fair_wait_timeout=fair_wait_timeout)
    second_client = make_client(fair_wait_timeout=fair_wait_timeout)
    holder = aiolock_client.fair_lock("patient", owner="holder")
    await holder.lock()
    served: list[str] = []

    async def waiter(client: aiolock.Client, tag: str) -> None:
        async with client.fair_lock("patient").acquire(wait=30):
            served.append(tag)

    first = asyncio.create_task(waiter(first_client, "first"))
    await queued(redis, holder, 1)
    second = asyncio.create_task(waiter(second_client, "second"))
    await queued(redis, holder, 2)
    for client in (first_client, second_client):
        lock = client.fair_lock("patient")
        await eventually(lambda: parked_on(client, lock) == 1, what="parked")  # noqa: B023
    line = await queue(redis, holder)
    pushed = (await command_calls(redis)).get("rpush", 0)
    loop = asyncio.get_running_loop()
    end = loop.time() + 2.0  # the holding time: over six wait timeouts
    while loop.time() < end:
        # Both keep their places: a waiter dropped and queued again would be pushed again,
        # behind the other.
        assert await queue(redis, holder) == line
        await asyncio.sleep(0.02)
    assert (await command_calls(redis)).get("rpush", 0) == pushed
    await holder.unlock()
    await asyncio.gather(first, second)
    assert served == ["first", "second"]
    for client in (aiolock_client, first_client, second_client):
        await assert_clean(redis, client)


async def test_no_keys_left_behind(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    clients = [aiolock_client, make_client(), make_client()]
    holder = aiolock_client.fair_lock("tidy", owner="holder")
    keys = fair_keys(holder)
    await holder.lock()

    async def worker(i: int) -> None:
        lock = clients[i % 3].fair_lock("tidy")
        async with lock.acquire(wait=30):
            async with lock.acquire(wait=0):  # reentry
                await asyncio.sleep(0)

    workers = [asyncio.create_task(worker(i)) for i in range(6)]
    timing_out = asyncio.create_task(clients[1].fair_lock("tidy").try_lock(wait=1.0))
    cancelled = asyncio.create_task(clients[2].fair_lock("tidy").try_lock(wait=30))
    await queued(redis, holder, 8)
    assert not await clients[0].fair_lock("tidy").try_lock(wait=0)
    assert await timing_out is False
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await holder.unlock()
    await asyncio.gather(*workers)
    for client in clients:
        await assert_clean(redis, client)
    assert not await redis.exists(keys.queue)
    left = sorted([str(key) async for key in redis.scan_iter(match=f"{keys.lock}*")])
    assert left == []  # no fault, no marker: not even the meta hash


async def test_many_waiters_on_many_locks_use_one_channel_per_lock(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    names = [f"many-{i}" for i in range(20)]
    holders = [aiolock_client.fair_lock(name, owner="holder") for name in names]
    for holder in holders:
        await holder.lock()
    served: Counter[str] = Counter()

    async def waiter(i: int) -> None:
        name = names[i % len(names)]
        async with aiolock_client.fair_lock(name).acquire(wait=60):
            served[name] += 1

    tasks = [asyncio.create_task(waiter(i)) for i in range(500)]

    async def all_queued() -> bool:
        sizes = [int(await redis.llen(fair_keys(holder).queue)) for holder in holders]
        return sum(sizes) == 500

    await eventually(all_queued, timeout=30, what="500 waiters queued")
    await eventually(lambda: aiolock_client.statistics().waiters == 500, what="all joined")
    expected = sorted(fair_keys(holder).channel for holder in holders)

    async def subscribed() -> bool:
        return await channels(redis, aiolock_client) == expected

    await eventually(subscribed, what="one channel per lock")
    assert aiolock_client.statistics().subscriptions == len(names)
    for holder in holders:
        await holder.unlock()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert served == Counter({name: 25 for name in names})
    await assert_clean(redis, aiolock_client)
    for holder in holders:
        assert await no_queue_keys(redis, holder)


async def test_try_lock_without_waiting_leaves_no_queue_entry(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.fair_lock("no-wait", owner="holder")
    await holder.lock()
    other = make_client()
    lock = other.fair_lock("no-wait")
    assert not await lock.try_lock(wait=0)
    assert other.statistics().subscriptions == 0

    async def gone() -> bool:
        return await no_queue_keys(redis, holder)

    await eventually(gone, timeout=1.0, what="the queue entry removed")
    await holder.unlock()
    assert await lock.try_lock(wait=0)  # nobody left in line ahead of it
    await lock.unlock()
    for client in (aiolock_client, other):
        await assert_clean(redis, client)
    assert await no_queue_keys(redis, holder)


async def test_a_caller_that_will_not_wait_takes_no_place_and_withdraws_nothing(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A refused one-shot try (``try_lock(wait=0)``, a composite's part: its try carries
    ``once``) takes no place in the queue, so a release meanwhile grants nobody, and its call
    sends no withdraw: one script call in all."""
    holder = aiolock_client.fair_lock("once", owner="holder")
    await holder.lock()
    client = make_client()
    lock = client.fair_lock("once", owner="once")
    await lock.try_lock(wait=0)  # the scripts loaded, and the subscriber idle
    before = await command_calls(redis)
    assert not await lock.try_lock(wait=0)
    after = await command_calls(redis)
    assert after["evalsha"] - before["evalsha"] == 1  # the try; no withdraw
    assert await queue(redis, holder) == []
    await holder.unlock()
    assert not await redis.exists(fair_keys(holder).lock)  # nobody to grant it to
    await assert_clean(redis, client)


async def test_a_try_after_a_withdraw_that_never_landed_keeps_one_place(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A withdraw that gave up (the server out of reach for longer than it tries) may leave
    the owner's place behind: the owner's next call does not take its first try for one with
    nothing on the server, so it finds that place and keeps it, and its own withdraw then
    leaves nothing."""
    holder = aiolock_client.fair_lock("left-behind", owner="holder")
    await holder.lock()
    client = make_client()
    lock = client.fair_lock("left-behind", owner="again")
    owner, services = lock.current_owner()[0], lock.services
    script, keys, args = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    assert not isinstance(await services.calls.run(script, keys, args), list)
    assert await queue(redis, holder) == [owner]  # the place a lost withdraw left
    lock._withdraw_lost(owner)  # as the withdraw's giving up records it
    assert not await lock.try_lock(wait=0.3)
    # Its withdraw, in the background, removes the one place (a second would stay).
    await eventually(lambda: no_queue_keys(redis, holder), what="the place withdrawn")
    await holder.unlock()
    await assert_clean(redis, client)


async def test_a_newcomer_does_not_barge_in_ahead_of_the_queue(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """The lock comes free with no hand-off message (as when a holder's lease runs out): the
    head is parked until its next try, 1.7 s away.  A newcomer trying meanwhile must not get it.
    """
    head_client = make_client()
    head_lock = head_client.fair_lock("barge")
    keys = fair_keys(head_lock)
    await redis.hset(keys.lock, "someone-else", 1)
    await redis.pexpire(keys.lock, 30_000)

    async def head() -> bool:
        acquired = await head_lock.try_lock(wait=30)
        await head_lock.unlock()
        return acquired

    head_task = asyncio.create_task(head())
    await queued(redis, head_lock, 1)
    await eventually(lambda: parked_on(head_client, head_lock) == 1, what="the head parked")
    await redis.delete(keys.lock)
    newcomer = make_client().fair_lock("barge")
    assert not await newcomer.try_lock(wait=0)
    assert not await newcomer.try_lock(wait=0.05)
    assert await asyncio.wait_for(head_task, 5)
    assert await newcomer.try_lock(wait=0)  # now the queue is empty
    await newcomer.unlock()
    await assert_clean(redis, head_client)
    assert await no_queue_keys(redis, head_lock)


async def test_a_waiter_that_gave_up_leaves_the_queue_even_if_its_client_closes(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.fair_lock("closing", owner="holder")
    await holder.lock()
    quitter = make_client()
    assert not await quitter.fair_lock("closing").try_lock(wait=0)
    await quitter.aclose()  # "releases finishing in the background get a moment to land"

    async def gone() -> bool:
        return await no_queue_keys(redis, holder)

    await eventually(gone, timeout=1.0, what="the queue entry removed")


async def test_a_waiter_still_waiting_when_its_client_closes_leaves_the_queue(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.fair_lock("closing-wait", owner="holder")
    await holder.lock()
    quitter = make_client()
    lock = quitter.fair_lock("closing-wait")
    waiter = asyncio.create_task(lock.lock())
    await eventually(lambda: lock.statistics().waiters == 1, what="queued and parked")
    await quitter.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await waiter

    async def gone() -> bool:
        return await no_queue_keys(redis, holder)

    await eventually(gone, timeout=1.0, what="the queue entry removed")
    await holder.unlock()


async def script_calls(redis: Redis) -> int:
    """EVALSHA calls the server has run."""
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def alive_key(client: aiolock.Client, lock: aiolock.AsyncFairLock) -> str:
    """The key that keeps ``client``'s fair waiters in line in ``lock``'s slot."""
    return fair_keys(lock).alive + services_of(client).owners.client_id


async def test_parked_waiters_keep_their_places_with_one_call_for_all(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A client's parked waiters do not try again to keep their places, nor when the lease they
    met runs out: one call per half timeout sets the client's alive key, which keeps every one
    of them in line, on every lock of the slot."""
    client = make_client(fair_wait_timeout=0.3)
    # Leases of 0.6 s, renewed by the watchdog: the waiters meet a lease that would run out
    # five times over while they wait.
    holding = make_client(watchdog_timeout=0.6)
    holders = [holding.fair_lock(name, owner="holder") for name in ("kept-1", "kept-2")]
    for holder in holders:
        await holder.lock()
    locks = [client.fair_lock(holder.name) for holder in holders]

    async def waiter(lock: aiolock.AsyncFairLock) -> None:
        async with lock.acquire(wait=30):
            pass

    waiters = [asyncio.create_task(waiter(lock)) for lock in locks for _ in range(30)]
    for holder, lock in zip(holders, locks, strict=True):
        await queued(redis, holder, 30)

        def all_parked(lock: aiolock.AsyncFairLock = lock) -> bool:
            return parked_on(client, lock) == 30

        await eventually(all_parked, what="all 30 parked")
    lines = [await redis.lrange(fair_keys(h).queue, 0, -1) for h in holders]
    before = await command_calls(redis)

    async def kept_a_while() -> bool:  # 3 s at least: every try's deadline and lease passed
        calls = await command_calls(redis)
        return calls.get("set", 0) - before.get("set", 0) >= 20

    await eventually(kept_a_while, timeout=15, what="the alive key set twenty times")
    calls = await command_calls(redis)
    after = {name: count - before.get(name, 0) for name, count in calls.items()}
    assert after.get("hgetall", 0) == after.get("rpush", 0) == 0  # no waiter tried again
    # Every script call was a keep-alive's (one SET of the alive key for all 60 waiters on
    # both locks) or a renewal of the holds (HEXISTS).
    assert after["evalsha"] <= after["set"] + after["hexists"]
    for holder, line in zip(holders, lines, strict=True):
        assert await redis.lrange(fair_keys(holder).queue, 0, -1) == line
        server_ms = int((await redis.time())[0]) * 1000
        assert all(deadline < server_ms for deadline in (await deadlines(redis, holder)).values())
        await holder.unlock()
    assert 0 < await redis.pttl(alive_key(client, locks[0])) <= 300
    await asyncio.wait_for(asyncio.gather(*waiters), 10)
    await assert_clean(redis, client)  # the alive key too
    await assert_clean(redis, holding)
    for holder in holders:
        assert await no_queue_keys(redis, holder)


async def test_a_waiter_whose_place_was_lost_takes_one_again(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    client = make_client(fair_wait_timeout=0.3)
    holder = aiolock_client.fair_lock("lost-place", owner="holder")
    await holder.lock()
    lock = client.fair_lock("lost-place")

    async def waiter() -> None:
        async with lock.acquire(wait=30):
            pass

    task = asyncio.create_task(waiter())
    await queued(redis, holder, 1)
    await eventually(lambda: parked_on(client, lock) == 1, what="the waiter parked")
    alive = alive_key(client, lock)

    async def alive_set() -> bool:
        return bool(await redis.exists(alive))

    await eventually(alive_set, what="the alive key set")
    keys = fair_keys(holder)
    [owner] = await queue(redis, holder)
    # As if dropped while its client stalled past the timeout (its alive key expired).
    await redis.delete(alive)
    await redis.delete(keys.queue)

    async def queued_again() -> bool:  # its client's keep-alive found the key gone
        return await queue(redis, holder) == [owner]

    await eventually(queued_again, what="the waiter queued again")
    assert await queue(redis, holder) == [owner]
    await holder.unlock()
    await asyncio.wait_for(task, 10)
    await assert_clean(redis, client)
    assert await no_queue_keys(redis, holder)


# -- the hand-off by message ------------------------------------------------------------------


def token_of(lock: aiolock.AsyncFairLock, owner: str) -> int:
    hold = lock.hold(owner)
    assert hold is not None
    return hold.token


@pytest.mark.parametrize("lease", [2.0, None], ids=["lease", "watchdog"])
async def test_a_release_grants_the_next_waiter_with_no_call_of_its_own(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    lease: float | None,
) -> None:
    """The release grants the head of the queue and its message carries the grant: the waiter
    holds with no try, a newer fencing token and a lease it counts no later than the server's;
    a nested re-entry then counts a second hold (it does not adopt its own grant)."""
    holder = aiolock_client.fair_lock("handed", owner="holder")
    await holder.lock()
    previous = token_of(holder, holder.current_owner()[0])
    client = make_client()
    lock = client.fair_lock("handed")
    holding, done = asyncio.Event(), asyncio.Event()

    async def waiter() -> int:
        await lock.lock(lease=lease)
        holding.set()
        await done.wait()
        await lock.lock(lease=lease)  # nested: one more hold
        count = await lock.hold_count()
        await lock.unlock()
        await lock.unlock()
        return count

    task = asyncio.create_task(waiter())
    await queued(redis, holder, 1)
    [owner] = await queue(redis, holder)
    await eventually(lambda: parked_on(client, lock) == 1, what="the waiter parked")
    calls = await evalsha_calls(redis)
    await holder.unlock()
    await asyncio.wait_for(holding.wait(), 5)
    assert await evalsha_calls(redis) - calls == 1  # the release, and no try of the waiter's
    assert token_of(lock, owner) > previous
    hold = lock.hold(owner)
    assert hold is not None
    assert hold.count == 1
    loop = asyncio.get_running_loop()
    pttl = await redis.pttl(fair_keys(lock).lock)
    answered = loop.time()  # the PTTL was read before: the lease ends by then + PTTL (or later)
    assert 0 < pttl <= (5000 if lease is None else 2000)
    assert hold.expires_at <= answered + pttl / 1000  # the server's lease ends no sooner
    assert lock.statistics().acquisitions == 1
    if lease is None:
        # Granted for the wait timeout (5 s), not the watchdog's 30 s: renewed early.
        await eventually(
            lambda: lock.statistics().renewals >= 1, timeout=4, what="an early renewal"
        )
        assert hold.expires_at > loop.time() + 10
    done.set()
    assert await asyncio.wait_for(task, 5) == 2
    assert not await redis.exists(fair_keys(lock).lock)
    for each in (aiolock_client, client):
        await assert_clean(redis, each)
    assert await no_queue_keys(redis, holder)


@pytest.mark.parametrize("when", ["message-delivered", "release-returned"])
async def test_a_waiter_cancelled_as_it_is_granted_leaves_the_lock_to_the_next(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """A waiter cancelled as the release grants it: right after its client handed it the
    grant's message (its parked future done, the grant not yet recorded: certain), or in the
    loop step the release returns (the message there already, or not yet: a grant for an
    owner no longer waiting).  Its withdraw takes the grant back and hands the lock on."""
    holder = aiolock_client.fair_lock("cancelled-grant", owner="holder")
    quitter_client, next_client = make_client(), make_client()
    quitter_lock = quitter_client.fair_lock("cancelled-grant")
    next_lock = next_client.fair_lock("cancelled-grant", owner="next")
    loop = asyncio.get_running_loop()
    quitter: asyncio.Task[None] | None = None
    delivered = 0
    if when == "message-delivered":
        deliver = NamedEntry.deliver

        def deliver_then_cancel(entry: NamedEntry, payload: bytes) -> None:
            nonlocal delivered
            deliver(entry, payload)
            if payload.startswith(b"=") and quitter is not None and not quitter.done():
                delivered += 1
                quitter.cancel()  # before the task resumes from its parked future

        monkeypatch.setattr(NamedEntry, "deliver", deliver_then_cancel)
    for _ in range(3):
        await holder.lock()
        quitter = asyncio.create_task(quitter_lock.lock())
        await queued(redis, holder, 1)
        follower = asyncio.create_task(next_lock.try_lock(wait=30))
        await queued(redis, holder, 2)
        await eventually(lambda: parked_on(quitter_client, quitter_lock) == 1, what="parked")
        released = loop.time()
        await holder.unlock()
        if when == "release-returned":
            quitter.cancel()
        with pytest.raises(asyncio.CancelledError):  # else cancelled as its message came
            await asyncio.wait_for(quitter, 5)
        assert await asyncio.wait_for(follower, 5)
        assert loop.time() - released < 1.0  # far sooner than the grant's 5 s lease
        assert quitter_lock.statistics().held == 0
        await next_lock.unlock()
    assert delivered == (3 if when == "message-delivered" else 0)
    for client in (aiolock_client, quitter_client, next_client):
        await assert_clean(redis, client)
    assert await no_queue_keys(redis, holder)


async def test_a_grant_to_a_vanished_waiter_blocks_the_lock_at_most_the_wait_timeout(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """An owner queued by a client that then vanished (a try, and nothing after it) is granted
    the lock by the release for at most ``fair_wait_timeout``, not the lease it asked for."""
    fair_wait_timeout = 1.0
    holder = make_client(fair_wait_timeout=fair_wait_timeout).fair_lock("ghost", owner="holder")
    await holder.lock()
    ghost_client = make_client(fair_wait_timeout=fair_wait_timeout)
    ghost = ghost_client.fair_lock("ghost", owner="ghost")
    ghost_owner = ghost.current_owner()[0]
    services = ghost.services
    try_call = ghost.attempt_call(ghost_owner, services.owners.next_request(), 30_000)
    assert not isinstance(await services.calls.run(*try_call), list)  # queued
    await ghost_client.aclose()  # gone, without withdrawing
    waiter_client = make_client(fair_wait_timeout=fair_wait_timeout)
    waiter_lock = waiter_client.fair_lock("ghost", owner="waiter")
    task = asyncio.create_task(waiter_lock.try_lock(wait=10))
    await queued(redis, holder, 2)
    loop = asyncio.get_running_loop()
    released = loop.time()
    await holder.unlock()
    keys = fair_keys(holder)
    assert await redis.hget(keys.lock, ghost_owner) == "1"  # granted to the ghost
    assert 0 < await redis.pttl(keys.lock) <= fair_wait_timeout * 1000
    assert await asyncio.wait_for(task, 10)
    assert loop.time() - released < fair_wait_timeout + 0.5
    await waiter_lock.unlock()
    await assert_clean(redis, waiter_client)
    assert await no_queue_keys(redis, holder)


async def test_a_try_or_look_in_the_last_millisecond_of_a_lease_is_due_again_right_after(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A queued try, or a keep-alive's look at the lock, that lands in the millisecond the
    lease ends (``PTTL`` answers 0: the key expires only once the server's clock is past it)
    is due again at once, not a whole wait timeout later.  Tries and looks go back to back
    across the lease's end, well under a millisecond apart, so that some land in it."""
    client = make_client(fair_wait_timeout=5.0)
    waiter = client.fair_lock("edge", owner="waiter")
    services = waiter.services
    keys = waiter.keys
    assert isinstance(keys, FairKeys)
    owner = waiter.current_owner()[0]
    keep_keys = (keys.alive, keys.fence, keys.lock, keys.queue, keys.wake_prefix)
    keep_args = (5000, services.owners.client_id, "0", "-", -1)
    loop = asyncio.get_running_loop()
    for _ in range(5):
        await redis.hset(keys.lock, "holder", 1)
        await redis.pexpire(keys.lock, 20)
        deadline = loop.time() + 5
        pauses, dues = [], []
        while True:  # until the waiter's try or its client's look grants it the lock
            assert loop.time() < deadline, "the lock was never granted"
            try_call = waiter.attempt_call(owner, services.owners.next_request(), 30_000)
            reply = await services.calls.run(*try_call)
            if isinstance(reply, list):
                break
            pauses.append(int(reply.split()[0]))  # b"<pause ms> <server time ms>"
            _, (due,), _ = await services.calls.run(_scripts.FAIR_KEEP, keep_keys, keep_args)
            dues.append(int(due))
        assert max(pauses, default=0) <= 20  # the lease left, never the wait timeout
        assert 0 not in dues  # each look while it was held is due again when the lease ends
        await redis.delete(keys.lock)
    await redis.delete(f"{keys.alive}{services.owners.client_id}")
    assert not await redis.exists(keys.queue)


async def test_a_lost_grant_is_adopted_by_the_next_try_as_one_hold(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """A grant whose message nobody heard (the waiter's client not subscribed) is taken by
    the owner's next try: one hold, whose one release frees the lock."""
    holder = aiolock_client.fair_lock("unheard", owner="holder")
    await holder.lock()
    client = make_client()
    lock = client.fair_lock("unheard", owner="late")
    owner = lock.current_owner()[0]
    services = lock.services
    try_call = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    assert not isinstance(await services.calls.run(*try_call), list)  # queued, not subscribed
    await holder.unlock()
    keys = fair_keys(lock)
    assert await redis.hget(keys.lock, owner) == "1"  # granted from the queue, unheard
    assert await redis.hget(keys.lock, f"q:{owner}") is not None
    assert await lock.try_lock(wait=0)
    assert await lock.hold_count() == 1
    assert await redis.hget(keys.lock, f"q:{owner}") is None
    assert await redis.pttl(keys.lock) > 10_000  # the lease asked for (the watchdog's 30 s)
    await lock.unlock()
    assert not await redis.exists(keys.lock)
    for each in (aiolock_client, client):
        await assert_clean(redis, each)
    assert await no_queue_keys(redis, holder)


async def test_a_force_unlock_wakes_the_next_waiter_of_its_own_client_without_a_loss(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A force wakes the head rather than granting it: a grant's message could reach the
    forcing client's own waiter before the force's reply, which takes every hold of the lock
    in that client for lost."""
    holder = aiolock_client.fair_lock("forced", owner="holder")
    lock = aiolock_client.fair_lock("forced")
    for _ in range(3):
        await holder.lock()
        granted, checked = asyncio.Event(), asyncio.Event()

        async def wait_and_hold(
            granted: asyncio.Event = granted, checked: asyncio.Event = checked
        ) -> None:
            assert await lock.try_lock(wait=10)
            granted.set()
            await checked.wait()  # held by this task until the test has looked
            await lock.unlock()

        waiter = asyncio.create_task(wait_and_hold())
        await queued(redis, holder, 1)
        await eventually(lambda: parked_on(aiolock_client, lock) == 1, what="parked")
        assert await holder.force_unlock()
        await asyncio.wait_for(granted.wait(), 5)
        owner = await owner_of(redis, lock)
        hold = lock.hold(owner)
        assert hold is not None
        assert not hold.lost
        checked.set()
        await waiter
        assert not await lock.is_locked()
    await assert_clean(redis, aiolock_client)
    assert await no_queue_keys(redis, holder)


async def owner_of(redis: Redis, lock: aiolock.AsyncFairLock) -> str:
    """The owner holding ``lock`` now, read from its hash."""
    fields = cast(dict[str, str], await redis.hgetall(fair_keys(lock).lock))  # decoded replies
    [owner] = [key for key in fields if not key.startswith((":", "x:", "f:", "r:"))]
    return str(owner)
