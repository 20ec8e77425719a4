"""The contract every lock kind keeps (SPEC "Every lock kind"), run over each kind.

Modelled on trio's generic lock tests: one suite, parametrized by kind, against a real server.
Each kind's own behaviour (FIFO across clients, backoff, ...) is tested in its own module.

The two composites run here too: ``multi`` is a ``MultiLock`` over a plain and a fair lock of
one name and client; ``redlock`` a ``RedLock`` over three clients of the test server, the test's
client and two more on key prefixes of their own (three independent lock namespaces stand in
for three masters; ``test_redlock.py`` runs it over five real servers).  Where a composite
differs (its token is a tuple or a maximum, its statistics are its parts', a RedLock never
parks), the tests look through the helpers below at the single locks it is made of.

The semaphore runs here with one permit, as the lock it then is.  It is not reentrant, has no
owners, fencing tokens or ``force_unlock``, and its holds are permits: the tests of what it
has take and give back through :func:`take` and :func:`give_back`, and the others skip, saying
which part of the contract a semaphore does not offer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock._core.holds import Hold
from aiolock._core.kind import HoldKind, LockKind
from aiolock._core.state import LockStatistics
from aiolock.semaphore import permits_of
from tests.helpers import assert_clean, evalsha_calls, eventually, services_of

pytestmark = pytest.mark.anyio

Kind = Callable[..., Any]

# RedLock's extra "servers" of each client, made on first use and closed by the kind fixture.
_SERVERS: dict[aiolock.Client, list[aiolock.Client]] = {}


def redlock_clients(client: aiolock.Client) -> list[aiolock.Client]:
    """``client`` and two clients sharing its connections under key prefixes of their own
    (beside its prefix, not under it: each keeps a fencing counter of its own)."""
    extra = _SERVERS.get(client)
    if extra is None:
        extra = _SERVERS[client] = [
            aiolock.Client(
                client.redis,
                key_prefix=f"{client.key_prefix}-redlock{index}",
                watchdog_timeout=client.watchdog_timeout,
            )
            for index in (1, 2)
        ]
    return [client, *extra]


KINDS: dict[str, Callable[[aiolock.Client], Kind]] = {
    "lock": lambda client: client.lock,
    "fair": lambda client: client.fair_lock,
    "spin": lambda client: client.spin_lock,
    "write": lambda client: lambda name, **kw: client.rw_lock(name).write_lock(**kw),
    "read": lambda client: lambda name, **kw: client.rw_lock(name).read_lock(**kw),
    "multi": lambda client: (
        lambda name, **kw: aiolock.MultiLock(client.lock(name, **kw), client.fair_lock(name, **kw))
    ),
    "redlock": lambda client: (
        lambda name, **kw: aiolock.RedLock(redlock_clients(client), name, **kw)
    ),
    "semaphore": lambda client: lambda name, **kw: client.semaphore(name, 1, **kw),
}
# Modes that many owners hold at once: the tests of exclusion and hand-off do not apply.
SHARED = {"read"}
# Two kinds that are two modes of one lock (a reader and a writer exclude each other).
SAME_LOCK = {"read", "write"}
# The single kinds whose locks a composite is made of, on the test's client: it shares their
# keys by design (a MultiLock is its parts; a RedLock's part on a server is that client's
# plain lock of the name), so it is not a different lock from them.
PARTS = {"multi": {"lock", "fair"}, "redlock": {"lock"}}


def exclusive_only(kind: str) -> None:
    if kind in SHARED:
        pytest.skip("many owners hold a read lock at once")


def lock_only(kind: str, why: str) -> None:
    """Skip for the semaphore, which does not offer that part of the contract (``why``)."""
    if kind == "semaphore":
        pytest.skip(f"a semaphore {why}")


async def take(lock: Any, wait: float | None = None) -> Any:
    """Hold ``lock`` as the calling task: a truthy hold (a semaphore's permit), or a falsy miss
    once ``wait`` ran out (``None``: wait as long as it takes)."""
    if isinstance(lock, aiolock.AsyncSemaphore):
        return await lock.try_acquire(wait=wait)
    if wait is None:
        await lock.lock()
        return True
    return await lock.try_lock(wait=wait)


async def give_back(lock: Any, taken: Any) -> None:
    """Release what :func:`take` returned, from the task that took it."""
    if isinstance(taken, aiolock.Permit):
        await taken.release()
    else:
        await lock.unlock()


async def end_hold(lock: Any, taken: Any) -> None:
    """End what :func:`take` returned, from any task (a lock's by force, a permit's: any task
    may release it)."""
    if isinstance(taken, aiolock.Permit):
        await taken.release()
    else:
        await lock.force_unlock()


@pytest.fixture(params=sorted(KINDS))
async def kind(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    yield str(request.param)
    # Torn down before the clients (the tests name it last): the RedLock servers go first.
    while _SERVERS:
        base, extra = _SERVERS.popitem()
        for client in extra:
            await client.aclose()
            if base.closed:  # a test's own client (nothing listens there), closed already
                continue
            keys = [key async for key in client.redis.scan_iter(match=f"{client.key_prefix}:*")]
            if keys:
                await client.redis.unlink(*keys)


def factory(client: aiolock.Client, kind: str) -> Kind:
    return KINDS[kind](client)


def singles(lock: Any) -> list[HoldKind]:
    """The single locks that ``lock`` is made of: itself, or a composite's parts."""
    if isinstance(lock, aiolock.MultiLock):
        return list(lock.locks)
    if isinstance(lock, aiolock.RedLock):
        return list(lock.parts)
    if isinstance(lock, aiolock.AsyncSemaphore):
        return [permits_of(lock)]  # its permits lock
    assert isinstance(lock, LockKind)
    return [lock]


def part_statistics(lock: Any) -> Sequence[LockStatistics]:
    """The statistics of each single lock in ``lock`` (a composite's are its parts')."""
    stats = lock.statistics()
    return stats.parts if isinstance(stats, aiolock.CompositeStatistics) else [stats]


def granted(lock: Any) -> list[Hold]:
    """The calling owner's holds of every part of ``lock``, right after an acquire."""
    return [part.caller_hold() for part in singles(lock)]


def token_of(lock: Any) -> object:
    """The token a guard would show for the caller's hold of ``lock``, right after an acquire."""
    tokens = [hold.token for hold in granted(lock)]
    if isinstance(lock, aiolock.MultiLock):
        return tuple(tokens)
    return max(tokens)  # a RedLock's (every part is granted: its servers never fail here)


def increasing(tokens: Sequence[object]) -> bool:
    """Strictly increasing; a MultiLock's tuples in every part."""
    columns = zip(*tokens, strict=True) if isinstance(tokens[0], tuple) else [tokens]
    return all(list(column) == sorted(set(column)) for column in columns)


async def is_free(lock: Any) -> bool:
    """Whether nobody holds ``lock``, by the server (a semaphore: its one permit is free)."""
    if isinstance(lock, aiolock.AsyncSemaphore):
        return await lock.available() == lock.permits
    return not await lock.is_locked()


async def all_clean(redis: Redis, *clients: aiolock.Client) -> None:
    """``assert_clean`` for each client and the RedLock servers made for it."""
    for client in clients:
        for one in [client, *_SERVERS.get(client, [])]:
            await assert_clean(redis, one)


async def test_exclusion_among_tasks_and_clients(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], kind: str
) -> None:
    exclusive_only(kind)
    clients = [aiolock_client, make_client(), make_client()]
    inside = peak = entered = 0

    async def worker(i: int) -> None:
        nonlocal inside, peak, entered
        lock = factory(clients[i % 3], kind)("shared")
        for _ in range(3):
            async with lock.acquire(wait=20):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.001)
                inside -= 1
                entered += 1

    await asyncio.gather(*(worker(i) for i in range(12)))
    assert (peak, entered) == (1, 36)


