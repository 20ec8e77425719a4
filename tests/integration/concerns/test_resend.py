"""Resend safety: redis-py retries a call whose reply timed out; hold counts stay exact.

The scripts carry a request id, so a resent acquire or release is applied once.  The first tests
replay requests directly; the last makes redis-py itself resend, by stalling the server
(DEBUG SLEEP on another connection) past a short ``socket_timeout``: the first send runs once the
server wakes up, and so does the resend.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

import aiolock
from aiolock import _scripts
from aiolock._core.settlement import ReleaseCopies
from aiolock.fair.queue import FairKeys
from aiolock.lock import wake_prefix
from aiolock.semaphore import permits_of
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import (
    evalsha_calls,
    eventually,
    held_by_another_task,
    keys_of,
    services_of,
    stall_server,
)

pytestmark = pytest.mark.anyio


async def _resending_client(
    server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> tuple[Redis, aiolock.Client]:
    """A client on a redis-py connection that resends a call whose reply takes over 50 ms
    (the tests stall the server with DEBUG SLEEP; skipped where DEBUG is not allowed)."""
    try:
        await redis.execute_command("DEBUG", "SLEEP", 0)  # type: ignore[no-untyped-call]
    except ResponseError:
        pytest.skip("this server does not allow DEBUG (enable-debug-command)")
    # redis-py's Retry is what resends.  Given explicitly: the constructor's default differs
    # between versions (none before redis-py 6), and before 6 it applies only with the errors
    # named in retry_on_error.
    address = urlsplit(server.url)
    flaky = Redis(
        host=address.hostname or "127.0.0.1",
        port=address.port or 6379,
        socket_timeout=0.05,
        retry=Retry(NoBackoff(), 10),
        retry_on_error=[RedisTimeoutError],
    )
    return flaky, aiolock.Client(flaky, key_prefix=aiolock_client.key_prefix)


async def test_replayed_requests_apply_once(aiolock_client: aiolock.Client, redis: Redis) -> None:
    keys = keys_of(aiolock_client.lock("replayed"))
    calls = services_of(aiolock_client).calls
    owner = f"{aiolock_client.id}:x:replay"
    acquire = (keys.lock, keys.meta, keys.fence)
    release = (keys.lock, keys.meta, keys.channel, keys.waiting)

    first = await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 1))
    again = await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 1))
    assert first[:2] == again[:2]  # same token, count 1
    assert await redis.hget(keys.lock, owner) == "1"
    reentered = await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 2))
    assert reentered[1] == 2
    assert (await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 2)))[1] == 2

    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 3, "")) == 1
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 3, "")) == 1  # not 0
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 4, "")) == 0
    # A resend of the release that deleted the lock finds nothing: no marker outlives the lock
    # (its client knows it resent, and takes that for released: the last step of
    # test_redis_py_resends_do_not_double_count).
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 4, "")) is None
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 5, "")) is None  # not held
    assert not await redis.exists(keys.lock)
    assert not await redis.exists(keys.meta)  # and no marker was written


async def test_undo_releases_exactly_the_named_grant(aiolock_client: aiolock.Client) -> None:
    keys = keys_of(aiolock_client.lock("undo"))
    calls = services_of(aiolock_client).calls
    owner = f"{aiolock_client.id}:x:undo"
    acquire = (keys.lock, keys.meta, keys.fence)
    release = (keys.lock, keys.meta, keys.channel, keys.waiting)
    await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 1))
    # Undoing a request that was never applied leaves the hold alone.
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 2, "", 99)) == 1
    await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 3))
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 4, "", 3)) == 1
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 4, "", 3)) == 1  # resent undo
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 5, "")) == 0


async def test_a_resent_release_enters_no_waiting_member_again(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    # A plain-lock release that carries a waiting member enters it and, the last, grants it
    # the lock.  Its resend must not enter the member again: granted once already, it would be
    # granted twice (a second grant its client no longer waits for).
    lock = aiolock_client.lock("resent-entry")
    keys = keys_of(lock)
    calls = services_of(aiolock_client).calls
    owner = f"{aiolock_client.id}:x:holder"
    acquire = (keys.lock, keys.meta, keys.fence)
    release = (keys.lock, keys.meta, wake_prefix(keys.lock), keys.waiting, keys.fence)
    entry = f"1 32000 5000 9 {aiolock_client.id} waiter"
    await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 1))
    # The last release answers the grant's message instead of 0.
    granted = await calls.run(_scripts.LOCK_RELEASE, release, (owner, 2, entry))
    assert granted == f"=2 5000 9 {aiolock_client.id} waiter".encode()
    assert await redis.hget(keys.lock, "q:waiter") == "9"
    assert await redis.zcard(keys.waiting) == 0
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 2, entry)) is None
    assert await redis.zcard(keys.waiting) == 0
    # An inner release of a hold enters it, as before.
    await redis.delete(keys.lock)
    await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 3))
    await calls.run(_scripts.LOCK_ACQUIRE, acquire, (30000, owner, 4))
    assert await calls.run(_scripts.LOCK_RELEASE, release, (owner, 5, entry)) == 1
    assert await redis.zcard(keys.waiting) == 1
    await redis.delete(keys.lock, keys.waiting)


async def test_redis_py_resends_do_not_double_count(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    flaky, client = await _resending_client(aiolock_server, aiolock_client, redis)
    lock = client.lock("resent")
    try:
        await lock.lock()  # warm up: scripts loaded, connection open
        await lock.unlock()
        for step in ("acquire", "reenter", "release", "release-last"):
            before = await evalsha_calls(redis)
            started = asyncio.Event()
            stall = asyncio.create_task(stall_server(aiolock_server.url, 0.3, started))
            await started.wait()
            if step in ("acquire", "reenter"):
                await lock.lock()
            else:
                await lock.unlock()
            await stall
            calls = await evalsha_calls(redis) - before
            assert calls >= 2, f"{step}: redis-py did not resend ({calls} call)"
            expected = {"acquire": 1, "reenter": 2, "release": 1, "release-last": 0}[step]
            assert await lock.hold_count() == expected, step
        assert not await lock.is_locked()
    finally:
        await client.aclose()
        await flaky.aclose()


# Every kind whose acquire a late copy could apply: the reentrant locks and both read-write modes.
LATE_KINDS = ["lock", "fair_lock", "read", "write"]


async def _late_copy_refused(client: aiolock.Client, lock: Any, acquire: Any) -> None:
    """``acquire``'s first copy arrives late: it grants nothing, and the owner's own next call
    is granted as usual."""
    reply = await services_of(client).calls.run(*acquire)
    assert lock.grant_of(reply, 30_000) is None  # refused, not granted
    assert not await lock.is_locked()
    assert await lock.try_lock()
    await lock.unlock()
    assert not await lock.is_locked()


def _lock(client: aiolock.Client, kind: str, name: str) -> Any:
    if kind == "read":
        return client.rw_lock(name).read_lock()
    if kind == "write":
        return client.rw_lock(name).write_lock()
    return getattr(client, kind)(name)


@pytest.mark.parametrize("gone", [False, True], ids=["held", "gone"])
@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_late_copy_of_an_undone_acquire_does_not_apply(
    aiolock_client: aiolock.Client, kind: str, gone: bool
) -> None:
    """A reentrant acquire timed out; its undo ran before the request itself reached the server
    (a slow path).  When that late copy arrives, while the owner still holds the lock or once
    its last release deleted it (and the marks the lock hash kept), it must not add a hold
    nobody knows of."""
    lock = _lock(aiolock_client, kind, "late")
    await lock.lock()
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    late = services.owners.next_request()
    undo = lock.release_call(owner, services.owners.next_request(), late)
    assert await services.calls.run(*undo) == 1  # nothing applied yet: nothing undone
    if gone:
        await lock.unlock()
    reply = await services.calls.run(*lock.attempt_call(owner, late, 30_000))  # the late copy
    assert lock.grant_of(reply, 30_000) is None  # refused, neither re-entered nor granted
    if gone:
        assert not await lock.is_locked()
        assert await lock.try_lock()  # the owner's own next call is granted as usual
    assert await lock.hold_count() == 1
    await lock.unlock()
    assert not await lock.is_locked()


@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_late_copy_of_an_undone_fresh_acquire_does_not_grant(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """The same, for a fresh acquire: the lock is free when the late copy arrives."""
    lock = _lock(aiolock_client, kind, "late-fresh")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    late = services.owners.next_request()
    undo = lock.release_call(owner, services.owners.next_request(), late)
    assert await services.calls.run(*undo) is None  # nothing held: nothing undone
    reply = await services.calls.run(*lock.attempt_call(owner, late, 30_000))  # the late copy
    assert lock.grant_of(reply, 30_000) is None  # refused, not granted
    assert not await lock.is_locked()
    assert await lock.try_lock()  # the owner's own next call is granted as usual
    await lock.unlock()


@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_late_copy_of_an_acquire_answered_by_its_resend_does_not_apply_again(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """A nested acquire was resent and applied; the owner released it; then the first copy,
    delayed on a slow path, arrives.  It must not count a hold a second time."""
    lock = _lock(aiolock_client, kind, "late-resent")
    await lock.lock()
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    nested = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    assert (await services.calls.run(*nested))[1] == 2  # the resend lands: two holds
    release = lock.release_call(owner, services.owners.next_request(), None)
    assert await services.calls.run(*release) == 1  # released: one hold left
    reply = await services.calls.run(*nested)  # the first copy, late
    assert lock.grant_of(reply, 30_000) is None  # refused, not counted again
    assert await lock.hold_count() == 1
    await lock.unlock()
    assert not await lock.is_locked()


@pytest.mark.parametrize("nested", [False, True], ids=["fresh", "nested"])
@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_late_copy_of_an_answered_acquire_grants_nothing_once_the_owner_released(
    aiolock_client: aiolock.Client, kind: str, nested: bool
) -> None:
    """An acquire (fresh, or nested in a hold) was resent and applied, and the owner then
    released every hold, which deleted the lock.  The first copy, delayed on a slow path,
    arrives: it must not grant a fresh hold that nobody knows of.  The resend carries its
    mark (the client's resend window), as every resend does: its script voided the request,
    and no release wrote anything."""
    lock = _lock(aiolock_client, kind, "late-after")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    if nested:
        await lock.lock()
    acquire = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    script, keys, args = acquire
    resend = (script, keys, (*args, services.resend_window_ms))
    assert (await services.calls.run(*resend))[1] == 1 + nested  # the resend lands
    release = lock.release_call(owner, services.owners.next_request(), None)
    assert await services.calls.run(*release) == nested  # the acquire's hold released
    if nested:
        await lock.unlock()  # and the outer one
    assert not await lock.is_locked()
    await _late_copy_refused(aiolock_client, lock, acquire)


@pytest.mark.parametrize("kind", [*LATE_KINDS, "semaphore"])
async def test_a_resend_after_a_stall_answers_with_a_lease_from_now(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """A resend of an acquire that was applied a while ago (its reply lost in a stall) answers
    with a lease that runs from the resend, as the first copy's did from then: the client
    counts the hold's lease from its send time, and a reply with a lease about to end would
    have it taken for lost at once while the server still holds it."""
    if kind == "semaphore":
        lock = permits_of(aiolock_client.semaphore("resent-lease", 1))  # its permits lock
        owner = "resent-permit"
    else:
        lock = _lock(aiolock_client, kind, "resent-lease")
        owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    acquire = lock.attempt_call(owner, services.owners.next_request(), 1_000)
    first = lock.grant_of(await services.calls.run(*acquire), 1_000)
    assert first is not None

    async def aged() -> bool:  # the server's clock moved on since the first copy
        return 0 < await redis.pttl(lock.keys.lock) < 1_000

    await eventually(aged)
    again = lock.grant_of(await services.calls.run(*acquire), 1_000)  # the resend
    assert again is not None
    assert again[:2] == first[:2]  # the same grant, not a second hold
    assert again[2] == 1_000  # its lease runs from now
    release = lock.release_call(owner, services.owners.next_request(), None)
    assert await services.calls.run(*release) == 0


async def _another_owner_takes_and_releases(client: aiolock.Client, kind: str, name: str) -> None:
    """A task of its own (another owner) takes the lock and releases it: the meta hash's
    'released' marker then names that owner's release, not the first owner's."""

    async def cycle() -> None:
        lock = _lock(client, kind, name)
        await lock.lock()
        await lock.unlock()

    await asyncio.create_task(cycle())


@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_voided_acquire_grants_nothing_after_another_owner_released(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """An acquire was resent and its resend answered; the client voided it before the
    release that ended the hold.  Another owner then takes and releases the lock, replacing
    the marker of that release.  The first copy, arriving now, must still grant nothing."""
    lock = _lock(aiolock_client, kind, "voided")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    acquire = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    landed = lock.grant_of(await services.calls.run(*acquire), 30_000)
    assert landed is not None
    assert landed[1] == 1  # the resend lands
    await lock.settlement.void(owner, [acquire[2][2]])
    release = lock.release_call(owner, services.owners.next_request(), None)
    assert await services.calls.run(*release) == 0
    await _another_owner_takes_and_releases(aiolock_client, kind, "voided")
    await _late_copy_refused(aiolock_client, lock, acquire)


async def test_a_voided_read_grants_nothing_while_other_readers_keep_the_lock(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A read hold whose acquire was resent ends while another reader keeps the lock alive
    (the lock hash then forgets the owner's last request).  The first copy of that acquire,
    arriving now, must not grant a read hold nobody knows of."""
    rw = aiolock_client.rw_lock("voided-read")
    lock = rw.read_lock()
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    async with held_by_another_task(rw.read_lock()):  # another reader keeps the lock alive
        acquire = lock.attempt_call(owner, services.owners.next_request(), 30_000)
        assert (await services.calls.run(*acquire))[1] == 1  # the resend lands
        await lock.settlement.void(owner, [acquire[2][2]])
        release = lock.release_call(owner, services.owners.next_request(), None)
        assert await services.calls.run(*release) == 0
        reply = await services.calls.run(*acquire)  # the first copy, late
        assert lock.grant_of(reply, 30_000) is None  # refused, not granted
        assert await redis.hget(lock.keys.lock, f"r:{owner}") is None
    assert not await redis.exists(lock.keys.lock)


@pytest.mark.parametrize("kind", LATE_KINDS)
async def test_a_late_copy_of_an_undone_acquire_stays_refused_after_other_undos(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """An acquire was undone before it arrived; then another owner's acquire of the same lock
    was undone too.  The first one's late copy, arriving now with the lock gone, must still
    grant nothing: the second marker must not replace the first."""
    lock = _lock(aiolock_client, kind, "undone-twice")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    late = services.owners.next_request()
    acquire = lock.attempt_call(owner, late, 30_000)
    undo = lock.release_call(owner, services.owners.next_request(), late)
    assert await services.calls.run(*undo) is None  # nothing held: nothing undone

    async def another_owner_undoes() -> None:
        other = _lock(aiolock_client, kind, "undone-twice")
        other_owner, _ = other.current_owner()
        request = services.owners.next_request()
        call = other.release_call(other_owner, services.owners.next_request(), request)
        assert await services.calls.run(*call) is None

    await asyncio.create_task(another_owner_undoes())
    await _late_copy_refused(aiolock_client, lock, acquire)


async def test_a_voided_fair_try_does_not_queue_its_owner_again_after_it_left(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A fair lock's try queued its owner (the lock was held); the try had been resent, so
    the client voided it.  The owner gave up and left the queue.  The first copy of that
    try, arriving now, must not queue the owner again: a place nobody waits in, which would
    hold up the queue behind it."""
    lock = aiolock_client.fair_lock("voided-queue")
    async with held_by_another_task(aiolock_client.fair_lock("voided-queue")):
        owner, _ = lock.current_owner()
        services = services_of(aiolock_client)
        keys = lock.keys
        assert isinstance(keys, FairKeys), keys
        queue = keys.queue
        try_call = lock.attempt_call(owner, services.owners.next_request(), 30_000)
        assert not isinstance(await services.calls.run(*try_call), list)  # queued
        assert await _queued(redis, queue, owner)
        await lock.settlement.void(owner, [try_call[2][2]])
        withdraw = lock.withdraw_call(owner)
        assert withdraw is not None  # a fair lock keeps its waiters on the server
        assert await services.calls.run(*withdraw) == 1  # it gave up
        assert not isinstance(await services.calls.run(*try_call), list)  # the late copy
        assert not await _queued(redis, queue, owner)  # not queued again
    assert not await lock.is_locked()


async def _queued(redis: Redis, queue: str, owner: str) -> bool:
    """Whether ``owner`` has a member in a fair lock's queue (scripts/fair/_queue.lua)."""
    return any(str(m).split(" ", 4)[4] == owner for m in await redis.lrange(queue, 0, -1))


async def test_marks_past_their_time_are_pruned_when_a_void_mark_is_added(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """The meta hash of a lock in steady use never expires as a whole (each release keeps it
    alive), so the per-request marks it gathers under faults are pruned once past their time,
    where new ones are added."""
    lock = aiolock_client.lock("pruned")
    owner, _ = lock.current_owner()
    meta = lock.keys.meta
    await redis.hset(meta, mapping={f"{owner}/{n}": 1 for n in range(40)})  # long past
    await redis.hset(meta, "released", f"{owner}/99")
    await redis.pexpire(meta, 60_000)
    await lock.settlement.void(owner, [1000])
    assert sorted(await redis.hkeys(meta)) == sorted(["released", f"{owner}/1000"])
    assert 0 < await redis.pttl(meta) <= 60_000


async def _cycle_permits(semaphore: aiolock.AsyncSemaphore, times: int) -> None:
    """Other acquisitions take and release a permit ``times`` times (each a permit id of its
    own), pushing earlier ones out of the semaphore's list of its last releases."""
    for _ in range(times):
        async with semaphore.acquire(wait=1):
            pass


@pytest.mark.parametrize("how", ["released", "undone", "voided", "refused"])
async def test_a_late_copy_of_a_permit_acquire_grants_nothing(
    aiolock_client: aiolock.Client, redis: Redis, how: str
) -> None:
    """A permit's acquire whose acquisition has ended arrives late: it must not take a permit
    nobody holds.  A copy exists only after a fault, and is voided with a mark in the
    permits set itself, which holds however many releases came in between: resent (the
    resend's own script marks it), answered, and the permit released since; the same, voided
    again by the client; undone before it arrived; resent and refused (no permit was free),
    its take given up."""
    semaphore = aiolock_client.semaphore("late-permits", 1)
    permits = permits_of(semaphore)  # the permits lock's
    services = services_of(aiolock_client)
    permit = "late-permit"  # a permit id: one acquisition's own owner
    late = services.owners.next_request()
    acquire = permits.attempt_call(permit, late, 30_000)
    if how == "undone":
        undo = permits.release_call(permit, services.owners.next_request(), late)
        assert await services.calls.run(*undo) is None  # nothing held: nothing undone
    elif how == "refused":
        async with semaphore.acquire(wait=1):  # another task holds the only permit
            assert not isinstance(await services.calls.run(*acquire), list)  # refused
        await permits.settlement.void(permit, [late])
    else:
        script, keys, args = acquire
        resend = (script, keys, (*args, services.resend_window_ms))  # marked, as every resend
        assert isinstance(await services.calls.run(*resend), list)  # granted
        if how == "voided":
            await permits.settlement.void(permit, [late])
        release = permits.release_call(permit, services.owners.next_request(), None)
        assert await services.calls.run(*release) == 0
    await _cycle_permits(semaphore, 0 if how == "released" else 40)
    assert await semaphore.available() == 1  # marks are not permits
    assert not isinstance(await services.calls.run(*acquire), list)  # the late copy
    assert await semaphore.available() == 1
    assert await redis.zscore(permits.keys.lock, permit) is None
    async with semaphore.acquire(wait=1):  # the permit is free for everybody
        assert await semaphore.available() == 0


async def test_permit_marks_past_their_time_are_dropped(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """Void marks live in a key of their own, for the resend window: marks past their time go
    when marks are added, and the key lives as long as its latest mark, however long the
    leases of the permits (whose set goes with its last permit).  Marks that earlier versions
    kept in the permits set, with negative scores, are dropped past their time and are never
    counted as permits."""
    semaphore = aiolock_client.semaphore("old-marks", 2)
    permits_lock = permits_of(semaphore)
    services = services_of(aiolock_client)
    permits, marks = permits_lock.keys.lock, f"{permits_lock.keys.lock}:marks"
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    await redis.zadd(permits, {"gone/1": -(now - 1), "kept/2": -(now + 60_000)})
    await redis.pexpire(permits, 60_000)
    assert await semaphore.available() == 2
    assert await redis.zrange(permits, 0, -1) == ["kept/2"]
    await redis.delete(permits)

    await redis.zadd(marks, {"gone/1": now - 1})
    await redis.pexpire(marks, 60_000)
    async with semaphore.acquire(wait=1, lease=600) as permit:
        assert await semaphore.available() == 1  # marks are no permits
        await services.calls.run(
            *permits_lock.void_call(permit.id, [services.owners.next_request()])
        )
    assert not await redis.exists(permits)  # its last permit gone: no ten-minute key
    [(mark, until)] = cast(
        list[tuple[str, float]], await redis.zrange(marks, 0, -1, withscores=True)
    )
    assert mark.startswith(f"{permit.id}/")  # the old one dropped
    assert until > now
    window = services.resend_window_ms
    assert 0 < await redis.pttl(marks) <= window


@pytest.mark.parametrize("outcome", ["refused", "granted"])
@pytest.mark.parametrize("kind", [*LATE_KINDS, "semaphore"])
async def test_a_resent_acquire_voids_itself(
    aiolock_client: aiolock.Client, kind: str, outcome: str
) -> None:
    """A resend carries a mark (one more argument), and its script voids the request in
    the same call, granted or refused: the first copy, arriving once the lock is free (or
    once the hold the resend got has ended, and another owner's release has replaced the
    marker of the owner's own), grants nothing, with no round trip of the client's in
    between in which it could have."""
    name = f"resent-{outcome}"
    services = services_of(aiolock_client)
    semaphore = aiolock_client.semaphore(name, 1)
    lock: Any = None  # a lock kind's object; a semaphore is asked through its permits lock
    if kind == "semaphore":
        lock = permits_of(semaphore)
        owner = "resent-permit"
        blocker: Any = aiolock_client.semaphore(name, 1)
    else:
        lock = _lock(aiolock_client, kind, name)
        owner, _ = lock.current_owner()
        blocker = _lock(aiolock_client, "write" if kind == "read" else kind, name)
    script, keys, args = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    if outcome == "refused":
        async with held_by_another_task(blocker):
            resend = await services.calls.run(script, keys, (*args, services.resend_window_ms))
            assert lock.grant_of(resend, 30_000) is None
    else:
        resend = await services.calls.run(script, keys, (*args, services.resend_window_ms))
        assert lock.grant_of(resend, 30_000) is not None
        release = lock.release_call(owner, services.owners.next_request(), None)
        assert await services.calls.run(*release) == 0  # no void call of the client's
        async with held_by_another_task(blocker):  # another owner's release comes after
            pass
        if kind == "semaphore":
            await _cycle_permits(semaphore, 40)
    late = await services.calls.run(script, keys, args)  # the first copy, arriving now
    assert lock.grant_of(late, 30_000) is None  # voided
    if kind == "semaphore":
        assert await semaphore.available() == 1
    else:
        assert not await lock.is_locked()
        assert await lock.try_lock()  # the owner's own next try is granted as usual
        await lock.unlock()


# Every kind whose hold counts per owner, so that a late copy of a release could end a newer
# hold of the same owner: the reentrant locks and both read-write modes (a semaphore's permit
# id is an owner of one acquisition, which no later acquire re-enters).
RELEASE_KINDS = ["lock", "spin_lock", "fair_lock", "read", "write"]


async def _server_token(redis: Redis, lock: Any, owner: str) -> int:
    """The fencing token of the owner's hold as the lock hash has it."""
    if isinstance(lock, aiolock.AsyncReadLock):
        field = f"t:{owner}"
    elif isinstance(lock, aiolock.AsyncWriteLock):
        field = ":fence"  # the read-write lock's hash (scripts/rw/_rw.lua)
    else:
        field = f"f:{owner}"  # the reentrant hold's (scripts/common/_hold.lua)
    token = await redis.hget(keys_of(lock).lock, field)
    assert token is not None
    return int(token)


async def _resent_release(lock: Any, owner: str, left: int) -> Any:
    """Release one of the owner's holds as a resent release does: its first copy went out on
    a connection that failed, and the resend lands (the client keeps the id of a release it
    resent once it is answered).  Returns the release call, for its late first copy."""
    services = lock.services
    request = services.owners.next_request()
    release = lock.release_call(owner, request, None)
    copies = ReleaseCopies()  # what Calls.run's on_send tells the release: a copy, then a resend
    copies.sending(False)
    copies.sending(True)
    assert await services.calls.run(*release) == left  # the resend lands
    lock.settlement.released_copies(owner, request, copies)  # as the client does then
    services.holds.released(lock.registry_key, owner, left)
    return release


@pytest.mark.parametrize("kind", RELEASE_KINDS)
async def test_a_late_copy_of_a_resent_last_release_leaves_the_next_hold_alone(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """The owner's last release was resent, and its resend deleted the lock; the owner then
    acquired the lock again (a fresh grant).  The release's first copy, delayed on a frozen
    path, arrives now: it must not release that newer hold, which its owner believes it has
    (another owner could be granted the lock alongside)."""
    lock = _lock(aiolock_client, kind, "late-release")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    await lock.lock()
    release = await _resent_release(lock, owner, 0)
    assert not await redis.exists(lock.keys.lock)
    await lock.lock()  # the owner's next acquire: it carries the resent release's id
    hold = lock.hold(owner)
    assert hold is not None
    token = hold.token
    assert await services.calls.run(*release) == 1  # the late copy: changes nothing
    assert await lock.is_locked()
    assert await lock.hold_count() == 1
    assert await _server_token(redis, lock, owner) == token
    await lock.unlock()  # the owner releases it as usual
    assert not await lock.is_locked()
    assert not await redis.exists(lock.keys.lock)  # the late ids went with the lock


@pytest.mark.parametrize("kind", RELEASE_KINDS)
async def test_a_late_copy_of_a_resent_nested_release_leaves_the_next_hold_alone(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """The same for a nested hold: a release of 2 holds to 1 was resent and landed; the owner
    re-entered (1 to 2).  The first copy, arriving now, must not take the count back to 1."""
    lock = _lock(aiolock_client, kind, "late-nested-release")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    await lock.lock()
    await lock.lock()
    release = await _resent_release(lock, owner, 1)
    await lock.lock()  # re-entered: two holds again
    hold = lock.hold(owner)
    assert hold is not None
    token = hold.token
    assert await services.calls.run(*release) == 2  # the late copy: changes nothing
    assert await lock.hold_count() == 2
    assert await _server_token(redis, lock, owner) == token
    await lock.unlock()
    assert await lock.hold_count() == 1
    await lock.unlock()
    assert not await lock.is_locked()


@pytest.mark.parametrize("after_fault", [False, True], ids=["clean", "after-a-resend"])
@pytest.mark.parametrize("kind", RELEASE_KINDS)
async def test_a_release_and_a_reentry_of_one_explicit_owner_may_arrive_in_either_order(
    aiolock_client: aiolock.Client, kind: str, after_fault: bool
) -> None:
    """Two tasks share an explicit owner: one releases a hold while the other re-enters, on
    two connections, with no fault.  The release (the older request) may arrive after the
    re-entry: it is no late copy, and applies (a release refused for being older would leave
    the owner a hold its client does not count).  Also while the client keeps the id of an
    earlier resent release of that owner: only that id is refused."""
    name = f"racing-{after_fault}"
    if kind == "read":
        lock: Any = aiolock_client.rw_lock(name).read_lock(owner="job")
    elif kind == "write":
        lock = aiolock_client.rw_lock(name).write_lock(owner="job")
    else:
        lock = getattr(aiolock_client, kind)(name, owner="job")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    await lock.lock()
    if after_fault:
        await lock.lock()
        await _resent_release(lock, owner, 1)
        assert services.holds.late_releases(lock.keys.lock, owner)
    release = lock.release_call(owner, services.owners.next_request(), None)
    reentry = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    assert (await services.calls.run(*reentry))[1] == 2  # the re-entry arrives first
    assert await services.calls.run(*release) == 1  # then the release: it applies
    assert await lock.hold_count() == 1
    await lock.unlock()  # the client's one hold (the pair cancelled out)
    assert not await lock.is_locked()


async def test_the_client_keeps_the_id_of_a_resent_release_for_the_resend_window(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """redis-py itself resends a release script (the server stalls past a short socket
    timeout): the client keeps its id, its owner's next acquire carries it, and a late copy of
    the release then leaves the new hold alone.  (The write lock's: the plain and fair locks'
    last release is one HDEL, see the next test.)"""
    flaky, client = await _resending_client(aiolock_server, aiolock_client, redis)
    lock = client.rw_lock("resent-release").write_lock()
    try:
        await lock.lock()
        owner, _ = lock.current_owner()
        services = services_of(client)
        assert services.holds.late_releases(lock.keys.lock, owner) == []  # no fault, no id
        started = asyncio.Event()
        stall = asyncio.create_task(stall_server(aiolock_server.url, 0.3, started))
        await started.wait()
        await lock.unlock()  # resent by redis-py
        await stall
        late = services.holds.late_releases(lock.keys.lock, owner)
        assert len(late) == 1
        assert f"late:{late[0]}" in lock.attempt_call(owner, 1, 1000)[2]
        await lock.lock()
        copy = lock.release_call(owner, late[0], None)
        assert await services.calls.run(*copy) == 1  # a late copy: the hold is intact
        assert await lock.hold_count() == 1
        await lock.unlock()
        assert not await lock.is_locked()
    finally:
        await client.aclose()
        await flaky.aclose()


async def hdel_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_hdel", {}).get("calls", 0))


@pytest.mark.parametrize("kind", ["lock", "spin_lock", "fair_lock"])
async def test_a_late_copy_of_a_resent_plain_release_leaves_the_next_hold_alone(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """The plain lock's last release is a plain HDEL of the owner's fields, which cannot
    refuse a late copy of itself (the fair lock's, fair/last.lua, the same HDEL and the
    hand-over).  redis-py resends it (the server stalls past a short socket timeout): the
    owner's next hold of the lock goes by another id for the resend window, so that the first
    copy, arriving late, names none of that hold's fields."""
    flaky, client = await _resending_client(aiolock_server, aiolock_client, redis)
    lock = getattr(client, kind)("resent-hdel")
    try:
        await lock.lock()
        owner, _ = lock.current_owner()
        before = await hdel_calls(redis)
        started = asyncio.Event()
        stall = asyncio.create_task(stall_server(aiolock_server.url, 0.3, started))
        await started.wait()
        await lock.unlock()  # HDEL, resent by redis-py
        await stall
        assert await hdel_calls(redis) - before >= 2
        alias, _ = lock.current_owner()
        assert alias != owner  # the owner's next hold goes by another id
        assert alias.partition(":")[0] == owner.partition(":")[0]  # of the same client
        await lock.lock()
        # The late copy names none of it.
        if kind == "fair_lock":
            keys = lock.keys
            assert isinstance(keys, FairKeys)
            copy = (owner, "-")
            assert (
                await services_of(client).calls.run(_scripts.FAIR_LAST, keys.script_keys(), copy)
                == 0
            )
        else:
            hdel = ("HDEL", lock.keys.lock, owner, f"f:{owner}", f"r:{owner}", ":w")
            assert await redis.execute_command(*hdel) == 0  # type: ignore[no-untyped-call]
        assert await lock.hold_count() == 1
        assert await redis.hget(lock.keys.lock, alias) == "1"
        await lock.unlock()
        assert not await lock.is_locked()
    finally:
        await client.aclose()
        await flaky.aclose()


async def test_an_owner_goes_by_its_own_id_again_after_the_window(
    aiolock_client: aiolock.Client,
) -> None:
    """The other id lasts the resend window, and as long as a hold made under it: no longer
    (a bare-command release's outcome left unknown is what starts it)."""
    services = services_of(aiolock_client)
    lock = aiolock_client.lock("realiased")
    owner, _ = lock.current_owner()
    client, _, rest = owner.partition(":")
    services.holds.realias(lock.registry_key, owner, 7, 0.05)
    alias, _ = lock.current_owner()
    assert alias == f"{client}:a7:{rest}"
    async with lock.acquire(wait=5):
        await asyncio.sleep(0.1)  # past the window, but a hold under the alias lasts
        assert lock.current_owner()[0] == alias
        assert await lock.hold_count() == 1
    assert lock.current_owner()[0] == owner
    services.holds.realias(lock.registry_key, owner, 8, 5)
    alias = lock.current_owner()[0]
    services.holds.realias(lock.registry_key, alias, 9, 5)  # of an alias: of the owner
    assert lock.current_owner()[0] == f"{client}:a9:{rest}"


@pytest.mark.parametrize("kind", RELEASE_KINDS)
async def test_an_acquire_sent_while_a_release_is_resent_does_not_refuse_that_release(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    """Two tasks share an explicit owner.  One's release is being resent (its first copy went
    out on a connection that failed) when the other re-enters, and the re-entry lands before
    the resend.  The re-entry must not name that release as a late copy: the client keeps
    its id only once it is answered, so the resend, arriving now, applies."""
    name = f"resending-{kind}"
    if kind in ("read", "write"):
        rw = aiolock_client.rw_lock(name)
        lock: Any = rw.read_lock(owner="job") if kind == "read" else rw.write_lock(owner="job")
    else:
        lock = getattr(aiolock_client, kind)(name, owner="job")
    owner, _ = lock.current_owner()
    services = services_of(aiolock_client)
    settlement = lock.settlement
    await lock.lock()
    await lock.lock()
    request = services.owners.next_request()
    release = lock.release_call(owner, request, None)
    copies = ReleaseCopies()
    copies.sending(False)  # the first copy, on a connection that then fails
    copies.sending(True)  # the resend, not answered yet
    reentry = lock.attempt_call(owner, services.owners.next_request(), 30_000)
    assert not any(str(arg).startswith("late:") for arg in reentry[2])
    assert (await services.calls.run(*reentry))[1] == 3  # the re-entry lands first
    assert await services.calls.run(*release) == 2  # then the resend: it applies
    settlement.released_copies(owner, request, copies)  # answered: kept from now on
    assert services.holds.late_releases(lock.keys.lock, owner) == [request]
    assert await services.calls.run(*release) == 2  # a late copy now: nothing changes
    assert await lock.hold_count() == 2
    await lock.unlock()
    await lock.unlock()
    assert not await lock.is_locked()
