"""The chaos run's last checks: what may stay once every worker has drained (on a real server),
and where a worker's stranded tasks waited (from its stack dump)."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from aiolock.testing.pytest_plugin import ServerInfo

from .run import PREFIX, _print_stranded, leftovers_on

pytestmark = pytest.mark.anyio


async def test_a_permits_set_with_no_live_lease_is_not_left_behind(
    aiolock_server: ServerInfo, redis: Redis
) -> None:
    """A semaphore's void marks keep its permits set alive a minute, with a permit whose
    lease ended still in it (the next call drops both): nothing is held there.  A live lease
    in it is a leftover."""
    server = aiolock_server.server
    if server is None:
        pytest.skip("reads every key of the embedded server")
    key = f"{PREFIX}:semaphore:{{leftover-check}}"
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    try:
        await redis.zadd(key, {"ended-permit": now - 4_000, "voided/1": -(now + 60_000)})
        await redis.pexpire(key, 60_000)
        assert await leftovers_on(server, {}, grace=0) == []
        await redis.zadd(key, {"live-permit": now + 60_000})
        [found] = await leftovers_on(server, {}, grace=0)
        assert "live-permit" in found
    finally:
        await redis.delete(key)


async def test_a_semaphores_marks_stay_only_for_a_window(
    aiolock_server: ServerInfo, redis: Redis
) -> None:
    """A semaphore's void marks (request -> until when) may stay for a resend window, as a
    meta hash's; a mark kept for a lease, or a set kept past its last mark, is a leftover."""
    server = aiolock_server.server
    if server is None:
        pytest.skip("reads every key of the embedded server")
    key = f"{PREFIX}:semaphore:{{leftover-marks}}:marks"
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    try:
        await redis.zadd(key, {"permit/7": now + 5_000})
        await redis.pexpire(key, 5_000)
        assert await leftovers_on(server, {}, grace=0) == []
        for member, until, ttl in [
            ("permit/9", now + 600_000, 600_000),
            ("permit/7", now + 5_000, 600_000),
        ]:
            await redis.delete(key)
            await redis.zadd(key, {member: until})
            await redis.pexpire(key, ttl)
            [found] = await leftovers_on(server, {}, grace=0)
            assert "semaphore marks left behind" in found, found
    finally:
        await redis.delete(key)


async def test_a_meta_hash_stays_only_with_resend_marks_for_a_window(
    aiolock_server: ServerInfo, redis: Redis
) -> None:
    """Markers are written only after a fault and live for a resend window: a meta hash of
    such marks may stay a while; one with another field (a 'released' marker of a fault-free
    release), a mark kept for a lease, or a hash kept past its marks is a leftover."""
    server = aiolock_server.server
    if server is None:
        pytest.skip("reads every key of the embedded server")
    key = f"{PREFIX}:{{leftover-meta}}:meta"
    seconds, micros = await redis.time()
    now = seconds * 1000 + micros // 1000
    try:
        await redis.hset(key, "client:task/7", now + 5_000)
        await redis.pexpire(key, 5_000)
        assert await leftovers_on(server, {}, grace=0) == []
        cases: list[tuple[str, str | int, int]] = [
            ("released", "client:task/8", 5_000),
            ("client:task/9", now + 600_000, 600_000),
            ("client:task/7", now + 5_000, 600_000),
        ]
        for field, value, ttl in cases:
            await redis.delete(key)
            await redis.hset(key, field, value)
            await redis.pexpire(key, ttl)
            [found] = await leftovers_on(server, {}, grace=0)
            assert "meta hash left behind" in found, (field, found)
    finally:
        await redis.delete(key)


def test_stranded_tasks_are_shown_where_they_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker's stack dump (its stderr) becomes one line per distinct library stack, with
    how many stranded tasks wait there; stacks of the harness alone are left out."""
    stderr = tmp_path / "cluster-0.stderr"
    wait = "  /r/aiolock/_base.py:396 _wait_for_grant\n  /r/aiolock/_waiting.py:104 park\n"
    stderr.write_text(
        "12 WARNING aiolock.lock: a line of the library's log\n"
        f"task Task-1:\n  /r/tests/chaos/worker.py:300 task_loop\n{wait}"
        f"task Task-2:\n  /r/tests/chaos/worker.py:300 task_loop\n{wait}"
        "task Task-3:\n  /r/tests/chaos/worker.py:90 run\n"
    )
    _print_stranded(0, stderr)
    assert capsys.readouterr().out.splitlines() == [
        "   worker 0 tasks waiting x2: _waiting.py:104 park <- _base.py:396 _wait_for_grant"
        " <- worker.py:300 task_loop"
    ]
