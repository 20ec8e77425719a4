"""One subscriber connection and the one task that reads it: a server's, or a Cluster node's.

The reader alone connects, reads and reconnects (redis-py connections tolerate exactly one
reader).  Other tasks only *write* (S)SUBSCRIBE / (S)UNSUBSCRIBE, and only while the connection
is up; after a reconnect the reader subscribes every channel of this subscriber itself.  It
PINGs an idle connection, so a TCP path that silently stopped forwarding is noticed and
replaced.

Replies answer commands in order, so the commands written are kept as the replies due, oldest
first, each naming one channel: an error reply is pinned on the command it answers (a SUBSCRIBE
refused by an ACL fails that channel's waiters; the connection and the other channels carry
on).  A reply that answers no command due means the reader has lost track of them: it starts
afresh on a new connection, as after a lost one.

Sharded (a Cluster node, SSUBSCRIBE): a node serves only the channels of its own slots.  It
answers a channel of another slot with MOVED (ASK, TRYAGAIN or CLUSTERDOWN while a slot moves
or a failover runs), and when it loses a slot (migrated away, or taken over by a replica) it
drops that slot's subscribers with an *unrequested* ``sunsubscribe``: one that answers no
command due.  Either way the channel is no longer served here, which the :class:`Listener`
hears as a move (find the owner again, subscribe there); it is never taken as the answer to a
command of ours.  (If the slot moves while our SUNSUBSCRIBE is on its way, the unrequested
drop comes first and is taken for its answer; the command's own answer, a MOVED naming the
slot, then answers nothing due, and a redirection for another slot than the oldest command's
is known for that.)  A sharded subscriber closes its connection once it has had nothing to
listen to for a ping interval: a client keeps a connection only to the nodes it has waiters
on.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, RedisError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .tasks import Background, cancel, supervise
from .wire import write

if TYPE_CHECKING:
    from .entry import Entry

__all__ = ["Listener", "Subscriber", "SubscriberSource"]

logger = logging.getLogger("aiolock.pubsub")

_CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, EOFError)
# "This node does not serve the channel's slot (now)".  MovedError is an AskError.
_REDIRECTIONS = (AskError, TryAgainError, ClusterDownError)


class SubscriberSource(Protocol):
    """A redis-py ``ConnectionPool``, or a Cluster node: what a connection is made with."""

    @property
    def connection_class(self) -> type[AbstractConnection]: ...

    @property
    def connection_kwargs(self) -> dict[str, Any]: ...


class Listener(Protocol):
    """What a subscriber reports to the service that owns the entries (``PubSub``)."""

    def moved(self, subscriber: Subscriber, entry: Entry) -> None:
        """The node does not serve ``entry``'s channel (any more); it is no longer here."""
        ...

    def refused(self, entry: Entry, error: ResponseError) -> None:
        """The server refused ``entry``'s SUBSCRIBE; it is no longer here."""
        ...

    def lost(self, subscriber: Subscriber) -> None:
        """The connection could not be made (the node may have gone)."""
        ...


@dataclass(frozen=True, slots=True)
class _Verbs:
    subscribe: str
    unsubscribe: str
    message: bytes

    @property
    def subscribed(self) -> bytes:
        return self.subscribe.lower().encode()

    @property
    def unsubscribed(self) -> bytes:
        return self.unsubscribe.lower().encode()


_CLASSIC = _Verbs("SUBSCRIBE", "UNSUBSCRIBE", b"message")
_SHARDED = _Verbs("SSUBSCRIBE", "SUNSUBSCRIBE", b"smessage")
_PONG = b"pong"


class _OutOfStep(RedisConnectionError):
    """A reply that answers no command due: the reader starts afresh on a new connection."""


