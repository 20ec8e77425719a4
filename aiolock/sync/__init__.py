"""aiolock for threads: the same locks, every call blocking, over the same async engine.

For code that is not async (Celery tasks, Django or Flask views, scripts, thread pools)::

    import aiolock.sync

    with aiolock.sync.Client.from_url("redis://127.0.0.1:6379/0") as client:
        with client.lock("orders:42").acquire(wait=5) as guard:
            ...

The owner of a lock is the calling thread.  A lock taken here and one taken by a task of an
async client on the same name are the same lock: one protocol, one set of keys.
"""

from ._client import Client as Client
from ._composites import MultiLock as MultiLock
from ._composites import RedLock as RedLock
from ._kinds import CountDownLatch as CountDownLatch
from ._kinds import Permit as Permit
from ._kinds import ReadWriteLock as ReadWriteLock
from ._kinds import Semaphore as Semaphore
from ._locks import Guard as Guard
from ._locks import Lock as Lock

__all__ = [
    "Client",
    "CountDownLatch",
    "Guard",
    "Lock",
    "MultiLock",
    "Permit",
    "ReadWriteLock",
    "RedLock",
    "Semaphore",
]
