"""Fixtures of the fault tests: a proxy in front of the session's server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo

from .proxy import FreezableProxy


@pytest.fixture
async def proxy(aiolock_server: ServerInfo) -> AsyncIterator[FreezableProxy]:
    proxy = FreezableProxy(urlsplit(aiolock_server.url).port or 6379)
    await proxy.start()
    yield proxy
    await proxy.aclose()


@pytest.fixture
async def proxied(
    aiolock_client: aiolock.Client, proxy: FreezableProxy
) -> AsyncIterator[Callable[..., aiolock.Client]]:
    """Makes clients whose connections, their subscriber's included, go through ``proxy``.

    Keyword options go to ``Client.from_url``.  The clients are closed with the proxy flowing
    again, so that closing does not hang on a frozen or refusing path.
    """
    clients: list[aiolock.Client] = []

    def make(**options: Any) -> aiolock.Client:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        client = aiolock.Client.from_url(url, key_prefix=aiolock_client.key_prefix, **options)
        clients.append(client)
        return client

    try:
        yield make
    finally:
        proxy.refuse = False
        proxy.thaw()
        for client in clients:
            await client.aclose()
