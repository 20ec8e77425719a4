"""The freezable proxy: a frozen path keeps its sockets open and stops every byte."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from .proxy import FreezableProxy


@pytest.fixture
async def proxy(aiolock_server: Any) -> AsyncIterator[FreezableProxy]:
    port = int(aiolock_server.url.rsplit(":", 1)[1].split("/")[0])
    proxy = FreezableProxy(port)
    await proxy.start()
    yield proxy
    await proxy.aclose()


@pytest.mark.anyio
async def test_freeze_stops_bytes_but_keeps_the_connection(proxy: FreezableProxy) -> None:
    async with Redis(port=proxy.port, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)) as redis:
        assert await redis.ping()
        proxy.freeze()
        with pytest.raises(RedisTimeoutError):
            await redis.ping()
        assert proxy.connections == 1  # nothing was closed
        proxy.thaw(reset=True)
        assert await redis.ping()  # on a new connection: the reset aborted the old one


@pytest.mark.anyio
async def test_slow_path_delays_in_order(proxy: FreezableProxy) -> None:
    async with Redis(port=proxy.port) as redis:
        proxy.delay = 0.05
        assert await redis.echo("a") == b"a"
        assert await redis.echo("b") == b"b"


@pytest.mark.anyio
async def test_a_disarmed_cut_lets_requests_through(proxy: FreezableProxy) -> None:
    async with Redis(port=proxy.port, retry=Retry(NoBackoff(), 0)) as redis:
        reply = proxy.cut_next_request(b"ECHO")
        proxy.disarm_cut()
        assert reply.cancelled()
        assert await redis.echo("a") == b"a"  # not cut
        assert proxy.connections == 1
