"""One blocking call: a coroutine run on the loop thread as the calling thread."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..client import owners_of
from ._loop import Call, refuse_in_loop

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["run", "settle"]

T = TypeVar("T")


def run(
    clients: Sequence[Client],
    work: Callable[[], Awaitable[T]],
    api: str,
    undo: Callable[[T], Awaitable[object]] | None = None,
    call: Call[T] | None = None,
) -> T:
    """Run ``work()`` on the loop as the calling thread, and wait for it.

    The task acts for the thread with each of ``clients`` (a ``MultiLock``'s parts may belong
    to several): every part's owner is the thread.  ``api`` names the async call that a
    thread running an event loop should make instead.  ``call``: the call to run it as, if
    another thread may answer it (see ``_line.Waiting``).
    """
    refuse_in_loop(api)
    loop, act = _acting(clients)

    def flush() -> None:
        for client in clients:
            client.flush()

    return (Call[T]() if call is None else call).run(loop, work, act, undo, flush)


def settle(clients: Sequence[Client], work: Callable[[], Awaitable[object]]) -> None:
    """Run ``work()`` on the loop as the calling thread and wait for its end, uninterrupted
    (what an interrupted call leaves to the loop: its settlement)."""
    loop, act = _acting(clients)
    Call[object]().settle_after(loop, work, act)


def _acting(
    clients: Sequence[Client],
) -> tuple[asyncio.AbstractEventLoop, Callable[[asyncio.Task[Any]], None]]:
    """The loop of ``clients``, and what makes a task on it act for the calling thread with
    each of them (the loop runs the thread's own posts first)."""
    acting = []
    loop: asyncio.AbstractEventLoop | None = None
    for client in clients:
        made, loop = client.engine()
        client.flush()
        acting.append((owners_of(made), client.thread_owner(made)))
    assert loop is not None, "a call needs a client"

    def act(task: asyncio.Task[Any]) -> None:
        for owners, owner in acting:
            owners.act_for(task, owner)

    return loop, act
