"""The plain lock hands over to one waiter per release across all clients, not one per client.

One owner per client with a waiter is in the lock's waiting set (``scripts/lock/_waiting.lua``);
the release grants the lock to the first and tells its client, whose waiter starts with no
further call.  Counted with the server's own command statistics, on both servers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._core.line import LineEntry
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import (
    assert_clean,
    counted,
    eventually,
    keys_of,
    server_calls_of,
    services_of,
    settled,
    stall_server,
)

pytestmark = pytest.mark.anyio


class Waiter:
    """A task of its own client that waits for the lock, holds it until told, and releases."""

    def __init__(self, client: aiolock.Client, name: str, *, wait: float = 60) -> None:
        self.client = client
        self.lock = client.lock(name)
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run(wait))

    async def _run(self, wait: float) -> bool:
        if not await self.lock.try_lock(wait=wait):
            return False
        self.holding.set()
        await self.release.wait()
        await self.lock.unlock()
        return True


def client_id_of(client: aiolock.Client) -> str:
    return services_of(client).owners.client_id


async def waiting_members(redis: Redis, lock: aiolock.AsyncRLock) -> list[str]:
    """The members of the lock's waiting set, first first: '<lease ms> <n> <client> <owner>'."""
    found = await redis.zrange(keys_of(lock).waiting, 0, -1)
    return [member.decode() if isinstance(member, bytes) else str(member) for member in found]


async def waiting_clients(redis: Redis, lock: aiolock.AsyncRLock) -> list[str]:
    """The clients of the members of the lock's waiting set, first first."""
    return [member.split(" ")[2] for member in await waiting_members(redis, lock)]


async def grant_unheard(redis: Redis, lock: aiolock.AsyncRLock) -> str:
    """Free the lock and grant it to the first member of its waiting set, as a release would,
    but publish nothing: a grant whose message its client never reads.  Returns the member."""
    keys = keys_of(lock)
    member = (await waiting_members(redis, lock))[0]
    ms, n, _, owner = member.split(" ", 3)
    await redis.zrem(keys.waiting, member)
    await redis.delete(keys.lock)
    # The hold as lock/_waiting.lua's hand_over writes it (token 1: nobody checks it here).
    fields = (
        owner,
        "1",
        f"f:{owner}",
        "1",
        f"r:{owner}",
        f"{owner}/{n}",
        f"q:{owner}",
        n,
        ":w",
        "1",
    )
    for field, value in zip(fields[::2], fields[1::2], strict=True):
        await redis.hset(keys.lock, field, value)
    await redis.pexpire(keys.lock, int(ms))
    return member


async def parked_in_order(redis: Redis, holder: aiolock.AsyncRLock, waiters: list[Waiter]) -> None:
    """The last of ``waiters`` started is parked with its subscription confirmed, and its
    client is in the set behind the others (call it after starting each)."""

    async def entered() -> bool:
        return len(await waiting_clients(redis, holder)) == len(waiters)

    await eventually(entered, what=f"{len(waiters)} clients in the waiting set")
    last = waiters[-1]
    await eventually(lambda: settled(last.client, last.lock), what="the waiter parked")


