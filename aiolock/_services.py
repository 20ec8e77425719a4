"""The one object a lock kind is handed: everything it may use of its client, and nothing more.

Lock objects never see :class:`~aiolock.Client`'s privates.  They receive this bundle of the
client's services (script calls, pub/sub, the hold registry, the watchdog, owner ids) and its
options, plus a cache of per-name state shared by all lock objects of one kind and name.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from redis.asyncio import Redis, RedisCluster

from ._calls import Calls
from ._cluster import ClusterCalls
from ._holds import Holds
from ._metrics import Metrics, Tracing
from ._owners import Owners
from ._pubsub import PubSub
from ._transaction import CommandTable
from ._watchdog import Watchdog

__all__ = ["Services"]

_State = TypeVar("_State")


@dataclass(eq=False, slots=True)
class Services:
    """A client's services and options, as its lock objects see them."""

    redis: Redis | RedisCluster
    calls: Calls | ClusterCalls
    pubsub: PubSub
    holds: Holds
    watchdog: Watchdog
    owners: Owners
    key_prefix: str
    watchdog_timeout: float
    fair_wait_timeout: float
    metrics: Metrics | None = None  # None: opentelemetry is not installed (see _metrics)
    tracing: Tracing | None = None  # likewise
    cluster: bool = False  # a Redis Cluster: per-slot fencing counters and renewal batches
    sync: tuple[int, float] | None = None  # (replicas, seconds) every grant waits for
    closed: bool = False
    # The server's commands, for transactions (made at first use: most clients never need it).
    commands: CommandTable | None = None
    # Per (kind, name) state, shared by every lock object of that kind and name while one
    # exists: thousands of waiters on a few names hold one copy of the keys and counters each.
    _names: weakref.WeakValueDictionary[tuple[str, str], object] = field(
        default_factory=weakref.WeakValueDictionary
    )

    # Where the client connects, without credentials (``redis://host:port/db``), as it was
    # given: fixed here, since a Cluster client's known nodes change with its first call and
    # with failovers (a MultiLock orders parts of the same key on two servers by it).
    server: str = field(init=False)

    def __post_init__(self) -> None:
        self.server = _address(self.redis)

    def check_open(self) -> Services:
        if self.closed:
            raise RuntimeError("the aiolock client is closed")
        return self

    def command_table(self) -> CommandTable:
        """What transactions need to know of the server's commands (made once per client)."""
        if self.commands is None:
            self.commands = CommandTable(self.redis)
        return self.commands

    def name_state(self, kind: str, name: str, build: Callable[[], _State]) -> _State:
        """The shared state of ``kind``/``name``, made by ``build()`` if none is alive."""
        state = self._names.get((kind, name))
        if state is None:
            state = build()
            self._names[(kind, name)] = state
        return state  # type: ignore[return-value]


def _address(redis: Redis | RedisCluster) -> str:
    if isinstance(redis, RedisCluster):
        nodes = redis.nodes_manager.startup_nodes.values()
        return "redis-cluster://" + ",".join(sorted(node.name for node in nodes))
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    secure = "SSL" in redis.connection_pool.connection_class.__name__
    scheme = "rediss" if secure else "redis"
    host, port, db = kwargs.get("host", "?"), kwargs.get("port", "?"), kwargs.get("db", 0)
    return f"{scheme}://{host}:{port}/{db}"
