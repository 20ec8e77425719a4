"""The seeds' scenario: 100 concurrent requests join a group limited to 5."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

from aiolock._demo import LIMIT, demo, run_requests
from aiolock.testing.pytest_plugin import ServerInfo

pytestmark = pytest.mark.anyio


async def test_100_tasks_exactly_5_join(aiolock_server: ServerInfo) -> None:
    users = [f"user-{i}" for i in range(100)]
    outcomes = await run_requests(aiolock_server.url, f"g-{uuid.uuid4().hex}", users, locked=True)
    assert outcomes["joined"] == LIMIT
    assert outcomes["refused"] == 100 - LIMIT
    assert outcomes["timeout"] == 0


async def test_without_the_lock_the_race_shows(aiolock_server: ServerInfo) -> None:
    users = [f"user-{i}" for i in range(100)]
    outcomes = await run_requests(aiolock_server.url, f"g-{uuid.uuid4().hex}", users, locked=False)
    assert outcomes["joined"] > LIMIT  # every request saw a group with room


def test_4_processes_exactly_5_join(aiolock_server: ServerInfo) -> None:
    outcomes = demo(aiolock_server.url, requests=100, processes=4, locked=True)
    assert outcomes["joined"] == LIMIT
    assert outcomes["refused"] == 100 - LIMIT


def test_demo_command(aiolock_server: ServerInfo) -> None:
    if aiolock_server.server is not None and aiolock_server.server.binary != "valkey":
        pytest.skip("the command is the same on every server: run it once")
    run = subprocess.run(
        [sys.executable, "-m", "aiolock", "demo", "--url", aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.search(r"^\s*joined\s+5$", run.stdout, re.MULTILINE), run.stdout
    assert re.search(r"^\s*refused\s+95$", run.stdout, re.MULTILINE), run.stdout
