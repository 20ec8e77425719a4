"""``Client``: one Redis connection pool, one client id, and the services its locks share.

A client owns (or wraps) a ``redis.asyncio.Redis``, the pub/sub service that waiting tasks share,
the watchdog that renews ``lease=None`` holds, and the registry of what it holds.  Lock objects
are cheap views onto these; create as many as you like.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from redis.asyncio import Redis, RedisCluster

from ._core.habits import REDIS_PY_KEYWORDS, redis_py_keyword, teaching
from ._core.holds import Hold, Holds
from ._core.metrics import metrics, tracing
from ._core.names import P, R, locked
from ._core.owners import Owners
from ._core.services import Services
from ._core.validate import check_name, check_permits, check_timeout
from ._core.watchdog import Watchdog
from ._redis.calls import Calls
from ._redis.cluster import ClusterCalls, ClusterTopology
from ._redis.pubsub import OneServer, PubSub, Topology
from .fair import AsyncFairLock
from .latch import AsyncCountDownLatch
from .lock import AsyncRLock
from .rw import AsyncReadWriteLock
from .semaphore import AsyncSemaphore
from .spin import AsyncSpinLock

__all__ = ["Client", "ClientStatistics"]


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of one client (no I/O).

    :ivar holds: locks its owners hold now.
    :ivar waiters: its tasks waiting for a lock now.
    :ivar subscriptions: channels its subscriber connection is subscribed to.
    :ivar pubsub_connected: whether the subscriber connections are up (on a Cluster with sharded
        pub/sub, one per node that has waiters).
    :ivar renewals: successful watchdog renewals so far.
    :ivar pending: background settlements in flight (releases finishing after a cancellation).
    """

    holds: int
    waiters: int
    subscriptions: int
    pubsub_connected: bool
    renewals: int
    pending: int


