"""``aiolock.sync.Client``: the async client, run on a loop thread, for code that blocks."""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from redis.asyncio import Redis, RedisCluster

from .. import client as async_client
from .._core.habits import teaching
from .._core.names import NameTemplate
from ..client import Client as AsyncClient
from ..client import ClientStatistics
from . import _direct
from ._direct import Taken
from ._kinds import CountDownLatch, ReadWriteLock, Semaphore
from ._line import Line
from ._locks import Lock, locked
from ._loop import Call, LoopThread, abandon, detach, generation, loop_thread, refuse_in_loop

__all__ = ["Client"]

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


class Client:
    """The blocking face of :class:`aiolock.Client`: the same locks, for threads.

    ``aiolock.sync.Client.from_url(url, **options)`` takes the async client's options;
    ``aiolock.sync.Client(connect, **options)`` takes a function that makes the
    ``redis.asyncio`` client to use (``Redis``, ``RedisCluster`` or a sentinel's
    ``master_for``), called at once and again in a forked child; the client closes what it
    made.  Either checks the options at once and connects on the first call.

    Every call blocks the calling thread until the async engine, running on a loop thread
    shared by the process' blocking clients, has done it: locks taken here and from tasks of
    async clients are the same locks.

    The owner of a lock is the calling *thread* (a number per thread, never reused during the
    client's life), or the lock's ``owner=``.  Use it as a context manager or call
    :meth:`close`; a client never closed does not keep the interpreter from exiting.
    """

    __slots__ = (
        "_async",
        "_close_redis",
        "_closed",
        "_connect",
        "_first",
        "_generation",
        "_line",
        "_lock",
        "_loop",
        "_numbers",
        "_threads",
    )

    def __init__(self, connect: Callable[[], Redis | RedisCluster], **options: Any) -> None:
        if not callable(connect):
            raise TypeError(f"connect must be a callable, not {type(connect).__name__}")

        self._setup(lambda: AsyncClient(connect(), **options), close_redis=True)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Client:
        """A client with its own connection pool (the options of
        :meth:`aiolock.Client.from_url`, checked here, before any I/O)."""
        client = cls.__new__(cls)
        client._setup(lambda: AsyncClient.from_url(url, **options), close_redis=False)
        return client

    def _setup(self, build: Callable[[], AsyncClient], *, close_redis: bool) -> None:
        # Built here, which checks the options at once (it connects to nothing yet); it
        # moves to the loop thread with the first call.  A forked child builds its own.
        self._first: AsyncClient | None = build()
        self._connect = build
        self._close_redis = close_redis  # aclose() closes a from_url pool, not one it was given
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._threads = threading.local()
        self._closed = False
        self._async: AsyncClient | None = None
        self._loop: LoopThread | None = None
        self._line: Line | None = None  # the threads' own connections (see _direct.py)
        self._generation = generation()

    # -- the engine --------------------------------------------------------------------------

    def engine(self) -> tuple[AsyncClient, asyncio.AbstractEventLoop]:
        """The async client this one runs (made on first use, and afresh in a forked child)
        and the loop it lives on."""
        made = self._async
        if made is not None and self._generation == generation():
            assert self._loop is not None
            return made, self._loop.loop
        return self._start()

    def _start(self) -> tuple[AsyncClient, asyncio.AbstractEventLoop]:
        if self._generation != generation():  # a forked child: the parent's are not ours
            abandon((self._async, self._loop, self._first, self._line))
            self._async = self._loop = self._first = self._line = None
            self._lock = threading.Lock()
            self._threads = threading.local()
            self._generation = generation()
        with self._lock:
            if self._closed:
                raise RuntimeError("this aiolock.sync.Client is closed")
            if self._async is None:
                thread = loop_thread()
                try:
                    made = Call[AsyncClient]().run(thread.loop, self._make, _nothing)
                except BaseException:
                    detach(thread)
                    raise
                self._line = Line.of(made.redis, thread.loop)
                if self._line is not None:
                    # A grant message to a waiting thread is told to it at once.
                    answer = functools.partial(_direct.answer_message, self._line)
                    async_client.answer_grants(made, answer)
                self._async, self._loop = made, thread
            assert self._loop is not None
            return self._async, self._loop.loop

    async def _make(self) -> AsyncClient:
        first, self._first = self._first, None
        return first if first is not None else self._connect()

    def thread_owner(self, made: AsyncClient) -> str:
        """The calling thread's owner id with ``made`` (numbered on its first call)."""
        number: int | None = getattr(self._threads, "number", None)
        if number is None:
            number = self._threads.number = next(self._numbers)
        return async_client.owners_of(made).of_thread(number)

    def line(self) -> Line | None:
        """The blocking connections the calling threads send their own first tries and
        releases on (``None``: every call goes through the loop; see ``_direct.py``)."""
        return self._line

    def flush(self) -> None:
        """Before a call queued on the loop: the loop runs what the calling threads posted
        first (see ``_line.Posts``)."""
        line = self._line
        if line is not None:
            line.flush()

    def taken(self) -> dict[str, Taken]:
        """What the calling thread took by its own first tries, by lock (registry key)."""
        taken: dict[str, Taken] | None = getattr(self._threads, "taken", None)
        if taken is None:
            taken = self._threads.taken = {}
        return taken

    # -- factories ---------------------------------------------------------------------------

    @teaching
    def lock(self, name: str, *, owner: str | None = None) -> Lock:
        """A reentrant lock (:meth:`aiolock.Client.lock`), its calls blocking."""
        return Lock((self,), lambda made: made[0].lock(name, owner=owner), "client.lock")

    @teaching
    def fair_lock(self, name: str, *, owner: str | None = None) -> Lock:
        """A first-come, first-served lock (:meth:`aiolock.Client.fair_lock`)."""
        return Lock((self,), lambda made: made[0].fair_lock(name, owner=owner), "client.fair_lock")

    @teaching
    def spin_lock(
        self,
        name: str,
        *,
        owner: str | None = None,
        initial_delay: float = 0.001,
        max_delay: float = 0.128,
    ) -> Lock:
        """A lock that never subscribes (:meth:`aiolock.Client.spin_lock`)."""
        return Lock(
            (self,),
            lambda made: made[0].spin_lock(
                name, owner=owner, initial_delay=initial_delay, max_delay=max_delay
            ),
            "client.spin_lock",
        )

    @teaching
    def rw_lock(self, name: str) -> ReadWriteLock:
        """A read-write lock (:meth:`aiolock.Client.rw_lock`)."""
        return ReadWriteLock(self, name)

    @teaching
    def semaphore(self, name: str, permits: int) -> Semaphore:
        """A semaphore with leased permits (:meth:`aiolock.Client.semaphore`)."""
        return Semaphore(self, name, permits)

    @teaching
    def countdown_latch(self, name: str) -> CountDownLatch:
        """A countdown latch (:meth:`aiolock.Client.countdown_latch`)."""
        return CountDownLatch(self, name)

    @teaching
    def locked(
        self, name_template: str, *, wait: float | None = None, lease: float | None = None
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """A decorator that runs a plain function under ``client.lock(name)``, the name made
        from its arguments as in :meth:`aiolock.Client.locked`::

            @client.locked("orders:{order_id}", wait=5)
            def ship(order_id: int) -> None: ...
        """
        return locked(self.lock, NameTemplate(name_template, wait, lease))

    # -- life --------------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The async client's id (part of every owner id); a forked child's is its own."""
        return self.engine()[0].id

    def statistics(self) -> ClientStatistics:
        """The async client's :meth:`~aiolock.Client.statistics` (no I/O; read on the loop)."""
        refuse_in_loop("client.statistics()")
        made, loop = self.engine()

        async def read() -> ClientStatistics:
            return made.statistics()

        self.flush()
        return Call[ClientStatistics]().run(loop, read, _nothing)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the async client (holds still held expire by their leases) and, with the
        process' last blocking client, stop the loop thread."""
        refuse_in_loop("await client.aclose()")
        if self._generation != generation():
            self._start_over_closed()
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
            made, thread, line = self._async, self._loop, self._line
            self._async = self._line = None  # every later call goes to _start, which refuses it
            self._first = None  # never used: it holds no connection
        if made is None or thread is None:
            return

        async def close() -> None:
            await made.aclose()
            if self._close_redis:
                await made.redis.aclose()

        try:
            if line is not None:
                line.flush()
            Call[None]().run(thread.loop, close, _nothing)
        finally:
            if line is not None:
                line.close()
            detach(thread)

    def _start_over_closed(self) -> None:
        """``close()`` in a forked child before any call: nothing of its own to close."""
        abandon((self._async, self._loop, self._first, self._line))
        self._async = self._loop = self._first = self._line = None
        self._generation = generation()
        self._closed = True

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        made = self._async
        return f"<aiolock.sync.Client {made.id if made else '(not started)'} [{state}]>"


def _nothing(_: object) -> None:
    return None
