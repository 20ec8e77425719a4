"""One small adapter per lock implementation, so that every scenario is written once.

An :class:`Impl` is one implementation inside one process: it owns the Redis clients, and
:meth:`Impl.handle` gives each task a :class:`Handle` of its own (redis-py's and pottery's lock
objects keep the token of the current hold, so tasks must not share them).  Every handle has
``async acquire()`` (wait as long as it takes) and ``async release()``.

The async implementations share one connection-pool policy: a :class:`BlockingConnectionPool` of
:data:`POOL_SIZE` connections per process, as a service would configure it; without a cap a burst
of 5,000 waiters opens thousands of connections, whichever lock is used.

python-redis-lock is synchronous: with one task its calls run inline (the loop has nothing else
to do), with many they run in a thread per task, each blocked in its own ``BLPOP``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol

import redis
import redis.asyncio as aioredis
from redis.asyncio.lock import Lock as RedisPyLock

import aiolock

__all__ = [
    "IMPLS",
    "KEY_PREFIX",
    "PERMITS",
    "POOL_SIZE",
    "SHARED",
    "Handle",
    "Impl",
    "available",
    "available_shared",
    "make",
]

POOL_SIZE = 128
KEY_PREFIX = "bench"  # the aiolock clients' key_prefix
LEASE_S = 120  # every polling lock's lease, past the fan-in's two windows (aiolock: lease=None)
PERMITS = 5  # the semaphores' limit in the ``shared`` scenario


# Handles have __slots__: fan-in counts RSS per waiting task, and the harness' own objects should
# add as little to it as they can, for every implementation alike.
class Handle(Protocol):
    async def acquire(self) -> None: ...
    async def release(self) -> None: ...


class Impl(ABC):
    """One implementation in one process: ``open()``, ``handle(key)`` per task, ``aclose()``."""

    label: ClassVar[str]

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Create clients (inside the running loop)."""

    @abstractmethod
    def handle(self, key: str) -> Handle: ...

    @abstractmethod
    async def aclose(self) -> None: ...

    def _async_redis(self) -> aioredis.Redis:
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url, max_connections=POOL_SIZE, timeout=None
        )
        return aioredis.Redis(connection_pool=pool)


# -- aiolock ---------------------------------------------------------------------------------


class _AiolockHandle:
    __slots__ = ("_lock",)

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        await self._lock.lock()

    async def release(self) -> None:
        await self._lock.unlock()


class AiolockImpl(Impl):
    """``client.<factory>(key)``: ``lock`` today; ``fair_lock``/``spin_lock`` once they exist."""

    factory: ClassVar[str] = "lock"
    label = "aiolock AsyncRLock"

    async def open(self) -> None:
        self._redis = self._async_redis()
        self._client = aiolock.Client(self._redis, key_prefix=KEY_PREFIX)

    def handle(self, key: str) -> Handle:
        return _AiolockHandle(self.lock_object(key))

    def lock_object(self, key: str) -> Any:
        """The lock object a user makes: ``client.lock(key)`` (fan-in counts its waiters as a
        user writes them, ``await lock.try_lock(wait=None)`` in a task of their own)."""
        return getattr(self._client, self.factory)(key)

    async def aclose(self) -> None:
        await self._client.aclose()
        await self._redis.aclose()


class AiolockFairImpl(AiolockImpl):
    factory = "fair_lock"
    label = "aiolock fair_lock"


class AiolockSpinImpl(AiolockImpl):
    factory = "spin_lock"
    label = "aiolock spin_lock"


# -- redis-py --------------------------------------------------------------------------------


class _RedisPyHandle:
    __slots__ = ("_lock",)

    def __init__(self, lock: RedisPyLock) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        await self._lock.acquire()

    async def release(self) -> None:
        await self._lock.release()


class RedisPyImpl(Impl):
    """``redis.asyncio.lock.Lock``: SET NX PX, then sleep ``sleep`` seconds between tries."""

    sleep: ClassVar[float] = 0.1
    label = "redis-py Lock sleep=0.1"

    async def open(self) -> None:
        self._redis = self._async_redis()

    def handle(self, key: str) -> Handle:
        # thread_local=False: the default keeps the token in threading.local(), which every task
        # of the loop shares; each task has its own Lock object here anyway.
        lock = RedisPyLock(self._redis, key, timeout=LEASE_S, sleep=self.sleep, thread_local=False)
        return _RedisPyHandle(lock)

    async def aclose(self) -> None:
        await self._redis.aclose()


class RedisPyFastImpl(RedisPyImpl):
    sleep = 0.001
    label = "redis-py Lock sleep=0.001"


