"""What ``aiolock inspect`` reads: one lock's state on the server, in one MULTI/EXEC.

Each kind's keys come from a lock object built through the :class:`~aiolock.Client` (its
``keys``), never from names put together here; how each kind stores
its state is described in the headers of its scripts (``scripts/<kind>/``).  The reads of one
kind run in a single transaction with the server's ``TIME``, so the holders, leases, queue and
counter are one consistent snapshot, and deadlines kept on the server's clock are turned into
seconds left without trusting this machine's clock.

On a Redis Cluster every key of a lock, its slot's fencing counter included, shares one hash
slot, so the same transaction runs on the primary that serves it.  Waiting clients may be
subscribed on any node there (classic pub/sub) or on the slot's (sharded): the subscriber
counts are summed over every primary, outside the transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from .._core.keys import LockKeys
from .._redis.cluster import node_of
from ..client import Client
from ..fair import FairKeys
from ..rw import RWKeys
from ..semaphore import permits_of

__all__ = ["KINDS", "Holder", "Report", "Waiter", "inspect", "queue_fencing_counter"]

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
        """The report as plain JSON-ready values (the ``--json`` output)."""
        data = asdict(self)
        return {"kind": data.pop("kind"), "name": data.pop("name"), "held": self.held, **data}


def queue_fencing_counter(pipe: Pipeline, keys: LockKeys) -> None:
    """Queue on ``pipe`` the read of the fencing counter of the lock at ``keys``: the last token
    handed out under the key prefix (one counter serves every name; on a Cluster, every name of
    the lock's slot), or nil before the first.
    The one place here that knows where it lives."""
    pipe.get(keys.fence)


async def inspect(client: Client, kind: str, name: str, *, permits: int | None = None) -> Report:
    """Read the state of lock ``name`` of ``kind`` (one of :data:`KINDS`) on the server."""
    reader = _READERS[kind]
    return await reader(client, name, permits)


# -- the kinds ---------------------------------------------------------------------------------


async def _reentrant(client: Client, kind: str, name: str) -> Report:
    lock = client.spin_lock(name) if kind == "spin" else client.lock(name)
    keys = lock.keys

    def reads(pipe: Pipeline) -> None:
        pipe.hgetall(keys.lock)
        pipe.pttl(keys.lock)
        queue_fencing_counter(pipe, keys)

    # The spin lock's waiters never subscribe.
    channels = (keys.channel,) if kind == "lock" else ()
    (fields, pttl, counter), subscribers = await _snapshot(client, keys.lock, reads, channels)
    holders = _hash_holders(fields, pttl)
    return Report(kind, name, keys.lock, holders, _int(counter), subscribers=subscribers)


async def _lock(client: Client, name: str, permits: int | None) -> Report:
    return await _reentrant(client, "lock", name)


async def _spin(client: Client, name: str, permits: int | None) -> Report:
    return await _reentrant(client, "spin", name)


async def _fair(client: Client, name: str, permits: int | None) -> Report:
    keys = client.fair_lock(name).keys
    assert isinstance(keys, FairKeys)

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.hgetall(keys.lock)
        pipe.pttl(keys.lock)
        queue_fencing_counter(pipe, keys)
        pipe.lrange(keys.queue, 0, -1)

    values, _ = await _snapshot(client, keys.lock, reads)
    time, fields, pttl, counter, queue = values
    now = _ms(time)
    ends: dict[str, int] = {}  # in line, first in line first (an owner's first member)
    for member in map(_str, queue):
        owner, deadline = _member(member)
        if owner is not None and owner not in ends:
            ends[owner] = deadline
    # Past its try's deadline, a waiter is live while its client's alive key lasts (see
    # scripts/fair/_queue.lua); one that is neither has vanished: the next look drops it.
    clients = sorted({owner.partition(":")[0] for owner, end in ends.items() if end <= now})
    if clients:

        def alive_reads(pipe: Pipeline) -> None:
            for client_id in clients:
                pipe.pttl(keys.alive + client_id)

        alive, _ = await _snapshot(client, keys.lock, alive_reads)
        lasts = {c: now + int(ms) for c, ms in zip(clients, alive, strict=True) if int(ms) > 0}
        for owner, end in ends.items():
            ends[owner] = max(end, lasts.get(owner.partition(":")[0], 0))
    live = [owner for owner, end in ends.items() if end > now]
    waiters = [
        Waiter(owner, position, _seconds(ends[owner] - now))
        for position, owner in enumerate(live, 1)
    ]
    holders = _hash_holders(fields, pttl)
    return Report("fair", name, keys.lock, holders, _int(counter), waiters)


async def _rw(client: Client, name: str, permits: int | None) -> Report:
    keys = client.rw_lock(name).write_lock().keys
    assert isinstance(keys, RWKeys)

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.hgetall(keys.lock)
        queue_fencing_counter(pipe, keys)
        pipe.zrange(keys.readers, 0, -1, withscores=True)
        pipe.zrange(keys.writers, 0, -1, withscores=True)

    channels = (keys.read_channel, keys.write_channel)
    values, subscribers = await _snapshot(client, keys.lock, reads, channels)
    time, raw, counter, readers, writers = values
    now = _ms(time)
    fields = {_str(key): _str(value) for key, value in raw.items()}
    holders: list[Holder] = []
    # See scripts/rw/_rw.lua: 'w', 'wc', 'we' (server ms) and ':fence' are the write hold,
    # 'r:<owner>' and 't:<owner>' a reader's count and token; a hold past its end is gone.
    writer, write_ends = fields.get("w"), int(fields.get("we") or 0)
    if writer is not None and write_ends > now:
        writes = int(fields.get("wc") or 0)
        token = _int(fields.get(":fence"))
        holders.append(Holder(writer, writes, _seconds(write_ends - now), token, "write"))
    for member, ends in readers:
        owner = _str(member)
        held = int(fields.get(f"r:{owner}") or 0)
        if ends > now and held:  # other members are resend marks, with negative scores
            token = _int(fields.get(f"t:{owner}"))
            holders.append(Holder(owner, held, _seconds(ends - now), token, "read"))
    live = [(_str(owner), ends) for owner, ends in writers if ends > now]
    waiters = [
        Waiter(owner, position, _seconds(ends - now))
        for position, (owner, ends) in enumerate(live, 1)
    ]
    return Report("rw", name, keys.lock, holders, _int(counter), waiters, subscribers=subscribers)


async def _semaphore(client: Client, name: str, permits: int | None) -> Report:
    keys = permits_of(client.semaphore(name, permits or 1)).keys

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.zrange(keys.lock, 0, -1, withscores=True)

    (time, taken), subscribers = await _snapshot(client, keys.lock, reads, (keys.channel,))
    now = _ms(time)
    # See scripts/semaphore/_permits.lua: permit id -> the server ms at which its lease ends.
    holders = [
        Holder(_str(permit), 1, _seconds(ends - now), None) for permit, ends in taken if ends > now
    ]
    available = None if permits is None else max(permits - len(holders), 0)
    counts: dict[str, int | None] = {
        "held": len(holders),
        "limit": permits,
        "available": available,
    }
    return Report(
        "semaphore",
        name,
        keys.lock,
        holders,
        None,
        subscribers=subscribers,
        permits=counts,
    )


_READERS: Final = {
    "lock": _lock,
    "fair": _fair,
    "rw": _rw,
    "semaphore": _semaphore,
    "spin": _spin,
}


# -- helpers -----------------------------------------------------------------------------------


async def _snapshot(
    client: Client, key: str, queue: Callable[[Pipeline], None], channels: tuple[str, ...] = ()
) -> tuple[list[Any], int | None]:
    """Run the reads ``queue`` puts on a transaction pipeline, on the node that has ``key``:
    their replies in order, and the clients subscribed to ``channels`` (``None`` if none are
    given)."""
    redis = client.redis
    if isinstance(redis, Redis):
        async with redis.pipeline(transaction=True) as pipe:
            queue(pipe)
            if channels:
                pipe.pubsub_numsub(*channels)
            replies: list[Any] = await pipe.execute()
        if not channels:
            return replies, None
        return replies[:-1], _subscribers(replies[-1])
    node = await node_of(redis, key)
    async with node, node.pipeline(transaction=True) as pipe:
        queue(pipe)
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


def _hash_holders(raw: dict[Any, Any], pttl: int) -> list[Holder]:
    """The holder of a lock hash (see scripts/common/_hold.lua): fields ``<owner> -> count``
    beside its ``f:<owner>`` (the token) and ``r:<owner>``, and ``:w``, ``q:<owner>``,
    ``:late:<owner>`` and ``x:<owner>``; the whole hash expires with the lease.  (An owner id
    starts with its client's hex id: never with one of those prefixes.)"""
    fields = {_str(key): _str(value) for key, value in raw.items()}
    lease = pttl / 1000 if pttl >= 0 else None
    return [
        Holder(owner, int(count), lease, _int(fields.get(f"f:{owner}")))
        for owner, count in sorted(fields.items())
        if not owner.startswith((":", "x:", "f:", "r:", "q:"))
    ]


def _subscribers(numsub: list[tuple[Any, int]]) -> int:
    return sum(int(count) for _, count in numsub)


def _ms(time: tuple[int, int]) -> int:
    """The server's ``TIME`` in ms, as its scripts read it (common/_time.lua)."""
    seconds, micros = time
    return int(seconds) * 1000 + int(micros) // 1000


def _seconds(ms: float) -> float:
    return round(ms / 1000, 3)


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _member(member: str) -> tuple[str | None, int]:
    """A fair waiter's owner and deadline (server ms) from its member of the queue, '<lease
    ms> <request n> <wait ms> <deadline> <owner>' (scripts/fair/_queue.lua); no owner for a
    member of another shape."""
    parts = member.split(" ", 4)
    if len(parts) < 5 or not all(part.isdigit() for part in parts[:4]):
        return None, 0
    return parts[4], int(parts[3])


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