async def test_a_release_makes_exactly_one_client_try(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    lock = aiolock_client.lock("herd")
    await lock.lock()
    waiters = []
    for _ in range(4):
        waiters.append(Waiter(make_client(), "herd"))
        await parked_in_order(redis, lock, waiters)
    clients = [client_id_of(w.client) for w in waiters]
    assert await waiting_clients(redis, lock) == clients

    async def hand_off() -> None:
        await lock.unlock()
        await waiters[0].holding.wait()

    # The first holder, never refused, releases by a bare HDEL, which removes the waiters' mark:
    # its client hands over by one script.  No waiter tries, whatever the number that wait.
    commands = await counted(redis, hand_off)
    assert commands["evalsha"] == 1, commands
    assert commands["hdel"] == 1, commands
    assert await waiting_clients(redis, lock) == clients[1:]
    assert all(not w.holding.is_set() for w in waiters[1:])
    for before, after in itertools.pairwise(waiters):

        async def next_hand_off(before: Waiter = before, after: Waiter = after) -> None:
            before.release.set()
            await after.holding.wait()

        # The release script grants the lock to the next (INCR, HSET, PEXPIRE, PUBLISH): one
        # script in all, and no try (which would refuse, enter or grant: EXISTS first).
        commands = await counted(redis, next_hand_off)
        assert commands["evalsha"] == 1, commands
        assert commands["publish"] == 1, commands
        assert "exists" not in commands, commands
    waiters[-1].release.set()
    assert all(await asyncio.gather(*(w.task for w in waiters)))
    await assert_clean(redis, aiolock_client)
    for waiter in waiters:
        await assert_clean(redis, waiter.client)


async def test_waiters_of_several_clients_are_served_in_the_order_they_began_to_wait(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Two calls in one client, one in another that began to wait between them: the client
    # whose holder releases while a call of its own waits enters that call at the time it
    # began to wait, behind the other client's, and its own call is served after.
    lock = aiolock_client.lock("rotate")
    await lock.lock()
    first_client, other_client = make_client(), make_client()
    first = Waiter(first_client, "rotate")
    await parked_in_order(redis, lock, [first])
    other = Waiter(other_client, "rotate")
    await parked_in_order(redis, lock, [first, other])
    second = Waiter(first_client, "rotate")
    await eventually(lambda: settled(first_client, first.lock, 2), what="both calls parked")
    await lock.unlock()
    await first.holding.wait()
    first.release.set()  # its client still waits (second), which began after other
    await other.holding.wait()
    assert not second.holding.is_set()
    assert await waiting_clients(redis, lock) == [client_id_of(first_client)]
    other.release.set()
    await second.holding.wait()
    second.release.set()
    assert all(await asyncio.gather(first.task, second.task, other.task))
    for client in (aiolock_client, first_client, other_client):
        await assert_clean(redis, client)


async def test_a_grant_whose_waiter_left_is_given_back_to_the_next(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.lock("hand-on")
    await holder.lock()
    gone, staying = Waiter(make_client(), "hand-on"), Waiter(make_client(), "hand-on")
    await parked_in_order(redis, holder, [gone, staying])
    # As a release would: the lock is granted to the first waiter; its message never reaches
    # it, and it is cancelled instead.
    await grant_unheard(redis, holder)
    gone.task.cancel()
    # Its client gives the grant back, which hands the lock over: the other waiter holds it
    # now, not when the lease it parked under (the watchdog's, 30 s) ends.
    await asyncio.wait_for(staying.holding.wait(), 10)
    staying.release.set()
    assert await staying.task
    with pytest.raises(asyncio.CancelledError):
        await gone.task
    for waiter in (gone, staying):
        await assert_clean(redis, waiter.client)


async def test_a_grant_whose_message_was_lost_is_taken_by_a_try(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # A waiter whose grant message never came tries when the lease it parked under ends, and
    # its try takes the grant on the server (the lock was its own all along).
    holder = aiolock_client.lock("lost-grant")
    await holder.lock(lease=1.0)
    waiter = Waiter(make_client(), "lost-grant", wait=10)
    await parked_in_order(redis, holder, [waiter])
    await grant_unheard(redis, holder)
    await asyncio.wait_for(waiter.holding.wait(), 5)
    assert waiter.lock.statistics().acquisitions == 1
    waiter.release.set()
    assert await waiter.task
    await assert_clean(redis, waiter.client)


async def test_a_waiter_that_gives_up_takes_its_client_out_of_the_set(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    lock = aiolock_client.lock("give-up")
    await lock.lock()
    leaving, staying = Waiter(make_client(), "give-up"), Waiter(make_client(), "give-up")
    await parked_in_order(redis, lock, [leaving, staying])
    leaving.task.cancel()
    await eventually(lambda: leaving.client.statistics().pending == 0, what="the hand-on sent")

    async def left() -> bool:
        return await waiting_clients(redis, lock) == [client_id_of(staying.client)]

    await eventually(left, what="only the staying client in the set")
    await lock.unlock()
    await staying.holding.wait()
    staying.release.set()
    assert await staying.task
    for client in (aiolock_client, leaving.client, staying.client):
        await assert_clean(redis, client)


async def test_a_first_try_cancelled_in_flight_leaves_no_name_behind(
    aiolock_server: ServerInfo,
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
) -> None:
    # The try's refusal enters its client in the set on the server after its caller left:
    # the client takes itself out once that try is settled.
    lock = aiolock_client.lock("first-try")
    await lock.lock()
    leaving = make_client()
    warm_up = leaving.lock("warm-up")
    assert await warm_up.try_lock()  # scripts loaded, a connection open
    await warm_up.unlock()
    started = asyncio.Event()
    stall = asyncio.create_task(stall_server(aiolock_server.url, 0.3, started))
    await started.wait()
    waiter = asyncio.create_task(leaving.lock("first-try").try_lock(wait=10))
    await eventually(lambda: not server_calls_of(leaving).idle, what="the first try in flight")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await stall

    async def left() -> bool:
        return await waiting_clients(redis, lock) == []

    await eventually(left, what="the client out of the waiting set")
    await eventually(lambda: leaving.statistics().pending == 0, what="settled")
    await lock.unlock()
    await assert_clean(redis, aiolock_client)
    await assert_clean(redis, leaving)


async def test_a_grant_to_a_client_that_died_strands_nobody_past_the_lease(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.lock("dead-first")
    await holder.lock(lease=1.0)
    staying = Waiter(make_client(), "dead-first", wait=10)
    await parked_in_order(redis, holder, [staying])
    # A client killed while in the set, ahead of the live one: the release grants it the lock
    # for its lease (a grant's at most 5 s; 1 s here), and nobody takes it.
    await redis.zadd(keys_of(holder).waiting, {"1000 7 a-client-that-died job": 0})
    await holder.unlock()

    async def granted_to_the_dead() -> bool:
        return await redis.hget(keys_of(holder).lock, "q:job") in ("7", b"7")

    # A release by a bare HDEL sends the hand-over after it (lock/wake.lua; its first call on
    # a server loads the script, so it may land after unlock() returned).
    await eventually(granted_to_the_dead, what="the lock granted to the dead client")
    assert await waiting_clients(redis, holder) == [client_id_of(staying.client)]
    # The live waiter parked under the holder's lease (1 s): it tries when that ends, and
    # again when the dead one's grant ends.
    await asyncio.wait_for(staying.holding.wait(), 5)
    staying.release.set()
    assert await staying.task
    await assert_clean(redis, staying.client)


async def test_a_newcomer_still_barges_into_a_free_lock_in_one_call(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    holder = aiolock_client.lock("barge")
    await holder.lock(lease=1.0)
    waiter = Waiter(make_client(), "barge")
    await parked_in_order(redis, holder, [waiter])
    newcomer = make_client().lock("barge")
    assert not await newcomer.try_lock()  # no wait: its refusal enters nobody in the set
    assert await waiting_clients(redis, holder) == [client_id_of(waiter.client)]
    # The lease runs out, which publishes nothing: the lock is free with a waiter in the set,
    # and a newcomer takes it in one call.
    await redis.delete(keys_of(holder).lock)
    commands = await counted(redis, newcomer.try_lock)
    assert commands["evalsha"] == 1, commands
    assert await newcomer.is_held()
    await newcomer.unlock()
    # Its release was a bare HDEL (it was never refused), and nobody was marked waiting on
    # its hold: the waiter tries when the lease it parked under (1 s) ends.
    await asyncio.wait_for(waiter.holding.wait(), 5)
    waiter.release.set()
    assert await waiter.task
    await assert_clean(redis, waiter.client)


async def test_waiters_behind_a_renewed_hold_of_their_own_client_make_no_call(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # The client hears of its own hold's end (its release hands the lock over, its loss wakes
    # one): its waiters park with no deadline while the watchdog renews the hold, however many
    # leases pass, and the release hands over by message even after the waiting set expired.
    client = make_client(watchdog_timeout=0.6)
    holder = client.lock("quiet")
    await holder.lock()
    waiters = [Waiter(client, "quiet") for _ in range(3)]
    await eventually(lambda: settled(client, holder, 3), what="three waiters parked")
    renewed = holder.statistics().renewals

    async def leases_pass() -> None:
        # The set lives 2.6 s past its last entry here (a watchdog lease and 2 s).
        async def passed() -> bool:
            gone = await redis.pttl(keys_of(holder).waiting) == -2
            return gone and holder.statistics().renewals >= renewed + 6

        await eventually(passed, timeout=15, what="the set expired and the hold renewed")

    commands = await counted(redis, leases_pass)
    # The renewals' script alone (HEXISTS, PTTL, PEXPIRE, one hold a call): no try, which
    # runs EXISTS first.
    assert "exists" not in commands, commands
    assert commands["evalsha"] == commands["hexists"], commands

    async def hand_off() -> None:
        await holder.unlock()
        await waiters[0].holding.wait()

    # Its release enters the first waiter's place again and grants it: no try.
    commands = await counted(redis, hand_off)
    assert "exists" not in commands, commands
    for before, after in itertools.pairwise(waiters):
        before.release.set()
        await after.holding.wait()
    waiters[-1].release.set()
    assert all(await asyncio.gather(*(w.task for w in waiters)))
    await assert_clean(redis, client)


async def test_waiters_behind_their_own_client_are_not_stranded_by_a_grant_to_a_dead_one(
    make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    # Parked with no deadline behind a hold of their client, whose release grants the lock to
    # a client killed while in the set: they try within a grant's lease (5 s at most).
    client = make_client()
    holder = client.lock("dead-next")
    await holder.lock()
    waiter = Waiter(client, "dead-next", wait=20)
    await parked_in_order(redis, holder, [waiter])
    await redis.zadd(keys_of(holder).waiting, {"300 7 a-client-that-died job": 0})
    await holder.unlock()

    async def granted_to_the_dead() -> bool:
        return await redis.hget(keys_of(holder).lock, "q:job") in ("7", b"7")

    # A release by a bare HDEL sends the hand-over after it (lock/wake.lua; its first call on
    # a server loads the script, so it may land after unlock() returned).
    await eventually(granted_to_the_dead, what="the lock granted to the dead client")
    await asyncio.wait_for(waiter.holding.wait(), 10)
    waiter.release.set()
    assert await waiter.task
    await assert_clean(redis, client)


async def test_a_release_hands_a_waiter_of_its_own_client_the_grant_from_its_reply(
    make_client: Callable[..., aiolock.Client], redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The release's reply names the member it granted the lock to: a waiter of the releasing
    # client takes it from there, with no try, even when the message itself is never read
    # (dropped here; parked behind its own client's hold, the waiter would otherwise try only
    # once a grant's lease passed).
    deliver = LineEntry.deliver

    def drop_grants(entry: LineEntry, payload: bytes) -> None:
        if payload[:1] != b"=":
            deliver(entry, payload)

    monkeypatch.setattr(LineEntry, "deliver", drop_grants)
    client = make_client()
    holder = client.lock("from-reply")
    await holder.lock()
    waiter = Waiter(client, "from-reply", wait=60)
    await eventually(lambda: settled(client, holder), what="the waiter parked")

    async def hand_off() -> None:
        await holder.unlock()
        await waiter.holding.wait()

    commands = await counted(redis, hand_off)
    assert "exists" not in commands, commands  # every try runs EXISTS first
    assert commands["publish"] == 1, commands  # the grant's message, published all the same
    waiter.release.set()
    assert await waiter.task
    await assert_clean(redis, client)


async def test_a_waiter_leaving_as_a_release_of_its_client_enters_it_again_strands_nobody(
    make_client: Callable[..., aiolock.Client], redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Now and then a release enters the waiters of its own client in the set again (a call
    # parked behind its client's hold tries no more, and the set may have expired).  A waiter
    # that leaves while such a release is on its way withdraws after it lands: sent first, the
    # withdraw would find nothing to take back, and the release would then grant the lock to a
    # member nobody waits as, blocking it for the grant's lease (5 s).
    client = make_client()
    holder = client.lock("late-entry", owner="holder")  # released from a task of its own
    await holder.lock()
    waiter = Waiter(client, "late-entry", wait=60)
    await eventually(lambda: settled(client, holder), what="the waiter parked")
    calls = services_of(client).calls
    run = calls.run
    on_its_way, land = asyncio.Event(), asyncio.Event()

    async def slow_release(script: Any, keys: Any, args: Any, **options: Any) -> Any:
        if script.name == "lock/release":
            on_its_way.set()
            await land.wait()
        return await run(script, keys, args, **options)

    monkeypatch.setattr(calls, "run", slow_release)
    releasing = asyncio.create_task(holder.unlock())
    await on_its_way.wait()
    [entered] = await waiting_members(redis, holder)
    waiter.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter.task
    land.set()
    await releasing
    await eventually(lambda: client.statistics().pending == 0, what="the withdraw sent")
    assert await redis.exists(keys_of(holder).lock) == 0, "a grant nobody takes holds the lock"
    assert entered not in await waiting_members(redis, holder)
    newcomer = client.lock("late-entry")
    assert await newcomer.try_lock(wait=0)
    await newcomer.unlock()
    await assert_clean(redis, client)