async def test_reentrancy_and_inspection(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    lock_only(kind, "is not reentrant: each acquisition takes another permit")
    lock = factory(aiolock_client, kind)("reentrant")
    assert not await lock.is_locked()
    assert await lock.remaining_lease() is None
    async with lock.acquire() as outer:
        async with lock.acquire() as inner:
            assert inner.fencing_token == outer.fencing_token  # reentry shares the token
            assert await lock.hold_count() == 2
            assert lock.statistics().held == 2
        assert await lock.hold_count() == 1
        assert await lock.is_held()
        assert await lock.is_locked()
        lease = await lock.remaining_lease()
        assert lease is not None
        assert 0 < lease <= aiolock_client.watchdog_timeout
    assert not await lock.is_locked()
    assert await lock.hold_count() == 0
    await all_clean(redis, aiolock_client)


async def test_another_owner_waits_and_times_out(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    exclusive_only(kind)
    lock = factory(aiolock_client, kind)("busy")
    taken = await take(lock)

    async def other() -> tuple[bool, bool]:
        if kind != "semaphore":  # a semaphore has no owners to tell apart
            assert not await lock.is_held()
            with pytest.raises(aiolock.LockNotOwnedError):
                await lock.unlock()
        with pytest.raises(aiolock.LockTimeoutError):
            async with lock.acquire(wait=0.1):
                pass
        return bool(await take(lock, wait=0)), bool(await take(lock, wait=0.1))

    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await asyncio.create_task(other()) == (False, False)
    assert loop.time() - started < 2
    await give_back(lock, taken)
    late = await asyncio.create_task(take(lock, wait=1))  # that task ends holding it
    assert late
    await end_hold(lock, late)
    await all_clean(redis, aiolock_client)


async def test_a_release_hands_the_lock_to_a_waiter(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    kind: str,
) -> None:
    exclusive_only(kind)
    lock = factory(aiolock_client, kind)("handoff")
    other = factory(make_client(), kind)("handoff")
    taken = await take(lock)
    calls = await evalsha_calls(redis)
    waiter = asyncio.create_task(take(other, wait=10))
    if kind == "redlock":
        # A RedLock never parks: it asks every server again after a random pause.  Seen
        # waiting once it asked them all twice (and was refused: the lock is held).
        async def retried() -> bool:
            return await evalsha_calls(redis) >= calls + 2 * len(singles(other))

        await eventually(retried, what="the waiter asked twice")
    else:

        def parked() -> bool:
            return sum(stats.waiters for stats in part_statistics(other)) == 1

        await eventually(parked, what="the waiter parked")
    assert not waiter.done()
    await give_back(lock, taken)
    assert await waiter
    assert other.statistics().held == 1


async def test_fencing_tokens_increase_across_expiry_and_force(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    exclusive_only(kind)
    lock_only(kind, "permit has no fencing token")
    lock = factory(aiolock_client, kind)("fenced")
    tokens = []
    for _ in range(3):
        async with lock.acquire() as guard:
            tokens.append(guard.fencing_token)
    await lock.lock(lease=0.05)
    tokens.append(token_of(lock))
    await eventually(lambda: lock.statistics().lost, what="the lease ran out")
    await lock.lock()
    tokens.append(token_of(lock))
    assert await lock.force_unlock()
    async with lock.acquire() as guard:
        tokens.append(guard.fencing_token)
    assert increasing(tokens), tokens


async def test_a_lease_that_runs_out_is_reported_lost(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    lock = factory(aiolock_client, kind)("leased")
    with pytest.raises(aiolock.LockLostError, match="leased"):
        async with lock.acquire(lease=0.1) as guard:
            await eventually(lambda: guard.lost, what="the lease ran out")

            async def expired() -> bool:  # the client's timer fires a little before the server
                return await is_free(lock)

            await eventually(expired, what="the server expired it")
    stats = lock.statistics()
    assert (stats.held, stats.lost) == (0, True)
    assert [part.losses for part in part_statistics(lock)] == [1] * len(singles(lock))
    await all_clean(redis, aiolock_client)


async def test_force_unlock_is_a_loss_that_cancels_on_request(
    make_client: Callable[..., aiolock.Client], kind: str
) -> None:
    lock_only(kind, "has no force_unlock")
    client = make_client(watchdog_timeout=0.6)  # renewals every 0.2 s find the force soon
    lock = factory(client, kind)("forced")
    outsider = factory(make_client(), kind)("forced")
    reached_end = False
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire(cancel_on_loss=True):
            assert await outsider.force_unlock()
            assert not await outsider.force_unlock()  # nothing left to delete
            await asyncio.sleep(60)  # cancelled by the loss once the watchdog sees it
            reached_end = True
    assert not reached_end


async def test_the_watchdog_keeps_a_hold_alive(
    make_client: Callable[..., aiolock.Client], kind: str
) -> None:
    client = make_client(watchdog_timeout=0.3)
    lock = factory(client, kind)("kept")
    async with lock.acquire() as guard:
        await eventually(
            lambda: min(stats.renewals for stats in part_statistics(lock)) >= 3,
            what="three renewals",
        )
        assert not guard.lost
        assert not await is_free(lock)


async def test_explicit_owner_acquires_in_one_task_and_releases_in_another(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    lock_only(kind, "has no owners: a permit is released by whoever has it")
    lock = factory(aiolock_client, kind)("job", owner="job-17")
    assert await asyncio.create_task(lock.try_lock())
    assert await lock.is_held()
    await asyncio.create_task(lock.unlock())
    assert not await lock.is_locked()
    await all_clean(redis, aiolock_client)


async def test_random_cancellations_leave_nothing_behind(
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
    kind: str,
) -> None:
    clients = [aiolock_client, make_client()]
    rng = random.Random(7)

    async def worker(i: int) -> None:
        async with factory(clients[i % 2], kind)("storm").acquire(wait=10):
            await asyncio.sleep(0.002)

    for _ in range(4):
        tasks = [asyncio.create_task(worker(i)) for i in range(16)]
        for task in rng.sample(tasks, 8):
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results), results
    await all_clean(redis, *clients)


async def test_lock_objects_of_one_name_share_statistics(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    make = factory(aiolock_client, kind)
    first = make("counted")
    async with make("counted").acquire():
        assert first.statistics().held == 1
    assert [stats.acquisitions for stats in part_statistics(first)] == [1] * len(singles(first))
    # A composite's repr also counts its parts (MultiLock) or servers (RedLock).
    size = {"multi": ", parts:2", "redlock": ", servers:3"}.get(kind, "")
    state = "held:0/1" if kind == "semaphore" else f"unlocked{size}"
    assert repr(first) == f"<{type(first).__name__} {first.name!r} [{state}]>"


async def test_kinds_of_one_name_are_different_locks(
    aiolock_client: aiolock.Client, kind: str
) -> None:
    def made_of(name: str) -> set[str]:
        return PARTS.get(name, {name})

    others = [
        make(aiolock_client)("same")
        for name, make in KINDS.items()
        if name != kind
        and not {name, kind} <= SAME_LOCK
        and not made_of(name) & made_of(kind)  # a composite and a kind it is made of
    ]
    async with factory(aiolock_client, kind)("same").acquire():

        async def all_free() -> list[Any]:
            return [await take(other, wait=0) for other in others]

        taken = await asyncio.create_task(all_free())
        assert all(taken), taken
        for other, hold in zip(others, taken, strict=True):
            await end_hold(other, hold)


@pytest.mark.parametrize(
    ("call", "error", "param"),
    [
        (lambda lock: lock.try_lock(wait=-1), ValueError, "wait"),
        (lambda lock: lock.try_lock(lease=0), ValueError, "lease"),
        (lambda lock: lock.try_lock(lease=True), TypeError, "lease"),
        (lambda lock: lock.try_lock(wait=float("nan")), ValueError, "wait"),
        (lambda lock: lock.lock(lease=float("inf")), ValueError, "lease"),
        (lambda lock: lock.acquire(wait="1"), TypeError, "wait"),
        (lambda lock: lock.acquire(cancel_on_loss=1), TypeError, "cancel_on_loss"),
    ],
)
async def test_bad_arguments_fail_before_any_io(
    kind: str, call: Callable[[Any], Any], error: type[Exception], param: str
) -> None:
    lock_only(kind, "has no owner, try_lock or cancel_on_loss (its checks: test_semaphore.py)")
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")  # nothing listens there
    try:
        make = factory(client, kind)
        with pytest.raises(TypeError, match="name"):
            make(42)
        with pytest.raises(ValueError, match="name"):
            make("")
        with pytest.raises(TypeError, match="owner"):
            make("x", owner=5)
        with pytest.raises(error, match=param):
            result = call(make("x"))
            if asyncio.iscoroutine(result):
                await result
    finally:
        await client.aclose()


async def test_acquiring_again_after_a_loss_the_server_has_not_seen_yet_is_fresh(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """The client's deadlines run a little ahead of the server's: in that gap the owner's next
    acquire re-enters the old hold on the server.  It must not pass for a fresh grant."""
    lock_only(kind, "is not reentrant: every acquisition is a fresh permit")
    lock = factory(aiolock_client, kind)("gap")
    assert await lock.try_lock(lease=30)
    old = granted(lock)
    for part, hold in zip(singles(lock), old, strict=True):  # a composite: every part
        services_of(part).holds.lose(hold, "taken for lost by the test, still held there")
    assert await lock.try_lock()
    new = granted(lock)
    # Fresh grants, not the old tokens handed out again.
    assert all(n.token > o.token for n, o in zip(new, old, strict=True)), (new, old)
    assert [hold.count for hold in new] == [1] * len(new)
    assert await lock.hold_count() == 1  # the old holds are gone from the server
    await lock.unlock()
    assert not await lock.is_locked()
    await all_clean(redis, aiolock_client)


async def test_a_grant_the_client_never_saw_is_not_kept_behind_its_back(
    aiolock_client: aiolock.Client, redis: Redis, kind: str
) -> None:
    """A late copy of an earlier request (applied after its resend was answered "busy")
    grants the owner a hold the client never saw; the owner's next acquire re-enters it."""
    lock_only(
        kind, "permit's id is new at each acquisition: no later acquire re-enters a late grant"
    )
    lock = factory(aiolock_client, kind)("phantom")
    for part in singles(lock):  # a composite: a late copy lands for every part
        owner, _ = part.current_owner()
        services = part.services
        late = part.attempt_call(owner, services.owners.next_request(), 30_000)
        reply = await services.calls.run(*late)  # the late copy lands: a hold nobody knows of
        assert part.grant_of(reply, 30_000) is not None
    assert lock.statistics().held == 0
    assert await lock.try_lock()
    clients = [aiolock_client, *_SERVERS.get(aiolock_client, [])]
    await eventually(
        lambda: all(client.statistics().pending == 0 for client in clients), what="dropped"
    )
    assert lock.statistics().held == 1
    assert await lock.hold_count() == 1  # the server agrees: one hold, the one we know of
    await lock.unlock()
    assert not await lock.is_held()
    await all_clean(redis, aiolock_client)
