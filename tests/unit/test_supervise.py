"""The supervisor of a client's long-lived loops (no Redis involved): a failure is logged with
its traceback and the loop restarts after a pause that doubles while failures come in a row."""

from __future__ import annotations

import asyncio
import logging

import pytest

from aiolock._redis import tasks
from aiolock._redis.tasks import supervise

pytestmark = pytest.mark.anyio


class Boom(Exception):
    pass


@pytest.fixture
def short_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "FIRST_PAUSE", 0.01)
    monkeypatch.setattr(tasks, "LONGEST_PAUSE", 0.04)


def restarts(caplog: pytest.LogCaptureFixture, name: str) -> list[float]:
    """The pauses the supervisor logged for ``name``, in order (each with a traceback)."""
    found = []
    for record in caplog.records:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.name == "aiolock" and args and args[0] == name:
            assert record.levelno == logging.ERROR
            assert record.exc_info is not None
            assert isinstance(record.exc_info[1], Boom)
            pause = args[1]
            assert isinstance(pause, float)
            found.append(pause)
    return found


@pytest.mark.usefixtures("short_pauses")
async def test_a_failing_loop_is_logged_and_restarted_after_growing_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs <= 4:
            raise Boom(f"failure {runs}")

    await asyncio.wait_for(supervise("test-loop", loop), timeout=5)
    assert runs == 5  # restarted after each failure; the run that returned was the last
    assert restarts(caplog, "test-loop") == [0.01, 0.02, 0.04, 0.04]
    assert "failure 4" in caplog.text  # the traceback, with the exception
    assert "Traceback" in caplog.text


@pytest.mark.usefixtures("short_pauses")
async def test_a_healthy_run_resets_the_pause(caplog: pytest.LogCaptureFixture) -> None:
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        if runs == 4:
            await asyncio.sleep(0.05)  # longer than the longest pause: healthy, then failed
        if runs <= 4:
            raise Boom(f"failure {runs}")

    await asyncio.wait_for(supervise("test-loop", loop), timeout=5)
    assert restarts(caplog, "test-loop") == [0.01, 0.02, 0.04, 0.01]


async def test_a_loop_that_returns_is_not_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1

    task = supervise("test-loop", loop)
    assert task.get_name() == "test-loop"
    await asyncio.wait_for(task, timeout=5)
    assert runs == 1
    assert restarts(caplog, "test-loop") == []


@pytest.mark.parametrize("where", ["running", "pausing"])
async def test_cancelling_ends_the_loop_at_once(where: str) -> None:
    started, runs = asyncio.Event(), 0

    async def loop() -> None:
        nonlocal runs
        runs += 1
        started.set()
        if where == "pausing":
            raise Boom("into the pause")
        await asyncio.Event().wait()

    task = supervise("test-loop", loop)
    await started.wait()
    await asyncio.sleep(0)  # the failure, if any, is logged and the pause begins
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runs == 1
