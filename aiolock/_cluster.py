"""Script calls on a Redis Cluster: one :class:`~aiolock._calls.Calls` per node, picked by slot.

Why aiolock's own per-node connections rather than redis-py's cluster command path
(``RedisCluster.execute_command``): what :mod:`aiolock._calls` guarantees holds per connection
(a cancelled caller leaves at once while the reply is read in the background and settled; no
``asyncio.wait_for`` in the send path, which on Python 3.11 may swallow a cancellation; resends
only of idempotent scripts), and redis-py's cluster path offers none of it: it retries and
re-routes on its own, and a cancellation mid-read leaves the outcome unknown to us.  So each
node is the single-server transport, and this router adds what a Cluster needs: which node
serves a slot (redis-py's ``NodesManager``, refreshed when a node answers MOVED), and resends
on redirection.  A MOVED, ASK, TRYAGAIN or CLUSTERDOWN reply means the script did not run, so
sending it again (to the new owner, after a pause) is always safe; the request id makes it
idempotent anyway.

Every script touches the keys of one lock, which share a hash tag, so the first key names the
slot; the watchdog groups its batches by slot (one call may not span slots: CROSSSLOT).

Pub/sub: when the nodes have sharded pub/sub (``SPUBLISH``, Redis and Valkey 7+; asked once,
with the topology), the scripts run in their :func:`~aiolock._scripts.sharded` variant and
:class:`ClusterTopology` puts each channel on a subscriber of its slot's node.  Otherwise the
scripts PUBLISH, which the Cluster bus broadcasts to every node, and one subscriber on any node
hears every channel.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, TryAgainError

from ._calls import Calls, Orphan
from ._pubsub import Home
from ._scripts import Script, sharded

__all__ = ["ClusterCalls", "ClusterTopology", "NodeConnections"]

_T = TypeVar("_T")

# A slot being migrated answers ASK or TRYAGAIN until the move completes (milliseconds for a
# lock's few keys); a failover answers CLUSTERDOWN for up to the node timeout.
_REDIRECT_DEADLINE: Final = 10.0


class NodeConnections:
    """One Cluster node as a connection source for :class:`Calls` (and the subscriber)."""

    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.max_connections = node.max_connections
        self.connection_class = node.connection_class
        self.connection_kwargs = node.connection_kwargs

    def make_connection(self) -> AbstractConnection:
        connection: AbstractConnection = self.connection_class(**self.connection_kwargs)
        return connection


class ClusterCalls:
    """Runs one client's scripts on the node that serves each call's slot."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._nodes: dict[str, Calls] = {}
        self._refreshing: asyncio.Lock | None = None
        self._ready = False
        self.sharded = False  # the nodes have sharded pub/sub (known once initialized)

    async def run(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
    ) -> Any:
        """:meth:`Calls.run` on the node of ``keys[0]``'s slot, following redirections."""
        return await self._routed(
            keys[0], lambda calls: calls.run(self._variant(script), keys, args, orphan=orphan)
        )

    async def run_synced(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        sync: tuple[int, float],
        orphan: Orphan | None = None,
    ) -> tuple[Any, int]:
        """:meth:`Calls.run_synced` on the node of ``keys[0]``'s slot (WAIT counts that
        primary's replicas), following redirections."""
        return await self._routed(
            keys[0],
            lambda calls: calls.run_synced(
                self._variant(script), keys, args, sync=sync, orphan=orphan
            ),
        )

    def _variant(self, script: Script) -> Script:
        return sharded(script) if self.sharded else script

    async def _routed(self, key: str, call: Callable[[Calls], Awaitable[_T]]) -> _T:
        await self.initialize()
        slot = key_slot(key.encode())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _REDIRECT_DEADLINE
        delay = 0.01
        while True:
            node = self._cluster.nodes_manager.get_node_from_slot(slot)
            try:
                return await call(self._calls(node))
            except (AskError, TryAgainError, ClusterDownError):  # MovedError is an AskError
                if loop.time() + delay > deadline:
                    raise
                await self.refresh()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def initialize(self) -> None:
        """Learn the topology once, before any concurrent use.

        redis-py 8.1's ``RedisCluster`` may fail (``'NoneType' object has no attribute
        'writelines'``) when its very first commands run concurrently.
        """
        if self._ready:
            return
        async with self._lock():
            if not self._ready:
                await self._cluster.initialize()
                self.sharded = await _has_sharded_pubsub(self._cluster.get_primaries()[0])
                self._ready = True

    def nodes(self) -> list[NodeConnections]:
        """Every node the client knows of (primaries first); the startup nodes until the
        topology is known (the subscriber may connect while the first call learns it)."""
        known = self._cluster.get_nodes() or list(
            self._cluster.nodes_manager.startup_nodes.values()
        )
        nodes = sorted(known, key=lambda node: node.server_type != "primary")
        return [NodeConnections(node) for node in nodes]

    def _calls(self, node: ClusterNode) -> Calls:
        calls = self._nodes.get(node.name)
        if calls is None:
            calls = self._nodes[node.name] = Calls(NodeConnections(node))
        return calls

    def node_of(self, key: bytes) -> ClusterNode:
        """The primary that serves ``key``'s slot, as far as the client knows."""
        node: ClusterNode = self._cluster.nodes_manager.get_node_from_slot(key_slot(key))
        return node

    async def refresh(self) -> None:
        """Read the topology again (a slot moved, or a replica took over): one at a time."""
        lock = self._lock()
        if lock.locked():
            async with lock:  # somebody is refreshing it already: wait for theirs
                return
        async with lock:
            await self._cluster.nodes_manager.initialize()

    def _lock(self) -> asyncio.Lock:
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        return self._refreshing

    async def aclose(self, grace: float) -> None:
        """Close every node's connections (see :meth:`Calls.aclose`)."""
        await asyncio.gather(*(calls.aclose(grace) for calls in self._nodes.values()))


async def _has_sharded_pubsub(node: ClusterNode) -> bool:
    """Whether ``node`` knows SPUBLISH (``COMMAND INFO`` answers ``[nil]`` for an unknown
    command; read raw: redis-py's parser of that reply fails on a nil)."""
    connection = NodeConnections(node).make_connection()
    try:
        await connection.connect()  # type: ignore[no-untyped-call]
        await connection.send_command("COMMAND", "INFO", "SPUBLISH")
        reply = await connection.read_response()
    finally:
        await connection.disconnect()
    return isinstance(reply, list) and bool(reply) and reply[0] is not None


class ClusterTopology:
    """Which subscriber carries a channel on a Cluster (see :class:`aiolock._pubsub.Topology`).

    Sharded: the one of the node that serves the channel's slot.  Classic: one subscriber on
    any node; each reconnect takes the next node, so a dead one is skipped.
    """

    def __init__(self, calls: ClusterCalls) -> None:
        self._calls = calls
        self._turns = itertools.count()
        self._any = Home("", self._any_node)

    @property
    def sharded(self) -> bool:
        return self._calls.sharded

    async def ready(self) -> None:
        await self._calls.initialize()

    async def refresh(self) -> None:
        await self._calls.initialize()
        await self._calls.refresh()

    def home(self, channel: bytes) -> Home:
        if not self._calls.sharded:
            return self._any
        node = self._calls.node_of(channel)
        connections = NodeConnections(node)
        return Home(node.name, lambda: connections)

    def _any_node(self) -> NodeConnections:
        nodes = self._calls.nodes()
        return nodes[next(self._turns) % len(nodes)]
