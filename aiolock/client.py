"""``Client``: one Redis connection pool, one client id, and the services its locks share.

A client owns (or wraps) a ``redis.asyncio.Redis``, the pub/sub service that waiting tasks share,
the watchdog that renews ``lease=None`` holds, and the registry of what it holds.  Lock objects
are cheap views onto these; create as many as you like.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from redis.asyncio import Redis

from ._calls import Calls
from ._holds import Hold, Holds
from ._owners import Owners
from ._pubsub import PubSub
from ._services import Services
from ._validate import check_name, check_timeout
from ._watchdog import Watchdog
from .lock import AsyncRLock

__all__ = ["Client", "ClientStatistics"]


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """A snapshot of one client (no I/O).

    :ivar holds: locks its owners hold now.
    :ivar waiters: its tasks waiting for a lock now.
    :ivar subscriptions: channels its subscriber connection is subscribed to.
    :ivar pubsub_connected: whether the subscriber connection is up.
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

    :param redis: an existing ``redis.asyncio.Redis``; the client uses it and never closes it.
    :param key_prefix: the first part of every key and channel (no braces).
    :param watchdog_timeout: the lease, in seconds, of locks taken with ``lease=None``; the
        watchdog renews them every third of it.
    :param subscribe_concurrency: the size of the semaphore pool that bounds concurrent
        SUBSCRIBE/UNSUBSCRIBE work, hashed by channel.

    Use it as an async context manager, or call :meth:`aclose` when done.  Closing stops the
    watchdog and the subscriber connection; locks still held then expire by their leases.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        key_prefix: str = "aiolock",
        watchdog_timeout: float = 30.0,
        subscribe_concurrency: int = 50,
    ) -> None:
        if not isinstance(redis, Redis):
            raise TypeError(f"redis must be a redis.asyncio.Redis, not {type(redis).__name__}")
        _check_options(key_prefix, watchdog_timeout, subscribe_concurrency)
        self._init(redis, key_prefix, float(watchdog_timeout), subscribe_concurrency, owns=False)

    def _init(
        self, redis: Redis, prefix: str, watchdog_timeout: float, concurrency: int, *, owns: bool
    ) -> None:
        self.id = str(uuid.uuid4())
        self.key_prefix = prefix
        self.watchdog_timeout = watchdog_timeout
        self._owns_redis = owns
        calls = Calls(redis)
        pubsub = PubSub(redis, concurrency=concurrency)

        # A hold that ends without a release (its lease ran out, say) publishes nothing: this
        # client's own waiters may be parked behind it without a TTL to go by.  Wake one.
        def on_loss(hold: Hold) -> None:
            if hold.channel is not None:
                pubsub.wake(hold.channel)

        holds = Holds(on_loss=on_loss)
        self._services = Services(
            redis=redis,
            calls=calls,
            pubsub=pubsub,
            holds=holds,
            watchdog=Watchdog(calls, holds, lease=watchdog_timeout),
            owners=Owners(self.id),
            key_prefix=prefix,
            watchdog_timeout=watchdog_timeout,
            fair_wait_timeout=5.0,
        )

    @property
    def redis(self) -> Redis:
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
        **redis_options: Any,
    ) -> Client:
        """A client with a connection pool of its own, closed by :meth:`aclose`.

        Extra keyword arguments go to ``redis.asyncio.Redis.from_url``.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        _check_options(key_prefix, watchdog_timeout, subscribe_concurrency)
        client = cls.__new__(cls)
        redis = Redis.from_url(url, **redis_options)
        client._init(redis, key_prefix, float(watchdog_timeout), subscribe_concurrency, owns=True)
        return client

    # -- factories ---------------------------------------------------------------------------

    def lock(self, name: str, *, owner: str | None = None) -> AsyncRLock:
        """A reentrant lock named ``name`` (no I/O).

        :param owner: bind the lock object to this explicit owner instead of the calling task,
            so that one task may acquire and another release.
        """
        check_name(name)
        if owner is not None:
            check_name(owner, "owner")
        return AsyncRLock(self._services, name, owner)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._services.closed

    async def aclose(self) -> None:
        """Stop the watchdog and the subscriber connection; close an owned connection pool.

        Releases that are finishing in the background get a moment to land first.
        """
        services = self._services
        if services.closed:
            return
        services.closed = True
        pending = services.holds.pending()
        if pending:
            await asyncio.wait(pending, timeout=self.watchdog_timeout / 3)
        await services.watchdog.aclose()
        await services.pubsub.aclose()
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
            f"<Client {self.id} {_describe(self.redis)} [{state}, holds:{stats.holds}, "
            f"waiters:{stats.waiters}, subscriptions:{stats.subscriptions}]>"
        )


def _check_options(key_prefix: object, watchdog_timeout: object, concurrency: object) -> None:
    check_name(key_prefix, "key_prefix")
    assert isinstance(key_prefix, str)
    if "{" in key_prefix or "}" in key_prefix:
        raise ValueError("key_prefix must not contain '{' or '}' (they set Redis hash tags)")
    # Renewals run every third of it: below 10 ms the watchdog would only spin.
    check_timeout(watchdog_timeout, "watchdog_timeout", minimum=0.01)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise TypeError(f"subscribe_concurrency must be an int, not {type(concurrency).__name__}")
    if concurrency < 1:
        raise ValueError(f"subscribe_concurrency must be at least 1, got {concurrency}")


def _describe(redis: Redis) -> str:
    """Where ``redis`` connects, without credentials."""
    kwargs = redis.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    secure = "SSL" in redis.connection_pool.connection_class.__name__
    scheme = "rediss" if secure else "redis"
    return f"{scheme}://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
