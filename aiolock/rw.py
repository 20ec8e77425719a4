"""``AsyncReadWriteLock``: many readers or one writer, across all clients; writers not starved.

Redisson's ``RReadWriteLock`` for asyncio, on the shared engine (:mod:`aiolock._core.kind`): the
read lock and the write lock are two kinds over one lock hash (scripts in ``scripts/rw/``).

- Readers of many owners hold it at once; each owner's read holds have a lease of their own in
  a sorted set on the server's clock, and the lock lives as long as its longest hold, so the
  readers of a client that died expire within their leases.
- A writer that has to wait registers in a second sorted set (refreshed by each of its tries,
  dropped ``fair_wait_timeout`` after its last); while one waits, readers of other owners queue
  behind it.  A writer facing an endless stream of overlapping readers gets in once the
  readers holding it now are done.
- A write release wakes every waiting reader of every client with one message (a broadcast
  entry per client), or one waiting writer if a writer waits; a read release that frees the
  lock wakes one writer.
- The writer may take read holds, and keep them after its write hold ends (a downgrade).  A
  reader asking for the write lock gets :class:`~aiolock.LockError` at once: two readers doing
  so would wait for each other forever.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from . import _scripts
from ._core.habits import teaching
from ._core.holds import Hold
from ._core.hooks import Call, release_args
from ._core.inspection import (
    Holder,
    ServerState,
    Snapshot,
    Waiter,
    as_int,
    as_str,
    queue_fencing_counter,
    seconds,
    server_ms,
)
from ._core.keys import LockKeys, hash_tag
from ._core.kind import LockKind
from ._core.metrics import lock_extra
from ._core.services import Services
from ._core.validate import check_name
from ._core.waiting import ChannelWait, WaitStrategy
from ._redis.entry import BroadcastEntry
from .errors import LockError

__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock", "describe"]

logger = logging.getLogger("aiolock.lock")


@dataclass(frozen=True, slots=True)
class RWKeys(LockKeys):
    """The lock hash, meta, readers and waiting writers; ``channel`` is this mode's waiters'
    channel, ``read_channel`` and ``write_channel`` both."""

    readers: str
    writers: str
    read_channel: str
    write_channel: str

    def script_keys(self) -> tuple[str, ...]:
        return (
            self.lock,
            self.meta,
            self.readers,
            self.writers,
            self.read_channel,
            self.write_channel,
            self.fence,
        )


class _Mode(LockKind):
    """What the read and the write lock share."""

    __slots__ = ()

    mode: ClassVar[str]  # "r" or "w"

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        # One lock for both modes.
        base = LockKeys.build(services.key_prefix, name, "rw", cluster=services.cluster)
        read, write = f"{base.lock}:read", f"{base.lock}:write"
        return RWKeys(
            lock=base.lock,
            meta=base.meta,
            fence=base.fence,
            waiting=base.waiting,
            channel=read if cls.mode == "r" else write,
            readers=f"{base.lock}:readers",
            writers=f"{base.lock}:writers",
            read_channel=read,
            write_channel=write,
        )

    @property
    def _rw_keys(self) -> RWKeys:
        keys = self._keys
        assert isinstance(keys, RWKeys)
        return keys

    def _holds_either(self, owner: str) -> bool:
        """Whether ``owner`` holds either mode: the server answers its try at once (a re-entry,
        a read beside its own write, a refused upgrade), so it must not queue behind this
        client's waiters, who may be waiting for that very hold."""
        holds, lock = self._services.holds, self._keys.lock
        return (
            holds.get(f"{lock}#r", owner) is not None or holds.get(f"{lock}#w", owner) is not None
        )

    def _renew_keys(self) -> tuple[str, ...]:
        return (self._keys.lock, self._rw_keys.readers)

    def _force_call(self) -> Call:
        return _scripts.RW_FORCE, self._rw_keys.script_keys(), (self.mode,)

    def _channels(self) -> tuple[str, ...]:
        # A read hold that ends unpublished may free the lock for writers; a write hold, for
        # writers (this client's queued behind one that got it are parked without a lease to
        # go by) and readers.
        keys = self._rw_keys
        if self.mode == "r":
            return (keys.write_channel,)
        return (keys.write_channel, keys.read_channel)

    async def _rw_state(self) -> tuple[bool, int, int, int, float, float]:
        """(someone writes, live readers, the caller's read holds, its write holds, seconds
        until the write hold ends, seconds until the last read hold ends)."""
        owner, _ = self.current_owner()
        writer, readers, reads, writes, write_ms, read_ms = await self._services.calls.run(
            _scripts.RW_STATE, self._rw_keys.script_keys(), (owner,)
        )
        return (
            writer is not None,
            int(readers),
            int(reads),
            int(writes),
            int(write_ms) / 1000,
            int(read_ms) / 1000,
        )

    async def force_unlock(self) -> bool:
        """End this mode's holds whoever holds them (the other mode's holders keep theirs, as
        in Redisson) and wake who may now get in; ``True`` if there were any."""
        return await super().force_unlock()


