"""A node that accepts connections and then says nothing (a partition, a hung host) must not
hold up the subscriptions of channels on the healthy nodes: the semaphores that order a
channel's SUBSCRIBE and UNSUBSCRIBE are a pool shared by every node's channels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import ConnectionPool

from aiolock._pubsub import Home, PubSub
from aiolock.pytest_plugin import ServerInfo
from tests.helpers import eventually

pytestmark = pytest.mark.anyio


class _TwoNodes:
    """A classic topology of two nodes: channels starting with ``{dead}`` live on a node that
    never answers, the others on the test server."""

    sharded = False

    def __init__(self, live: ConnectionPool, dead: ConnectionPool) -> None:
        self._homes = {
            "live": Home("live", lambda: live),
            "dead": Home("dead", lambda: dead),
        }

    async def ready(self) -> None:
        return None

    async def refresh(self) -> None:
        return None

    def home(self, channel: bytes) -> Home:
        return self._homes["dead" if channel.startswith(b"{dead}") else "live"]


@pytest.fixture
async def silent_port() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A port that accepts connections and never writes a byte (nor closes them)."""
    accepted = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        accepted.set()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], accepted
    finally:
        server.close()
        for writer in held:
            writer.close()


async def test_a_silent_node_holds_up_no_other_channel(
    aiolock_server: ServerInfo, silent_port: tuple[int, asyncio.Event]
) -> None:
    port, accepted = silent_port
    live = ConnectionPool.from_url(aiolock_server.url)
    # A handshake that would wait a minute for an answer: longer than this test may take.
    dead = ConnectionPool(host="127.0.0.1", port=port, socket_connect_timeout=60, socket_timeout=60)
    # One semaphore for every channel: the dead node's and the live one's share it.
    pubsub = PubSub(_TwoNodes(live, dead), concurrency=1, ping_interval=60)
    try:
        stuck = pubsub.join("{dead}:channel", None)
        await asyncio.wait_for(accepted.wait(), 10)  # its subscriber is in the handshake
        served = pubsub.join("{live}:channel", None)
        await eventually(lambda: served.confirmed, what="the live node's channel confirmed")
        assert not stuck.confirmed
        # Leaving the dead node's channel waits for nothing either.
        pubsub.release(stuck)
        await asyncio.wait_for(pubsub.drain(), 5)
        pubsub.release(served)
        await asyncio.wait_for(pubsub.drain(), 5)
        assert pubsub.statistics().channels == 0
    finally:
        await asyncio.wait_for(pubsub.aclose(), 10)
        await live.aclose()
        await dead.aclose()
