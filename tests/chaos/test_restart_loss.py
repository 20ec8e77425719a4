"""A release resent to a server that restarted and lost every lock (issue 29, target 4).

A resent release that finds the hold gone is read as released when the server kept it: its
first copy may have applied (the resend answers "nothing held").  But a resend often follows a
restart: if the first copy never reached the old server, and the new one lost the hold with its
state, "nothing held" means the hold was lost, and the release must not report success.  The
client asks the server's uptime then (only then): a server that started after the hold was last
found on it vouches for nothing.  The chaos runs found this as two "amnesia" violations.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ConstantBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock.testing.embedded import EmbeddedServer
from tests.helpers import eventually

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio

# What each kind's release looks like on the wire: the plain lock's is one HDEL.
KINDS: dict[str, tuple[Callable[[aiolock.Client], Any], bytes]] = {
    "lock": (lambda client: client.lock("restarted"), b"HDEL"),
    "fair": (lambda client: client.fair_lock("restarted"), b"EVALSHA"),
    "permit": (lambda client: client.semaphore("restarted", 2), b"EVALSHA"),
}


@pytest.fixture
async def volatile(
    request: pytest.FixtureRequest, aiolock_server: Any
) -> AsyncIterator[tuple[EmbeddedServer, FreezableProxy]]:
    """A server of the session's binary with no persistence, behind a proxy."""
    binary = request.node.callspec.params["aiolock_server"]
    with EmbeddedServer(binary=binary) as server:
        proxy = FreezableProxy(server.port)
        await proxy.start()
        try:
            yield server, proxy
        finally:
            await proxy.aclose()


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_release_resent_to_a_server_that_lost_the_hold_reports_the_loss(
    volatile: tuple[EmbeddedServer, FreezableProxy], kind: str
) -> None:
    server, proxy = volatile
    make, release = KINDS[kind]
    client = aiolock.Client.from_url(
        f"redis://127.0.0.1:{proxy.port}/0",
        # A short pause between tries: the reset of every proxied connection can refuse a
        # try or two made right after it (ten back-to-back tries ran out now and then).
        retry=Retry(ConstantBackoff(0.02), 20),
        retry_on_error=[RedisConnectionError],
    )
    sent: asyncio.Future[asyncio.Future[None]] = asyncio.get_running_loop().create_future()

    async def hold() -> None:
        async with make(client).acquire(wait=5, lease=30):  # no watchdog: no renewal
            sent.set_result(proxy.next_request(release))
            proxy.freeze()  # the release's first copy stays in the proxy

    holder = asyncio.create_task(hold())
    try:
        await (await sent)  # the release is written, and held at the proxy
        # The server dies with the hold and comes back empty; the first copy never reaches
        # it, and the client's connection breaks: redis-py resends to the new server.
        await asyncio.to_thread(server.restart, kill=True)
        proxy.thaw(reset=True)
        # Failed before the fix: the resend found nothing held, and the block ended as if
        # the release had applied.
        with pytest.raises(aiolock.LockLostError):
            await holder
    finally:
        holder.cancel()
        proxy.thaw()
        await client.aclose()


async def test_a_release_resent_to_the_same_server_that_finds_the_hold_gone_succeeded(
    proxied: Callable[..., aiolock.Client], proxy: FreezableProxy, redis: Redis
) -> None:
    """The other side: the first copy applied (the server was up all along), its reply was
    lost, and the resend finds the hold gone: a release, not a loss.  The plain lock's
    release, a plain HDEL, answers a resend that finds nothing as it answers a loss."""

    async def up_two_seconds() -> bool:  # a server that started within a second or two
        return int((await redis.info("server"))["uptime_in_seconds"]) >= 2  # vouches for none

    await eventually(up_two_seconds, what="the server up for two seconds")
    client = proxied(retry=Retry(NoBackoff(), 10), retry_on_error=[RedisConnectionError])
    lock = client.lock("kept")
    asked = await info_calls(redis)
    async with lock.acquire(wait=5, lease=30) as guard:
        # The release runs on the server; its connection is cut before the reply.
        applied = proxy.cut_next_request(b"HDEL")
    assert await applied == b":3\r\n"  # the server ran the first copy: the hold was there
    # The client asked whether the server had restarted (one INFO more than the reading above).
    assert await info_calls(redis) >= asked + 2
    assert not guard.lost
    assert not await lock.is_locked()


async def info_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_info", {}).get("calls", 0))