class AsyncReadLock(_Mode):
    """The read side of an :class:`AsyncReadWriteLock`: held by many owners at once.

    It offers every call of :class:`~aiolock.AsyncRLock`.  ``is_locked()`` is true while
    anyone reads; ``hold_count()`` counts the caller's read holds.
    """

    __slots__ = ()

    kind: ClassVar[str] = "rw-read"
    mode: ClassVar[str] = "r"
    _registry_suffix: ClassVar[str] = "#r"
    _renew = _scripts.RW_RENEW_READ

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        args = (lease_ms, owner, request, 0, *self._late_args(owner))
        return _scripts.RW_READ, self._rw_keys.script_keys(), args

    def _transact_call(self, hold: Hold) -> Call:
        keys = self._rw_keys
        return _scripts.RW_TRANSACT_READ, (keys.lock, keys.readers), (hold.owner, hold.token)

    def _extend_call(self, hold: Hold, lease_ms: int) -> Call:
        args = (lease_ms, hold.owner, hold.token)
        return _scripts.RW_EXTEND_READ, self._rw_keys.script_keys(), args

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        return (
            _scripts.RW_RELEASE_READ,
            self._rw_keys.script_keys(),
            release_args(owner, request, undo),
        )

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        return ChannelWait(
            self._services,
            self._keys.channel,
            self._counters,
            reentering=self._holds_either(owner),
            shared=True,
            entry_type=BroadcastEntry,
        )

    async def is_locked(self) -> bool:
        """``True`` while anyone holds a read hold."""
        return (await self._rw_state())[1] > 0

    async def is_held(self) -> bool:
        """``True`` if the caller holds a read hold."""
        return (await self._rw_state())[2] > 0

    async def hold_count(self) -> int:
        """The caller's read holds."""
        return (await self._rw_state())[2]

    async def remaining_lease(self) -> float | None:
        """Seconds until the last read hold ends; ``None`` if nobody reads."""
        left = (await self._rw_state())[5]
        return left if left > 0 else None


class AsyncWriteLock(_Mode):
    """The write side of an :class:`AsyncReadWriteLock`: one owner, and no other readers.

    It offers every call of :class:`~aiolock.AsyncRLock`.  A caller that holds the read lock
    (and not the write lock) gets :class:`~aiolock.LockError` at once.
    """

    __slots__ = ()

    kind: ClassVar[str] = "rw-write"
    mode: ClassVar[str] = "w"
    _registry_suffix: ClassVar[str] = "#w"
    _renew = _scripts.RW_RENEW_WRITE

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        wait_timeout_ms = round(self._services.fair_wait_timeout * 1000)
        args = (lease_ms, owner, request, wait_timeout_ms, *self._late_args(owner))
        return _scripts.RW_WRITE, self._rw_keys.script_keys(), args

    def _transact_call(self, hold: Hold) -> Call:
        return _scripts.RW_TRANSACT_WRITE, (self._keys.lock,), (hold.owner, hold.token)

    def _extend_call(self, hold: Hold, lease_ms: int) -> Call:
        args = (lease_ms, hold.owner, hold.token)
        return _scripts.RW_EXTEND_WRITE, self._rw_keys.script_keys(), args

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        return (
            _scripts.RW_RELEASE_WRITE,
            self._rw_keys.script_keys(),
            release_args(owner, request, undo),
        )

    async def _after_error(
        self, owner: str, task: asyncio.Task[Any] | None, error: ResponseError
    ) -> bool:
        # The script refuses an owner that reads (an upgrade).  Read holds the client did not
        # know of are dropped and the write tried again; known ones make it a LockError.
        if "upgrade refused" not in str(error):
            return False
        if task is None or not await self._dropped_unknown_reads(owner):
            raise LockError(
                f"the read lock of {self.name!r} is held by this owner: taking the "
                "write lock too could deadlock (release the read holds first)"
            ) from None
        return True

    async def _dropped_unknown_reads(self, owner: str) -> bool:
        """Whether the read holds that made the script refuse the owner (a task) were ones
        the client did not know of, now released: the write is then tried again."""
        services = self._services
        reader = AsyncReadLock(services, self.name, self._explicit_owner)
        if reader.hold(owner) is not None:
            return False  # the owner reads, knowingly: an upgrade, refused
        # Read holds the client took for lost (its deadlines run a little ahead of the
        # server's) or a background release gave up on, else a bug signal (a late copy of a
        # read acquire that nothing could recognise).  Never taken as the owner's: released,
        # then the write is tried again.
        holds = services.holds
        if holds.lost_token(reader.registry_key, owner) is not None:
            why = " (a hold it took for lost)"
        elif holds.was_abandoned(self._keys.lock, owner):
            why = " (left by a release that gave up)"
        else:
            why = ""
        logger.log(
            logging.WARNING if why else logging.ERROR,
            "rw lock %r: the server has read hold(s) of this owner that the client did not "
            "know of%s; releasing them",
            self.name,
            why,
            extra=lock_extra(self.kind, self.name, owner),
        )
        dropped: list[bool] = []

        async def drop() -> None:
            dropped.append(await reader.drop_all(owner))

        services.holds.defer(self._keys.lock, owner, drop())
        await services.holds.wait_pending(self._keys.lock, owner)
        return dropped == [True]

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        return ChannelWait(
            self._services,
            self._keys.channel,
            self._counters,
            reentering=self._holds_either(owner),
        )

    def withdraw_call(self, owner: str) -> Call:
        # A writer that stops waiting stops holding readers back at once.
        return _scripts.RW_WITHDRAW, self._rw_keys.script_keys(), (owner,)

    async def is_locked(self) -> bool:
        """``True`` while anyone holds the write lock."""
        return (await self._rw_state())[0]

    async def is_held(self) -> bool:
        """``True`` if the caller holds the write lock."""
        return (await self._rw_state())[3] > 0

    async def hold_count(self) -> int:
        """The caller's write holds."""
        return (await self._rw_state())[3]

    async def remaining_lease(self) -> float | None:
        """Seconds until the write hold ends; ``None`` if nobody writes."""
        left = (await self._rw_state())[4]
        return left if left > 0 else None


