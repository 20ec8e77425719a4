"""aiolock: asyncio-native distributed locks on Redis.

A reentrant lock per task that survives crashes (leases), waits without polling (pub/sub), keeps
long jobs' locks alive (a watchdog), and tells its holder when it lost the lock::

    async with aiolock.Client.from_url("redis://127.0.0.1:6379/0") as client:
        async with client.lock("orders:42").acquire(wait=5) as guard:
            ...
"""

import logging as _logging

from ._core.composite import CompositeStatistics as CompositeStatistics
from .client import Client as Client
from .client import ClientStatistics as ClientStatistics
from .errors import LockError as LockError
from .errors import LockLostError as LockLostError
from .errors import LockNotOwnedError as LockNotOwnedError
from .errors import LockSyncError as LockSyncError
from .errors import LockTimeoutError as LockTimeoutError
from .fair import AsyncFairLock as AsyncFairLock
from .latch import AsyncCountDownLatch as AsyncCountDownLatch
from .lock import AsyncRLock as AsyncRLock
from .lock import LockGuard as LockGuard
from .lock import LockStatistics as LockStatistics
from .multi import MultiLock as MultiLock
from .redlock import RedLock as RedLock
from .rw import AsyncReadLock as AsyncReadLock
from .rw import AsyncReadWriteLock as AsyncReadWriteLock
from .rw import AsyncWriteLock as AsyncWriteLock
from .semaphore import AsyncSemaphore as AsyncSemaphore
from .semaphore import Permit as Permit
from .spin import AsyncSpinLock as AsyncSpinLock

__all__ = [
    "AsyncCountDownLatch",
    "AsyncFairLock",
    "AsyncRLock",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "AsyncSpinLock",
    "AsyncWriteLock",
    "Client",
    "ClientStatistics",
    "CompositeStatistics",
    "LockError",
    "LockGuard",
    "LockLostError",
    "LockSyncError",
    "LockNotOwnedError",
    "LockStatistics",
    "LockTimeoutError",
    "MultiLock",
    "Permit",
    "RedLock",
]

__version__ = "0.1.0"

# A library logs, the application decides where to: no "no handlers" warning by default.
_logging.getLogger("aiolock").addHandler(_logging.NullHandler())
