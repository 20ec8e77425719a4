"""Security: TLS, a least-privilege ACL user, unguessable owners, and passwords kept secret.

The TLS tests run Debian's ``redis-server`` (built with TLS) with certificates made here, and an
ACL file whose ``aiolock`` user may run only what aiolock needs (the README documents it).
Without ``redis-server`` they skip, saying so.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError

import aiolock
from aiolock.testing.embedded import EmbeddedServer, free_port, redis_server_binary
from tests.helpers import (
    documented_acl_commands,
    eventually,
    keys_of,
    late_reply_times_out,
    paused,
    settled,
)

pytestmark = pytest.mark.anyio

PASSWORD = "s3cret-Pa55word-" + uuid.uuid4().hex  # never to be seen in a repr, log or error
PREFIX = "secure"
# The commands aiolock runs: its scripts' own calls (ACL checks commands run by scripts too),
# EVALSHA with the EVAL fallback, the inspection calls, and the subscriber connection's.
AIOLOCK_COMMANDS = documented_acl_commands()
ACL = f"""\
user default on nopass -@all +ping
user aiolock on >{PASSWORD} resetkeys ~{PREFIX}:* resetchannels &{PREFIX}:* -@all {AIOLOCK_COMMANDS}
user admin on >{PASSWORD}-admin ~* &* +@all
"""


@dataclass(frozen=True)
class TlsServer:
    port: int
    ca: Path
    pid: int

    def url(self, user: str = "aiolock", password: str = PASSWORD) -> str:
        return f"rediss://{user}:{password}@127.0.0.1:{self.port}/0"

    def client(self, watchdog_timeout: float = 30.0, **options: Any) -> aiolock.Client:
        return aiolock.Client.from_url(
            self.url(),
            key_prefix=PREFIX,
            watchdog_timeout=watchdog_timeout,
            ssl_ca_certs=str(self.ca),
            **options,
        )

    def admin(self) -> Redis:
        return Redis.from_url(self.url("admin", PASSWORD + "-admin"), ssl_ca_certs=str(self.ca))


def _write_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 that it signed: (ca, cert, key) files.

    Made with the ``openssl`` command line tool (the ``cryptography`` package is not a test
    dependency).
    """
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, request = directory / "server.pem", directory / "server.key", directory / "req.csr"
    # The extensions Python 3.13's strict verification (VERIFY_X509_STRICT) requires: a CA's
    # key usage, and the issuer's key identifier on the server's certificate.
    (directory / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nauthorityKeyIdentifier=keyid,issuer\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    commands = [
        [
            "req",
            "-x509",
            *new_key,
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "1",
            "-subj",
            "/CN=aiolock test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        ["req", *new_key, "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1"],
        [
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            directory / "san.ext",
        ],
    ]
    for command in commands:
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return ca, cert, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server): no TLS server")
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no test certificates")
    directory = tmp_path_factory.mktemp("tls")
    ca, cert, key = _write_certificates(directory)
    (directory / "users.acl").write_text(ACL)
    port = free_port()
    config = {
        "tls-port": port,
        "tls-cert-file": cert,
        "tls-key-file": key,
        "tls-ca-cert-file": ca,
        "tls-auth-clients": "no",
        "aclfile": directory / "users.acl",
    }
    server = EmbeddedServer(binary="redis", config=config)
    try:
        server.start()
    except Exception as exc:  # e.g. a redis-server built without TLS
        pytest.skip(f"redis-server could not serve TLS: {exc}")
    assert server.pid is not None
    try:
        yield TlsServer(port, ca, server.pid)
    finally:
        server.stop()


async def test_locks_work_over_tls_as_the_minimal_acl_user(tls_server: TlsServer) -> None:
    admin = tls_server.admin()
    await admin.script_flush()  # so the EVAL fallback (NOSCRIPT) runs too
    # A lease of 1 s, renewed every third of it: a renewal late by half a second under load
    # (a TLS handshake costs CPU) still comes in time.
    async with tls_server.client(watchdog_timeout=1.0) as client:
        lock = client.lock("orders:42")
        async with lock.acquire(wait=1) as guard:
            assert await lock.is_locked()
            assert await lock.is_held()
            assert await lock.hold_count() == 1
            assert (await lock.remaining_lease() or 0) > 0
            waiter = asyncio.create_task(client.lock("orders:42").try_lock(wait=10, lease=1))
            await eventually(lambda: settled(client, lock), what="the waiter subscribed")
            await eventually(lambda: lock.statistics().renewals > 0, what="a renewal")
            assert not waiter.done()
        assert not guard.lost
        assert await waiter  # woken through pub/sub over TLS
        assert await client.lock("orders:42").force_unlock()
    await admin.aclose()


async def test_a_late_reply_over_tls_raises_timeout_error(tls_server: TlsServer) -> None:
    # As the minimal ACL user: the undo of the call whose reply was late runs commands of its
    # own (docs/deployment.md's ACL names them).
    admin = tls_server.admin()
    async with tls_server.client(socket_timeout=0.2, retry=Retry(NoBackoff(), 0)) as client:
        await late_reply_times_out(client, *paused(admin))
    await admin.aclose()


async def test_a_late_reply_from_a_frozen_server_over_tls_raises_timeout_error(
    tls_server: TlsServer,
) -> None:
    # A server frozen whole does not answer a TLS shutdown either: the overdue socket is
    # aborted, where a close would wait for that answer (asyncio's SSL shutdown timeout, 30 s).
    async def freeze() -> None:
        os.kill(tls_server.pid, signal.SIGSTOP)

    async def thaw() -> None:
        os.kill(tls_server.pid, signal.SIGCONT)

    async with tls_server.client(socket_timeout=0.2, retry=Retry(NoBackoff(), 0)) as client:
        await late_reply_times_out(client, freeze, thaw)


async def test_the_acl_user_can_do_nothing_else(tls_server: TlsServer) -> None:
    redis = Redis.from_url(tls_server.url(), ssl_ca_certs=str(tls_server.ca))
    try:
        for command in (
            ("FLUSHALL",),
            ("GET", f"{PREFIX}:x"),
            ("KEYS", "*"),
            ("CONFIG", "GET", "*"),
        ):
            with pytest.raises(NoPermissionError):
                await redis.execute_command(*command)  # type: ignore[no-untyped-call]
        with pytest.raises(NoPermissionError):  # keys outside the prefix
            await redis.exists("other:key")
    finally:
        await redis.aclose()


def _secret_free(*texts: str) -> bool:
    return not any(PASSWORD in text for text in texts)


async def test_passwords_stay_out_of_reprs_logs_and_errors(
    tls_server: TlsServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with tls_server.client() as client:
        async with client.lock("job").acquire(wait=1) as guard:
            assert _secret_free(repr(client), repr(guard), repr(guard.lock), str(client))
            admin = tls_server.admin()
            await admin.client_kill_filter(_type="pubsub")  # a logged reconnect, if subscribed
            await admin.aclose()
    wrong = aiolock.Client.from_url(
        tls_server.url(password="wrong-" + PASSWORD),
        key_prefix=PREFIX,
        ssl_ca_certs=str(tls_server.ca),
    )
    unreachable = aiolock.Client.from_url(
        f"redis://aiolock:{PASSWORD}@127.0.0.1:{free_port()}/0", key_prefix=PREFIX
    )
    for client in (wrong, unreachable):
        assert _secret_free(repr(client))
        with pytest.raises(RedisError) as failure:
            await client.lock("job").try_lock()
        text = "".join(traceback.format_exception(failure.value))
        assert _secret_free(text, repr(failure.value))
        await client.aclose()
    await _until_closed(tls_server)
    assert isinstance(failure.value, RedisError)
    assert _secret_free(*(record.getMessage() for record in caplog.records))


async def test_wrong_password_is_an_authentication_error(tls_server: TlsServer) -> None:
    async with aiolock.Client.from_url(
        tls_server.url(password="nope"), ssl_ca_certs=str(tls_server.ca)
    ) as client:
        with pytest.raises(AuthenticationError):
            await client.lock("job").is_locked()
    await _until_closed(tls_server)


async def _until_closed(tls_server: TlsServer) -> None:
    """Wait until the server has closed every connection but the one asking.

    redis-py drops a connection whose AUTH failed without waiting for it to close
    (``disconnect(nowait=True)``); over TLS the close is a handshake that ends in the
    background, and a test whose loop stops first leaves its transport to be reported unclosed
    in a later test.
    """
    admin = tls_server.admin()
    try:

        async def alone() -> bool:
            return len(await admin.client_list()) == 1

        await eventually(alone, what="the connections that failed AUTH were closed")
        await admin.ping()  # one round trip more: the client has taken the server's close
    finally:
        await admin.aclose()


async def test_owner_ids_are_random_uuid4(aiolock_client: aiolock.Client) -> None:
    ids = {aiolock.Client(aiolock_client.redis).id for _ in range(100)} | {aiolock_client.id}
    assert len(ids) == 101
    assert all(uuid.UUID(client_id).version == 4 for client_id in ids)
    lock = aiolock_client.lock("who")
    async with lock.acquire(wait=1):
        fields = await aiolock_client.redis.hgetall(keys_of(lock).lock)
    owners = [str(field.decode() if isinstance(field, bytes) else field) for field in fields]
    owners = [owner for owner in owners if not owner.startswith((":", "f:", "r:"))]
    assert len(owners) == 1
    client_id, _, task = owners[0].rpartition(":")
    assert client_id == aiolock_client.id
    assert task.startswith("t")
    assert task[1:].isdigit()
