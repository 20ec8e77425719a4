"""A node that accepts connections and then says nothing (a partition, a hung host) must not
hold up the subscriptions of channels on the healthy nodes: the semaphores that order a
channel's SUBSCRIBE and UNSUBSCRIBE are a pool shared by every node's channels.  And a reply
to a SUBSCRIBE confirms the entry it was written for, no other."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import ConnectionPool, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._redis.entry import Entry
from aiolock._redis.pubsub import Home, PubSub
from aiolock.testing.pytest_plugin import ServerInfo
from tests.chaos.proxy import FreezableProxy
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
        pubsub.unreference(stuck)
        await asyncio.wait_for(pubsub.drain(), 5)
        pubsub.unreference(served)
        await asyncio.wait_for(pubsub.drain(), 5)
        assert pubsub.statistics().channels == 0
    finally:
        await asyncio.wait_for(pubsub.aclose(), 10)
        await live.aclose()
        await dead.aclose()


async def test_a_node_gone_silent_after_connecting_holds_up_no_other_channel(
    aiolock_server: ServerInfo,
) -> None:
    """The node's subscriber connection was up when it went silent (a partition, a frozen
    path), and reconnecting to it hangs.  A SUBSCRIBE written on the silent connection waits
    for its confirmation holding the channel's semaphore: once the reader finds the connection
    dead (no reply to its PING), nobody waits through the reconnect."""
    upstream = urlsplit(aiolock_server.url).port or 6379
    proxy = FreezableProxy(upstream)
    await proxy.start()
    live = ConnectionPool.from_url(aiolock_server.url)
    far = ConnectionPool(host="127.0.0.1", port=proxy.port, socket_connect_timeout=60)
    pubsub = PubSub(_TwoNodes(live, far), concurrency=1, ping_interval=0.2)
    try:
        first = pubsub.join("{dead}:first", None)
        await eventually(lambda: first.confirmed, what="the far node's first channel confirmed")
        proxy.freeze()  # silent from now on, new connections too (their handshake hangs)
        pubsub.join("{dead}:second", None)  # written on the silent connection
        served = pubsub.join("{live}:channel", None)
        # Found dead within two ping intervals; then the live channel's SUBSCRIBE goes out.
        await eventually(lambda: served.confirmed, what="the live node's channel confirmed")
    finally:
        proxy.thaw()
        await asyncio.wait_for(pubsub.aclose(), 10)
        await proxy.aclose()
        await live.aclose()
        await far.aclose()


async def test_a_reply_confirms_only_the_entry_its_subscribe_was_for(
    aiolock_server: ServerInfo,
) -> None:
    """On the wire: SUBSCRIBE for an entry, its UNSUBSCRIBE, then a new entry's SUBSCRIBE of
    the same channel (a waiter left and another came while the reader resubscribed after a
    reconnect).  The first SUBSCRIBE's reply must not confirm the new entry: the server has
    not yet subscribed it again, and a release published meanwhile would be missed."""
    live = ConnectionPool.from_url(aiolock_server.url)
    pubsub = PubSub(_TwoNodes(live, live), concurrency=1, ping_interval=60)
    subscriber = pubsub._subscriber(Home("live", lambda: live))
    try:
        opener = Entry(b"{live}:opener")
        await subscriber.subscribe(opener)  # starts the reader, which connects
        await eventually(lambda: opener.confirmed, what="the subscriber connected")
        key = b"{live}:channel"
        confirmed_with: list[int] = []  # the replies still due when the new entry was confirmed

        class Recorded(Entry):
            __slots__ = ()

            def confirm(self) -> None:
                confirmed_with.append(len(subscriber._due))
                super().confirm()

        old, new = Entry(key), Recorded(key)
        subscriber.entries[key] = old
        assert await subscriber._send("SUBSCRIBE", key, old)  # as the reader resubscribes
        await subscriber.unsubscribe(old)
        assert await subscriber.subscribe(new)
        assert confirmed_with == [0]  # by its own reply, the last one due
    finally:
        await asyncio.wait_for(pubsub.aclose(), 10)
        await live.aclose()


async def test_a_confirmation_failed_while_its_subscribe_was_written_is_not_left_unretrieved(
    aiolock_server: ServerInfo,
) -> None:
    """The connection is lost while a SUBSCRIBE is being written: the reader fails the
    confirmations awaited, and the write reports that nothing went out, so nobody awaits that
    confirmation.  Its exception must still be retrieved (a long chaos run logged "Future
    exception was never retrieved")."""
    live = ConnectionPool.from_url(aiolock_server.url)
    pubsub = PubSub(_TwoNodes(live, live), concurrency=1, ping_interval=60)
    subscriber = pubsub._subscriber(Home("live", lambda: live))
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:

        async def lost_while_writing(command: str, key: bytes, entry: Entry | None = None) -> bool:
            subscriber.fail_confirmations(RedisConnectionError("lost while writing"))
            return False

        subscriber._send = lost_while_writing  # type: ignore[method-assign]
        assert not await subscriber.subscribe(Entry(b"{live}:channel"))
        gc.collect()  # an unretrieved exception is reported when its future is collected
        assert unretrieved == []
    finally:
        loop.set_exception_handler(previous)
        await asyncio.wait_for(pubsub.aclose(), 10)
        await live.aclose()


async def test_a_caller_that_gives_up_while_the_topology_is_learnt_leaves_it_going() -> None:
    """The first calls of a Cluster client learn its topology in one task that every caller
    awaits through a shield: a caller whose wait ends meanwhile leaves at once (redis-py's
    ``asyncio.wait_for`` on Python 3.11 may swallow a cancellation that reaches it: a chaos run
    saw an acquire with a 0.16 s wait return granted 3.7 s later), and the learning goes on for
    the next caller, on the same connection."""
    connections: list[asyncio.StreamWriter] = []

    def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)  # a startup node that never answers

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cluster = RedisCluster(
        host="127.0.0.1", port=port, socket_connect_timeout=60, socket_timeout=60
    )
    client = aiolock.Client(cluster)
    loop = asyncio.get_running_loop()
    try:
        lock = client.lock("learning")
        started = loop.time()
        assert not await lock.try_lock(wait=0.2)
        assert loop.time() - started < 1.0
        await eventually(lambda: len(connections) == 1, what="the handshake under way")
        assert not await client.lock("learning").try_lock(wait=0.2)
        assert len(connections) == 1  # the second caller joined the same learning
    finally:
        await client.aclose()
        await cluster.aclose()
        server.close()
        for writer in connections:
            writer.close()