class AsyncReadWriteLock:
    """A lock that many readers or one writer hold, across every client of one Redis.

    Create it with :meth:`aiolock.Client.rw_lock`::

        cache = client.rw_lock("prices")
        async with cache.read_lock().acquire(wait=5):
            ...                                   # many readers at once
        async with cache.write_lock().acquire(wait=5):
            ...                                   # one writer, no readers

    See the module documentation for the rules (no writer starvation, downgrade, no upgrade).
    """

    __slots__ = ("_services", "name")

    def __init__(self, services: Services, name: str) -> None:
        self._services = services
        self.name = name

    @property
    def hash_tag(self) -> str:
        """The Redis Cluster hash tag of the lock's keys, with its braces (see
        :attr:`aiolock.AsyncRLock.hash_tag`)."""
        return hash_tag(self.name)

    @teaching
    def read_lock(self, *, owner: str | None = None) -> AsyncReadLock:
        """The read lock (no I/O); ``owner`` binds it to an explicit owner."""
        return AsyncReadLock(self._services, self.name, _owner(owner))

    @teaching
    def write_lock(self, *, owner: str | None = None) -> AsyncWriteLock:
        """The write lock (no I/O); ``owner`` binds it to an explicit owner."""
        return AsyncWriteLock(self._services, self.name, _owner(owner))

    def __repr__(self) -> str:
        return f"<AsyncReadWriteLock {self.name!r}>"


def _owner(owner: object) -> str | None:
    return None if owner is None else check_name(owner, "owner")


async def describe(keys: RWKeys, snapshot: Snapshot) -> ServerState:
    """The lock's holders (the writer and the readers, each with its mode) and its live waiting
    writers, for ``aiolock inspect``; its channels are both modes' waiters'."""

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.hgetall(keys.lock)
        queue_fencing_counter(pipe, keys)
        pipe.zrange(keys.readers, 0, -1, withscores=True)
        pipe.zrange(keys.writers, 0, -1, withscores=True)

    channels = (keys.read_channel, keys.write_channel)
    (time, raw, counter, readers, writers), subscribers = await snapshot(reads, channels)
    now = server_ms(time)
    fields = {as_str(key): as_str(value) for key, value in raw.items()}
    holders: list[Holder] = []
    # See scripts/rw/_rw.lua: 'w', 'wc', 'we' (server ms) and ':fence' are the write hold,
    # 'r:<owner>' and 't:<owner>' a reader's count and token; a hold past its end is gone.
    writer, write_ends = fields.get("w"), int(fields.get("we") or 0)
    if writer is not None and write_ends > now:
        writes = int(fields.get("wc") or 0)
        token = as_int(fields.get(":fence"))
        holders.append(Holder(writer, writes, seconds(write_ends - now), token, "write"))
    for member, ends in readers:
        owner = as_str(member)
        held = int(fields.get(f"r:{owner}") or 0)
        if ends > now and held:  # other members are resend marks, with negative scores
            token = as_int(fields.get(f"t:{owner}"))
            holders.append(Holder(owner, held, seconds(ends - now), token, "read"))
    live = [(as_str(owner), ends) for owner, ends in writers if ends > now]
    waiters = [
        Waiter(owner, position, seconds(ends - now))
        for position, (owner, ends) in enumerate(live, 1)
    ]
    return ServerState(holders, as_int(counter), waiters, subscribers)
