"""Closing the subscriber side while a node's channels are being moved (no server involved:
the nodes refuse connections, and the topology's refresh swallows one cancellation, as redis-py's
``nodes_manager.initialize()`` may through ``asyncio.wait_for`` on Python 3.11)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import ConnectionPool

from aiolock._redis.pubsub import Home, PubSub
from tests.helpers import eventually

pytestmark = pytest.mark.anyio


class _SwallowingTopology:
    """A sharded topology whose refresh swallows one cancellation, then names another node."""

    sharded = True

    def __init__(self) -> None:
        self.moved = False
        self.refreshing = asyncio.Event()
        # Nothing listens on these ports: every connect fails, and the channel is rehomed.
        self._pools = {
            name: ConnectionPool(host="127.0.0.1", port=port) for name, port in (("a", 1), ("b", 2))
        }

    async def ready(self) -> None:
        return None

    async def refresh(self) -> None:
        self.refreshing.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # swallowed: carries on as if not cancelled
        self.moved = True

    def home(self, channel: bytes) -> Home:
        name = "b" if self.moved else "a"
        return Home(name, lambda: self._pools[name])


async def test_closing_while_a_refresh_swallows_the_cancellation_leaves_nothing_running() -> None:
    topology = _SwallowingTopology()
    before = asyncio.all_tasks()  # the test runner's own
    pubsub = PubSub(topology, concurrency=4, ping_interval=0.5)
    pubsub.join("{x}:channel", None)
    await asyncio.wait_for(topology.refreshing.wait(), 10)  # the node failed: being rehomed
    await pubsub.aclose()  # returns, and raises nothing
    assert not pubsub.scheduled
    assert pubsub.subscriber_homes == ["a"]  # nothing subscribed on "b" after the close
    ours = asyncio.all_tasks() - before
    await eventually(lambda: all(task.done() for task in ours), what="no task left running")
