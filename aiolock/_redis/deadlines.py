"""The socket timeout of a runner's replies, kept by one timer per runner.

redis-py bounds each read by the connection's ``socket_timeout`` with an ``asyncio.timeout``
of its own: a timer made, pushed on the loop's heap and cancelled for every reply (the
cancelled ones stay on the heap for the timeout's length, and every later timer sorts through
them), a cost on every call (measured in benchmarks/README.md).  A runner's connections are its
own, so it reads a reply with their ``socket_timeout`` set aside and keeps the bound itself: it
notes when each reply is due, and one timer, armed for the earliest, aborts the socket of a
connection whose reply is overdue.  The read then fails, and is raised as redis-py's
``TimeoutError``, as redis-py's own timeout would be.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .redispy import stream_writer

__all__ = ["Deadlines"]


class Deadlines:
    """When each reply a runner waits for is overdue, and the one timer that enforces it."""

    __slots__ = ("_due", "_overdue", "_timer")

    def __init__(self) -> None:
        self._due: dict[AbstractConnection, float] = {}
        self._overdue: set[AbstractConnection] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def read(self, conn: AbstractConnection, *, disconnect_on_error: bool) -> Any:
        """The next reply on ``conn``, within its ``socket_timeout`` (none if it has none).

        :raises redis.exceptions.TimeoutError: the reply did not come in time (the socket is
            aborted: the connection must connect again).
        """
        timeout = conn.socket_timeout
        if timeout is None:
            return await conn.read_response(disconnect_on_error=disconnect_on_error)
        loop = asyncio.get_running_loop()
        due = self._due[conn] = loop.time() + timeout
        if self._timer is None or due < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(due, self._check)
        # Set aside for this read only: redis-py reads the attribute as the read starts (the
        # connect's handshake, which redis-py runs, keeps its bound).  A timeout of the socket's
        # own (ETIMEDOUT) is still redis-py's TimeoutError, as with no socket_timeout at all.
        conn.socket_timeout = None
        try:
            return await conn.read_response(disconnect_on_error=disconnect_on_error)
        except (RedisConnectionError, OSError) as error:
            if conn in self._overdue:
                raise RedisTimeoutError(f"no reply within {timeout} s (socket_timeout)") from error
            raise
        finally:
            conn.socket_timeout = timeout
            self._due.pop(conn, None)
            # Overdue but read whole (the reply came in the pass that aborted it): the
            # connection is dropped when it is next borrowed (its socket is at its end).
            self._overdue.discard(conn)

    def _check(self) -> None:
        """Abort the socket of every connection whose reply is overdue; wait for the next."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._timer = None
        nearest = None
        for conn, due in self._due.items():
            if conn in self._overdue:
                continue
            if due <= now:
                self._overdue.add(conn)
                writer = stream_writer(conn)
                if writer is not None:
                    # Not close(): over TLS it waits for the server's side of the shutdown,
                    # which a stalled server never sends.
                    writer.transport.abort()
            elif nearest is None or due < nearest:
                nearest = due
        if nearest is not None:
            self._timer = loop.call_at(nearest, self._check)
