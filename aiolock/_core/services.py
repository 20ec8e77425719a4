"""The one object a lock kind is handed: everything it may use of its client, and nothing more.

Lock objects never see :class:`~aiolock.Client`'s privates.  They receive this bundle of the
client's services (script calls, pub/sub, the hold registry, the watchdog, owner ids) and its
options, plus a cache of per-name state shared by all lock objects of one kind and name.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode

from .._redis.calls import Runner
from .._redis.pubsub import PubSub
from .._redis.redispy import retry_policy
from .holds import Holds
from .metrics import Metrics, Tracing
from .owners import Owners
from .transaction import CommandTable
from .watchdog import Watchdog

__all__ = ["Services", "resend_window"]

_State = TypeVar("_State")


@dataclass(eq=False, slots=True)
class Services:
    """A client's services and options, as its lock objects see them."""

    redis: Redis | RedisCluster
    calls: Runner
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
    # A plain lock's grant message for a waiter of this client, on the loop, before its call
    # is woken: aiolock.sync's threads are told at once, by (lock's registry key, message);
    # True when told (see aiolock.sync._direct.answer_message).
    answer_grant: Callable[[str, bytes], bool] | None = None
    # The event loop that first used the client: its connections, pub/sub reader, watchdog
    # and timers live there, and a call from another loop would fail deep in asyncio and
    # leave them broken (see check_loop).
    loop: asyncio.AbstractEventLoop | None = None
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
    # How long after a call a copy of it may still reach the server (ms), from the client's
    # retry policy: what a marker against a resent or undone call lives (see resend_window).
    resend_window_ms: int = field(init=False)

    def __post_init__(self) -> None:
        self.server = _address(self.redis)
        self.resend_window_ms = round(resend_window(self.redis) * 1000)

    def check_open(self) -> Services:
        """These services, for a call on a client that is open and on its own event loop
        (every call that may do I/O passes here first)."""
        if self.closed:
            raise RuntimeError("the aiolock client is closed")
        if asyncio.get_running_loop() is not self.loop:
            self.check_loop()
        return self

    def check_loop(self) -> None:
        """Refuse a call from an event loop other than the one that first used the client,
        before any I/O; the first call binds the client to its loop."""
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
        elif loop is not self.loop:
            since = ", which has closed since" if self.loop.is_closed() else ""
            raise RuntimeError(
                "this aiolock client belongs to the event loop that first used it"
                f"{since}, and was called from another one: use one client per event loop "
                "(its connections, pub/sub reader and watchdog live on that loop); make the "
                "client inside the loop that uses it, e.g. in the coroutine given to "
                "asyncio.run()"
            )

    def command_table(self) -> CommandTable:
        """What transactions need to know of the server's commands (made once per client)."""
        if self.commands is None:
            self.commands = CommandTable(self.redis)
        return self.commands

    def name_state(self, namespace: str, name: str, build: Callable[[], _State]) -> _State:
        """The shared state of ``name`` in ``namespace`` (a kind's, or one of its parts' such
        as ``fair-watch``), made by ``build()`` if none is alive."""
        state = self._names.get((namespace, name))
        if state is None:
            state = build()
            self._names[(namespace, name)] = state
        return state  # type: ignore[return-value]

    def peek_name_state(self, namespace: str, name: str) -> object | None:
        """The shared state of ``name`` in ``namespace`` if one is alive (made by nobody here)."""
        return self._names.get((namespace, name))


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


# The shortest window: a copy on a connection that failed comes within a few seconds, if ever.
_WINDOW_FLOOR: Final = 2.0
# A socket without a timeout bounds nothing: the window then is what markers always lived.
_UNBOUNDED_WINDOW: Final = 60.0


def resend_window(redis: Redis | RedisCluster) -> float:
    """How long (s) after the client sent a call a copy of it may still reach the server.

    A late copy exists only after a fault: an attempt that went out on a connection that then
    failed (the call was resent, or its outcome stayed unknown).  The client's own retry policy
    bounds the call: each attempt connects and then waits at most the socket timeouts, and
    there are ``retries + 1`` attempts with a backoff (at most its cap) between them.  A copy
    still on its way after that is taken to be lost with its connection.  At least
    ``_WINDOW_FLOOR``; ``_UNBOUNDED_WINDOW`` when a socket timeout is unset (nothing bounds it).
    """
    if isinstance(redis, RedisCluster):
        kwargs = dict(redis.nodes_manager.connection_kwargs)
        node = ClusterNode(kwargs.pop("host", "localhost"), kwargs.pop("port", 6379), **kwargs)
        conn: Any = node.connection_class(**node.connection_kwargs)  # never connected
    else:
        conn = redis.connection_pool.make_connection()  # type: ignore[no-untyped-call]
    timeout, connect = conn.socket_timeout, conn.socket_connect_timeout or conn.socket_timeout
    if timeout is None or connect is None:
        return _UNBOUNDED_WINDOW
    retries, pause = retry_policy(conn.retry) if conn.retry is not None else (0, 0.0)
    if retries < 0:  # retries without end: nothing bounds a copy's arrival
        return _UNBOUNDED_WINDOW
    window = (retries + 1) * (float(timeout) + float(connect)) + retries * float(pause)
    return window if math.isfinite(window) and window > _WINDOW_FLOOR else _WINDOW_FLOOR