# -- the classic spin lock -------------------------------------------------------------------

# KEYS[1] the lock key; ARGV[1] the caller's token.  Returns 1 if it deleted its own lock, else 0.
_COMPARE_AND_DELETE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class _SpinHandle:
    __slots__ = ("_impl", "_key", "_token")

    def __init__(self, impl: SpinImpl, key: str) -> None:
        self._impl = impl
        self._key = key
        self._token = uuid.uuid4().hex

    async def acquire(self) -> None:
        redis_ = self._impl.redis
        # The polling loop is the point of this peer.
        while not await redis_.set(  # noqa: ASYNC110
            self._key, self._token, nx=True, px=LEASE_S * 1000
        ):
            await asyncio.sleep(self._impl.retry_delay)

    async def release(self) -> None:
        await self._impl.unlock(keys=[self._key], args=[self._token])


class SpinImpl(Impl):
    """SET NX PX in a loop, retried as soon as the reply says busy; compare-and-delete release.

    This is the seeds' Lettuce lock (``while (!setIfAbsent()) sleep``) without the sleep:
    ``asyncio.sleep(0)`` only yields to the loop, each try still costs a round trip.
    """

    retry_delay: ClassVar[float] = 0.0
    label = "SET NX spin lock"

    async def open(self) -> None:
        self.redis = self._async_redis()
        self.unlock = self.redis.register_script(_COMPARE_AND_DELETE)

    def handle(self, key: str) -> Handle:
        return _SpinHandle(self, key)

    async def aclose(self) -> None:
        await self.redis.aclose()


# -- pottery ---------------------------------------------------------------------------------


class _PotteryHandle:
    __slots__ = ("_lock",)

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    async def acquire(self) -> None:
        await self._lock.acquire()

    async def release(self) -> None:
        await self._lock.release()


class PotteryImpl(Impl):
    """pottery's ``AIORedlock`` on a single master (random 0-0.2 s sleep between tries)."""

    label = "pottery AIORedlock"

    async def open(self) -> None:
        from pottery import AIORedlock

        logging.getLogger("pottery").setLevel(logging.ERROR)
        self._redis = self._async_redis()
        self._cls = AIORedlock

    def handle(self, key: str) -> Handle:
        return _PotteryHandle(self._cls(key=key, masters={self._redis}, auto_release_time=LEASE_S))

    async def aclose(self) -> None:
        await self._redis.aclose()


# -- python-redis-lock (synchronous) ---------------------------------------------------------


class _RedisLockHandle:
    __slots__ = ("_impl", "_lock")

    def __init__(self, impl: RedisLockImpl, key: str) -> None:
        import redis_lock  # type: ignore[import-untyped]

        self._impl = impl
        self._lock = redis_lock.Lock(impl.redis, key, expire=LEASE_S)

    def _acquire_blocking(self) -> None:
        # BLPOP wakes up every second to notice a closing harness; a release wakes it at once.
        while not self._lock.acquire(timeout=1):
            if self._impl.closing.is_set():
                raise RuntimeError("harness closing")

    async def acquire(self) -> None:
        await self._impl.call(self._acquire_blocking)

    async def release(self) -> None:
        await self._impl.call(self._lock.release)


class RedisLockImpl(Impl):
    """python-redis-lock: SET NX EX, waiters block in ``BLPOP`` on a signal list."""

    label = "python-redis-lock (sync)"

    async def open(self) -> None:
        logging.getLogger("redis_lock").setLevel(logging.ERROR)
        pool = redis.BlockingConnectionPool.from_url(
            self.url, max_connections=self.concurrency + 8, timeout=None
        )
        self.redis = redis.Redis(connection_pool=pool)
        self.closing = threading.Event()
        self._executor = (
            ThreadPoolExecutor(max_workers=self.concurrency) if self.concurrency > 1 else None
        )

    async def call(self, func: Callable[[], object]) -> None:
        if self._executor is None:
            func()  # one task: nothing else would run on the loop meanwhile
        else:
            await asyncio.get_running_loop().run_in_executor(self._executor, func)

    def handle(self, key: str) -> Handle:
        return _RedisLockHandle(self, key)

    async def aclose(self) -> None:
        self.closing.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            self.redis.close()


# -- shared locks: the read-write lock and the semaphores (scenario ``shared`` only) ----------


class AiolockReadImpl(AiolockImpl):
    """``client.rw_lock(key).read_lock()``: many readers at once."""

    factory = "rw_lock"
    label = "aiolock rw_lock read"

    def handle(self, key: str) -> Handle:
        return _AiolockHandle(self._client.rw_lock(key).read_lock())


