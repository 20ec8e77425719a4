"""The blocking connections of one async client for its threads' own calls, and the way
their outcomes reach the loop (:mod:`aiolock.sync._direct` sends the calls).

:class:`Line` makes the connections with the async pool's options and never resends (a fault
is the loop's settlement's); :class:`Posts` hands the loop what a thread's call did, in the
thread's order; :class:`Waiting` is a thread's acquire waiting on the loop, which another
thread's release, or the loop reading a grant's message, may answer (``_direct._tell``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio import connection as async_connection
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._core.holds import Hold
from .._core.line import LineGrant
from ._loop import Call

__all__ = ["BATCH", "Line", "Posts", "Waiting"]

logger = logging.getLogger("aiolock")

# How long after the loop is woken for a thread's post it runs the batch (seconds): the records
# of a thread's grants and releases wait that long, the loop path never (see Posts).
BATCH: Final = 0.002

# The async pool's connection classes and the blocking ones that speak the same (a sentinel's
# managed connection, or any other class, has no counterpart here: no line, the loop's path).
_BLOCKING: Final[dict[type[Any], type[Any]]] = {
    async_connection.Connection: redis.Connection,
    async_connection.SSLConnection: redis.SSLConnection,
    async_connection.UnixDomainSocketConnection: redis.UnixDomainSocketConnection,
}
# The connection options a line takes from the async pool (where, who, how long, TLS): not its
# retry policy (the line never resends: a fault is the loop's settlement's) nor redis-py's
# async-only helpers.
_OPTIONS: Final = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "credential_provider",
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "socket_keepalive_options",
        "client_name",
        "lib_name",
        "lib_version",
        "encoding",
        "encoding_errors",
        "decode_responses",
        "protocol",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
    }
)


class Line:
    """One async client's blocking connections, for its threads' own calls (made with the
    async pool's options, never resending), the way their outcomes reach the loop, and its
    threads waiting there (:class:`Waiting`, by lock and owner)."""

    __slots__ = ("_idle", "_make", "_posts", "waiting")

    def __init__(self, make: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self._make = make
        self._idle: list[Any] = []  # pop and append are atomic: the threads share them
        self._posts = Posts(loop)
        # Each thread sets and removes its own entries; any thread reads them.
        self.waiting: dict[tuple[str, str], Waiting] = {}

    @classmethod
    def of(cls, client: Any, loop: asyncio.AbstractEventLoop) -> Line | None:
        """A line to the server of ``client`` (a ``redis.asyncio`` client); ``None`` for a
        Cluster, a sentinel's or any connection this module does not know."""
        if not isinstance(client, AsyncRedis):
            return None
        pool = client.connection_pool
        blocking = _BLOCKING.get(pool.connection_class)
        kwargs = pool.connection_kwargs
        if blocking is None or kwargs.get("redis_connect_func") is not None:
            return None
        options = {name: value for name, value in kwargs.items() if name in _OPTIONS}
        return cls(lambda: blocking(retry=Retry(NoBackoff(), 0), **options), loop)

    def borrow(self) -> Any:
        """An idle connection, or a new one, connected; an error here sent nothing."""
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._make()
        conn.connect()
        # The pool's own check: data or EOF on an idle connection means it is not clean.
        if conn.can_read():
            conn.disconnect()
            conn.connect()
        return conn

    def give_back(self, conn: Any) -> None:
        self._idle.append(conn)

    def post(
        self, callback: Callable[[], object], *, urgent: bool = False, wake: bool = True
    ) -> None:
        """Run ``callback`` on the loop, after the ones posted before (see :class:`Posts`);
        ``wake=False``: the caller calls :meth:`wake` soon."""
        self._posts.post(callback, urgent=urgent, wake=wake)

    def wake(self) -> None:
        """Have the loop run what was posted with ``wake=False``, in a batch (see
        :class:`Posts`)."""
        self._posts.wake()

    def flush(self) -> None:
        """Have the loop run what the threads posted before what they queue there next."""
        self._posts.flush()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().disconnect()


class Posts:
    """Callbacks that threads hand the loop, run there in the order they were posted.

    They are run in batches: the first callback posted after a batch wakes the loop, which
    runs the batch :data:`BATCH` seconds later (a thread's release often follows its grant
    within that), so that a thread taking and releasing a lock over and over does not wake
    the loop for each.  An ``urgent`` callback (one that owes others a wake-up, or settles an
    unknown outcome) runs the batch at once, and so does :meth:`flush`, which a thread calls
    before it queues anything else on the loop: the loop path then finds every post run.
    """

    __slots__ = ("_loop", "_queue", "_scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[Callable[[], object]] = deque()
        # A batch is due: a callback posted now is run with it.
        self._scheduled = False

    def post(
        self, callback: Callable[[], object], *, urgent: bool = False, wake: bool = True
    ) -> None:
        self._queue.append(callback)
        if wake:
            self.wake(urgent=urgent)

    def wake(self, *, urgent: bool = False) -> None:
        """Have the loop run the queue: now if ``urgent``, else in a batch.  A thread that
        answered another posts without waking the loop, and wakes it once the answered
        thread has taken the GIL: the loop would compete for it."""
        if urgent:
            self._loop.call_soon_threadsafe(self._run)
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._due)

    def flush(self) -> None:
        """Run what was posted before anything queued on the loop from now on."""
        if self._queue:
            self._loop.call_soon_threadsafe(self._run)

    def _due(self) -> None:
        self._loop.call_later(BATCH, self._run)

    def _run(self) -> None:
        self._scheduled = False  # first: a callback posted from now on is due in a new batch
        queue = self._queue
        while queue:
            callback = queue.popleft()
            try:
                callback()
            except Exception:  # a bug: the next callbacks still run
                logger.exception("a callback a thread posted to the loop failed")


class Waiting:
    """A thread's acquire waiting on the loop, which a grant to it answers at once: told by
    the thread of this client whose release made it (``_direct._answer``), or by the loop as
    it reads the grant's message (``_direct.answer_message``).

    :ivar call: the blocking call the thread waits on; answered with ``value``.
    :ivar grant: the grant it was answered with (set before the answer).
    :ivar kept: the loop's record of that hold, once made.
    """

    __slots__ = ("call", "grant", "kept", "lease", "started", "target", "value")

    def __init__(self, target: Any, lease: float | None, started: float, value: Any) -> None:
        self.call: Call[Any] = Call()
        self.target = target  # the lock it waits for (a ReentrantKind)
        self.lease = lease  # the acquire's own, for the loop's record
        self.started = started  # when the acquire began (loop time)
        self.value = value
        self.grant: LineGrant | None = None
        self.kept: list[Hold] = []
