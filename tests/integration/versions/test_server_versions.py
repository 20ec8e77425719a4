"""What differs between server versions (the table in docs/install.md), on the server at hand.

Each test asks the server what it is and checks what aiolock does with it: these run on every
server of the matrix (``noxfile.py``), Redis 6.2 included, so each row of the table is checked
on the versions it names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis
from redis.exceptions import NoPermissionError

import aiolock
from aiolock.testing.embedded import EmbeddedServer
from aiolock.testing.pytest_plugin import ServerInfo
from tests.conftest import SERVERS
from tests.helpers import (
    cluster_calls_of,
    cluster_clients,
    documented_acl_commands,
    entries_of,
    eventually,
    redis_version,
)

pytestmark = pytest.mark.anyio

PREFIX = "acl"
PASSWORD = "s3cret-acl"
# The plain lock's commands, as docs/deployment.md lists them (no TLS here: the Redis 6.2
# binary is built without it, and test_security.py runs this user over TLS on Redis 7).
PLAIN_LOCK_COMMANDS = documented_acl_commands()


def subscriptions(url: str, channel: str) -> dict[str, int]:
    """How many subscribers ``channel`` has over the whole Cluster, classic and sharded (a
    server that has no sharded pub/sub has none of those)."""
    counts = {"classic": 0, "sharded": 0}
    with Redis.from_url(url) as seed:
        ports = {int(r[2][1]) for r in seed.execute_command("CLUSTER", "SLOTS")}
    for port in ports:
        with Redis(port=port) as node:
            counts["classic"] += int(node.execute_command("PUBSUB", "NUMSUB", channel)[1])
            if redis_version(f"redis://127.0.0.1:{port}") >= (7, 0):
                shard = node.execute_command("PUBSUB", "SHARDNUMSUB", channel)
                counts["sharded"] += int(shard[1])
    return counts


async def test_a_cluster_waits_on_sharded_pubsub_from_7_and_classic_before(
    aiolock_cluster: ServerInfo,
) -> None:
    """The docs' row: a Cluster of Redis 7+ or Valkey waits on SSUBSCRIBE and is woken by
    SPUBLISH; one of Redis 6 (no sharded pub/sub) waits on classic SUBSCRIBE and PUBLISH, and
    is woken all the same (the holder's lease outlasts the wait: only the release wakes it)."""
    sharded = redis_version(aiolock_cluster.url) >= (7, 0)
    async with cluster_clients(aiolock_cluster.url, "versions") as make:
        holder, waiter = make(), make()
        held = holder.lock("row")
        await held.lock(lease=60)
        wanted = waiter.lock("row", owner="waiter")
        waiting = asyncio.ensure_future(wanted.try_lock(wait=20, lease=5))
        await eventually(
            lambda: [e.confirmed for e in entries_of(waiter).values()] == [True], what="subscribed"
        )
        [channel] = [key.decode() for key in entries_of(waiter)]
        assert subscriptions(aiolock_cluster.url, channel) == {
            "classic": int(not sharded),
            "sharded": int(sharded),
        }
        assert cluster_calls_of(waiter).sharded is sharded
        await held.unlock()
        assert await asyncio.wait_for(waiting, 15)
        await wanted.unlock()


@pytest.fixture(scope="module", params=SERVERS)
def acl_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedServer]:
    """A server of each binary whose ``aiolock`` user may run only the plain lock's commands."""
    acl = Path(tmp_path_factory.mktemp("acl")) / "users.acl"
    acl.write_text(
        "user default on nopass -@all +ping +info\n"
        f"user aiolock on >{PASSWORD} resetkeys ~{PREFIX}:* resetchannels &{PREFIX}:* -@all"
        f" {PLAIN_LOCK_COMMANDS}\n"
        f"user admin on >{PASSWORD}-admin ~* &* +@all\n"
    )
    with EmbeddedServer(binary=request.param, config={"aclfile": acl}) as server:
        yield server


async def test_the_plain_lock_runs_as_the_documented_acl_user(acl_server: EmbeddedServer) -> None:
    """The docs' ACL row, on every server: channel permissions (``resetchannels``, ``&``) exist
    from Redis 6.2, and the listed commands are all the plain lock needs, waiter included."""
    url = f"redis://aiolock:{PASSWORD}@{acl_server.host}:{acl_server.port}/0"
    async with aiolock.Client.from_url(url, key_prefix=PREFIX) as client:
        held = client.lock("orders:1")
        await held.lock(lease=60)
        waiter = asyncio.ensure_future(client.lock("orders:1", owner="other").try_lock(wait=20))
        await eventually(
            lambda: any(e.confirmed for e in entries_of(client).values()), what="subscribed"
        )
        await held.unlock()
        assert await asyncio.wait_for(waiter, 15)  # woken through the permitted channel
        assert await client.lock("orders:1").force_unlock()
        # And nothing else: a key outside the prefix is refused.
        with pytest.raises(NoPermissionError):
            await client.redis.get("elsewhere")
