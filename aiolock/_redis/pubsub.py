"""Waiting without polling: a client's subscriptions, shared by every waiting task.

The pieces, as in Redisson's ``PublishSubscribeService`` and ``RedissonLockEntry``:

- :class:`Entry`: one per subscribed channel, with a reference count (the tasks waiting on that
  lock) and a wake-one latch: each published release hands out *one* wake-up, and so does the
  confirmation of the SUBSCRIBE (a release may have been published before it).
  A message is the entry's to read (:meth:`Entry.deliver`): an :class:`Entry` wakes one waiter
  per message, a :class:`BroadcastEntry` all of them; a kind whose messages carry more
  subclasses it in its own package (the fair lock's :class:`~aiolock.fair.entry.NamedEntry`),
  so the transport knows no kind's message format.
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
import copy
import logging
import math
import zlib
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Protocol

from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .subscriber import Subscriber, SubscriberSource
from .tasks import Background

__all__ = [
    "BroadcastEntry",
    "Contention",
    "Entry",
    "Home",
    "OneServer",
    "PubSub",
    "PubSubStatistics",
    "SubscriberSource",
    "Topology",
]

logger = logging.getLogger("aiolock.pubsub")


class Contention(Protocol):
    """What an entry needs to know of its lock's tasks (``NameCounters`` in practice)."""

    @property
    def contenders(self) -> int:
        """Tasks of this client after the lock: trying, or parked."""
        ...

    @property
    def first_tries(self) -> int:
        """Tasks after the lock that have not joined its channel: on their first try."""
        ...