class Client:
    """The entry point: ``aiolock.Client.from_url(url)`` or ``aiolock.Client(redis)``.

    :param redis: an existing ``redis.asyncio.Redis``, or a ``redis.asyncio.RedisCluster``; the
        client uses it and never closes it.
    :param key_prefix: the first part of every key and channel (no braces).
    :param watchdog_timeout: the lease, in seconds, of locks taken with ``lease=None``; the
        watchdog renews them every third of it.
    :param subscribe_concurrency: the size of the semaphore pool that bounds concurrent
        SUBSCRIBE/UNSUBSCRIBE work, hashed by channel.
    :param fair_wait_timeout: how long, in seconds, a fair lock's waiter that is no longer kept
        (its process died) keeps its place in the queue.
    :param sync_replicas: make every grant wait (``WAIT``) until that many replicas have it; a
        grant they do not confirm within ``sync_timeout`` seconds is undone, and the call
        raises :class:`~aiolock.LockSyncError`.  The watchdog's renewals wait too: one they do
        not confirm extends nothing (a failover would forget it).  0 (the default): nothing
        waits.

    Use it as an async context manager, or call :meth:`aclose` when done.  Closing stops the
    watchdog and the subscriber connection; locks still held then expire by their leases.

    A client belongs to the event loop that first uses it: a call from another loop raises
    :class:`RuntimeError` before any I/O.  Make one client per event loop.
    """

    @teaching
    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        key_prefix: str = "aiolock",
        watchdog_timeout: float = 30.0,
        subscribe_concurrency: int = 50,
        fair_wait_timeout: float = 5.0,
        sync_replicas: int = 0,
        sync_timeout: float = 1.0,
        trace_names: bool = False,
    ) -> None:
        if not isinstance(redis, Redis | RedisCluster):
            raise TypeError(
                f"redis must be a redis.asyncio.Redis or RedisCluster, not {type(redis).__name__}"
            )
        self._init(redis, _Options.given(locals()), owns=False)

    def _init(self, redis: Redis | RedisCluster, options: _Options, *, owns: bool) -> None:
        self.id = str(uuid.uuid4())
        self.key_prefix = options.key_prefix
        self.watchdog_timeout = options.watchdog_timeout
        self._owns_redis = owns
        calls: Calls | ClusterCalls
        topology: Topology
        if isinstance(redis, RedisCluster):
            calls = ClusterCalls(redis)
            topology = ClusterTopology(calls)
        else:
            calls = Calls(redis.connection_pool)
            topology = OneServer(redis.connection_pool)
        pubsub = PubSub(topology, concurrency=options.subscribe_concurrency)

        # A hold that ends without a release (its lease ran out, say) publishes nothing: this
        # client's own waiters may be parked behind it without a TTL to go by.  Wake one.
        def on_loss(hold: Hold) -> None:
            for channel in hold.channels:
                pubsub.wake(channel)

        # Waiters parked behind a hold of their own client may count on it to tell them of the
        # hold's end (the plain lock's behind a renewed hold: see LineEntry.hold_ended).
        def on_end(hold: Hold) -> None:
            for channel in hold.channels:
                pubsub.hold_ended(channel)

        recorder = metrics()  # None without opentelemetry: nothing is recorded
        tracer = tracing(options.trace_names)  # None without opentelemetry too
        holds = Holds(on_loss=on_loss, metrics=recorder, tracing=tracer, on_end=on_end)
        sync = (options.sync_replicas, options.sync_timeout) if options.sync_replicas else None
        self._services = Services(
            redis=redis,
            calls=calls,
            pubsub=pubsub,
            holds=holds,
            watchdog=Watchdog(
                calls,
                holds,
                lease=options.watchdog_timeout,
                per_slot=isinstance(redis, RedisCluster),
                sync=sync,
            ),
            owners=Owners(self.id),
            key_prefix=options.key_prefix,
            watchdog_timeout=options.watchdog_timeout,
            fair_wait_timeout=options.fair_wait_timeout,
            metrics=recorder,
            tracing=tracer,
            cluster=isinstance(redis, RedisCluster),
            sync=sync,
        )

    @property
    def redis(self) -> Redis | RedisCluster:
        """The ``redis.asyncio`` client this client uses (for your own commands and tools)."""
        return self._services.redis

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        key_prefix: str = "aiolock",
        watchdog_timeout: float = 30.0,
        subscribe_concurrency: int = 50,
        fair_wait_timeout: float = 5.0,
        sync_replicas: int = 0,
        sync_timeout: float = 1.0,
        trace_names: bool = False,
        cluster: bool = False,
        **redis_options: Any,
    ) -> Client:
        """A client with a connection pool of its own, closed by :meth:`aclose`.

        :param cluster: connect to a Redis Cluster (``url`` names any of its nodes).

        Extra keyword arguments go to ``redis.asyncio.Redis.from_url`` (or
        ``RedisCluster.from_url``).
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        for keyword in redis_options:
            # redis-py's connections refuse them too, deep in its pool: say what they are here.
            if keyword in REDIS_PY_KEYWORDS:
                sockets = (
                    " (redis-py's socket timeouts are socket_timeout= and socket_connect_timeout=)"
                    if keyword == "timeout"
                    else ""
                )
                raise TypeError(redis_py_keyword("Client.from_url()", keyword) + sockets)
        options = _Options.given(locals())
        client = cls.__new__(cls)
        if not isinstance(cluster, bool):
            raise TypeError(f"cluster must be a bool, not {type(cluster).__name__}")
        redis: Redis | RedisCluster = (
            RedisCluster.from_url(url, **redis_options)
            if cluster
            else Redis.from_url(url, **redis_options)
        )
        client._init(redis, options, owns=True)
        return client

    # -- factories ---------------------------------------------------------------------------

    @teaching
    def lock(self, name: str, *, owner: str | None = None) -> AsyncRLock:
        """A reentrant lock named ``name`` (no I/O).

        :param owner: bind the lock object to this explicit owner instead of the calling task,
            so that one task may acquire and another release.
        """
        return AsyncRLock(self._services, *_name_and_owner(name, owner))

    @teaching
    def fair_lock(self, name: str, *, owner: str | None = None) -> AsyncFairLock:
        """A reentrant lock granted first come, first served across all clients (no I/O).

        A waiter whose process vanished delays those behind it by at most the client's
        ``fair_wait_timeout``; see :class:`~aiolock.AsyncFairLock`.
        """
        return AsyncFairLock(self._services, *_name_and_owner(name, owner))

    @teaching
    def spin_lock(
        self,
        name: str,
        *,
        owner: str | None = None,
        initial_delay: float = 0.001,
        max_delay: float = 0.128,
    ) -> AsyncSpinLock:
        """A reentrant lock that never subscribes: it sleeps a jittered backoff between tries.

        :param initial_delay: the first backoff bound, in seconds; it doubles up to ``max_delay``.
        """
        name, owner = _name_and_owner(name, owner)
        initial = check_timeout(initial_delay, "initial_delay", minimum=0.0001)
        maximum = check_timeout(max_delay, "max_delay", minimum=0.0001)
        if maximum < initial:
            raise ValueError(
                f"max_delay must not be less than initial_delay, got {max_delay} < {initial_delay}"
            )
        return AsyncSpinLock(self._services, name, owner, initial_delay=initial, max_delay=maximum)

    @teaching
    def locked(
        self, name_template: str, *, wait: float | None = None, lease: float | None = None
    ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
        """A decorator that runs a coroutine function under ``client.lock(name)``.

        The name is ``name_template.format(**arguments)``, the call's arguments bound to the
        function's parameters (defaults applied)::

            @client.locked("orders:{order_id}", wait=5)
            async def ship(order_id: int) -> None: ...

        A placeholder that names no parameter raises :class:`ValueError` when decorating;
        :class:`~aiolock.LockTimeoutError` propagates from the call when ``wait`` runs out.
        """
        return locked(self.lock, name_template, wait, lease)

    @teaching
    def rw_lock(self, name: str) -> AsyncReadWriteLock:
        """A read-write lock named ``name`` (no I/O): ``.read_lock()`` and ``.write_lock()``."""
        return AsyncReadWriteLock(self._services, check_name(name))

    @teaching
    def semaphore(self, name: str, permits: int) -> AsyncSemaphore:
        """A semaphore named ``name`` with at most ``permits`` leased permits held (no I/O)."""
        check_name(name)
        return AsyncSemaphore(self._services, name, check_permits(permits))

    @teaching
    def countdown_latch(self, name: str) -> AsyncCountDownLatch:
        """A countdown latch named ``name`` (no I/O): wait, across clients, for a count of 0."""
        return AsyncCountDownLatch(self._services, check_name(name))

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`aclose` was called: new acquires then raise ``RuntimeError``."""
        return self._services.closed

    async def aclose(self) -> None:
        """Stop the watchdog and the subscriber connection; close an owned connection pool.

        Releases that are finishing in the background get a moment to land first.
        """
        services = self._services
        if services.closed:
            return
        services.check_loop()  # its tasks and connections can be closed on their loop only
        services.closed = True
        # Waiters are woken first, and given a loop pass to leave (a fair lock's waiter withdraws
        # from its queue): what they leave behind is settled with the rest below.
        await services.pubsub.aclose()
        await asyncio.sleep(0)
        pending = services.holds.pending()
        if pending:
            await asyncio.wait(pending, timeout=self.watchdog_timeout / 3)
        await services.watchdog.aclose()
        await services.calls.aclose(grace=self.watchdog_timeout / 3)
        services.holds.clear()
        services.owners.clear()  # identities never get reused: the counter goes on
        if self._owns_redis:
            await services.redis.aclose()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- observability -----------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """What the client holds, waits for and renews now, read from memory (no I/O)."""
        services = self._services
        pubsub = services.pubsub.statistics()
        return ClientStatistics(
            holds=len(services.holds),
            waiters=pubsub.waiters,
            subscriptions=pubsub.channels,
            pubsub_connected=pubsub.connected,
            renewals=services.watchdog.renewals,
            pending=len(services.holds.pending()),
        )

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "closed" if self.closed else "open"
        return (
            f"<Client {self.id} {self._services.server} [{state}, holds:{stats.holds}, "
            f"waiters:{stats.waiters}, subscriptions:{stats.subscriptions}]>"
        )


