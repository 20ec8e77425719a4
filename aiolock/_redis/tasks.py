"""Background tasks of a client: kept referenced while they run, and ended on close.

The event loop keeps only weak references to tasks, so work started in the background (a
reply read for a cancelled caller, a SUBSCRIBE, a connect whose caller has gone) is held in a
:class:`Background` set of its owner until it ends; closing the owner waits for it or cancels
it (:func:`cancel`).

The client's long-lived loops (the watchdog's, each subscriber's reader, the fair lock's
keep-alive) run under :func:`supervise`: a loop that fails (a bug: the loops handle Redis and
connection errors themselves) is logged with its traceback and started again after a pause,
since waiters whose next wake-up depends on it would otherwise wait forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["FIRST_PAUSE", "LONGEST_PAUSE", "Background", "cancel", "supervise"]

logger = logging.getLogger("aiolock")

_T = TypeVar("_T")

# A failed loop restarts after a pause that doubles with each failure in a row, up to the
# longest; a run that lasted at least the longest pause was healthy, and resets it.
FIRST_PAUSE = 0.1
LONGEST_PAUSE = 2.0


def supervise(name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
    """Run ``loop()`` in a task named ``name`` that restarts it whenever it fails.

    A failure is logged (logger ``aiolock``, with its traceback), and ``loop()`` runs again
    after a pause (:data:`FIRST_PAUSE`, doubling to :data:`LONGEST_PAUSE` while the failures
    come in a row).  A loop that returns is done; cancelling the task ends it, also during a
    pause.  The caller keeps the task (the event loop holds tasks weakly).
    """
    return asyncio.get_running_loop().create_task(_supervised(name, loop), name=name)


async def _supervised(name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
    clock = asyncio.get_running_loop()
    pause = FIRST_PAUSE
    while True:
        started = clock.time()
        try:
            await loop()
            return
        except Exception:
            if clock.time() - started >= LONGEST_PAUSE:
                pause = FIRST_PAUSE
            logger.exception("%s failed; restarting it in %.1fs", name, pause)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)


class Background:
    """The tasks one component runs in the background; true while any is running."""

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
        """Run ``work`` in a task that stays referenced here until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def tasks(self) -> set[asyncio.Task[Any]]:
        """The tasks running now (a copy: they leave the set as they end)."""
        return set(self._tasks)

    async def wait(self, within: float | None = None) -> set[asyncio.Task[Any]]:
        """Wait for the tasks running now, at most ``within`` seconds; those still running."""
        if not self._tasks:
            return set()
        _, pending = await asyncio.wait(set(self._tasks), timeout=within)
        return pending

    async def drain(self) -> None:
        """Wait until no task runs, also those that the running ones start meanwhile."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await _ended()

    async def cancel_all(self) -> None:
        """Cancel every task, also those started while the earlier ones were ending."""
        while self._tasks:
            await cancel(set(self._tasks))
            await _ended()

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def __len__(self) -> int:
        return len(self._tasks)


async def _ended() -> None:
    """One step of the loop, in which tasks that have ended leave the set.

    A task leaves in its done callback, which runs a step after it ends; and awaiting ended
    tasks does not yield (Python 3.12's ``gather`` returns at once when all are done), so a
    loop that waits for the set to empty would spin forever without this step.
    """
    await asyncio.sleep(0)


async def cancel(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait for them to end.

    The request is repeated every second for a task that is still running: code beneath us
    (``asyncio.wait_for`` on Python 3.11) may have swallowed one, and closing must not hang.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a failure here is of no use to anybody now
