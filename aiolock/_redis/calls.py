"""Script calls (and the few bare commands) on the client's own connections, made with its
redis-py pool's settings.

A lock operation is one small script call, and redis-py's ``execute_command`` costs more than
the round trip itself on loopback: two pool locks, a health check, observability hooks, and,
under a ``socket_timeout`` (5 s by default in redis-py 8), an ``asyncio.wait_for`` per send that
adds a task and on Python 3.11 may swallow a cancellation.  So the client runs its scripts
itself: pack, write, read one reply.  redis-py's ``Connection`` still does the protocol, TLS,
AUTH and reconnects, and its ``Retry`` still resends (the scripts are idempotent per request).

The connections are the client's own (made by ``pool.make_connection()``, at most
``min(32, pool.max_connections)``; callers beyond that queue in FIFO order), so that they never
starve the pool that the application shares.

A caller cancelled while its call is in flight leaves at once.  The call is not abandoned: the
reply is read in the background and handed, as a future, to the caller's ``orphan`` callback, so
that what the script did on the server (a grant, a release) can be settled.  A call that fails
after its request was written (the connection dropped, the reply timed out, after redis-py's
resends) has an outcome just as unknown: ``orphan`` gets it too, and the caller the error.
"""

from __future__ import annotations

import abc
import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, Protocol, TypeVar

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._scripts import Script
from .auth import asked_for_password
from .deadlines import Deadlines
from .redispy import has_data
from .tasks import Background
from .wire import evaluate, read_replies, read_wait, wait_args

__all__ = [
    "Calls",
    "ConnectionSource",
    "NotSent",
    "Orphan",
    "Runner",
    "not_sent",
]

# At most this many connections of its own per client, and never more than the pool allows.
# The server runs one script at a time: more calls in flight would only queue there.
_MAX_CONNECTIONS: Final = 32


_T = TypeVar("_T")

# What redis-py's Retry resends on (its default supported errors, and the OSError they wrap).
_RESENT_ON: Final = (RedisConnectionError, RedisTimeoutError, OSError)