@dataclass(frozen=True, slots=True)
class _Options:
    """The client's options, checked.  Both constructors spell them out in their signatures
    (for readers, ``help()`` and type checkers); :meth:`given` reads them from there by name,
    so that adding one means adding it to the two signatures and here."""

    key_prefix: str
    watchdog_timeout: float
    subscribe_concurrency: int
    fair_wait_timeout: float
    sync_replicas: int
    sync_timeout: float
    trace_names: bool

    @classmethod
    def given(cls, arguments: Mapping[str, Any]) -> _Options:
        """The options among a constructor's ``arguments`` (its ``locals()``), checked in
        order: a bad one raises ``TypeError`` or ``ValueError`` naming it, before any I/O."""
        prefix = check_name(arguments["key_prefix"], "key_prefix")
        if "{" in prefix or "}" in prefix:
            raise ValueError("key_prefix must not contain '{' or '}' (they set Redis hash tags)")
        # Renewals run every third of it: below 10 ms the watchdog would only spin.
        watchdog = check_timeout(arguments["watchdog_timeout"], "watchdog_timeout", minimum=0.01)
        concurrency = arguments["subscribe_concurrency"]
        if isinstance(concurrency, bool) or not isinstance(concurrency, int):
            raise TypeError(
                f"subscribe_concurrency must be an int, not {type(concurrency).__name__}"
            )
        if concurrency < 1:
            raise ValueError(f"subscribe_concurrency must be at least 1, got {concurrency}")
        # The fair keep-alive calls every half of it: below 10 ms it would only spin.
        fair = check_timeout(arguments["fair_wait_timeout"], "fair_wait_timeout", minimum=0.01)
        replicas = arguments["sync_replicas"]
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise TypeError(f"sync_replicas must be an int, not {type(replicas).__name__}")
        if replicas < 0:
            raise ValueError(f"sync_replicas must be at least 0, got {replicas}")
        sync = check_timeout(arguments["sync_timeout"], "sync_timeout", minimum=0.001)
        trace_names = arguments["trace_names"]
        if not isinstance(trace_names, bool):
            raise TypeError(f"trace_names must be a bool, not {type(trace_names).__name__}")
        return cls(prefix, watchdog, concurrency, fair, replicas, sync, trace_names)


def owners_of(client: Client) -> Owners:
    """The owner ids of ``client`` (the declared seam through which ``aiolock.sync`` runs a
    call on the loop as the calling thread: :meth:`~aiolock._core.owners.Owners.act_for`)."""
    return client._services.owners


def answer_grants(client: Client, answer: Callable[[str, bytes], bool]) -> None:
    """Have ``answer`` see ``client``'s plain-lock grant messages before the loop wakes the
    waiting call (the declared seam through which ``aiolock.sync`` tells a waiting thread at
    once: :attr:`~aiolock._core.services.Services.answer_grant`)."""
    client._services.answer_grant = answer


def _name_and_owner(name: object, owner: object) -> tuple[str, str | None]:
    """A lock factory's ``name`` and ``owner``, checked before anything else happens."""
    return check_name(name), None if owner is None else check_name(owner, "owner")
