"""A server that asks for a password the client did not give: redis-py's error, told plainly.

redis-py reports it in the server's words, which name a command the user never sent (``HELLO
must be called with the client already authenticated, ...`` under RESP3, ``NOAUTH
Authentication required.`` under RESP2).  The error keeps its class (Redis' own errors
propagate unchanged, SPEC "Errors"), with a message that says what to do, chained to the
original.
"""

from __future__ import annotations

from typing import Final

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError

__all__ = ["asked_for_password"]

# What the servers answer a client that has not authenticated (Redis 6-7, Valkey 7-8).
_UNAUTHENTICATED: Final = ("NOAUTH", "Authentication required", "HELLO must be called with")


def asked_for_password(
    error: BaseException, conn: AbstractConnection
) -> AuthenticationError | None:
    """``error`` told as "the server asks for a password", if it is one that a connection
    without credentials got; ``None`` for any other error (a wrong password, say)."""
    if not isinstance(error, AuthenticationError):
        return None
    if conn.password or conn.username or conn.credential_provider is not None:
        return None
    said = str(error)
    if not any(words in said for words in _UNAUTHENTICATED):
        return None
    path = getattr(conn, "path", None)
    where = (
        f"unix://{path}" if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
    )
    return type(error)(
        f"the server at {where} asks for a password, and the client gave none: put it in the "
        "URL, redis://:PASSWORD@host:port/0 (or redis://USERNAME:PASSWORD@host:port/0 for an "
        "ACL user), or pass password= (and username=) to Client.from_url() or to "
        f"redis.asyncio.Redis(); the server said: {said}"
    )
