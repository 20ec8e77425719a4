"""Task identities: unique for the client's life, and forgotten once the task is done (no I/O)."""

from __future__ import annotations

import asyncio

import pytest

import aiolock

pytestmark = pytest.mark.anyio


async def test_each_task_gets_its_own_identity_and_it_is_forgotten_when_done() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")  # constructing does no I/O
    try:

        async def identity() -> tuple[str, str]:
            task = asyncio.current_task()
            assert task is not None
            return client._task_owner_id(task), client._task_owner_id(task)

        tasks = [asyncio.create_task(identity()) for _ in range(100)]
        pairs = [await task for task in tasks]
        assert all(first == second for first, second in pairs)  # stable within a task
        assert len({first for first, _ in pairs}) == 100  # never reused
        assert all(first.startswith(f"{client.id}:t") for first, _ in pairs)
        await asyncio.sleep(0)  # one loop pass: the last task's done callbacks have run
        assert client._task_owners == {}  # forgotten when done, though the tasks still exist
    finally:
        await client.aclose()
