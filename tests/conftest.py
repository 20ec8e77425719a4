"""Shared test setup: the servers every integration test runs against.

The integration tests run once per available server: the embedded Valkey always, and Redis 7
(``redis-server`` from PATH, Debian's package) when it is installed.  ``AIOLOCK_REDIS_URL``
replaces both with one external server.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from typing import Any

import pytest
from redis.asyncio import Redis

import aiolock
from aiolock.embedded import EmbeddedCluster, EmbeddedServer, redis_server_binary
from aiolock.pytest_plugin import CLUSTER_URL_VARIABLE, URL_VARIABLE, ServerInfo, _serve

# On a failure hypothesis imports libcst (to suggest an @example patch), which warns about
# mypy_extensions.TypedDict; with filterwarnings=error that turns a test failure into a pytest
# INTERNALERROR.  Import it once here, quietly.
with warnings.catch_warnings(), contextlib.suppress(ImportError):
    warnings.simplefilter("ignore", DeprecationWarning)
    import hypothesis.extra._patching  # noqa: F401

SERVERS = ["valkey"] + (["redis"] if redis_server_binary() else [])


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", params=SERVERS)
def aiolock_server(request: pytest.FixtureRequest) -> Iterator[ServerInfo]:
    """Overrides the plugin's fixture: one session server per available server binary."""
    _one_external(request, URL_VARIABLE)
    # DEBUG SLEEP stalls the server in the resend and chaos tests.
    config = {"enable-debug-command": "yes"}
    yield from _serve(
        URL_VARIABLE, "server", partial(EmbeddedServer, binary=request.param, config=config)
    )


@pytest.fixture(scope="session", params=SERVERS)
def aiolock_cluster(request: pytest.FixtureRequest) -> Iterator[ServerInfo]:
    """Overrides the plugin's fixture: a 3-primary cluster of each available server binary."""
    _one_external(request, CLUSTER_URL_VARIABLE)
    yield from _serve(
        CLUSTER_URL_VARIABLE, "cluster", partial(EmbeddedCluster, binary=request.param)
    )


def _one_external(request: pytest.FixtureRequest, variable: str) -> None:
    """An external server replaces every binary's: run the tests once on it."""
    if os.environ.get(variable) and request.param != SERVERS[0]:
        pytest.skip(f"{variable} names one server")


@pytest.fixture
async def redis(aiolock_server: ServerInfo) -> AsyncIterator[Redis]:
    """A plain client on the test server, for looking at keys and channels directly."""
    client = Redis.from_url(aiolock_server.url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def make_client(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client
) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """Build more clients on the test server, sharing ``aiolock_client``'s key prefix."""
    made: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        options.setdefault("key_prefix", aiolock_client.key_prefix)
        client = aiolock.Client.from_url(aiolock_server.url, **options)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            await client.aclose()
