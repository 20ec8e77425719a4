"""Helpers for the framework tests: the example apps, a crowd of joins, a server run for real."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import uvicorn
from starlette.types import ASGIApp

from tests.helpers import eventually

EXAMPLES = Path(__file__).parents[3] / "examples"
LIMIT = 5


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def crowd(join: Callable[[str], Awaitable[int]], users: int = 100) -> Counter[int]:
    """``users`` concurrent joins, each in a task of its own; the count of each status."""
    statuses = await asyncio.gather(*(join(f"user-{i}") for i in range(users)))
    return Counter(statuses)


def check_crowd(statuses: Counter[int], users: int = 100) -> None:
    """Exactly ``LIMIT`` joined (201), no 5xx, every other one refused (409) or locked (423)."""
    assert statuses[201] == LIMIT, statuses
    assert not [status for status in statuses if status >= 500], statuses
    assert statuses[409] + statuses[423] == users - LIMIT, statuses


@contextlib.asynccontextmanager
async def uvicorn_serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn in this event loop, on a free loopback port: its base URL.

    The app's lifespan is not run: a test app carries its client in ``app.state``.
    """
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
    with socket.create_server(("127.0.0.1", 0)) as sock:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            await eventually(lambda: server.started or serving.done(), what="uvicorn started")
            if serving.done():
                serving.result()  # the error that stopped it
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            await serving


@dataclass
class Served:
    """A server process; ``stdout`` and ``stderr`` once it exited."""

    process: asyncio.subprocess.Process
    base_url: str
    stdout: str = ""
    stderr: str = ""


@contextlib.asynccontextmanager
async def served(
    argv: Sequence[str], *, port: int, redis_url: str, stop: signal.Signals, ready_path: str
) -> AsyncIterator[Served]:
    """Run ``argv`` until the block ends, then send ``stop`` and wait for it to exit.

    The block starts once ``GET ready_path`` answers (polled: no fixed sleeps).  Warnings are
    shown in the child (``PYTHONWARNINGS=default``, which includes ResourceWarning), so that a
    client or connection left unclosed at shutdown shows in its stderr.
    """
    env = dict(os.environ, REDIS_URL=redis_url, PYTHONWARNINGS="default")
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=EXAMPLES.parent,
    )
    output = asyncio.create_task(process.communicate())  # drains the pipes from the start
    run = Served(process, f"http://127.0.0.1:{port}")
    try:
        await _wait_until_ready(run, output, ready_path)
        yield run
    finally:
        if process.returncode is None:
            process.send_signal(stop)
        try:
            out, err = await asyncio.wait_for(asyncio.shield(output), 30)
        except TimeoutError:
            process.kill()
            out, err = await output
        run.stdout, run.stderr = out.decode(), err.decode()


async def _wait_until_ready(
    run: Served, output: asyncio.Future[tuple[bytes, bytes]], path: str, timeout: float = 30.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(base_url=run.base_url, timeout=5) as http:
        while not output.done():
            try:
                if (await http.get(path)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if loop.time() > deadline:
                raise AssertionError(f"the server did not answer within {timeout}s")
            await asyncio.sleep(0.05)  # the polling interval, not a guess at the start-up time
    out, err = output.result()
    raise AssertionError(f"the server exited ({run.process.returncode}):\n{(out + err).decode()}")


async def http_crowd(base_url: str, group: str, users: int = 100) -> Counter[int]:
    """``users`` concurrent joins over real HTTP connections."""
    limits = httpx.Limits(max_connections=users)
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as http:

        async def join(user: str) -> int:
            reply = await http.post(f"/groups/{group}/join", json={"user": user})
            return reply.status_code

        return await crowd(join, users)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
