"""Waiting without polling: one subscriber connection per client, shared by every waiting task.

The pieces, as in Redisson's ``PublishSubscribeService`` and ``RedissonLockEntry``:

- :class:`Entry`: one per subscribed channel, with a reference count (the tasks waiting on that
  lock) and a wake-one latch: each published release hands out *one* wake-up, and so does the
  confirmation of the SUBSCRIBE (a release may have been published before it).
- :class:`PubSub`: the cache of entries keyed by channel.  The first waiter of a channel creates
  its entry and schedules the SUBSCRIBE, the last one out schedules the UNSUBSCRIBE; both run in
  the background, so joining never waits.  A pool of ``asyncio.Semaphore(1)``, picked by hashing
  the channel, serialises that work per channel and bounds how much of it runs at once.
- One reader task owns the connection: it alone connects, reads and reconnects (redis-py
  connections tolerate exactly one reader).  Other tasks only *write* SUBSCRIBE/UNSUBSCRIBE, and
  only while the connection is up; after a reconnect the reader resubscribes every cached channel
  itself.  The reader PINGs an idle connection, so a TCP path that silently stopped forwarding is
  noticed and replaced.  Every command names one channel and the replies due are kept in order,
  so an error reply (a SUBSCRIBE refused by an ACL) is pinned on its channel: that entry's
  waiters raise it, and the connection and the other channels carry on.

A later Cluster mode keeps this interface and runs one reader per node (SSUBSCRIBE): entries,
refcounts and the semaphore pool do not change.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import zlib
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._calls import write

__all__ = [
    "BroadcastEntry",
    "Entry",
    "NamedEntry",
    "PubSub",
    "PubSubStatistics",
    "SubscriberSource",
]

logger = logging.getLogger("aiolock.pubsub")

_CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, EOFError)


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
    :meth:`PubSub.release`; ``_permits <= refs + contention.first_tries`` (restored by
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
        """A message on the channel: a release, which wakes one waiter."""
        self.wake_one()

    def granted(self) -> None:
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

    def __repr__(self) -> str:
        state = "refused" if self.refusal else "confirmed" if self.confirmed else "pending"
        return (
            f"<Entry {self.channel.decode(errors='replace')!r} [{state}, "
            f"refs:{self.refs}, parked:{self.parked}, permits:{self._permits}]>"
        )


class BroadcastEntry(Entry):
    """A channel whose every message wakes every waiter (a latch at zero, readers after a
    write): each of them looks at the state again."""

    __slots__ = ()

    def deliver(self, payload: bytes) -> None:
        self.wake_all()

    def wake_one(self) -> None:
        self.wake_all()


class NamedEntry(Entry):
    """A channel whose messages name the one waiter to wake (the fair lock's hand-off).

    Each waiting owner registers its name for the whole of its wait (:meth:`enter` ..
    :meth:`leave`), so that a message naming it while it is between two tries is kept for its
    next park instead of lost.  Anything that is not a named hand-off (the confirmation of the
    SUBSCRIBE, a reconnect, a loss) wakes every waiter: each tries, and only the next in the
    queue can win.
    """

    __slots__ = ("_named",)

    def __init__(self, channel: bytes, contention: Contention | None = None) -> None:
        super().__init__(channel, contention)
        # owner -> its parked future, or None between parks, or True: woken before it parked.
        # Keyed by the owner's id as the waiter has it (no copy per waiter; a message decodes).
        self._named: dict[str, asyncio.Future[bool] | bool | None] = {}

    def enter(self, name: str) -> None:
        self._named.setdefault(name, None)

    def leave(self, name: str) -> None:
        self._named.pop(name, None)

    def deliver(self, payload: bytes) -> None:
        self.wake_named(payload.decode(errors="replace"))

    def wake_named(self, name: str) -> None:
        """Wake the owner ``name`` if it waits here (at its next park if it is not parked)."""
        if name not in self._named:
            return  # not (or no longer) waiting here
        waiter = self._named[name]
        if isinstance(waiter, asyncio.Future) and not waiter.done():
            self._parked -= 1
            waiter.set_result(True)
            self._named[name] = None
        else:
            self._named[name] = True

    def wake_one(self) -> None:
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every parked waiter, and mark those between two tries as woken: exactly one
        more try each (no spare wake-ups, unlike :meth:`Entry.wake_all`)."""
        for name, waiter in self._named.items():
            if isinstance(waiter, asyncio.Future) and not waiter.done():
                self._parked -= 1
                waiter.set_result(True)
                self._named[name] = None
            elif waiter is None:
                self._named[name] = True

    def park_named(self, name: str, deadline: float) -> asyncio.Future[bool]:
        """:meth:`Entry.park` for the owner ``name``, which a message naming it wakes."""
        if self._named.get(name) is True:
            self._named[name] = None
            woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            woken.set_result(True)
            return woken
        waiter = self.park(deadline)
        self._named[name] = waiter
        return waiter


class SubscriberSource(Protocol):
    """A redis-py ``ConnectionPool``, or a Cluster node: what a connection is made with."""

    @property
    def connection_class(self) -> type[AbstractConnection]: ...

    @property
    def connection_kwargs(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class PubSubStatistics:
    """What the subscriber connection is doing right now."""

    connected: bool
    channels: int
    waiters: int
    reconnects: int
    messages: int


class PubSub:
    """The per-client subscription service (see the module docstring).

    :param source: called at each (re)connect, it says where the subscriber connection goes and
        with which settings: the connection pool of one server, or a node of a Cluster (classic
        pub/sub reaches every node of a Cluster, so any node serves; a dead one is skipped at
        the next reconnect).
    :param concurrency: the size of the semaphore pool.
    :param ping_interval: seconds of silence after which the reader PINGs; a second silent
        interval means the connection is dead.
    """

    def __init__(
        self,
        source: Callable[[], SubscriberSource],
        *,
        concurrency: int,
        ping_interval: float = 5.0,
    ) -> None:
        self._source = source
        self._concurrency = concurrency
        self._semaphores: dict[int, asyncio.Semaphore] = {}  # made on first use of a slot
        self._ping_interval = ping_interval
        self._entries: dict[bytes, Entry] = {}
        self._confirmations: dict[bytes, deque[asyncio.Future[None]]] = {}
        self._connection: AbstractConnection | None = None
        # The replies still due on the connection, oldest first: (kind, channel).  An error
        # reply names no channel; this tells which command the server refused.
        self._due: deque[tuple[bytes, bytes | None]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._demand = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False
        self._reconnects = 0
        self._messages = 0

    # -- the public surface used by the wait loop ------------------------------------------

    def join(
        self, channel: str, contention: Contention | None, entry_type: type[Entry] = Entry
    ) -> Entry:
        """Take a reference on ``channel``'s entry, creating it if it is new; no I/O, no wait.

        ``contention`` is that of the lock the channel is for.  A new entry's SUBSCRIBE runs in
        the background; until the server confirms it, ``entry.confirmed`` is false.  The
        confirmation wakes one parked waiter, who must try the lock (a release may have been
        published before the subscription existed).  If the connection fails first, the entry
        stays: the reader subscribes every cached channel when it reconnects.  If the server
        refuses the SUBSCRIBE, the entry's waiters are woken to raise its error
        (:meth:`Entry.raise_refusal`).  Every call must be balanced by :meth:`release`.
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

    def release(self, entry: Entry) -> None:
        """Drop a reference; the last one schedules the UNSUBSCRIBE (off the caller's path)."""
        entry.refs -= 1
        entry.trim()
        if entry.refs == 0 and not self._closed:
            self._spawn(self._unsubscribe(entry))

    def left(self, channel: str, *, granted: bool) -> None:
        """A task left the lock's wait loop.

        Without the lock: somebody may have queued behind it, or it may have been handed a
        wake-up it will not use; either way the next in line tries now.  With it: wake-ups kept
        meanwhile are dropped (:meth:`Entry.granted`).
        """
        if not granted:
            self.wake(channel)
        elif (entry := self._entries.get(channel.encode())) is not None:
            entry.granted()

    def wake(self, channel: str) -> None:
        """Wake one of this client's waiters on ``channel``, if it has any."""
        entry = self._entries.get(channel.encode())
        if entry is not None:
            entry.wake_one()

    def statistics(self) -> PubSubStatistics:
        return PubSubStatistics(
            connected=self._connection is not None and self._connection.is_connected,
            channels=len(self._entries),
            waiters=sum(entry.refs for entry in self._entries.values()),
            reconnects=self._reconnects,
            messages=self._messages,
        )

    async def drain(self) -> None:
        """Wait until the scheduled SUBSCRIBE/UNSUBSCRIBE work is done (for tests and shutdown)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the reader, close the connection, and wake every waiter so it can leave."""
        self._closed = True
        for entry in self._entries.values():
            entry.wake_all()
        self._fail_confirmations(RuntimeError("the aiolock client is closed"))
        await _cancel(self._background | ({self._reader} if self._reader else set()))
        if self._background:  # a connect the reader left: its connection is dropped when done
            await asyncio.wait(set(self._background), timeout=1.0)
            await _cancel(set(self._background))
        if self._connection is not None:
            await self._connection.disconnect()
            self._connection = None

    # -- subscribe / unsubscribe work, under the channel's semaphore ---------------------------

    def _semaphore(self, key: bytes) -> asyncio.Semaphore:
        slot = zlib.crc32(key) % self._concurrency
        semaphore = self._semaphores.get(slot)
        if semaphore is None:
            semaphore = self._semaphores[slot] = asyncio.Semaphore(1)
        return semaphore

    async def _subscribe(self, entry: Entry) -> None:
        """SUBSCRIBE a new entry, holding its semaphore until the server answers."""
        key = entry.channel
        confirmation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            async with self._semaphore(key):
                # Sent even if every waiter has left meanwhile: while the entry is cached a new
                # waiter may join it, and its UNSUBSCRIBE comes after this (the semaphore is
                # first come, first served).
                self._confirmations.setdefault(key, deque()).append(confirmation)
                self._start_reader()
                # While the connection is down the reader subscribes every cached entry after it
                # reconnects, which confirms this one too.
                await self._send("SUBSCRIBE", key)
                await confirmation
        except (RedisError, OSError, RuntimeError) as exc:
            # Refused: the reader has failed the entry's waiters already (``_refused``).  The
            # connection failed, or the client is closing: the entry stays, and the reader
            # subscribes every cached channel once it has reconnected, which confirms it.
            logger.debug("SUBSCRIBE %r not confirmed here: %r", key, exc)
        finally:
            waiting = self._confirmations.get(key)
            if waiting is not None and confirmation in waiting:
                waiting.remove(confirmation)
                if not waiting:
                    del self._confirmations[key]

    async def _unsubscribe(self, entry: Entry) -> None:
        key = entry.channel
        async with self._semaphore(key):
            if self._entries.get(key) is not entry or entry.refs > 0:
                return  # taken up again, or refused, while this call waited for the semaphore
            del self._entries[key]
            await self._send("UNSUBSCRIBE", key)

    async def _send(self, command: str, key: bytes) -> None:
        """Write a command if the connection is up; never connect (that is the reader's job)."""
        connection = self._connection
        if connection is None or not connection.is_connected:
            return
        try:
            # Never a health check (it would read a reply: a second reader of the connection).
            await self._write(connection, command, key)
        except _CONNECTION_ERRORS as exc:
            logger.debug("pub/sub write failed (the reader reconnects): %r", exc)

    def _write(
        self, connection: AbstractConnection, command: str, key: bytes | None
    ) -> Coroutine[Any, Any, None]:
        """Write ``command`` (one channel per command: a refusal then names its channel)."""
        self._due.append((command.lower().encode(), key))
        return write(connection, (command,) if key is None else (command, key))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- the reader ------------------------------------------------------------------------

    def _start_reader(self) -> None:
        self._demand.set()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(
                self._run(), name="aiolock-pubsub-reader"
            )

    def _new_connection(self) -> AbstractConnection:
        pool = self._source()
        kwargs = dict(pool.connection_kwargs)
        # RESP2 keeps messages plain arrays; our own retry loop replaces redis-py's.
        kwargs.update(
            protocol=2,
            decode_responses=False,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        connection: AbstractConnection = pool.connection_class(**kwargs)
        return connection

    async def _run(self) -> None:
        delay = 0.0
        while not self._closed:
            if not self._entries:
                self._demand.clear()
                await self._demand.wait()
                continue
            connection = self._new_connection()
            # In a task of its own: redis-py's handshake writes through asyncio.wait_for, which
            # on Python 3.11 may swallow our cancellation, and the reader would then read on
            # after the client closed, with ``aclose`` waiting for it.
            connecting = asyncio.ensure_future(connection.connect())  # type: ignore[no-untyped-call]
            try:
                await asyncio.shield(connecting)
            except asyncio.CancelledError:
                self._spawn(_drop_when_connected(connection, connecting))
                raise
            except (*_CONNECTION_ERRORS, RedisError) as exc:
                await connection.disconnect()
                logger.warning("pub/sub connection failed: %r", exc)
                self._fail_confirmations(exc)
                delay = min(max(delay * 2, 0.05), 1.0)
                await asyncio.sleep(delay)
                continue
            delay = 0.0
            if self._closed:  # closed while connecting
                await connection.disconnect(nowait=True)
                return
            self._connection, self._due = connection, deque()
            try:
                for key in list(self._entries):
                    await self._write(connection, "SUBSCRIBE", key)
                await self._read(connection)
            except _CONNECTION_ERRORS as exc:
                logger.warning("pub/sub connection lost, reconnecting: %r", exc)
            finally:
                self._connection = None
                await connection.disconnect(nowait=True)
            self._reconnects += 1

    async def _read(self, connection: AbstractConnection) -> None:
        # An entry confirmed on an earlier connection may have missed a release meanwhile: its
        # first waiter retries once its resubscription is confirmed.
        stale = {key for key, entry in self._entries.items() if entry.confirmed}
        ping_outstanding = False
        while True:
            try:
                reply = await connection.read_response(timeout=self._ping_interval)
            except ResponseError as error:
                ping_outstanding = False
                self._refused(error)
                continue
            if reply is None:  # a silent interval
                if ping_outstanding:
                    raise RedisConnectionError("no reply to PING on the pub/sub connection")
                await self._write(connection, "PING", None)
                ping_outstanding = True
                continue
            ping_outstanding = False
            if not isinstance(reply, list) or len(reply) < 2:
                self._answered()
                continue  # +PONG when subscribed to nothing
            kind, channel = reply[0], reply[1]
            if kind != b"message":
                self._answered()
            if kind == b"message":
                self._messages += 1
                entry = self._entries.get(channel)
                if entry is not None:
                    entry.deliver(reply[2])
            elif kind == b"subscribe":
                self._confirmed(channel)
                entry = self._entries.get(channel)
                if entry is not None and not entry.confirmed:
                    entry.confirm()
                elif entry is not None and channel in stale:
                    # One try hands a missed release on (a grant wakes the next as it goes); all
                    # at once would let the lock go to whichever try landed first, not the head.
                    stale.discard(channel)
                    entry.wake_one()

    def _answered(self) -> None:
        if self._due:
            self._due.popleft()

    def _refused(self, error: ResponseError) -> None:
        """The server answered the oldest command still due with an error."""
        kind, key = self._due.popleft() if self._due else (b"a command", None)
        if kind != b"subscribe" or key is None:
            logger.warning(
                "the server refused %s on the pub/sub connection: %s", kind.decode(), error
            )
            return
        logger.warning("the server refused SUBSCRIBE %r: %s", key, error)
        # Waiting on it would only ever end by timeout: its waiters get the error instead, and
        # the next task to wait on that lock tries again with an entry of its own.
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.refuse(error)
        for confirmation in self._confirmations.pop(key, ()):
            if not confirmation.done():
                confirmation.set_exception(error)

    def _confirmed(self, channel: bytes) -> None:
        waiting = self._confirmations.get(channel)
        # A future already done (failed, or cancelled while the client closes) is skipped: the
        # confirmation belongs to the next one, if any.
        while waiting:
            confirmation = waiting.popleft()
            if not confirmation.done():
                confirmation.set_result(None)
                break
        if not waiting:
            self._confirmations.pop(channel, None)

    def _fail_confirmations(self, exc: BaseException) -> None:
        for waiting in self._confirmations.values():
            for confirmation in waiting:
                if not confirmation.done():
                    confirmation.set_exception(exc)
        self._confirmations.clear()

    def __repr__(self) -> str:
        stats = self.statistics()
        state = "connected" if stats.connected else "disconnected"
        return f"<PubSub [{state}, channels:{stats.channels}, waiters:{stats.waiters}]>"


async def _drop_when_connected(
    connection: AbstractConnection, connecting: asyncio.Future[None]
) -> None:
    """Close a connection once its connect (whose caller has gone) has ended."""
    try:
        await asyncio.wait([connecting])
    finally:
        if connecting.done() and not connecting.cancelled():
            connecting.exception()  # retrieved: nobody else will
        await connection.disconnect(nowait=True)


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them to end.

    The request is repeated every second for a task that is still running: code beneath us
    (``asyncio.wait_for`` on Python 3.11) may have swallowed one, and closing must not hang.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: a failure here is of no use to anybody now
