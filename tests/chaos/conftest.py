"""Fixtures of the fault tests: a proxy in front of the session's server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from aiolock.pytest_plugin import ServerInfo

from .proxy import FreezableProxy


@pytest.fixture
async def proxy(aiolock_server: ServerInfo) -> AsyncIterator[FreezableProxy]:
    proxy = FreezableProxy(urlsplit(aiolock_server.url).port or 6379)
    await proxy.start()
    yield proxy
    await proxy.aclose()
