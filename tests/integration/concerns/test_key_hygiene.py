"""Keys that outlive their locks do not pile up with the number of names used.

Per-entity names (``orders:{id}``) are the common case: once every lock is released after a
fault-free use, what is left under the key prefix is the one fencing counter, within two
seconds, for every kind.  Markers against late copies are written only after a fault (a
resend, an undo) and live for the client's resend window (from its retry policy), never for
a lease.  Fencing tokens still strictly increase per name across expiry, ``force_unlock`` and
a restart with persistence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff
from redis.exceptions import ResponseError

import aiolock
from aiolock._core.keys import marks_of
from aiolock._core.kind import HoldKind, LockKind
from aiolock.semaphore import permits_of
from aiolock.testing.embedded import EmbeddedServer
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import evalsha_calls, eventually, services_of, stall_server, use_once
from tests.integration.concerns.test_transaction import lock_of

pytestmark = pytest.mark.anyio

NAMES = 10_000


async def keys_under(redis: Redis, prefix: str) -> list[str]:
    return sorted([str(key) async for key in redis.scan_iter(match=f"{prefix}:*", count=1000)])


async def in_batches(
    names: list[str], each: Callable[[str], Awaitable[object]], size: int = 100
) -> None:
    for start in range(0, len(names), size):
        await asyncio.gather(*(each(name) for name in names[start : start + size]))


async def test_ten_thousand_names_leave_one_key(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    prefix = aiolock_client.key_prefix
    tokens: list[int] = []

    async def use(name: str) -> None:
        lock = aiolock_client.lock(name)
        async with lock.acquire(wait=0, lease=1.0) as guard:
            tokens.append(guard.fencing_token)

    await in_batches([f"orders:{i}" for i in range(NAMES)], use)
    assert len(tokens) == NAMES
    assert len(set(tokens)) == NAMES  # one counter: every grant has a token of its own
    # No release writes a marker: the counter is all there is, at once.
    assert await keys_under(redis, prefix) == [f"{prefix}:fence"]
    assert await redis.ttl(f"{prefix}:fence") == -1  # it never expires


KINDS = ["lock", "fair", "spin", "read", "write", "semaphore", "latch"]


@pytest.mark.parametrize("names", [200, 2_000])
@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_leaves_no_key_per_name(
    aiolock_client: aiolock.Client, redis: Redis, kind: str, names: int
) -> None:
    """Within two seconds of the last release, only the fencing counter is left (the latch
    takes no token: not even that), however many names were used."""
    prefix = aiolock_client.key_prefix
    await in_batches(
        [f"{kind}:{i}" for i in range(names)], lambda name: use_once(aiolock_client, kind, name)
    )

    async def only_the_counter() -> bool:
        return set(await keys_under(redis, prefix)) <= {f"{prefix}:fence"}

    await eventually(only_the_counter, timeout=2.0, what=f"no {kind} key per name left")


LONG_HOLD_KINDS = ["lock", "fair", "spin", "read", "write", "permit"]


async def test_a_long_hold_released_after_a_resend_leaves_nothing_after_the_window(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """A ``lease=600`` acquire that redis-py resent (the server stalled past a short socket
    timeout) voids its request, and the client voids it again before the release: the
    marker lives for the client's resend window (from its retry policy: here the two-second
    floor), not for the ten minutes of the lease, and then nothing is left.  (A semaphore kept
    its marks in its permits set, which lives as long as the longest lease granted: ten
    minutes.)  Every kind at once, each under a name of its own, in one stall: the window is
    waited for once."""
    address = urlsplit(aiolock_server.url)
    flaky = Redis(
        host=address.hostname or "127.0.0.1",
        port=address.port or 6379,
        socket_timeout=0.05,
        socket_connect_timeout=0.05,
        retry=Retry(ConstantBackoff(0.01), 20),
        max_connections=64,
    )
    client = aiolock.Client(flaky, key_prefix=aiolock_client.key_prefix)
    prefix = client.key_prefix
    window = services_of(client).resend_window_ms
    assert window == 2_300  # 21 attempts x (0.05 + 0.05) s + 20 pauses of 0.01 s
    locks = {kind: lock_of(client, kind, f"long-hold-{kind}") for kind in LONG_HOLD_KINDS}

    async def left() -> dict[str, int]:
        """Each key of the run but the fencing counter, with its PTTL."""
        keys = [key for key in await keys_under(redis, prefix) if key != f"{prefix}:fence"]
        return {key: await redis.pttl(key) for key in keys}

    entered: list[Any] = []

    async def hold(lock: Any, stalled: asyncio.Event) -> None:
        async with lock.acquire(wait=5, lease=600):
            entered.append(lock)
            await stalled.wait()

    try:
        await redis.execute_command("DEBUG", "SLEEP", 0)  # type: ignore[no-untyped-call]
    except ResponseError:
        pytest.skip("this server does not allow DEBUG (enable-debug-command)")
    try:
        # Warm up, all at once: scripts loaded, and a connection open for each kind (one
        # opened during the stall would send its acquire after it, never resent).
        warm = asyncio.Event()
        warming = [asyncio.create_task(hold(lock, warm)) for lock in locks.values()]
        await eventually(lambda: len(entered) == len(locks), what="every kind held at once")
        warm.set()
        await asyncio.gather(*warming)
        assert await left() == {}  # a fault-free cycle marks nothing
        before = await evalsha_calls(redis)
        started, stalled = asyncio.Event(), asyncio.Event()
        stall = asyncio.create_task(stall_server(aiolock_server.url, 0.3, started))
        await started.wait()
        holders = [asyncio.create_task(hold(lock, stalled)) for lock in locks.values()]
        await stall
        stalled.set()
        await asyncio.gather(*holders)
        assert await evalsha_calls(redis) - before >= 2 * len(locks), "redis-py did not resend"
        marks = await left()
        for kind, lock in locks.items():
            tag = lock.hash_tag
            assert any(tag in key for key in marks), f"the resend of {kind} left no mark"
        assert all(0 < pttl <= window for pttl in marks.values()), marks  # for the window

        async def only_the_counter() -> bool:
            return await left() == {}

        await eventually(only_the_counter, timeout=window / 1000 + 2, what="the marks expired")
    finally:
        await client.aclose()
        await flaky.aclose()


async def test_tokens_increase_across_expiry_and_force_unlock(
    aiolock_client: aiolock.Client,
) -> None:
    lock = aiolock_client.lock("fenced")
    other = aiolock_client.lock("fenced", owner="other")
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire(wait=0, lease=0.05) as guard:
            first = guard.fencing_token

            async def expired() -> bool:
                return not await lock.is_locked()

            await eventually(expired, what="the lease ended")
    with pytest.raises(aiolock.LockLostError):
        async with other.acquire(wait=0, lease=5) as guard:
            after_expiry = guard.fencing_token
            assert await other.force_unlock()
    async with other.acquire(wait=0, lease=5) as guard:
        after_force = guard.fencing_token
    assert first < after_expiry < after_force


async def test_tokens_increase_across_a_restart_with_persistence(
    aiolock_server: ServerInfo, request: pytest.FixtureRequest
) -> None:
    binary = request.node.callspec.params["aiolock_server"]  # a server of the same binary
    config = {"appendonly": "yes", "appendfsync": "always"}
    with EmbeddedServer(binary=binary, config=config) as server:
        async with aiolock.Client.from_url(server.url) as client:
            async with client.lock("durable").acquire(wait=0, lease=5) as guard:
                before = guard.fencing_token
        await asyncio.to_thread(server.restart)
        async with aiolock.Client.from_url(server.url) as client:
            async with client.lock("durable").acquire(wait=0, lease=5) as guard:
                after = guard.fencing_token
    assert after > before


async def test_an_undo_marks_for_the_resend_window_only(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client, redis: Redis
) -> None:
    """An acquire whose outcome was unknown is undone; the undo finds it not applied (it is
    still on its way) and marks it, so that its late copy grants nothing.  The mark lives for
    the client's resend window (here its two-second floor), and then nothing is left.  Every
    kind at once, each under a name of its own: the window is waited for once."""
    client = aiolock.Client.from_url(
        aiolock_server.url,
        key_prefix=aiolock_client.key_prefix,
        socket_timeout=0.05,
        socket_connect_timeout=0.05,
        retry=Retry(ConstantBackoff(0.01), 1),
    )
    window = services_of(client).resend_window_ms
    assert window == 2_000  # the floor: 2 x (0.05 + 0.05) s + 0.01 s is less

    async def mark(kind: str) -> None:
        name = f"undone-{kind}"
        lock: HoldKind
        if kind == "semaphore":
            lock = permits_of(client.semaphore(name, 1))  # its permits lock
            owner = "undone-permit"
            marked = marks_of(lock.keys)  # apart from the permits: theirs lives for a lease
        else:
            makers: dict[str, Callable[[str], LockKind]] = {
                "lock": client.lock,
                "fair": client.fair_lock,
                "read": lambda n: client.rw_lock(n).read_lock(),
                "write": lambda n: client.rw_lock(n).write_lock(),
            }
            lock = makers[kind](name)
            owner, _ = lock.current_owner()
            marked = lock.keys.meta
        services = services_of(client)
        late = services.owners.next_request()
        loop = asyncio.get_running_loop()
        settlement = lock.settlement
        await settlement.retry_release(owner, services.owners.next_request(), late, loop.time() + 5)
        assert 0 < await redis.pttl(marked) <= window, kind
        reply = await services.calls.run(*lock.attempt_call(owner, late, 600_000))  # the late copy
        assert lock.grant_of(reply, 600_000) is None, kind  # refused

    async def only_the_counter() -> bool:
        return set(await keys_under(redis, client.key_prefix)) <= {f"{client.key_prefix}:fence"}

    try:
        await asyncio.gather(
            *(mark(kind) for kind in ("lock", "fair", "read", "write", "semaphore"))
        )
        assert not await only_the_counter()  # the marks are there
        await eventually(only_the_counter, timeout=window / 1000 + 2, what="the marks expired")
    finally:
        await client.aclose()
