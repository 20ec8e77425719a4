"""A server that asks for a password the client did not give: redis-py's error, told plainly.

redis-py reports it in the server's words, which name a command the user never sent (``HELLO
must be called with the client already authenticated, ...`` under RESP3, ``NOAUTH
Authentication required.`` under RESP2), and on a Cluster inside ``Redis Cluster cannot be
connected``.  The error keeps its class (Redis' own errors propagate unchanged, SPEC
"Errors"), with a message that says what to do; the caller chains it to the original.
"""

from __future__ import annotations

from typing import Final, TypeVar

from redis.asyncio import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AuthenticationError, RedisClusterException, ResponseError

__all__ = ["asked_for_password", "cluster_asked_for_password"]

_E = TypeVar("_E", bound=Exception)

# The connection settings that authenticate.
_CREDENTIALS: Final = ("password", "username", "credential_provider")
# What the servers answer a client that has not authenticated (Redis 6-7, Valkey 7-8); a
# call of more than 10 words or a long argument gets a protocol error instead.
_UNAUTHENTICATED: Final = (
    "NOAUTH",
    "Authentication required",
    "HELLO must be called with",
    "unauthenticated multibulk length",
    "unauthenticated bulk length",
)


def asked_for_password(
    error: BaseException, conn: AbstractConnection
) -> AuthenticationError | None:
    """``error`` told as "the server asks for a password", if it is one that ``conn``, a
    connection without credentials, got; ``None`` for any other error (a wrong password).

    The server's protocol error for a long call before authentication (a ``ResponseError``)
    is told as the ``AuthenticationError`` it stands for, as redis-py tells ``NOAUTH``."""
    given = (conn.password, conn.username, conn.credential_provider)
    if not isinstance(error, AuthenticationError | ResponseError) or any(given):
        return None
    path = getattr(conn, "path", None)
    where = (
        f"unix://{path}" if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
    )
    return _told(AuthenticationError, error, f"the server at {where}")


def cluster_asked_for_password(
    error: RedisClusterException, cluster: RedisCluster
) -> RedisClusterException | None:
    """``error`` told likewise, if the Cluster client could reach no node because they ask
    for a password it did not give; ``None`` otherwise."""
    cause = error.__cause__
    manager = cluster.nodes_manager
    given = (manager.connection_kwargs.get(name) for name in _CREDENTIALS)
    if not isinstance(cause, AuthenticationError) or any(given):
        return None
    nodes = ", ".join(sorted(node.name for node in manager.startup_nodes.values()))
    return _told(type(error), cause, f"the Cluster at {nodes}")


def _told(error_type: type[_E], said: BaseException, who: str) -> _E | None:
    """An ``error_type`` error saying that ``who`` asks for a password (``said``: the server's own
    words), or ``None`` if they say something else."""
    words = str(said)
    if not any(marker in words for marker in _UNAUTHENTICATED):
        return None
    return error_type(
        f"{who} asks for a password, and the client gave none: put it in the "
        "URL, redis://:PASSWORD@host:port/0 (or redis://USERNAME:PASSWORD@host:port/0 for an "
        "ACL user), or pass password= (and username=) to Client.from_url() or to "
        f"redis.asyncio.Redis(); the server said: {words}"
    )
