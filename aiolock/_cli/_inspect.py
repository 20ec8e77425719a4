"""What ``aiolock inspect`` reads: one lock's state on the server, in one MULTI/EXEC.

Each kind's keys come from a lock object built through the :class:`~aiolock.Client` (its
``keys``), never from names put together here, and each kind reads
its own layout (its ``describe`` function, see :mod:`aiolock._core.inspection`): nothing here
decodes a hash, a queue or a set.  The reads of one kind run in a single transaction with the
server's ``TIME`` (:func:`_snapshot`), so the holders, leases, queue and counter are one
consistent snapshot, and deadlines kept on the server's clock are turned into seconds left
without trusting this machine's clock.

On a Redis Cluster every key of a lock, its slot's fencing counter included, shares one hash
slot, so the same transaction runs on the primary that serves it.  Waiting clients may be
subscribed on any node there (classic pub/sub) or on the slot's (sharded): the subscriber
counts are summed over every primary, outside the transaction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from .. import rw, semaphore
from .._core.inspection import (
    Holder,
    Reads,
    ServerState,
    Snapshot,
    Waiter,
    as_str,
    describe_holds,
)
from .._redis.cluster import node_of
from ..client import Client
from ..fair import queue as fair_queue
from ..fair.queue import FairKeys
from ..lock import wake_prefix
from ..rw import RWKeys

__all__ = ["KINDS", "Holder", "Report", "Waiter", "inspect"]

KINDS: Final = ("lock", "fair", "rw", "semaphore", "spin")
"""The kinds ``--kind`` accepts (``spin`` shares the plain lock's layout in keys of its own)."""

KIND_TITLES: Final = {
    "lock": "lock",
    "fair": "fair lock",
    "rw": "read-write lock",
    "semaphore": "semaphore",
    "spin": "spin lock",
}


@dataclass(frozen=True, slots=True)
class Report:
    """One lock as the server has it now.

    :ivar subscribers: client connections subscribed to the lock's channels: the clients with
        tasks waiting for it (one subscription per client, however many of its tasks wait);
        ``None`` for the kinds whose waiters do not park on a channel of the lock (the fair
        lock's are in its queue, the spin lock's sleep).
    :ivar permits: for a semaphore: ``held``, and ``limit`` and ``available`` when the caller
        gave the limit (the server does not keep it), else ``None``.
    """

    kind: str
    name: str
    key: str
    holders: list[Holder]
    fencing_counter: int | None
    waiters: list[Waiter] = field(default_factory=list)
    subscribers: int | None = None
    permits: dict[str, int | None] | None = None

    @property
    def held(self) -> bool:
        """Whether anyone holds it."""
        return bool(self.holders)

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready values (the ``--json`` output)."""
        data = asdict(self)
        return {"kind": data.pop("kind"), "name": data.pop("name"), "held": self.held, **data}


async def inspect(client: Client, kind: str, name: str, *, permits: int | None = None) -> Report:
    """Read the state of lock ``name`` of ``kind`` (one of :data:`KINDS`) on the server."""
    key, state = await _DESCRIBERS[kind](client, name, permits)
    counts: dict[str, int | None] | None = None
    if kind == "semaphore":  # the server does not keep the limit: the caller gave it, or not
        held = len(state.holders)
        available = None if permits is None else max(permits - held, 0)
        counts = {"held": held, "limit": permits, "available": available}
    return Report(
        kind,
        name,
        key,
        state.holders,
        state.fencing_counter,
        state.waiters,
        state.subscribers,
        counts,
    )


# -- the kinds: each asked through its own describe function -------------------------------

Described = tuple[str, ServerState]
"""A lock's key, and its state as its kind describes it."""


async def _lock(client: Client, name: str, permits: int | None) -> Described:
    keys = client.lock(name).keys
    snapshot = _snapshot_of(client, keys.lock)

    # Each client's waiters park on a channel of its own: those of the clients in the waiting
    # set (one waiting owner per client at a time) are counted.
    def waiting(pipe: Pipeline) -> None:
        pipe.zrange(keys.waiting, 0, -1)

    (members,), _ = await snapshot(waiting)
    clients = sorted({as_str(member).split(" ")[2] for member in members})
    channels = tuple(wake_prefix(keys.lock) + client_id for client_id in clients)
    return keys.lock, await describe_holds(keys, snapshot, channels)


async def _spin(client: Client, name: str, permits: int | None) -> Described:
    keys = client.spin_lock(name).keys
    # The spin lock's waiters never subscribe.
    return keys.lock, await describe_holds(keys, _snapshot_of(client, keys.lock))


async def _fair(client: Client, name: str, permits: int | None) -> Described:
    keys = client.fair_lock(name).keys
    assert isinstance(keys, FairKeys)
    return keys.lock, await fair_queue.describe(keys, _snapshot_of(client, keys.lock))


async def _rw(client: Client, name: str, permits: int | None) -> Described:
    keys = client.rw_lock(name).write_lock().keys
    assert isinstance(keys, RWKeys)
    return keys.lock, await rw.describe(keys, _snapshot_of(client, keys.lock))


async def _semaphore(client: Client, name: str, permits: int | None) -> Described:
    keys = semaphore.permits_of(client.semaphore(name, permits or 1)).keys
    return keys.lock, await semaphore.describe(keys, _snapshot_of(client, keys.lock))


_DESCRIBERS: Final = {
    "lock": _lock,
    "fair": _fair,
    "rw": _rw,
    "semaphore": _semaphore,
    "spin": _spin,
}


# -- helpers -----------------------------------------------------------------------------------


def _snapshot_of(client: Client, key: str) -> Snapshot:
    """The :class:`~aiolock._core.inspection.Snapshot` a kind's reads run in: on the node
    that has ``key``."""

    async def snapshot(
        reads: Reads, channels: tuple[str, ...] = ()
    ) -> tuple[list[Any], int | None]:
        return await _snapshot(client, key, reads, channels)

    return snapshot


async def _snapshot(
    client: Client, key: str, reads: Reads, channels: tuple[str, ...] = ()
) -> tuple[list[Any], int | None]:
    """Run the reads ``reads`` puts on a transaction pipeline, on the node that has ``key``:
    their replies in order, and the clients subscribed to ``channels`` (``None`` if none are
    given)."""
    redis = client.redis
    if isinstance(redis, Redis):
        async with redis.pipeline(transaction=True) as pipe:
            reads(pipe)
            if channels:
                pipe.pubsub_numsub(*channels)
            replies: list[Any] = await pipe.execute()
        if not channels:
            return replies, None
        return replies[:-1], _subscribers(replies[-1])
    node = await node_of(redis, key)
    async with node, node.pipeline(transaction=True) as pipe:
        reads(pipe)
        replies = await pipe.execute()
    return replies, (await _cluster_subscribers(redis, channels) if channels else None)


async def _cluster_subscribers(redis: RedisCluster, channels: tuple[str, ...]) -> int:
    """Subscribers to ``channels`` on every primary: classic and sharded subscriptions."""
    total = 0
    for primary in redis.get_primaries():
        numsub = await redis.execute_command("PUBSUB NUMSUB", *channels, target_nodes=primary)
        total += _subscribers(_pairs(numsub))
        try:
            numsub = await redis.execute_command(
                "PUBSUB SHARDNUMSUB", *channels, target_nodes=primary
            )
        except ResponseError:  # a server without sharded pub/sub (before 7.0)
            continue
        total += _subscribers(_pairs(numsub))
    return total


def _pairs(reply: Any) -> list[tuple[Any, int]]:
    """A NUMSUB reply, flat or already paired by redis-py's callback."""
    if reply and not isinstance(reply[0], list | tuple):
        return list(zip(reply[::2], reply[1::2], strict=True))
    return [(channel, count) for channel, count in reply]


def _subscribers(numsub: list[tuple[Any, int]]) -> int:
    return sum(int(count) for _, count in numsub)
