"""Exceptions raised by aiolock.

All of them derive from one root, so ``except aiolock.LockError`` catches every lock outcome::

    LockError(Exception)
    ├── LockTimeoutError(LockError, TimeoutError)   # the wait ran out
    ├── LockNotOwnedError(LockError)                 # release by a caller that does not hold it
    ├── LockLostError(LockError)                     # the lease was lost while the lock was held
    └── LockSyncError(LockError)                     # replicas did not confirm a grant in time

Bad arguments raise :class:`TypeError` or :class:`ValueError` before any I/O.  Redis' own
errors (``redis.exceptions.ConnectionError`` and friends) propagate unchanged; only a server's
request for a password the client did not give is told in plain words (the same
``AuthenticationError`` class, chained to redis-py's).  The habits of ``asyncio.Lock`` and
redis-py's ``Lock`` (``await lock.acquire()``, ``timeout=``, a release from another task, a
client called from a second event loop) get messages that say what to write instead.
"""

from __future__ import annotations

__all__ = [
    "LockError",
    "LockLostError",
    "LockNotOwnedError",
    "LockSyncError",
    "LockTimeoutError",
]


class LockError(Exception):
    """The root of every error that aiolock raises about a lock's state."""


class LockTimeoutError(LockError, TimeoutError):
    """The lock could not be acquired before the ``wait`` ran out."""


class LockNotOwnedError(LockError):
    """The caller released (or extended) a lock that it does not hold."""


class LockLostError(LockError):
    """The lock's lease ran out, or the lock was taken from its holder, while it was held.

    Raised when a ``LockGuard`` block is left after the loss, so that a critical section that
    lost its lock is never reported as a success.
    """


class LockSyncError(LockError):
    """Fewer replicas than the client's ``sync_replicas`` confirmed a grant within its
    ``sync_timeout``: the grant was undone, and the caller does not hold it (a reentrant
    acquisition keeps the holds it had before)."""
