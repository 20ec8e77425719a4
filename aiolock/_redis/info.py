"""What the client reads from a server's ``INFO`` reply."""

from __future__ import annotations

from typing import Any

from redis.exceptions import RedisError

from .calls import Runner

__all__ = ["uptime"]


async def uptime(calls: Runner, key: str) -> int | None:
    """Whole seconds the server that answers for ``key`` has been up (``uptime_in_seconds``
    of ``INFO server``); ``None`` when it cannot tell (no answer, or no such line)."""
    try:
        info = await calls.command(key, ("INFO", "server"))
    except RedisError:
        return None
    return uptime_of(info)


def uptime_of(info: Any) -> int | None:
    """``uptime_in_seconds`` of an ``INFO server`` reply, if it has the line."""
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("uptime_in_seconds:"):
            return int(line.partition(":")[2])
    return None
