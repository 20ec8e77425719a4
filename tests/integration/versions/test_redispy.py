"""The guard on what aiolock reads of redis-py's connection (``aiolock._redis.redispy``).

These fail, naming the attribute, when an installed redis-py no longer has the connection
internals that the client's own call path writes and checks through: that is the signal to
adapt ``aiolock._redis.redispy`` before allowing the new redis-py in ``pyproject.toml``.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio import Connection

from aiolock._redis.redispy import has_data, stream_writer
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import eventually

pytestmark = pytest.mark.anyio


def connection(server: ServerInfo) -> Connection:
    host, port = server.url.removeprefix("redis://").rsplit(":", 1)
    return Connection(host=host, port=int(port.split("/")[0]))


async def test_the_writer_is_the_connections_stream_writer(aiolock_server: ServerInfo) -> None:
    conn = connection(aiolock_server)
    assert hasattr(conn, "_writer"), f"redis-py {redis.__version__}: Connection._writer is gone"
    assert stream_writer(conn) is None  # not connected yet
    await conn.connect()  # type: ignore[no-untyped-call]
    try:
        writer = stream_writer(conn)
        assert isinstance(writer, asyncio.StreamWriter), (
            f"redis-py {redis.__version__}: Connection._writer is a {type(writer).__name__}"
        )
        # Bytes written on it are what redis-py's reader then reads as the reply.
        writer.writelines(conn.pack_command("ECHO", "through the writer"))
        await writer.drain()
        assert await conn.read_response() == b"through the writer"
    finally:
        await conn.disconnect()
    assert stream_writer(conn) is None, f"redis-py {redis.__version__}: _writer kept on disconnect"


async def test_has_data_sees_an_unread_reply_and_a_closed_socket(
    aiolock_server: ServerInfo,
) -> None:
    conn = connection(aiolock_server)
    await conn.connect()  # type: ignore[no-untyped-call]
    try:
        assert not await has_data(conn)  # a clean idle connection
        writer = stream_writer(conn)
        assert writer is not None
        writer.writelines(conn.pack_command("PING"))
        await writer.drain()

        async def unread_reply() -> bool:
            return await has_data(conn)

        # Up to redis-py 7 the check consumes what it finds ("destructive"): the connection
        # is only fit to be dropped after, which is all aiolock does with a dirty one.
        await eventually(unread_reply, what="the unread PONG")
        await conn.disconnect()
        await conn.connect()  # type: ignore[no-untyped-call]
        assert not await has_data(conn)
        await conn.send_command("CLIENT", "ID")
        own_id = await conn.read_response()
        killer = connection(aiolock_server)
        await killer.connect()  # type: ignore[no-untyped-call]
        try:
            await killer.send_command("CLIENT", "KILL", "ID", own_id)
            assert await killer.read_response() == 1
        finally:
            await killer.disconnect()

        async def eof_seen() -> bool:
            try:
                return await has_data(conn)
            except redis.ConnectionError:
                return True  # redis-py reports a failed socket as an error, also a dirty one

        await eventually(eof_seen, what="the EOF of the killed connection")
    finally:
        await conn.disconnect()


async def test_the_commands_parser_finds_the_keys_of_a_command(aiolock_server: ServerInfo) -> None:
    """``guard.transaction()`` finds its commands' keys with redis-py's commands parser."""
    from redis.asyncio import Redis

    from aiolock._redis.redispy import commands_parser

    parser = commands_parser()
    async with Redis.from_url(aiolock_server.url) as client:
        await parser.initialize(client)  # type: ignore[arg-type]
        assert "sadd" in parser.commands, f"redis-py {redis.__version__}: no command table"
        keys = await parser.get_keys("SADD", "members", "a")
        assert list(keys or ()) == ["members"], f"redis-py {redis.__version__}: keys {keys!r}"
        moving = await parser.get_keys("ZUNIONSTORE", "out", 2, "a", "b")
        assert sorted(moving or ()) == ["a", "b", "out"], f"redis-py {redis.__version__}"


async def test_the_retry_policy_is_read_from_every_backoff() -> None:
    """The resend window bounds a late copy by the client's retry policy (retries, pauses)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import ConstantBackoff, ExponentialBackoff, NoBackoff

    from aiolock._redis.redispy import retry_policy

    version = f"redis-py {redis.__version__}"
    assert retry_policy(Retry(ExponentialBackoff(cap=2.5, base=0.1), 4)) == (4, 2.5), version
    assert retry_policy(Retry(ConstantBackoff(0.3), 2)) == (2, 0.3), version
    assert retry_policy(Retry(NoBackoff(), 0)) == (0, 0.0), version
    assert retry_policy(Retry(NoBackoff(), -1)) == (-1, 0.0), version


async def test_the_resend_window_follows_the_clients_retry_policy() -> None:
    """Two attempts of 1 s socket + 0.5 s connect, a 0.75 s pause: 3.75 s; without end: 60 s.
    The window is read from the client's settings: the clients never connect."""
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import ConstantBackoff

    from aiolock._core.services import resend_window

    def client(retries: int) -> Redis:
        return Redis(
            port=1, socket_timeout=1.0, socket_connect_timeout=0.5,
            retry=Retry(ConstantBackoff(0.75), retries),
        )  # fmt: skip

    bounded, endless = client(1), client(-1)
    try:
        assert resend_window(bounded) == pytest.approx(3.75), f"redis-py {redis.__version__}"
        assert resend_window(endless) == 60.0, f"redis-py {redis.__version__}"
    finally:
        await bounded.aclose()
        await endless.aclose()