class AiolockWriteImpl(AiolockImpl):
    """``client.rw_lock(key).write_lock()``: one writer (no readers in the benchmark)."""

    factory = "rw_lock"
    label = "aiolock rw_lock write"

    def handle(self, key: str) -> Handle:
        return _AiolockHandle(self._client.rw_lock(key).write_lock())


class _PermitHandle:
    __slots__ = ("_permit", "_semaphore")

    def __init__(self, semaphore: Any) -> None:
        self._semaphore = semaphore
        self._permit: Any = None

    async def acquire(self) -> None:
        self._permit = await self._semaphore.try_acquire(wait=None)

    async def release(self) -> None:
        permit, self._permit = self._permit, None
        await permit.release()


class AiolockSemaphoreImpl(AiolockImpl):
    """``client.semaphore(key, PERMITS)``: ``try_acquire(wait=None)``, ``permit.release()``."""

    factory = "semaphore"
    label = f"aiolock semaphore({PERMITS})"

    def handle(self, key: str) -> Handle:
        return _PermitHandle(self._client.semaphore(key, PERMITS))


# KEYS[1] the semaphore's sorted set (id -> client time of the acquisition, ms); ARGV[1] now
# (ms), ARGV[2] the lease (ms), ARGV[3] the limit, ARGV[4] the acquisition's id.  1 if taken.
_ZSET_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(ARGV[1]) - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
    return 1
end
return 0
"""


class _ZSetSemaphoreHandle:
    __slots__ = ("_id", "_impl", "_key")

    def __init__(self, impl: ZSetSemaphoreImpl, key: str) -> None:
        self._impl = impl
        self._key = key
        self._id = uuid.uuid4().hex  # one per task: a task holds at most one permit at a time

    async def acquire(self) -> None:
        impl, keys = self._impl, [self._key]
        while True:
            now_ms = int(time.time() * 1000)
            if await impl.try_acquire(keys=keys, args=[now_ms, LEASE_S * 1000, PERMITS, self._id]):
                return
            await asyncio.sleep(impl.poll_s)

    async def release(self) -> None:
        await self._impl.redis.zrem(self._key, self._id)


class ZSetSemaphoreImpl(Impl):
    """The classic sorted-set semaphore in plain redis-py: a Lua script drops the expired
    entries (``ZREMRANGEBYSCORE``), and ``ZADD``s the caller's id if ``ZCARD`` < limit;
    a waiter polls every ``poll_s``; the release is a ``ZREM``."""

    poll_s: ClassVar[float] = 0.001
    label = f"redis-py zset semaphore({PERMITS}) poll 1 ms"

    async def open(self) -> None:
        self.redis = self._async_redis()
        self.try_acquire = self.redis.register_script(_ZSET_ACQUIRE)

    def handle(self, key: str) -> Handle:
        return _ZSetSemaphoreHandle(self, key)

    async def aclose(self) -> None:
        await self.redis.aclose()


# -- the registry ----------------------------------------------------------------------------

IMPLS: dict[str, type[Impl]] = {
    "aiolock": AiolockImpl,
    "aiolock-fair": AiolockFairImpl,
    "aiolock-spin": AiolockSpinImpl,
    "redispy-0.1": RedisPyImpl,
    "redispy-0.001": RedisPyFastImpl,
    "spin": SpinImpl,
    "python-redis-lock": RedisLockImpl,
    "pottery": PotteryImpl,
}

# Run by the ``shared`` scenario alone (beside ``aiolock``, the plain lock), not by the others.
SHARED: dict[str, type[Impl]] = {
    "aiolock-read": AiolockReadImpl,
    "aiolock-write": AiolockWriteImpl,
    "aiolock-semaphore": AiolockSemaphoreImpl,
    "zset-semaphore": ZSetSemaphoreImpl,
}


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def available() -> list[str]:
    """The implementations this environment can run (peers that failed to install are skipped,
    later aiolock lock kinds join as soon as the client has their factory)."""
    names = []
    for name, cls in IMPLS.items():
        if issubclass(cls, AiolockImpl) and not hasattr(aiolock.Client, cls.factory):
            continue
        if cls is PotteryImpl and not _importable("pottery"):
            continue
        if cls is RedisLockImpl and not _importable("redis_lock"):
            continue
        names.append(name)
    return names


def available_shared() -> list[str]:
    """The kinds of :data:`SHARED` this environment can run."""
    return [
        name
        for name, cls in SHARED.items()
        if not issubclass(cls, AiolockImpl) or hasattr(aiolock.Client, cls.factory)
    ]


def make(name: str, url: str, concurrency: int) -> Impl:
    return (IMPLS.get(name) or SHARED[name])(url, concurrency)
