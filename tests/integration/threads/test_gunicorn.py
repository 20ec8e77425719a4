"""The Flask example under a real gunicorn: the seeds' scenario (100 concurrent joins to a
group limited to 5, through ``guard.transaction()``) with threaded workers and with forked
sync workers, exactly 5 members either way."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiolock.testing.pytest_plugin import ServerInfo

EXAMPLES = Path(__file__).parents[3] / "examples"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def post(url: str, body: dict[str, str]) -> int:
    sent = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(sent, timeout=60) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as refused:
        refused.close()
        return refused.code


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def serving(base: str, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, "gunicorn exited"
    try:
        get(f"{base}/groups/probe")
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param(
            ["--workers", "2", "--threads", "4", "--worker-class", "gthread"], id="gthread"
        ),
        pytest.param(["--workers", "2", "--worker-class", "sync", "--preload"], id="sync-fork"),
    ],
)
def test_100_concurrent_joins_exactly_5_members(
    aiolock_server: ServerInfo, workers: list[str], tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "--chdir",
                str(EXAMPLES),
                "--bind",
                f"127.0.0.1:{port}",
                "--backlog",
                "256",
                *workers,
                "flask_app:app",
            ],
            env={**os.environ, "REDIS_URL": aiolock_server.url},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not serving(base, server):
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        group = f"g-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(100) as pool:
            outcomes = Counter(
                pool.map(
                    lambda n: post(f"{base}/groups/{group}/join", {"user": f"user-{n}"}),
                    range(100),
                )
            )
        assert outcomes == {201: 5, 409: 95}, (outcomes, log.read_text())
        members = get(f"{base}/groups/{group}")
        assert isinstance(members, dict)
        assert len(members["members"]) == 5
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert "Traceback" not in log.read_text(), log.read_text()