class Entry:
    """A subscribed channel: who waits on it, and the wake-ups handed to them.

    Invariants: ``refs`` counts the tasks between :meth:`PubSub.join` and
    :meth:`PubSub.unreference`; ``_permits <= refs + contention.first_tries`` (restored by
    :meth:`trim` when a task leaves).  A wake-up is kept as a
    permit for the next task to park when nobody is parked, and also while a task of this client
    is on its first try: that task came before every parked one, and its try may have run
    before the release (or before the subscription existed).  More permits than tasks that may
    park would only cause empty retries.

    Thousands of tasks may wait on one client, so a parked waiter is only a future (``True``:
    woken, ``False``: its deadline passed) and its deadline in the queue; one timer per entry, at
    the earliest deadline, expires the waiters that are due.  Futures that ended by deadline or
    cancellation stay queued until skipped or compacted; ``parked`` counts the others.
    """

    __slots__ = (
        "_parked",
        "_permits",
        "_timer",
        "_timer_at",
        "_waiters",
        "channel",
        "confirmed",
        "contention",
        "refs",
        "refusal",
    )

    # A deadline is the end of the lease a task's try met: expiry publishes nothing.  Of this
    # client's tasks whose deadlines pass together, one tries: if the lock was free, it holds
    # it now (and its release wakes the next); if not, its try met a new lease, and it parks
    # with that; if it leaves, it wakes the next.  The others try only when woken.
    expires_one: ClassVar[bool] = True

    def __init__(self, channel: bytes, contention: Contention | None = None) -> None:
        self.channel = channel
        self.contention = contention  # of the lock this channel is for; None: no first tries
        self.refs = 0
        self.confirmed = False  # the server has confirmed its SUBSCRIBE
        self.refusal: ResponseError | None = None  # the server refused the SUBSCRIBE
        self._permits = 0
        self._parked = 0
        # (future, deadline, ticket), in ticket order: the order the tasks entered the contest.
        self._waiters: deque[tuple[asyncio.Future[bool], float, float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    @property
    def parked(self) -> int:
        return self._parked

    @property
    def permits(self) -> int:
        """Wake-ups kept for the next tasks to park (see the class docstring)."""
        return self._permits

    def wake_one(self) -> None:
        """Hand one wake-up to the first parked waiter, or keep it (see the class docstring).

        Kept while any task of this client is out trying (a first try, or a try after an
        earlier wake-up): that task is ahead of every parked one, and waking one more would
        put two tasks on the lock at once, where the later one may win.
        """
        first_tries = self._first_tries()
        while self._waiters and not self._trying():
            waiter, _, _ = self._waiters.popleft()
            if not waiter.done():
                self._parked -= 1
                waiter.set_result(True)
                return
        if self._permits < self.refs + first_tries:
            self._permits += 1

    def deliver(self, payload: bytes) -> None:
        """A message on the channel: a release, which wakes one waiter.

        The transport reads no message: a kind whose messages say more (the fair lock's name
        the waiter to wake) subclasses the entry and reads them in its override."""
        self.wake_one()

    def drop_wakeups(self) -> None:
        """A task of this client got the lock: drop the wake-ups kept meanwhile.

        Any try now would find the lock held; its next release wakes the head as usual.
        """
        self._permits = 0

    def trim(self) -> None:
        """Drop permits that no task can use any more (after one left)."""
        self._permits = min(self._permits, self.refs + self._first_tries())

    def _first_tries(self) -> int:
        return 0 if self.contention is None else self.contention.first_tries

    def _trying(self) -> int:
        """Tasks of this client after the lock and not parked: out on a try."""
        return 0 if self.contention is None else self.contention.contenders - self._parked

    def wake_all(self) -> None:
        """Wake every waiter: the server refused the channel, or the client closes.

        The tasks out trying meanwhile get a permit each: their try may have come too early.
        """
        out = self.refs - self._parked
        while self._waiters:
            waiter, _, _ = self._waiters.popleft()
            # A cancelled one is done already, and counted off by its own ``unpark``.
            if not waiter.done():
                self._parked -= 1
                waiter.set_result(True)
        self._permits = max(out, 0)

    def refuse(self, refusal: ResponseError) -> None:
        """The server refused the SUBSCRIBE (an ACL, say): wake every waiter to raise it."""
        if self.refusal is None:
            self.refusal = refusal
            self.wake_all()

    def raise_refusal(self) -> None:
        """Raise a copy of the server's refusal, if there was one.

        A copy per waiting task: tracebacks pile up on an exception object raised in several.
        """
        if self.refusal is not None:
            raise copy.copy(self.refusal)

    def confirm(self) -> None:
        """The server confirmed the SUBSCRIBE: one waiter tries, as after a release."""
        self.confirmed = True
        self.wake_one()

    def park(self, deadline: float, ticket: float = math.inf) -> asyncio.Future[bool]:
        """A future to await until a wake-up (``True``) or ``deadline`` (``False``; ``inf``: none).

        ``ticket``: the task's place in line (when it entered the contest); it is queued after
        every waiter with a lower or equal ticket, so that tasks woken together (their
        deadlines passed at once) re-park in their order, whatever order their tries came back in.

        A caller cancelled while awaiting it must call :meth:`unpark`; a caller that leaves the
        lock's wait loop without the lock wakes the next waiter (``PubSub.left``), which also
        hands on a wake-up it was given but will not use.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        if self._permits:
            self._permits -= 1
            waiter.set_result(True)
            return waiter
        waiters = self._waiters
        if len(waiters) > 2 * self._parked + 16:
            waiters = self._waiters = deque(item for item in waiters if not item[0].done())
        if not waiters or waiters[-1][2] <= ticket:
            waiters.append((waiter, deadline, ticket))  # a newcomer: the usual case
        else:
            place = next(i for i, item in enumerate(waiters) if item[2] > ticket)
            waiters.insert(place, (waiter, deadline, ticket))
        self._parked += 1
        if deadline < self._timer_at:
            self._arm(loop, deadline)
        return waiter

    def bound(self, until: float) -> None:
        """A task of this client got the lock, held until loop time ``until`` unless renewed
        or released: the parked ones try no later (see ``expires_one``; a hold that ends
        silently wakes one through its loss, but a release's message can be lost)."""
        if self.expires_one and self._parked and until < self._timer_at:
            self._arm(asyncio.get_running_loop(), until)

    def wake(self, waiter: asyncio.Future[bool]) -> None:
        """Wake one parked waiter out of turn (another call of its owner got the lock)."""
        if not waiter.done():
            self._parked -= 1
            waiter.set_result(True)

    def expire(self, waiter: asyncio.Future[bool]) -> None:
        """End one parked waiter's park as if its deadline had passed (a subclass's own bound)."""
        if not waiter.done():  # else woken, cancelled or timed out already
            self._parked -= 1
            waiter.set_result(False)

    def unpark(self, waiter: asyncio.Future[bool]) -> None:
        """The caller of :meth:`park` was cancelled: stop counting it if it was still parked."""
        if waiter.cancelled():
            self._parked -= 1

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._expire_due)

    def _expire_due(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer, self._timer_at = None, math.inf
        if self.expires_one:
            self._expire_first()
            return
        # The loop may run a timer up to its clock resolution early.
        now = loop.time() + 0.001
        earliest = math.inf
        for waiter, deadline, _ in self._waiters:
            if waiter.done():
                continue
            if deadline <= now:
                self._parked -= 1
                waiter.set_result(False)
            else:
                earliest = min(earliest, deadline)
        if earliest < math.inf:
            self._arm(loop, earliest)

    def _expire_first(self) -> None:
        """A deadline passed: wake the first waiter in line, and drop every other deadline
        (see ``expires_one``)."""
        waiters = self._waiters
        first = next((waiter for waiter, _, _ in waiters if not waiter.done()), None)
        if first is not None:
            self._parked -= 1
            first.set_result(False)
        self._waiters = deque((w, math.inf, ticket) for w, _, ticket in waiters if not w.done())

    def __repr__(self) -> str:
        state = "refused" if self.refusal else "confirmed" if self.confirmed else "pending"
        return (
            f"<Entry {self.channel.decode(errors='replace')!r} [{state}, "
            f"refs:{self.refs}, parked:{self.parked}, permits:{self._permits}]>"
        )


class BroadcastEntry(Entry):
    """A channel whose every message wakes every waiter (a latch at zero, readers after a
    write): each of them looks at the state again, as each does when its deadline passes."""

    __slots__ = ()
    expires_one = False

    def deliver(self, payload: bytes) -> None:
        self.wake_all()

    def wake_one(self) -> None:
        self.wake_all()


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
