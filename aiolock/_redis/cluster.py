"""Script calls on a Redis Cluster: one :class:`~aiolock._redis.calls.Calls` per node, by slot.

Why aiolock's own per-node connections rather than redis-py's cluster command path
(``RedisCluster.execute_command``): what :mod:`aiolock._redis.calls` guarantees holds per connection
(a cancelled caller leaves at once while the reply is read in the background and settled; no
``asyncio.wait_for`` in the send path, which on Python 3.11 may swallow a cancellation; resends
only of idempotent scripts), and redis-py's cluster path offers none of it: it retries and
re-routes on its own, and a cancellation mid-read leaves the outcome unknown to us.  So each
node is the single-server transport, and this router adds what a Cluster needs: which node
serves a slot (redis-py's ``NodesManager``, refreshed when a node answers MOVED), and resends
on redirection.  A MOVED, ASK, TRYAGAIN or CLUSTERDOWN reply means the script did not run, so
sending it again (to the new owner, after a pause) is always safe; the request id makes it
idempotent anyway.

**A node that dies** (a primary killed; its replica takes over after the cluster's node
timeout) answers nothing: connecting fails, or a call in flight fails or times out.  Each such
failure refreshes the topology, so that once the replica is promoted the next call goes there.
A call that never reached the node (every connect failed) is resent, to the slot's owner as
then known, until the same deadline as a redirection: an acquire waits out a failover.  A call
that did reach it has an unknown outcome, which :mod:`aiolock._core.settlement` settles with
the same request id (a grant undone, a release completed); so it is not resent here but
raised, as on one server.  Resending it would be worse than useless: the settlement of the
failed attempt would undo the grant its resend returned, since both carry the same request id.

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
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._scripts import Script, sharded
from .auth import cluster_asked_for_password
from .calls import Calls, Orphan, Runner
from .pubsub import Home

__all__ = ["ClusterCalls", "ClusterTopology", "NodeConnections", "node_of"]

_T = TypeVar("_T")

logger = logging.getLogger("aiolock.cluster")

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


class ClusterCalls(Runner):
    """Runs one client's scripts on the node that serves each call's slot, following
    redirections (a redirected call did not run: sending it on is not a resend)."""

    def __init__(self, cluster: RedisCluster) -> None:
        self._cluster = cluster
        self._nodes: dict[str, Calls] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._initializing: asyncio.Task[None] | None = None
        self._ready = False
        self.sharded = False  # every primary has sharded pub/sub (known once initialized)

    async def run_synced(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        sync: tuple[int, float] | None,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
        mark_resends: int = 0,
        no_resend: bool = False,
    ) -> tuple[Any, int]:
        """:meth:`Calls.run_synced` on the node of ``keys[0]``'s slot (WAIT counts that
        primary's replicas), following redirections."""
        return await self._routed(
            keys[0],
            lambda calls, orphan: calls.run_synced(
                self._variant(script),
                keys,
                args,
                sync=sync,
                orphan=orphan,
                on_send=on_send,
                mark_resends=mark_resends,
                no_resend=no_resend,
            ),
            orphan,
        )

    async def command(
        self,
        key: str,
        command: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
    ) -> Any:
        """:meth:`Calls.command` on the node of ``key``'s slot, following redirections."""
        return await self._routed(
            key,
            lambda calls, orphan: calls.command(key, command, orphan=orphan, on_send=on_send),
            orphan,
        )

    async def publish(self, channel: str, message: str) -> None:
        await self.initialize()  # it tells whether the nodes have sharded pub/sub
        verb = "SPUBLISH" if self.sharded else "PUBLISH"
        await self.command(channel, (verb, channel, message))

    def _variant(self, script: Script) -> Script:
        return sharded(script) if self.sharded else script

    async def _routed(
        self,
        key: str,
        call: Callable[[Calls, Orphan], Awaitable[_T]],
        orphan: Orphan | None,
    ) -> _T:
        await self.initialize()
        slot = key_slot(key.encode())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _REDIRECT_DEADLINE
        delay = 0.01
        while True:
            # Whether this attempt reached a node: Calls hands the outcome of every call that
            # did (or whose caller was cancelled) to the orphan callback.
            orphaned = False

            def unknown(work: asyncio.Future[Any]) -> None:
                nonlocal orphaned
                orphaned = True
                if orphan is not None:
                    orphan(work)

            try:
                node = self._cluster.nodes_manager.get_node_from_slot(slot)
            except SlotNotCoveredError as exc:  # the last refresh saw a failover half-way
                if loop.time() + delay > deadline:
                    raise ClusterDownError(f"no node serves slot {slot}") from exc
                await self._pause_and_refresh(delay)
                delay = min(delay * 2, 0.5)
                continue
            # Raised from the except clauses, never kept in a local: a local holding the error
            # whose traceback holds this frame is a reference cycle, and a fault's worth of
            # frames for the garbage collector (issue 42).
            try:
                return await call(self._calls(node), unknown)
            except (AskError, TryAgainError, ClusterDownError):  # MOVED is an ASK
                if loop.time() + delay > deadline:
                    await self.refresh()
                    raise
            except (RedisConnectionError, RedisTimeoutError):
                # The node is unreachable: a failover may be under way.  Only a call that never
                # reached the node may be sent again.
                if orphaned or loop.time() + delay > deadline:
                    await self.refresh()
                    raise
            await self._pause_and_refresh(delay)
            delay = min(delay * 2, 0.5)

    async def _pause_and_refresh(self, delay: float) -> None:
        await self.refresh()
        await asyncio.sleep(delay)

    async def initialize(self) -> None:
        """Learn the topology once, before any concurrent use.

        redis-py 8.1's ``RedisCluster`` may fail (``'NoneType' object has no attribute
        'writelines'``) when its very first commands run concurrently: one task learns it, and
        every caller awaits that task through a shield, as :meth:`refresh` does (redis-py
        connects through ``asyncio.wait_for``, which on Python 3.11 may swallow a
        cancellation: the first acquire's deadline would pass unnoticed).  A failed one is
        started again by the next caller.
        """
        if self._ready:
            return
        task = self._initializing
        if task is None or task.done():
            task = self._initializing = asyncio.get_running_loop().create_task(self._learn())
            # Retrieved here too: every caller may have left before it failed.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(task)

    async def _learn(self) -> None:
        try:
            await self._cluster.initialize()
        except RedisClusterException as exc:
            told = cluster_asked_for_password(exc, self._cluster)
            if told is not None:
                raise told from exc
            raise
        # Sharded only if every primary that answers has it (a cluster half-way through an
        # upgrade from Redis 6 would fail the releases' SPUBLISH on the others); one that
        # cannot be reached (a failover under way) is not asked.
        primaries = self._cluster.get_primaries()
        found = await asyncio.gather(*(_has_sharded_pubsub(node) for node in primaries))
        answers = [answer for answer in found if answer is not None]
        self.sharded = bool(answers) and all(answers)
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

    def serving(self, key: bytes) -> ClusterNode:
        """The primary that serves ``key``'s slot, as far as the client knows."""
        node: ClusterNode = self._cluster.nodes_manager.get_node_from_slot(key_slot(key))
        return node

    async def refresh(self) -> None:
        """Read the topology again (a slot moved, or a replica took over): one refresh at a
        time, which every caller that asks meanwhile waits for.

        It runs in a task of its own, which the caller awaits through a shield: redis-py
        connects through ``asyncio.wait_for``, which on Python 3.11 may swallow a cancellation
        (an acquire's deadline would then pass unnoticed).  A refresh that fails (no node
        reachable, or the slots not covered while a failover is under way) leaves the old
        topology: the next call's failure refreshes it again.
        """
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.get_running_loop().create_task(self._read_topology())
        await asyncio.shield(task)

    async def _read_topology(self) -> None:
        try:
            await self._cluster.nodes_manager.initialize()
        except (RedisConnectionError, RedisTimeoutError, RedisClusterException) as exc:
            logger.warning("could not refresh the Cluster topology: %r", exc)

    async def aclose(self, grace: float) -> None:
        """Close every node's connections (see :meth:`Calls.aclose`)."""
        for task in (self._refreshing, self._initializing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        await asyncio.gather(*(calls.aclose(grace) for calls in self._nodes.values()))


async def node_of(cluster: RedisCluster, key: str) -> Redis:
    """A redis-py client (close it after use) on the primary that serves ``key``'s slot, made with
    the cluster client's connection settings: for a MULTI of reads on that one node."""
    await cluster.initialize()
    primary = cluster.get_node_from_key(key)
    if primary is None:
        raise ClusterDownError(f"no node serves the slot of {key!r}")
    node = NodeConnections(primary)
    pool = ConnectionPool(connection_class=node.connection_class, **node.connection_kwargs)
    return Redis.from_pool(pool)


async def _has_sharded_pubsub(node: ClusterNode) -> bool | None:
    """Whether ``node`` knows SPUBLISH (``COMMAND INFO`` answers ``[nil]`` for an unknown
    command; read raw: redis-py's parser of that reply fails on a nil); ``None`` if it cannot
    be reached."""
    connection = NodeConnections(node).make_connection()
    try:
        await connection.connect()  # type: ignore[no-untyped-call]
        await connection.send_command("COMMAND", "INFO", "SPUBLISH")
        reply = await connection.read_response()
    except (RedisConnectionError, RedisTimeoutError, OSError):
        return None
    finally:
        await connection.disconnect()
    return isinstance(reply, list) and bool(reply) and reply[0] is not None


class ClusterTopology:
    """Which subscriber carries a channel on a Cluster (:class:`aiolock._redis.pubsub.Topology`).

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
        node = self._calls.serving(channel)
        connections = NodeConnections(node)
        return Home(node.name, lambda: connections)

    def _any_node(self) -> NodeConnections:
        nodes = self._calls.nodes()
        return nodes[next(self._turns) % len(nodes)]
