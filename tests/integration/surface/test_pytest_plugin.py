"""The shipped pytest plugin works under anyio's plugin and under pytest-asyncio (strict)."""

from __future__ import annotations

import pytest

from aiolock.testing.pytest_plugin import URL_VARIABLE, ServerInfo

pytest_plugins = ["pytester"]

BODY = """
import asyncio
import aiolock

async def exercise(aiolock_client):
    assert isinstance(aiolock_client, aiolock.Client)
    lock = aiolock_client.lock("plugin")
    async with lock.acquire(wait=1) as guard:
        assert guard.fencing_token >= 1
        other = asyncio.create_task(lock.try_lock(wait=0))
        assert await other is False
    assert aiolock_client.key_prefix.startswith("aiolock-test-")
"""

ANYIO_SUITE = (
    "import pytest\n"
    + BODY
    + """
@pytest.fixture
def anyio_backend():
    return "asyncio"

@pytest.mark.anyio
async def test_under_anyio(aiolock_client):
    await exercise(aiolock_client)

@pytest.mark.anyio
async def test_isolated_prefixes(aiolock_client, aiolock_server):
    assert aiolock_server.url
    await exercise(aiolock_client)
"""
)

ASYNCIO_SUITE = (
    "import pytest\n"
    + BODY
    + """
@pytest.mark.asyncio
async def test_under_pytest_asyncio(aiolock_client):
    await exercise(aiolock_client)

@pytest.mark.asyncio
async def test_again_with_a_fresh_loop(aiolock_client):
    await exercise(aiolock_client)
"""
)


@pytest.mark.parametrize(
    ("suite", "options"),
    [
        (ANYIO_SUITE, ["-p", "no:asyncio"]),
        (
            ASYNCIO_SUITE,
            ["-o", "asyncio_mode=strict", "-o", "asyncio_default_fixture_loop_scope=function"],
        ),
    ],
    ids=["anyio", "pytest-asyncio-strict"],
)
def test_fixtures_in_a_user_suite(
    pytester: pytest.Pytester,
    aiolock_server: ServerInfo,
    monkeypatch: pytest.MonkeyPatch,
    suite: str,
    options: list[str],
) -> None:
    if aiolock_server.server is not None and aiolock_server.server.binary != "valkey":
        pytest.skip("the plugin does not depend on the server: run it once")
    monkeypatch.setenv(URL_VARIABLE, aiolock_server.url)
    pytester.makepyfile(test_user=suite)
    pytester.makeini("[pytest]\nfilterwarnings = error\n")
    # The plugin comes in through its pytest11 entry point, as it does for users.
    result = pytester.runpytest_subprocess(*options)
    result.assert_outcomes(passed=2)
