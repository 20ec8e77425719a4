"""What ``aiolock list`` reads: every lock under the key prefix whose name matches a glob.

The keys are found with ``SCAN`` (never ``KEYS``, which blocks the server for the whole
keyspace), on every primary of a Cluster, matching only the prefix on the server; each key is
read back into its kind and name by :func:`aiolock._core.keys.parts_of`, the inverse of the
layout that made it, and the name is matched here against the glob (a server-side ``MATCH`` on
the escaped name could not be exact: a ``{`` in a name is three characters in its key).  Each
lock found is then read by :func:`~aiolock._cli._inspect.inspect`, the same snapshot that
``aiolock inspect`` prints, and kept when it has holders or waiters.

The countdown latch is not listed: it has a count, but no holders, leases or waiters the
server knows of (its waiters are subscribers only), so it is not a lock that someone holds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Final

from redis.asyncio import Redis

from .._core.keys import parts_of
from ..client import Client
from ._inspect import KINDS, Report, inspect

__all__ = ["glob_regex", "list_locks"]

SCAN_COUNT: Final = 1000  # keys per SCAN step: few round trips, each step still short
INSPECTS: Final = 16  # inspections in flight at once

# The kind segment of each listed kind's keys (see LockKeys.build): the plain lock has none.
_KIND_OF_SEGMENT: Final = {(None if kind == "lock" else kind): kind for kind in KINDS}


async def list_locks(client: Client, pattern: str = "*") -> list[Report]:
    """Every lock of every kind under ``client.key_prefix`` whose name matches the glob
    ``pattern`` (Redis's: ``*``, ``?``, ``[abc]``, ``[^a-c]``, ``\\`` escapes) and that has
    holders or waiters, ordered by name, then kind."""
    matches = glob_regex(pattern).fullmatch
    found: set[tuple[str, str]] = set()
    async for key in _scan(client):
        parts = parts_of(client.key_prefix, key)
        if parts is None or parts.kind not in _KIND_OF_SEGMENT:
            continue
        if matches(parts.name):
            found.add((_KIND_OF_SEGMENT[parts.kind], parts.name))
    gate = asyncio.Semaphore(INSPECTS)

    async def look(kind: str, name: str) -> Report:
        async with gate:
            return await inspect(client, kind, name)

    reports = await asyncio.gather(*(look(kind, name) for kind, name in found))
    listed = [report for report in reports if report.held or report.waiters]
    return sorted(listed, key=lambda report: (report.name, report.kind))


async def _scan(client: Client) -> AsyncIterator[str]:
    """Every key under the client's prefix, from each primary of a Cluster."""
    redis = client.redis
    match = _glob_escape(client.key_prefix) + ":*"
    if isinstance(redis, Redis):
        async for key in redis.scan_iter(match=match, count=SCAN_COUNT):
            yield _str(key)
        return
    await redis.initialize()  # a client that has sent nothing yet knows no nodes
    for primary in redis.get_primaries():
        cursor = 0
        while True:
            reply, keys = await redis.scan(
                cursor, match=match, count=SCAN_COUNT, target_nodes=primary
            )
            cursor = _cursor(reply)
            for key in keys:
                yield _str(key)
            if cursor == 0:
                break


def _cursor(reply: object) -> int:
    """The cursor of a ``SCAN`` sent to one node of a Cluster: redis-py keys it by the node's
    name (``{"host:port": cursor}``)."""
    if isinstance(reply, dict):
        [reply] = reply.values()
    assert isinstance(reply, int | str | bytes)
    return int(reply)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of a Redis glob (as in ``SCAN MATCH``): ``*`` any text, ``?`` one
    character, ``[abc]``, ``[a-c]`` and ``[^abc]`` (or ``[!abc]``) a class, ``\\x`` the character
    ``x`` itself; a ``[`` that is never closed is itself."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char == "\\" and i < len(pattern):
            out.append(re.escape(pattern[i]))
            i += 1
        elif char == "[":
            parsed = _glob_class(pattern, i)
            if parsed is None:
                out.append(re.escape(char))
            else:
                regex, i = parsed
                out.append(regex)
        else:
            out.append(re.escape(char))
    return re.compile("".join(out), re.DOTALL)


def _glob_class(pattern: str, start: int) -> tuple[str, int] | None:
    """The class that opens before ``start``: its regex and the index after its ``]``."""
    i, negate, items = start, False, []
    if i < len(pattern) and pattern[i] in "^!":
        negate, i = True, i + 1
    while i < len(pattern) and pattern[i] != "]":
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            char, i = pattern[i + 1], i + 1
        i += 1
        if i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
            high = pattern[i + 1]
            if high == "\\" and i + 2 < len(pattern):
                high, i = pattern[i + 2], i + 1
            i += 2
            low, high = sorted((char, high))
            items.append(f"{re.escape(low)}-{re.escape(high)}")
        else:
            items.append(re.escape(char))
    if i >= len(pattern):
        return None
    if not items:  # "[]" matches nothing, "[^]" any one character
        return ("." if negate else "(?!)"), i + 1
    return f"[{'^' if negate else ''}{''.join(items)}]", i + 1


def _glob_escape(text: str) -> str:
    """``text`` as a glob that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _str(key: object) -> str:
    # A key that is not UTF-8 is no lock's (names are str): it reads back as no lock's name.
    return key.decode(errors="replace") if isinstance(key, bytes) else str(key)
