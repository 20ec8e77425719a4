"""Owner identities and request ids: who holds a lock, and which call changed it.

An owner id is the client's UUID4 plus either a number per task (the default owner) or an
explicit owner given by the caller.  Task numbers are never reused during the client's life
(``id(task)`` is reused by Python; a ContextVar would be copied into child tasks), and task and
explicit ids can never be equal (``t<n>`` against ``x:<owner>``), so their holds never mix.

A third form, ``h<n>``, is a thread's (``aiolock.sync``): the blocking client numbers its
threads and runs each call as a task on its loop thread that *acts for* the thread's id
(:meth:`Owners.act_for`).  Such a task owns nothing itself: its holds are the thread's, like an
explicit owner's, and outlive the task.

Request ids number every state-changing script call of the client; a resend carries the same
id, so the scripts apply it once.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["Owners", "current_task"]


class Owners:
    """One client's owner ids and request ids (see the module docstring)."""

    __slots__ = (
        "_acting",
        "_callback_context",
        "_forget",
        "_numbers",
        "_request",
        "_requests",
        "_tasks",
        "client_id",
    )

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        # An entry goes when its task is done: a done callback, run in one shared empty context,
        # costs a waiting task less than a weak reference (and a context copy per callback).
        # The price: a task that never finishes stays here (and alive) until the client closes.
        self._tasks: dict[asyncio.Task[Any], str] = {}
        tasks = self._tasks
        self._forget: Callable[[asyncio.Task[Any]], object] = lambda t: tasks.pop(t, None)
        self._callback_context = contextvars.Context()
        self._numbers = itertools.count(1)
        self._request = 0  # the last request id handed out
        # ``next()`` of a count is one step under the GIL: aiolock.sync's calling threads draw
        # request ids too (its first try and release made off the loop), beside the loop.
        self._requests = itertools.count(1)
        # Tasks that act for a thread (``h<n>``), while they run: never in ``_tasks``.
        self._acting: dict[asyncio.Task[Any], str] = {}

    def __len__(self) -> int:
        """Tasks with an identity now."""
        return len(self._tasks)

    def current(self, explicit: str | None) -> tuple[str, asyncio.Task[Any] | None]:
        """The calling owner: ``explicit``'s id, or the current task's id and the task."""
        if explicit is not None:
            return self.explicit(explicit), None
        task = current_task()
        owner = self._tasks.get(task)
        if owner is not None:
            return owner, task
        # A task's first call (or a thread's): the dict above is the fast path's only lookup.
        acting = self._acting.get(task)
        if acting is not None:
            return acting, None
        return self.of_task(task), task

    def holder_task(self) -> asyncio.Task[Any] | None:
        """The task whose end ends the calling owner's holds: the current task, or ``None``
        when it acts for a thread (a thread's holds outlive each of its calls)."""
        task = current_task()
        return None if task in self._acting else task

    def of_thread(self, number: int) -> str:
        """The owner id of the client's thread ``number`` (numbered by ``aiolock.sync``)."""
        return f"{self.client_id}:h{number}"

    def act_for(self, task: asyncio.Task[Any], owner: str) -> None:
        """Make ``task`` act for ``owner``, a thread's id (:meth:`of_thread`), until it is done."""
        if task in self._tasks:
            raise RuntimeError("a task that has an owner id of its own cannot act for a thread")
        self._acting[task] = owner
        task.add_done_callback(self._stop_acting, context=self._callback_context)

    def _stop_acting(self, task: asyncio.Task[Any]) -> None:
        self._acting.pop(task, None)

    def of_task(self, task: asyncio.Task[Any]) -> str:
        owner = self._tasks.get(task)
        if owner is None:
            owner = self._tasks[task] = f"{self.client_id}:t{next(self._numbers)}"
            task.add_done_callback(self._forget, context=self._callback_context)
        return owner

    def explicit(self, owner: str) -> str:
        return f"{self.client_id}:x:{owner}"

    def next_request(self) -> int:
        """A new request id, from any thread (ids stay unique and increasing per client)."""
        self._request = request = next(self._requests)
        return request

    def last_request(self) -> int:
        """The last request id handed out (0: none yet): every later call's id is greater."""
        return self._request

    def clear(self) -> None:
        """Forget every task identity (the client closed); numbers are still never reused."""
        self._tasks.clear()


def current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock must be used from inside an asyncio task")
    return task
