"""Worker processes (``spawn``) that run one async job each time they are asked.

A job is a module-level ``async def`` and its keyword arguments; the worker runs it with
:func:`asyncio.run` and sends back its result, or ``{"error": ...}``.  Contended runs keep one
pool for a whole scenario; fan-in runs take a fresh process each, so RSS starts clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from typing import Any

from .scenarios import attempt

__all__ = ["Job", "WorkerPool"]

Job = tuple[Callable[..., Coroutine[Any, Any, dict[str, Any]]], dict[str, Any]]


def _serve(conn: Connection) -> None:
    from . import impls  # noqa: F401 - import the peers before the first timed job

    while True:
        job: Job | None = conn.recv()
        if job is None:
            return
        func, kwargs = job
        conn.send(attempt(functools.partial(asyncio.run, func(**kwargs))))


async def _ready() -> dict[str, Any]:
    return {}


class WorkerPool:
    """``processes`` spawned workers; :meth:`run` sends one job to each and gathers replies."""

    def __init__(self, processes: int) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._processes: list[Any] = []
        self._busy = 0
        for index in range(processes):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=_serve, args=(child,), name=f"bench-worker-{index}", daemon=True
        )
        process.start()
        child.close()
        if index < len(self._conns):
            self._conns[index], self._processes[index] = parent, process
        else:
            self._conns.append(parent)
            self._processes.append(process)

    def __len__(self) -> int:
        return len(self._conns)

    def send(self, jobs: list[Job]) -> None:
        """Give job ``i`` to worker ``i``; collect the replies with :meth:`gather`."""
        if len(jobs) > len(self._conns):
            raise ValueError(f"{len(jobs)} jobs for {len(self._conns)} workers")
        for conn, job in zip(self._conns, jobs, strict=False):
            conn.send(job)
        self._busy = len(jobs)

    def gather(self, timeout: float) -> list[dict[str, Any]]:
        replies = []
        for index, conn in enumerate(self._conns[: self._busy]):
            if conn.poll(timeout):
                replies.append(conn.recv())
            else:
                # A stuck worker would answer the next job with this one's reply: replace it.
                self._processes[index].kill()
                self._processes[index].join()
                conn.close()
                self._spawn(index)
                replies.append({"error": f"no reply within {timeout:.0f}s"})
        self._busy = 0
        return replies

    def wait_ready(self, timeout: float = 120) -> None:
        """Block until every worker has started and imported the peers: spawning many workers
        on a small machine takes seconds, and a timed window must not start before them."""
        errors = [r["error"] for r in self.run([(_ready, {})] * len(self), timeout) if "error" in r]
        if errors:
            raise RuntimeError(f"a worker did not start: {errors[0]}")

    def run(self, jobs: list[Job], timeout: float) -> list[dict[str, Any]]:
        self.send(jobs)
        return self.gather(timeout)

    def close(self) -> None:
        for conn, process in zip(self._conns, self._processes, strict=True):
            if process.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    conn.send(None)
            process.join(timeout=3)
            if process.is_alive():
                process.kill()
                process.join()
            conn.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
