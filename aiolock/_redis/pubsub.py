"""Waiting without polling: a client's subscriptions, shared by every waiting task.

The pieces, as in Redisson's ``PublishSubscribeService`` and ``RedissonLockEntry``:

- :class:`~aiolock._redis.entry.Entry` (its own module): one per subscribed channel, with a
  reference count (the tasks waiting on that lock) and a wake-one latch: each published
  release hands out *one* wake-up, and so does the confirmation of the SUBSCRIBE (a release may
  have been published before it).  A message is the entry's to read (``Entry.deliver``), so
  the transport knows no kind's message format.
- :class:`PubSub`: the cache of entries keyed by channel.  The first waiter of a channel creates
  its entry and schedules the SUBSCRIBE, the last one out schedules the UNSUBSCRIBE; both run in
  the background, so joining never waits.  A pool of ``asyncio.Semaphore(1)``, picked by hashing
  the channel, serialises that work per channel and bounds how much of it runs at once.
- :class:`~aiolock._redis.subscriber.Subscriber`: one connection and its one reader task.  One
  server has one; a Cluster has one per node that has waiters when its nodes have sharded
  pub/sub (SSUBSCRIBE, Redis and Valkey 7+: a message is handled by its slot's node only),
  else one classic subscriber on any node (PUBLISH reaches every node).  A :class:`Topology`
  says which subscriber carries a channel.  Entries, refcounts and the semaphore pool are the
  same whatever the topology.
- A channel that moves (its slot migrated, or failed over to a replica; the node says so with
  MOVED or an unrequested ``sunsubscribe``) is subscribed again where the refreshed topology
  puts it; its first waiter tries at once and again at the new confirmation, since a release
  may have been published where nobody of ours listened.  A node that cannot be reached has its
  channels moved as soon as the topology names another owner.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .entry import Contention, Entry
from .subscriber import Subscriber, SubscriberSource
from .tasks import Background

__all__ = [
    "Home",
    "OneServer",
    "PubSub",
    "PubSubStatistics",
    "SubscriberSource",
    "Topology",
]

logger = logging.getLogger("aiolock.pubsub")


class Home(NamedTuple):
    """Where the subscriber of a channel connects: ``name`` tells subscribers apart."""

    name: str
    source: Callable[[], SubscriberSource]


class Topology(Protocol):
    """Which subscriber carries a channel: one server's, or a Cluster node's."""

    @property
    def sharded(self) -> bool:
        """Sharded pub/sub (SSUBSCRIBE on the channel's node), known once :meth:`ready`."""
        ...

    async def ready(self) -> None:
        """Learn the topology, once."""
        ...

    async def refresh(self) -> None:
        """Learn it again (a node said a channel is not its own)."""
        ...

    def home(self, channel: bytes) -> Home:
        """Where ``channel`` is subscribed (after :meth:`ready`)."""
        ...


class OneServer:
    """The topology of one server: every channel on one subscriber connection to it."""

    sharded = False

    def __init__(self, source: SubscriberSource) -> None:
        self._home = Home("", lambda: source)

    async def ready(self) -> None:
        pass

    async def refresh(self) -> None:
        pass

    def home(self, channel: bytes) -> Home:
        return self._home


@dataclass(frozen=True, slots=True)
class PubSubStatistics:
    """What the subscriptions are doing right now.

    ``connected``: some subscriber connection is up, and every one that carries channels is;
    ``subscribers``: the connections up.
    """

    connected: bool
    channels: int
    waiters: int
    reconnects: int
    messages: int
    subscribers: int = 0


class PubSub:
    """The per-client subscription service (see the module docstring).

    :param topology: which subscriber carries a channel (:class:`OneServer`, or a Cluster's).
    :param concurrency: the size of the semaphore pool.
    :param ping_interval: seconds of silence after which a reader PINGs; a second silent
        interval means its connection is dead.
    """

    def __init__(self, topology: Topology, *, concurrency: int, ping_interval: float = 5.0) -> None:
        self._topology = topology
        self._concurrency = concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}  # made on first use of a slot
        self._ping_interval = ping_interval
        self._entries: dict[bytes, Entry] = {}
        self._subscribers: dict[str, Subscriber] = {}  # by Home.name, made on first use
        # The subscriber that carries each cached channel.  Invariant: a cached channel is
        # here, or a ``_subscribe`` of it is scheduled (it moved, or no node was found yet).
        self._homes: dict[bytes, Subscriber] = {}
        self._moves: dict[bytes, int] = {}  # moves of a channel since its last confirmation
        self._background = Background()  # SUBSCRIBE / UNSUBSCRIBE work, moves
        self._closed = False
        self._rehoming: set[Subscriber] = set()  # subscribers whose channels are being moved

    # -- the public surface used by the wait loop ------------------------------------------

    def join(
        self,
        channel: str,
        contention: Contention | None,
        entry_type: Callable[[bytes, Contention | None], Entry] = Entry,
    ) -> Entry:
        """Take a reference on ``channel``'s entry, creating it if it is new; no I/O, no wait.

        ``contention`` is that of the lock the channel is for.  A new entry's SUBSCRIBE runs in
        the background; until the server confirms it, ``entry.confirmed`` is false.  The
        confirmation wakes one parked waiter, who must try the lock (a release may have been
        published before the subscription existed).  If the connection fails first, the entry
        stays: the reader subscribes every channel it carries when it reconnects.  If the server
        refuses the SUBSCRIBE, the entry's waiters are woken to raise its error
        (:meth:`Entry.raise_refusal`).  Every call must be balanced by :meth:`unreference`.
        """
        if self._closed:
            raise RuntimeError("the aiolock client is closed")
        key = channel.encode()
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = entry_type(key, contention)
            self._spawn(self._subscribe(entry))
        # A refs==0 entry still cached has an UNSUBSCRIBE scheduled; it sees refs > 0 and skips.
        entry.refs += 1
        return entry

    def join_existing(self, channel: str) -> Entry | None:
        """:meth:`join` if ``channel`` has an entry already (it is subscribed, or about to be)."""
        entry = self._entries.get(channel.encode())
        if entry is None or self._closed:
            return None
        entry.refs += 1
        return entry

    def unreference(self, entry: Entry) -> None:
        """Drop a reference; the last one schedules the UNSUBSCRIBE (off the caller's path)."""
        entry.refs -= 1
        entry.trim()
        if entry.refs == 0 and not self._closed:
            self._spawn(self._unsubscribe(entry))

    def left(self, channel: str, *, granted: bool) -> None:
        """A task left the lock's wait loop.

        Without the lock: somebody may have queued behind it, or it may have been handed a
        wake-up it will not use; either way the next in line tries now.  With it: wake-ups kept
        meanwhile are dropped (:meth:`Entry.drop_wakeups`).
        """
        if not granted:
            self.wake(channel)
        elif (entry := self._entries.get(channel.encode())) is not None:
            entry.drop_wakeups()

    def wake(self, channel: str) -> None:
        """Wake one of this client's waiters on ``channel``, if it has any."""
        entry = self._entries.get(channel.encode())
        if entry is not None:
            entry.wake_one()

    def hold_ended(self, channel: str) -> None:
        """A hold of this client ended whose waiters park on ``channel`` (Entry.hold_ended)."""
        entry = self._entries.get(channel.encode())
        if entry is not None:
            entry.hold_ended()

    @property
    def entries(self) -> Mapping[bytes, Entry]:
        """The cached entries by channel (a read-only view: reading one takes no reference)."""
        return MappingProxyType(self._entries)

    @property
    def subscriber_homes(self) -> list[str]:
        """The homes (``Home.name``) a subscriber was made for, up or not, in the order made."""
        return list(self._subscribers)

    @property
    def scheduled(self) -> bool:
        """Whether SUBSCRIBE / UNSUBSCRIBE work or a move is still running (see :meth:`drain`)."""
        return bool(self._background)

    def statistics(self) -> PubSubStatistics:
        subscribers = self._subscribers.values()
        up = sum(subscriber.connected for subscriber in subscribers)
        return PubSubStatistics(
            connected=up > 0
            and all(subscriber.connected for subscriber in subscribers if subscriber.entries),
            channels=len(self._entries),
            waiters=sum(entry.refs for entry in self._entries.values()),
            reconnects=sum(subscriber.reconnects for subscriber in subscribers),
            messages=sum(subscriber.messages for subscriber in subscribers),
            subscribers=up,
        )

    async def drain(self) -> None:
        """Wait until the scheduled SUBSCRIBE/UNSUBSCRIBE work is done (for tests and shutdown)."""
        await self._background.drain()

    async def aclose(self) -> None:
        """Stop the readers, close the connections, and wake every waiter so it can leave."""
        self._closed = True
        for entry in self._entries.values():
            entry.wake_all()
        closed = RuntimeError("the aiolock client is closed")
        for subscriber in self._subscribers.values():
            subscriber.fail_confirmations(closed)
        # A task that swallowed its cancellation may have spawned more before it saw we closed.
        await self._background.cancel_all()
        await asyncio.gather(*(subscriber.aclose() for subscriber in self._subscribers.values()))

    # -- the Listener of every subscriber ----------------------------------------------------

    def moved(self, subscriber: Subscriber, entry: Entry) -> None:
        """A node does not serve ``entry``'s channel (any more): subscribe it where the
        refreshed topology puts it."""
        key = entry.channel
        if self._closed or self._entries.get(key) is not entry:
            return
        self._homes.pop(key, None)
        moves = self._moves[key] = self._moves.get(key, 0) + 1
        self._spawn(self._subscribe(entry, moves))

    def refused(self, entry: Entry, error: ResponseError) -> None:
        key = entry.channel
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._homes.pop(key, None)
            self._moves.pop(key, None)
        entry.refuse(error)

    def lost(self, subscriber: Subscriber) -> None:
        """A subscriber cannot connect: once the topology names other owners for its
        channels (a replica took over), they move there."""
        if (
            self._topology.sharded
            and subscriber.entries
            and not self._closed
            and subscriber not in self._rehoming
        ):
            # One at a time per subscriber: each failed connect would start a refresh.
            self._rehoming.add(subscriber)
            self._spawn(self._rehome(subscriber))

    # -- subscribe / unsubscribe work, under the channel's semaphore ---------------------------

    def _semaphore(self, key: bytes) -> asyncio.Semaphore:
        slot = zlib.crc32(key) % self._concurrency
        semaphore = self._semaphores.get(slot)
        if semaphore is None:
            semaphore = self._semaphores[slot] = asyncio.Semaphore(1)
        return semaphore

    def _subscriber(self, home: Home) -> Subscriber:
        subscriber = self._subscribers.get(home.name)
        if subscriber is None:
            subscriber = self._subscribers[home.name] = Subscriber(
                home.source,
                self,
                sharded=self._topology.sharded,
                ping_interval=self._ping_interval,
            )
        return subscriber

    async def _subscribe(self, entry: Entry, moves: int = 0) -> None:
        """SUBSCRIBE an entry where the topology puts it, holding its semaphore until the
        server answers (or, if that node's connection is down, until the reader has it: the
        semaphore is shared with other nodes' channels); ``moves``: how often it moved
        unconfirmed (the topology is then read again first, and after a second move in a row
        only after a pause: it may be settling).
        """
        key = entry.channel
        if moves > 1:
            await asyncio.sleep(min(0.01 * 2 ** min(moves, 7), 1.0))
        unrouted = False
        try:
            async with self._semaphore(key):
                if self._entries.get(key) is not entry:
                    return  # left, or refused, while this call waited
                # Sent even if every waiter has left meanwhile: while the entry is cached a new
                # waiter may join it, and its UNSUBSCRIBE comes after this (the semaphore is
                # first come, first served).
                try:
                    await (self._topology.refresh() if moves else self._topology.ready())
                    subscriber = self._subscriber(self._topology.home(key))
                except (RedisError, RedisClusterException, OSError) as exc:
                    logger.warning("no node found for channel %r yet: %r", key, exc)
                    unrouted = True
                else:
                    self._homes[key] = subscriber
                    if await subscriber.subscribe(entry):
                        self._moves.pop(key, None)
        except (RedisError, OSError, RuntimeError) as exc:
            # Refused or moved: the subscriber has told us (``refused``, ``moved``).  The
            # connection failed, or the client is closing: the entry stays, and the reader
            # subscribes it once it has reconnected, which confirms it.
            logger.debug("SUBSCRIBE %r not confirmed here: %r", key, exc)
        if unrouted and not self._closed:
            self._spawn(self._subscribe(entry, max(moves, 1) + 1))

    async def _rehome(self, subscriber: Subscriber) -> None:
        """Move the channels of a subscriber that cannot connect to the owners the refreshed
        topology names (the others stay: its reader keeps trying)."""
        try:
            await self._topology.refresh()
            homes = {key: self._topology.home(key) for key in subscriber.entries}
        except (RedisError, RedisClusterException, OSError) as exc:
            logger.debug("topology not refreshed: %r", exc)  # the next failed connect retries
            return
        finally:
            self._rehoming.discard(subscriber)
        if self._closed:  # the refresh may have swallowed the close's cancellation
            return
        for key, home in homes.items():
            entry = subscriber.entries.get(key)
            if entry is not None and self._entries.get(key) is entry:
                if self._subscriber(home) is subscriber:
                    continue
                subscriber.drop(entry)
                self._homes.pop(key, None)
                entry.wake_one()  # a release may have been published where nobody listened
                self._spawn(self._subscribe(entry))

    async def _unsubscribe(self, entry: Entry) -> None:
        key = entry.channel
        async with self._semaphore(key):
            if self._entries.get(key) is not entry or entry.refs > 0:
                return  # taken up again, or refused, while this call waited for the semaphore
            del self._entries[key]
            self._moves.pop(key, None)
            home = self._homes.pop(key, None)
            if home is not None:
                await home.unsubscribe(entry)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            coro.close()  # nothing starts once closing began
            return
        self._background.spawn(coro)

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "connected" if stats.connected else "disconnected"
        return f"<PubSub [{state}, channels:{stats.channels}, waiters:{stats.waiters}]>"