class Subscriber:
    """One subscriber connection, its reader, and the entries whose channels it carries.

    :param source: called at each (re)connect: where the connection goes, with which settings.
    :param sharded: SSUBSCRIBE on a Cluster node, instead of SUBSCRIBE.
    :param ping_interval: seconds of silence after which the reader PINGs; a second silent
        interval means the connection is dead.
    """

    def __init__(
        self,
        source: Callable[[], SubscriberSource],
        listener: Listener,
        *,
        sharded: bool = False,
        ping_interval: float = 5.0,
    ) -> None:
        self._source = source
        self._listener = listener
        self._sharded = sharded
        self._verbs = _SHARDED if sharded else _CLASSIC
        self._ping_interval = ping_interval
        # The channels carried here.  Invariant: an entry is on one subscriber at a time.
        self.entries: dict[bytes, Entry] = {}
        # Confirmed channels resubscribed here (a reconnect, a move) that may have missed a
        # release meanwhile: their confirmation wakes one waiter.
        self._stale: set[bytes] = set()
        # The confirmations awaited, per channel: the entry each is for, and its future.
        self._confirmations: dict[bytes, deque[tuple[Entry, asyncio.Future[None]]]] = {}
        self._connection: AbstractConnection | None = None
        # The replies due, in order: (reply verb, channel, the entry a SUBSCRIBE was for).  A
        # reply confirms that entry only: after an UNSUBSCRIBE and a new entry's SUBSCRIBE of
        # the same channel, the first SUBSCRIBE's reply must not confirm the new entry.
        self._due: deque[tuple[bytes, bytes | None, Entry | None]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._demand = asyncio.Event()
        self._background = Background()  # connects whose caller has gone
        self._closed = False
        self.reconnects = 0
        self.messages = 0

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.is_connected

    async def subscribe(self, entry: Entry) -> bool:
        """Carry ``entry``'s channel here; return True once the server confirms it, or False
        at once while the connection is down or still being made: the reader then subscribes
        it once connected, which confirms it.

        The caller holds the channel's semaphore, shared with other channels (on other nodes
        too): a node that cannot be reached must not hold it through a connect that may take
        minutes.  Raises the server's refusal or redirection (the :class:`Listener` has heard
        of it already), or the failure of the connection: the entry then stays, as above.
        """
        if self._closed:
            raise RuntimeError("the aiolock client is closed")
        key = entry.channel
        self.entries[key] = entry
        if entry.confirmed:
            self._stale.add(key)  # moved here from another node
        confirmation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        awaited = (entry, confirmation)
        self._confirmations.setdefault(key, deque()).append(awaited)
        try:
            self._start_reader()
            if not await self._send(self._verbs.subscribe, key, entry):
                return False
            await confirmation
            return True
        finally:
            waiting = self._confirmations.get(key)
            if waiting is not None and awaited in waiting:
                waiting.remove(awaited)
                if not waiting:
                    del self._confirmations[key]
            if confirmation.done() and not confirmation.cancelled():
                # Failed while the SUBSCRIBE was being written (the connection was lost):
                # retrieved here, since nobody awaits it after a write that did not go out.
                confirmation.exception()

    async def unsubscribe(self, entry: Entry) -> None:
        """Stop carrying ``entry``'s channel (nothing to do if it has moved elsewhere)."""
        key = entry.channel
        if self.entries.get(key) is not entry:
            return
        del self.entries[key]
        self._stale.discard(key)
        await self._send(self._verbs.unsubscribe, key)

    def drop(self, entry: Entry) -> None:
        """``entry`` moves to another subscriber: forget it here, without a word to the server
        (its connection is down, or the node no longer serves the channel)."""
        key = entry.channel
        if self.entries.get(key) is entry:
            del self.entries[key]
            self._stale.discard(key)
            self._fail(key, RedisConnectionError("the channel moved to another node"))

    def fail_confirmations(self, exc: BaseException) -> None:
        """Fail every confirmation still awaited (the connection failed, or the client closes)."""
        for waiting in self._confirmations.values():
            for _, confirmation in waiting:
                if not confirmation.done():
                    confirmation.set_exception(exc)
        self._confirmations.clear()

    async def aclose(self) -> None:
        """Stop the reader and close the connection."""
        self._closed = True
        self.fail_confirmations(RuntimeError("the aiolock client is closed"))
        await cancel(self._background.tasks() | ({self._reader} if self._reader else set()))
        if self._background:  # a connect the reader left: its connection is dropped when done
            await self._background.wait(within=1.0)
            await cancel(self._background.tasks())
        if self._connection is not None:
            await self._connection.disconnect()
            self._connection = None

    # -- writing ---------------------------------------------------------------------------

    async def _send(self, command: str, key: bytes, entry: Entry | None = None) -> bool:
        """Write a command if the connection is up; never connect (that is the reader's job).

        Returns whether it was written: if not, the connection is down, and the reader, once
        connected, subscribes the channels it then carries.
        """
        connection = self._connection
        if connection is None or not connection.is_connected:
            return False
        try:
            # Never a health check (it would read a reply: a second reader of the connection).
            await self._write(connection, command, key, entry)
        except _CONNECTION_ERRORS as exc:
            logger.debug("pub/sub write failed (the reader reconnects): %r", exc)
            return False
        return True

    def _write(
        self,
        connection: AbstractConnection,
        command: str,
        key: bytes | None,
        entry: Entry | None = None,
    ) -> Coroutine[Any, Any, None]:
        """Write ``command`` (one channel per command: a refusal then names its channel);
        ``entry``: the one a SUBSCRIBE is for."""
        self._due.append((_PONG if key is None else command.lower().encode(), key, entry))
        return write(connection, (command,) if key is None else (command, key))

    # -- the reader ------------------------------------------------------------------------

    def _start_reader(self) -> None:
        self._demand.set()
        if self._reader is None or self._reader.done():
            self._reader = supervise("aiolock-pubsub-reader", self._run)

    def _new_connection(self) -> AbstractConnection:
        source = self._source()
        kwargs = dict(source.connection_kwargs)
        # RESP2 keeps messages flat arrays; our own retry loop replaces redis-py's.
        kwargs.update(
            protocol=2,
            decode_responses=False,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        connection: AbstractConnection = source.connection_class(**kwargs)
        return connection

    async def _run(self) -> None:
        delay = 0.0
        while not self._closed:
            if not self.entries:
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
                self._background.spawn(_drop_when_connected(connection, connecting))
                raise
            except (*_CONNECTION_ERRORS, RedisError) as exc:
                await connection.disconnect()
                logger.warning("pub/sub connection failed: %r", exc)
                self.fail_confirmations(exc)
                self._listener.lost(self)
                delay = min(max(delay * 2, 0.05), 1.0)
                await asyncio.sleep(delay)
                continue
            delay = 0.0
            if self._closed:  # closed while connecting
                await connection.disconnect(nowait=True)
                return
            self._connection, self._due = connection, deque()
            # A channel confirmed on an earlier connection may have missed a release meanwhile.
            self._stale = {key for key, entry in self.entries.items() if entry.confirmed}
            try:
                for key, entry in list(self.entries.items()):
                    # One that left meanwhile (its UNSUBSCRIBE may be written already) is not
                    # subscribed again.
                    if self.entries.get(key) is entry:
                        await self._write(connection, self._verbs.subscribe, key, entry)
                await self._read(connection)
                continue  # idle: closed until there are waiters again
            except _CONNECTION_ERRORS as exc:
                logger.warning("pub/sub connection lost, reconnecting: %r", exc)
                # Nobody waits for a confirmation through the reconnect (a caller may hold a
                # semaphore shared with other nodes' channels): the entries stay, and the
                # reader subscribes them again once connected, which confirms them.
                self.fail_confirmations(exc)
            finally:
                self._connection = None
                await connection.disconnect(nowait=True)
            self.reconnects += 1

    async def _read(self, connection: AbstractConnection) -> None:
        """Read until the connection fails, or (sharded) it has been idle for a ping interval."""
        verbs = self._verbs
        ping_outstanding = False
        while True:
            try:
                reply = await connection.read_response(timeout=self._ping_interval)
            except ResponseError as error:
                ping_outstanding = False
                self._error(error)
                continue
            if reply is None:  # a silent interval
                if ping_outstanding:
                    raise RedisConnectionError("no reply to PING on the pub/sub connection")
                if self._sharded and not self.entries and not self._due:
                    return
                await self._write(connection, "PING", None)
                ping_outstanding = True
                continue
            ping_outstanding = False
            # +PONG when subscribed to nothing, else arrays: [verb, channel, ...].
            verb: bytes
            channel: bytes
            verb, channel = (reply[0], reply[1]) if isinstance(reply, list) else (_PONG, b"")
            if verb == verbs.message:
                self.messages += 1
                entry = self.entries.get(channel)
                if entry is not None:
                    entry.deliver(reply[2])
                    # Let the woken waiter run before this reader arms its next read: on a
                    # hand-off it is the one on the critical path.
                    await asyncio.sleep(0)
            elif verb == verbs.unsubscribed and self._sharded and not self._answers(verb, channel):
                logger.info("the node dropped channel %r (its slot moved)", channel)
                self._moved(channel, RedisConnectionError("the node no longer serves the slot"))
            else:
                if not self._answers(verb, channel):
                    raise _OutOfStep(f"{verb!r} {channel!r} answers no command due")
                _, _, entry = self._due.popleft()
                if verb == verbs.subscribed:
                    self._confirmed(channel, entry)

    def _answers(self, verb: bytes, channel: bytes | None) -> bool:
        """Whether a reply ``verb`` on ``channel`` answers the oldest command due."""
        if not self._due:
            return False
        due_verb, due_channel, _ = self._due[0]
        return due_verb == verb and (due_channel is None or due_channel == channel)

    def _answers_slot(self, slot: int) -> bool:
        """Whether a redirection for ``slot`` may answer the oldest command due."""
        return bool(self._due) and self._due[0][1] is not None and key_slot(self._due[0][1]) == slot

    def _error(self, error: ResponseError) -> None:
        """The server answered the oldest command still due with an error."""
        if isinstance(error, AskError) and not self._answers_slot(error.slot_id):
            # The slot moved while our SUNSUBSCRIBE was on its way: the node dropped the
            # channel (the unrequested ``sunsubscribe``, taken for that command's answer), then
            # answered the command itself with this redirection.  Nothing is due for it.
            logger.debug("a late answer to a SUNSUBSCRIBE: %s", error)
            return
        if not self._due:
            raise _OutOfStep(f"an error answers no command due: {error}")
        verb, key, _ = self._due.popleft()
        if verb == self._verbs.subscribed and key is not None:
            if isinstance(error, _REDIRECTIONS):
                logger.info("%s %r redirected: %s", self._verbs.subscribe, key, error)
                self._moved(key, error)
            else:
                self._refused(key, error)
        elif verb == self._verbs.unsubscribed and isinstance(error, _REDIRECTIONS):
            logger.debug("%s %r: the node had dropped it: %s", self._verbs.unsubscribe, key, error)
        else:
            logger.warning(
                "the server refused %s on the pub/sub connection: %s", verb.decode(), error
            )

    def _moved(self, key: bytes, error: Exception) -> None:
        """The node does not serve ``key``: its waiters try at once (a release may have been
        missed), and the listener finds the channel's owner again."""
        entry = self.entries.pop(key, None)
        self._stale.discard(key)
        self._fail(key, error)
        if entry is not None:
            entry.wake_one()
            self._listener.moved(self, entry)

    def _refused(self, key: bytes, error: ResponseError) -> None:
        logger.warning("the server refused %s %r: %s", self._verbs.subscribe, key, error)
        # Waiting on it would only ever end by timeout: its waiters get the error instead, and
        # the next task to wait on that lock tries again with an entry of its own.
        entry = self.entries.pop(key, None)
        self._stale.discard(key)
        self._fail(key, error)
        if entry is not None:
            self._listener.refused(entry, error)

    def _confirmed(self, channel: bytes, subscribed: Entry | None) -> None:
        """The server confirmed a SUBSCRIBE of ``channel`` written for entry ``subscribed``."""
        waiting = self._confirmations.get(channel)
        if waiting:
            for awaited in list(waiting):
                if awaited[0] is subscribed:
                    waiting.remove(awaited)
                    if not awaited[1].done():
                        awaited[1].set_result(None)
            if not waiting:
                self._confirmations.pop(channel, None)
        entry = self.entries.get(channel)
        if entry is None or entry is not subscribed:
            return  # that entry left (or moved) since: a later SUBSCRIBE confirms its successor
        if not entry.confirmed:
            entry.confirm()
        elif channel in self._stale:
            # One try hands a missed release on (a grant wakes the next as it goes); all at
            # once would let the lock go to whichever try landed first, not the head.
            self._stale.discard(channel)
            entry.wake_one()

    def _fail(self, key: bytes, error: BaseException) -> None:
        for _, confirmation in self._confirmations.pop(key, ()):
            if not confirmation.done():
                confirmation.set_exception(error)

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        verb = "sharded" if self._sharded else "classic"
        return f"<Subscriber {verb} [{state}, channels:{len(self.entries)}]>"


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