class _Written(Exception):
    """A ``no_resend`` call's error after its request was written: kept from redis-py's Retry."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _never_resent(
    attempt: Callable[[], Awaitable[_T]],
    written: Callable[[], bool],
    failed: Callable[[Exception], Awaitable[None]],
) -> Callable[[], Awaitable[_T]]:
    """``attempt``, whose error once its request was ``written()`` leaves redis-py's Retry
    wrapped in :class:`_Written`, after ``failed`` (as Retry would call it), so that it is not
    resent (redis-py 5's Retry has no is_retryable)."""

    async def once() -> _T:
        try:
            return await attempt()
        except _RESENT_ON as error:
            if written():
                await failed(error)
                raise _Written(error) from error
            raise

    return once


class NotSent(Exception):
    """The call was cancelled before any of it reached the server."""


Orphan = Callable[["asyncio.Future[Any]"], object]


class ConnectionSource(Protocol):
    """Where a :class:`Calls` gets its connections: a redis-py ``ConnectionPool`` (one server),
    or one node of a Cluster (see :mod:`aiolock._redis.cluster`)."""

    @property
    def max_connections(self) -> int: ...

    def make_connection(self) -> AbstractConnection: ...


class Runner(abc.ABC):
    """What runs scripts: :meth:`run_synced`, which a transport implements, and :meth:`run`,
    the call that waits for no replica.

    The one seam between the engine and the wire (as httpx's transport is): every call of a
    lock, its settlement and the watchdog goes through the client's runner, and its outcomes
    are the ones :meth:`run` lists (a reply, an error before or after the call was written, a
    cancellation that hands the outcome to ``orphan``).  The unit tests put an in-memory runner
    here that scripts those outcomes (``tests/unit/fake_runner.py``).
    """

    __slots__ = ()

    async def run(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
        mark_resends: int = 0,
        no_resend: bool = False,
    ) -> Any:
        """Run ``script`` by SHA (its source once on NOSCRIPT) and return the reply.

        If the caller is cancelled, ``orphan`` receives a future of the call's outcome: the
        reply, :class:`NotSent`, or the error that left the outcome unknown.  If the call fails
        after some attempt was written, ``orphan`` receives that error and the caller it too.
        ``on_send(resend)`` is called right before each attempt is written (after a reconnect
        and a retry's backoff), so that the caller can count a lease the reply reports from
        then.  ``resend`` is true when an earlier attempt was written on a connection that
        failed: that first copy may still reach the server, later.
        ``mark_resends`` (a positive number, the client's resend window in ms): such an attempt
        carries it as one more argument, so that the script knows it (an acquire script then
        voids that request for that long, granted or refused: see
        ``common/_requests.lua``).
        ``no_resend``: never sent again once some attempt was written (a script that is not
        idempotent, such as a transaction's queued commands): the caller gets the error.
        """
        reply, _ = await self.run_synced(
            script,
            keys,
            args,
            sync=None,
            orphan=orphan,
            on_send=on_send,
            mark_resends=mark_resends,
            no_resend=no_resend,
        )
        return reply

    @abc.abstractmethod
    async def run_synced(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        sync: tuple[int, float] | None,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
        mark_resends: int = 0,
        no_resend: bool = False,
    ) -> tuple[Any, int]:
        """:meth:`run`, then, with ``sync = (replicas, seconds)``, ``WAIT`` for that many
        replicas to have the script's writes: the reply, and how many have them (0 for
        ``sync=None``)."""

    @abc.abstractmethod
    async def command(
        self,
        key: str,
        command: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
    ) -> Any:
        """Run one bare ``command`` about ``key`` (on a Cluster, on the node of its slot), as
        :meth:`run` runs a script: resent as redis-py's ``Retry`` says (so only a command that
        is safe to apply twice), ``orphan`` and ``on_send`` likewise."""

    @abc.abstractmethod
    async def publish(self, channel: str, message: str) -> None:
        """Publish ``message`` on a lock's ``channel`` (``SPUBLISH`` on a Cluster whose nodes
        have sharded pub/sub, as the scripts' variants do)."""

    @abc.abstractmethod
    async def aclose(self, grace: float) -> None:
        """Close the runner's connections; replies still being read for callers that left get
        ``grace`` seconds to arrive first."""


class Calls(Runner):
    """Runs one server's scripts for a client (see the module docstring)."""

    def __init__(self, pool: ConnectionSource) -> None:
        self._pool = pool
        self._limit = max(1, min(_MAX_CONNECTIONS, self._pool.max_connections))
        self._connections = 0
        self._idle: list[AbstractConnection] = []
        self._queue: deque[asyncio.Future[AbstractConnection]] = deque()
        self._closed = False
        self._background = Background()  # replies read for callers that left, discards
        self._deadlines = Deadlines()  # the socket timeout of every reply read here

    @property
    def connections(self) -> int:
        """The connections this runner has open: idle, or carrying a call."""
        return self._connections

    @property
    def idle(self) -> tuple[AbstractConnection, ...]:
        """The open connections no call is using now (a snapshot)."""
        return tuple(self._idle)

    @property
    def queued(self) -> int:
        """The calls waiting for a connection (every one is in use, up to the limit)."""
        return len(self._queue)

    async def run_synced(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        sync: tuple[int, float] | None,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
        mark_resends: int = 0,
        no_resend: bool = False,
    ) -> tuple[Any, int]:
        """:meth:`run`, then, with ``sync = (replicas, seconds)``, ``WAIT`` on the same
        connection (WAIT covers the writes of its own connection): the reply, and how many
        replicas have the script's writes (0 for ``sync=None``, which waits for none)."""
        evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
        resent = (*evalsha, int(mark_resends)) if mark_resends else evalsha
        return await self._call(
            (evalsha, resent), script, orphan, sync, on_send, no_resend=no_resend
        )

    async def command(
        self,
        key: str,
        command: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
    ) -> Any:
        reply, _ = await self._call((command, command), None, orphan, None, on_send)
        return reply

    async def publish(self, channel: str, message: str) -> None:
        await self.command(channel, ("PUBLISH", channel, message))

    async def _call(
        self,
        commands: tuple[tuple[Any, ...], tuple[Any, ...]],
        script: Script | None,
        orphan: Orphan | None,
        sync: tuple[int, float] | None,
        on_send: Callable[[bool], object] | None = None,
        *,
        no_resend: bool = False,
    ) -> tuple[Any, int]:
        try:
            conn = await self._borrow()
        except asyncio.CancelledError:
            _orphaned(orphan, NotSent())
            raise
        # sent: some attempt reached the socket (the script may have run); resend: the current
        # attempt follows one that did; in_flight: this connection owes the current one's reply.
        sent = resend = in_flight = False
        connecting: asyncio.Task[None] | None = None
        wait = () if sync is None else (("WAIT", *wait_args(sync)),)
        # The script's reply once read, while its WAIT's is still owed: a cancellation then
        # leaves a known outcome, not a reply to read.
        answered: list[Any] = []

        async def attempt() -> tuple[Any, int]:
            nonlocal sent, resend, in_flight, connecting
            if not conn.is_connected:
                # redis-py's handshake writes through asyncio.wait_for, which on Python 3.11
                # may swallow our caller's cancellation: connect in a task of its own.
                connecting = asyncio.ensure_future(conn.connect())  # type: ignore[no-untyped-call]
                await asyncio.shield(connecting)
                connecting = None
            resend = sent  # an earlier copy went out on a connection that then failed
            if on_send is not None:
                on_send(resend)
            in_flight = True  # set first: a cancel inside write() comes after the bytes left
            sent = True
            # Not disconnected on cancellation: the reply is then read in the background.
            evalsha = commands[resend]  # a resend may carry a mark (``mark_resends``)
            answered.clear()
            reply, synced = await evaluate(
                conn, evalsha, script, wait, sync, deadlines=self._deadlines, answered=answered
            )
            in_flight = False
            return reply, synced

        async def failed(error: Exception) -> None:
            nonlocal in_flight
            in_flight = False
            await conn.disconnect(nowait=True)

        try:
            try:
                # ``once``: a connect that failed is tried again, a written attempt never.
                reply = await conn.retry.call_with_retry(
                    _never_resent(attempt, lambda: sent, failed) if no_resend else attempt, failed
                )
            except _Written as written:
                raise written.error from None
        except asyncio.CancelledError:
            if in_flight:
                # The scripts are idempotent per request, so this reply is the call's outcome,
                # even when it answers a resend.  Cancelled in the WAIT, the script's reply
                # read already is: settled now, not after WAIT's timeout.
                self._spawn(self._finish(conn, sync, resend, answered), orphan, answered)
            else:
                self._spawn(self._discard(conn, after=connecting), None)
                _orphaned(
                    orphan,
                    RedisConnectionError("cancelled between attempts") if sent else NotSent(),
                )
            raise
        except ResponseError as exc:
            self._answered_error(conn, exc)
            raise
        except BaseException as exc:
            self._failed(conn, exc, orphan if sent else None)
            raise
        self._give_back(conn)
        return reply

    def _answered_error(self, conn: AbstractConnection, exc: ResponseError) -> None:
        """The server answered a call with an error: the reply was read whole, and the
        connection is clean, unless the server asks for a password (it closes the connection
        after a long call before authentication), which is raised in plain words."""
        told = asked_for_password(exc, conn)
        if told is None:
            self._give_back(conn)
            return
        self._spawn(self._discard(conn), None)
        raise told from exc

    def _failed(self, conn: AbstractConnection, exc: BaseException, orphan: Orphan | None) -> None:
        """A call failed on ``conn`` with ``exc``: drop the connection, hand the error to
        ``orphan`` (given when some attempt was sent: the script may have run, its outcome is
        unknown), and raise a server's request for a password in plain words instead."""
        self._spawn(self._discard(conn), None)
        if isinstance(exc, Exception):
            _orphaned(orphan, exc)
        told = asked_for_password(exc, conn)
        if told is not None:
            raise told from exc

    async def _finish(
        self,
        conn: AbstractConnection,
        sync: tuple[int, float] | None,
        resend: bool,
        answered: list[Any],
    ) -> Any:
        """Read the reply of a call whose caller was cancelled, then give the connection back.

        ``resend``: that attempt followed one that reached the server, whose outcome a NOSCRIPT
        answer to this one leaves unknown (a restart in between empties the script cache).
        ``answered``: the script's reply, if the caller read it before it was cancelled in the
        WAIT: it is the outcome, and only WAIT's reply is owed.
        """
        if answered:
            assert sync is not None
            try:
                await read_wait(conn, sync, disconnect_on_error=True)
            except ResponseError:
                pass  # read whole: the connection is clean
            except BaseException:
                await self._discard(conn)
                return answered[0]
            self._give_back(conn)
            return answered[0]
        try:
            reply, _ = await read_replies(conn, sync, self._deadlines, disconnect_on_error=True)
        except NoScriptError:
            self._give_back(conn)
            if resend:
                raise RedisConnectionError(
                    "resent after a restart; an earlier copy may have run"
                ) from None
            raise NotSent() from None
        except BaseException:
            await self._discard(conn)
            raise
        self._give_back(conn)
        return reply

    async def _discard(
        self, conn: AbstractConnection, after: asyncio.Future[Any] | None = None
    ) -> None:
        """Drop a connection's socket (its state is unknown) and give it back.

        ``after``: a connect still running on it, waited for first.
        """
        try:
            if after is not None:
                await asyncio.wait([after])
                if not after.cancelled():
                    after.exception()  # retrieved: the caller has gone
            await conn.disconnect(nowait=True)
        finally:
            self._give_back(conn)

    async def _borrow(self) -> AbstractConnection:
        """An idle connection, a new one below the limit, or the next one given back (FIFO)."""
        while self._idle:
            conn = self._idle.pop()
            # The pool's own check: data or EOF on an idle connection means it is not clean.
            try:
                dirty = conn.is_connected and await has_data(conn)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                dirty = True
            except asyncio.CancelledError:
                self._give_back(conn)
                raise
            if not dirty:
                return conn
            self._spawn(self._discard(conn), None)
        if self._connections < self._limit:
            self._connections += 1
            return self._pool.make_connection()
        turn: asyncio.Future[AbstractConnection] = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        try:
            return await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._give_back(turn.result())  # handed over just as the caller was cancelled
            raise

    def _give_back(self, conn: AbstractConnection) -> None:
        if self._closed:
            self._spawn(conn.disconnect(), None)
            return
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(conn)
                return
        self._idle.append(conn)

    def _spawn(
        self, work: Coroutine[Any, Any, Any], orphan: Orphan | None, answered: Sequence[Any] = ()
    ) -> None:
        """Run ``work`` in the background; ``orphan`` gets its outcome, or ``answered[0]``
        (a reply already read) at once."""
        task = self._background.spawn(work)
        if orphan is not None and not answered:
            orphan(task)
        else:
            task.add_done_callback(_consume)
            if orphan is not None:
                done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                done.set_result(answered[0])
                orphan(done)

    async def aclose(self, grace: float) -> None:
        """Close every connection; background reads get ``grace`` seconds to finish first."""
        self._closed = True
        for task in await self._background.wait(within=grace):
            task.cancel()
        # Connections given back from now on are closed as they come (calls still in flight).
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.disconnect()
        await self._background.wait()


def not_sent() -> asyncio.Future[Any]:
    """The outcome of a call cancelled before it was sent."""
    return _failed(NotSent())


def _failed(error: BaseException) -> asyncio.Future[Any]:
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_exception(error)
    done.exception()  # marked retrieved: the orphan handler may ignore it
    return done


def _orphaned(orphan: Orphan | None, error: BaseException) -> None:
    if orphan is not None:
        orphan(_failed(error))


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
