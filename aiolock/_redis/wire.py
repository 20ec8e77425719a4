"""The wire: one call packed, written and its replies read, on a redis-py connection.

What :mod:`aiolock._redis.calls` runs on each of its connections, below redis-py's
``execute_command``: the bytes handed to the transport before the first await, EVALSHA with
its EVAL fallback on the same connection, and the reply of a WAIT read after the script's.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
from typing import Any, Final

import hiredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._scripts import Script
from .deadlines import Deadlines
from .redispy import stream_writer

__all__ = ["evaluate", "read_replies", "read_wait", "wait_args", "write"]


async def write(conn: AbstractConnection, *commands: tuple[Any, ...]) -> None:
    """Write commands on ``conn`` (pipelined), synchronously up to the final drain.

    redis-py's ``send_command`` writes inside ``asyncio.wait_for`` under a ``socket_timeout``:
    on Python 3.11 that is a task of its own, which may swallow a cancellation and which a
    concurrent disconnect can catch half-way (its writer gone).  Here the bytes are handed to
    the transport before the first await.
    """
    writer = stream_writer(conn)
    if writer is None:
        raise RedisConnectionError("the connection is closed")
    writer.writelines(_pack(conn, commands))
    transport = writer.transport
    if not transport.get_write_buffer_size() and not transport.is_closing():
        return  # all sent: drain() would return at once (it waits above the high-water mark)
    try:
        await writer.drain()
    except OSError as exc:
        raise RedisConnectionError(f"error while writing to the socket: {exc!r}") from exc


# hiredis packs a command in C, several times faster than redis-py's asyncio packer (figures in
# benchmarks/notes/): it encodes text as UTF-8.
_PACK_IN_C: Final = hasattr(hiredis, "pack_command")


@functools.cache
def _utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


def _pack(conn: AbstractConnection, commands: tuple[tuple[Any, ...], ...]) -> list[bytes]:
    """``commands`` as RESP, as redis-py's ``pack_command`` packs them."""
    encoder = conn.encoder
    if _PACK_IN_C and encoder.encoding_errors == "strict" and _utf8(encoder.encoding):
        try:
            return [hiredis.pack_command(command) for command in commands]
        except TypeError:
            pass  # a type hiredis does not take (a bytearray), or none: redis-py's error
    if len(commands) > 1:
        return conn.pack_commands(commands)
    return conn.pack_command(*commands[0])


async def evaluate(
    conn: AbstractConnection,
    evalsha: tuple[Any, ...],
    script: Script | None,
    wait: tuple[tuple[Any, ...], ...],
    sync: tuple[int, float] | None,
    *,
    deadlines: Deadlines,
    answered: list[Any] | None = None,
) -> tuple[Any, int]:
    """One attempt: EVALSHA, and on NOSCRIPT the source by EVAL on the same connection (EVAL
    caches it, so the next EVALSHA on this server finds it); with no ``script``, the plain
    command ``evalsha`` is.  ``answered`` gets the script's reply as soon as it is read.

    Within the attempt, so that NOSCRIPT never reads as "nothing ran" to the caller: a restart
    empties the cache, and an earlier copy of the call may have run before it.
    """
    await write(conn, evalsha, *wait)
    try:
        return await read_replies(conn, sync, deadlines, answered=answered)
    except NoScriptError:
        if script is None:
            raise
        await write(conn, ("EVAL", script.source, *evalsha[2:]), *wait)
        return await read_replies(conn, sync, deadlines, answered=answered)


# WAIT blocks for up to its own timeout, which a socket timeout must not cut short.
_WAIT_SLACK: Final = 5.0


def wait_args(sync: tuple[int, float]) -> tuple[int, int]:
    """WAIT's arguments; never a timeout of 0, which would wait forever."""
    replicas, timeout = sync
    return replicas, max(1, round(timeout * 1000))


async def read_replies(
    conn: AbstractConnection,
    sync: tuple[int, float] | None,
    deadlines: Deadlines,
    *,
    disconnect_on_error: bool = False,
    answered: list[Any] | None = None,
) -> tuple[Any, int]:
    """The script's reply, and (when a WAIT followed it) how many replicas have its writes.

    The WAIT's reply is read even when the script's is an error, so the connection stays clean;
    the script's error is the one raised (a Cluster replica answers MOVED to the script, then
    refuses the WAIT: the MOVED is what the caller must see to follow it).  A WAIT refused
    after the script ran (``UNBLOCKED`` on a failover) confirms nothing: 0 replicas.  The
    script's reply is waited for within the connection's ``socket_timeout`` (``deadlines``),
    WAIT's within its own timeout.
    """
    try:
        reply = await deadlines.read(conn, disconnect_on_error=disconnect_on_error)
    except ResponseError as error:
        if sync is not None:
            with contextlib.suppress(ResponseError):
                await read_wait(conn, sync, disconnect_on_error)
        raise error
    if sync is None:
        return reply, 0
    if answered is not None:
        answered.append(reply)
    try:
        return reply, await read_wait(conn, sync, disconnect_on_error)
    except ResponseError:
        return reply, 0


async def read_wait(
    conn: AbstractConnection, sync: tuple[int, float], disconnect_on_error: bool
) -> int:
    acked = await conn.read_response(
        timeout=sync[1] + _WAIT_SLACK, disconnect_on_error=disconnect_on_error
    )
    if acked is None:
        raise RedisTimeoutError("no reply to WAIT")
    return int(acked)
