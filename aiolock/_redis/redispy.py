"""What aiolock reads of redis-py's connection beyond its documented surface, in one place.

:mod:`aiolock._redis.calls` writes on redis-py's ``Connection`` itself (see its docstring for
why), and :mod:`aiolock._redis.deadlines` aborts the socket of a reply that is overdue, so both
need the connection's ``asyncio.StreamWriter``, which redis-py keeps in the private ``_writer``
(the same name from redis-py 5.0 through 8.x).
``tests/integration/versions/test_redispy.py`` checks this against the installed redis-py and
fails loudly when it changes; ``pyproject.toml`` allows the next major version of redis-py
only because that test exists.

``guard.transaction()`` finds the keys of its queued commands with the parser redis-py's
Cluster client routes by (``redis._parsers.commands.AsyncCommandsParser``: the server's
``COMMAND`` table, ``COMMAND GETKEYS`` for commands whose keys move), not exported by redis-py
(the same from 5.0 through 8.x).

The check for a dirty idle connection is public but renamed: ``can_read_destructive`` up to
redis-py 7, ``can_read`` from 8.0 (where the old name still works, with a deprecation warning).

The resend window (``aiolock._core.services.resend_window``) reads the client's retry policy:
``Retry.get_retries()`` is public from redis-py 5.1 (5.0 keeps the count in ``_retries`` only),
and no version exposes a backoff's longest pause (``_cap`` of the exponential backoffs,
``_backoff`` of the constant one).
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.connection import AbstractConnection

__all__ = ["AsyncCommandsParser", "commands_parser", "has_data", "retry_policy", "stream_writer"]


def stream_writer(conn: AbstractConnection) -> asyncio.StreamWriter | None:
    """The connection's writer, or ``None`` when it is not connected."""
    writer: asyncio.StreamWriter | None = conn._writer
    return writer


async def has_data(conn: AbstractConnection) -> bool:
    """Whether a connected idle connection has data or EOF waiting (redis-py's pool check);
    raises redis-py's ``ConnectionError`` when the socket failed."""
    check = getattr(conn, "can_read", None)
    if check is None:  # redis-py < 8
        check = conn.can_read_destructive
    result: bool = await check()
    return result


def retry_policy(retry: Any) -> tuple[int, float]:
    """A redis-py ``Retry``'s number of retries (``-1``: without end) and the longest pause (s)
    its backoff makes between two attempts (``0.0`` for a backoff this does not know)."""
    count = getattr(retry, "get_retries", None)
    retries = int(count() if count is not None else getattr(retry, "_retries", 0))  # 5.0
    backoff = getattr(retry, "_backoff", None)
    pause = getattr(backoff, "_cap", None)
    if pause is None:  # ConstantBackoff and NoBackoff keep their one pause as _backoff
        pause = getattr(backoff, "_backoff", 0.0)
    return retries, float(pause or 0.0)


def commands_parser() -> AsyncCommandsParser:
    """A new redis-py commands parser (``initialize(redis)`` reads the server's table)."""
    return AsyncCommandsParser()
