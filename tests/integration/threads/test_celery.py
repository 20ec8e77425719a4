"""A real Celery worker (Redis as the broker) runs a task that must not overlap per key, under
the threads pool and the prefork pool (forked children): 200 tasks over 5 keys, no overlap."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import BinaryIO

import pytest
import redis
from celery import Celery

from aiolock.testing.pytest_plugin import ServerInfo

ROOT = Path(__file__).parents[3]
TASKS = 200
KEYS = [f"k{i}" for i in range(5)]


def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def start_worker(
    pool: str, queue: str, env: dict[str, str], log: BinaryIO
) -> subprocess.Popen[bytes]:
    """A worker of ``pool`` consuming ``queue``, in a session of its own (stopped as a group)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.threads._celery_app",
            "worker",
            "--pool",
            pool,
            "--concurrency",
            "8" if pool == "threads" else "4",
            "-Q",
            queue,
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_no_two_tasks_of_one_key_overlap(
    aiolock_server: ServerInfo, pool: str, tmp_path: Path
) -> None:
    prefix = f"aiolock-test-celery-{uuid.uuid4().hex[:8]}"
    queue = f"{prefix}-queue"
    env = {
        **os.environ,
        "REDIS_URL": aiolock_server.url,
        "AIOLOCK_TEST_PREFIX": prefix,
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as log_file:
        worker = start_worker(pool, queue, env, log_file)
    records = redis.Redis.from_url(aiolock_server.url, decode_responses=True)
    producer = Celery("producer", broker=aiolock_server.url)
    try:
        for number in range(TASKS):
            producer.send_task(
                "aiolock_test.critical", (KEYS[number % len(KEYS)], number), queue=queue
            )

        def finished() -> bool:
            assert worker.poll() is None, "the worker exited"
            return int(records.get(f"{prefix}:done") or 0) == TASKS

        wait_for(finished, 120, f"{TASKS} tasks done")
        pids: set[str] = set()
        for key in KEYS:
            rows = [str(row).split() for row in records.lrange(f"{prefix}:intervals:{key}", 0, -1)]
            assert len(rows) == TASKS // len(KEYS)
            assert all(row[2] == "1" for row in rows)  # alone inside, by the counter
            intervals = sorted((int(row[0]), int(row[1])) for row in rows)
            for (_, left), (entered, _) in itertools.pairwise(intervals):
                assert entered >= left, f"{key}: overlapping critical sections"
            tokens = [int(row[3]) for row in rows]
            assert len(set(tokens)) == len(tokens)  # each a fresh acquisition
            pids.update(row[4] for row in rows)
        if pool == "prefork":
            assert len(pids) > 1  # the work was shared by forked children
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        producer.close()
        for key in records.scan_iter(match=f"{prefix}*"):
            records.delete(key)
        records.close()
    output = log.read_text()
    assert "Traceback" not in output, output
