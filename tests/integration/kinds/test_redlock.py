"""RedLock over five independent embedded servers: the majority rule, failures, losses."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

import aiolock
from aiolock.testing.embedded import EmbeddedServer
from tests.conftest import SERVERS
from tests.helpers import eventually, keys_of

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=SERVERS)
def servers(request: pytest.FixtureRequest) -> Iterator[list[EmbeddedServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(EmbeddedServer(binary=request.param)) for _ in range(5)]


@pytest.fixture
async def clients(servers: list[EmbeddedServer]) -> AsyncIterator[list[aiolock.Client]]:
    for server in servers:
        if not server.running:
            server.start()
        with redis.Redis.from_url(server.url) as plain:  # a clean slate for each test
            plain.flushall()
    made = [
        aiolock.Client.from_url(server.url, watchdog_timeout=0.6, socket_connect_timeout=0.5)
        for server in servers
    ]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


async def locked_on(clients: list[aiolock.Client], name: str) -> list[bool]:
    return [bool(await client.redis.exists(keys_of(client.lock(name)).lock)) for client in clients]


async def test_a_grant_holds_every_server_and_unlock_frees_them(
    clients: list[aiolock.Client],
) -> None:
    redlock = aiolock.RedLock(clients, "orders:1")
    async with redlock.acquire(wait=1) as guard:
        tokens = [part.caller_hold().token for part in redlock.parts]
        assert guard.fencing_token == max(tokens)
        assert await locked_on(clients, "orders:1") == [True] * 5
        assert await redlock.is_locked()
        assert await redlock.is_held()
        assert await redlock.hold_count() == 1
        assert redlock.statistics().held == 1
        assert repr(redlock) == "<RedLock 'orders:1' [held x1, servers:5]>"
    assert await locked_on(clients, "orders:1") == [False] * 5
    assert not await redlock.is_locked()


async def test_two_redlocks_exclude_each_other(clients: list[aiolock.Client]) -> None:
    first, second = aiolock.RedLock(clients, "x"), aiolock.RedLock(clients[::-1], "x")
    inside = peak = 0

    async def worker(redlock: aiolock.RedLock) -> None:
        nonlocal inside, peak
        for _ in range(5):
            async with redlock.acquire(wait=10):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.002)
                inside -= 1

    await asyncio.gather(*(worker(first if i % 2 else second) for i in range(4)))
    assert peak == 1
    assert await locked_on(clients, "x") == [False] * 5


async def test_works_with_two_servers_down_and_refuses_with_three(
    clients: list[aiolock.Client], servers: list[EmbeddedServer]
) -> None:
    redlock = aiolock.RedLock(clients, "quorum")
    servers[0].kill()
    servers[1].kill()
    async with redlock.acquire(wait=5):
        assert await locked_on(clients[2:], "quorum") == [True] * 3
    assert await locked_on(clients[2:], "quorum") == [False] * 3
    servers[2].kill()
    assert not await redlock.try_lock(wait=0.5)
    # Nothing is left on the two live servers, not even a part granted on its own.  A part's
    # release may outlast the wait (it finishes in the background): the server can answer
    # before the client has read the release's reply.
    assert await locked_on(clients[3:], "quorum") == [False, False]
    await eventually(
        lambda: clients[3].statistics().holds == clients[4].statistics().holds == 0,
        what="the parts' releases recorded",
    )


async def test_losing_the_majority_loses_the_guard(clients: list[aiolock.Client]) -> None:
    redlock = aiolock.RedLock(clients, "lost")
    reached_end = False
    with pytest.raises(aiolock.LockLostError):
        async with redlock.acquire(cancel_on_loss=True) as guard:
            for part in redlock.parts[:2]:
                assert await part.force_unlock()
            assert not guard.lost  # three of five still held: the majority holds
            # From another task: a loss the block's own task finds is one it knows of already,
            # which cancels nothing (see GuardContext._lost).
            await asyncio.create_task(redlock.parts[2].force_unlock())
            await asyncio.sleep(60)  # cancelled once the third loss is found
            reached_end = True
    assert not reached_end
    assert await locked_on(clients, "lost") == [False] * 5


async def test_a_cancelled_attempt_leaves_nothing(clients: list[aiolock.Client]) -> None:
    blocker = aiolock.RedLock(clients, "blocked")
    await blocker.lock(lease=30)
    attempt = asyncio.create_task(aiolock.RedLock(clients, "blocked").lock())
    await asyncio.sleep(0.1)  # a few attempts in, between two of them or inside one
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    await blocker.unlock()
    await eventually(
        lambda: all(client.statistics().pending == 0 for client in clients), what="settled"
    )
    assert await locked_on(clients, "blocked") == [False] * 5


async def test_a_cancellation_as_the_release_starts_still_releases_everywhere(
    clients: list[aiolock.Client],
) -> None:
    """Regression: the parts' releases ran as tasks that the caller's cancellation cancelled
    before their first step, so no release was sent and the lock stayed held for the lease."""
    redlock = aiolock.RedLock(clients, "exit", owner="job")
    context = redlock.acquire()
    await context.__aenter__()
    exiting = asyncio.create_task(context.__aexit__(None, None, None))
    # Runs right after the task's first step, which queues the releases behind it.
    asyncio.get_running_loop().call_soon(exiting.cancel)
    with pytest.raises(asyncio.CancelledError):
        await exiting

    async def released() -> bool:
        return await locked_on(clients, "exit") == [False] * 5

    await eventually(released, what="released on every server")


async def test_a_failed_attempt_cancelled_while_giving_back_leaves_nothing(
    clients: list[aiolock.Client],
) -> None:
    """Attempts that win a minority (two of five) give their grants back, also when the
    caller is cancelled between or inside them."""
    for client in clients[2:]:  # a majority held by someone else: two grants, then refusals
        assert await client.lock("split", owner="other").try_lock(lease=30)
    attempt = asyncio.create_task(aiolock.RedLock(clients, "split").try_lock(wait=5))
    await eventually(
        lambda: any(part.statistics().held for part in aiolock.RedLock(clients, "split").parts),
        what="a part granted",
    )
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    await eventually(
        lambda: all(client.statistics().holds == 0 for client in clients[:2]), what="given back"
    )

    async def given_back() -> bool:
        return await locked_on(clients[:2], "split") == [False, False]

    await eventually(given_back, what="nothing left on the first two servers")


async def test_a_stalled_majority_cannot_hold_the_caller_past_its_wait(
    clients: list[aiolock.Client], servers: list[EmbeddedServer]
) -> None:
    """Regression: each attempt waited for the servers' replies for up to the lease, whatever
    the caller's wait (here 5 s for a 0.3 s wait); late grants are undone."""
    redlock = aiolock.RedLock(clients, "stalled")
    stopped = [server.pid for server in servers[:3]]
    for pid in stopped:
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert not await redlock.try_lock(wait=0.3, lease=5)
        assert loop.time() - started < 1.0
    finally:
        for pid in stopped:
            assert pid is not None
            os.kill(pid, signal.SIGCONT)
    await eventually(
        lambda: all(client.statistics().pending == 0 for client in clients), what="settled"
    )
    assert await locked_on(clients, "stalled") == [False] * 5


def test_bad_arguments() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    others = [aiolock.Client.from_url("redis://127.0.0.1:1/0") for _ in range(2)]
    with pytest.raises(ValueError, match="at least 3"):
        aiolock.RedLock([client, others[0]], "x")
    with pytest.raises(ValueError, match="distinct"):
        aiolock.RedLock([client, client, others[0]], "x")
    with pytest.raises(TypeError, match="clients"):
        aiolock.RedLock("abc", "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name"):
        aiolock.RedLock([client, *others], 5)  # type: ignore[arg-type]
    redlock = aiolock.RedLock([client, *others], "x")
    with pytest.raises(ValueError, match="wait"):
        redlock.acquire(wait=-1)
