"""What a kind tells ``aiolock inspect`` of its state on the server, and the reads kinds share.

Each kind reads its own layout (the headers of its scripts, ``scripts/<kind>/``, describe it)
in a ``describe(keys, snapshot)`` function of its module: the read-write lock's and the
semaphore's in theirs, the fair lock's queue in :mod:`aiolock.fair.queue`, and the lock hash
every reentrant kind shares (the plain and spin locks, the fair lock's holders) here
(:func:`describe_holds`).  The command line (:mod:`aiolock._cli._inspect`) runs the reads it
is given as one transaction with the server's ``TIME`` on the node that has the lock
(:class:`Snapshot`), and decodes nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from redis.asyncio.client import Pipeline

from .keys import LockKeys

__all__ = [
    "Holder",
    "Reads",
    "ServerState",
    "Snapshot",
    "Waiter",
    "as_int",
    "as_str",
    "describe_holds",
    "hash_holders",
    "queue_fencing_counter",
    "seconds",
    "server_ms",
]


@dataclass(frozen=True, slots=True)
class Holder:
    """One owner's holds.

    :ivar owner: the owner id (``<client id>:t<n>`` for a task, ``<client id>:x:<owner>`` for an
        explicit owner, a permit id for a semaphore).
    :ivar count: its reentrant hold count (1 for a permit).
    :ivar lease: seconds until its hold ends; ``None`` if it has no expiry.
    :ivar token: the fencing token of its hold; ``None`` where the kind has none (a permit).
    :ivar mode: ``"read"`` or ``"write"`` for a read-write lock, else ``None``.
    """

    owner: str
    count: int
    lease: float | None
    token: int | None
    mode: str | None = None


@dataclass(frozen=True, slots=True)
class Waiter:
    """A waiter the server knows of (the fair lock's queue, the read-write lock's writers).

    :ivar owner: the waiting owner's id.
    :ivar position: 1 for the next in line.
    :ivar expires_in: seconds until the server drops it, unless a try or keep-alive renews it
        (for a fair waiter, that of its client's alive key once its try's deadline passed).
    """

    owner: str
    position: int
    expires_in: float


@dataclass(frozen=True, slots=True)
class ServerState:
    """One lock's state on the server, as its kind reads it.

    :ivar subscribers: client connections subscribed to the lock's channels; ``None`` for the
        kinds whose waiters do not park on a channel of the lock.
    """

    holders: list[Holder]
    fencing_counter: int | None
    waiters: list[Waiter] = field(default_factory=list)
    subscribers: int | None = None


Reads = Callable[[Pipeline], None]
"""Queues a kind's reads on a transaction pipeline."""


class Snapshot(Protocol):
    """Runs a kind's reads in one transaction on the node that has the lock."""

    async def __call__(
        self, reads: Reads, channels: tuple[str, ...] = ()
    ) -> tuple[list[Any], int | None]:
        """The replies of ``reads`` in order, and the clients subscribed to ``channels``
        (``None`` if none are given)."""
        ...


def queue_fencing_counter(pipe: Pipeline, keys: LockKeys) -> None:
    """Queue on ``pipe`` the read of the fencing counter of the lock at ``keys``: the last token
    handed out under the key prefix (one counter serves every name; on a Cluster, every name of
    the lock's slot), or nil before the first."""
    pipe.get(keys.fence)


async def describe_holds(
    keys: LockKeys, snapshot: Snapshot, channels: tuple[str, ...] = ()
) -> ServerState:
    """The holders of a reentrant lock's hash (the plain and spin locks' layout), and the
    clients subscribed to ``channels`` (its waiters' channels)."""

    def reads(pipe: Pipeline) -> None:
        pipe.hgetall(keys.lock)
        pipe.pttl(keys.lock)
        queue_fencing_counter(pipe, keys)

    (fields, pttl, counter), subscribers = await snapshot(reads, channels)
    return ServerState(hash_holders(fields, pttl), as_int(counter), subscribers=subscribers)


def hash_holders(raw: dict[Any, Any], pttl: int) -> list[Holder]:
    """The holder of a lock hash (see scripts/common/_hold.lua): fields ``<owner> -> count``
    beside its ``f:<owner>`` (the token) and ``r:<owner>``, and ``:w``, ``q:<owner>``,
    ``:late:<owner>`` and ``x:<owner>``; the whole hash expires with the lease.  (An owner id
    starts with its client's hex id: never with one of those prefixes.)"""
    fields = {as_str(key): as_str(value) for key, value in raw.items()}
    lease = pttl / 1000 if pttl >= 0 else None
    return [
        Holder(owner, int(count), lease, as_int(fields.get(f"f:{owner}")))
        for owner, count in sorted(fields.items())
        if not owner.startswith((":", "x:", "f:", "r:", "q:"))
    ]


def server_ms(time: tuple[int, int]) -> int:
    """The server's ``TIME`` in ms, as its scripts read it (common/_time.lua)."""
    secs, micros = time
    return int(secs) * 1000 + int(micros) // 1000


def seconds(ms: float) -> float:
    """A span in ms, in seconds to the ms."""
    return round(ms / 1000, 3)


def as_str(value: Any) -> str:
    """A reply's bytes as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def as_int(value: Any) -> int | None:
    """A reply that may be nil, as an int."""
    return None if value is None else int(value)
