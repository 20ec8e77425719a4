"""The event loop thread that runs every ``aiolock.sync`` client's calls, and the hop to it.

One loop thread per process serves every open blocking client (a ``MultiLock`` or a
``RedLock`` over several clients needs all their async clients on one loop).  It starts with
the first client's first call and stops when the last client closes; it is a daemon thread,
so a client never closed does not keep the interpreter from exiting.

A blocking call is a task on that loop; the calling thread waits on a plain lock that the task
releases in the step its work ends in (or its done callback, if it was cancelled). Who may wait
on whom: the calling thread waits on the loop, never the reverse (the loop never blocks on a
thread), so a call made *on* a thread that runs an event loop is refused (it could be that very
loop, and it would block its own tasks).

After ``os.fork()`` the child has no loop thread (threads do not survive a fork) but a copy
of the parent's loop and connections: :func:`_forked` drops them without touching them (kept
alive, so that no finalizer closes a socket the parent still uses) and counts a new
generation; each client then starts afresh on its next call.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Final, Generic, TypeVar

__all__ = [
    "Call",
    "LoopThread",
    "abandon",
    "detach",
    "generation",
    "loop_thread",
    "refuse_in_loop",
]

T = TypeVar("T")

# How long an answer waits for the answered thread to be scheduled (s).
YIELD: Final = 0.001

# Rounds of cancelling the tasks left when the loop stops (each may start another: a read of a
# cancelled call's reply, then a disconnect), bounded so that stopping always ends.
_SHUTDOWN_ROUNDS = 8


class _Process:
    """This process' loop thread and generation (one instance, :data:`_process`)."""

    def __init__(self) -> None:
        self.guard = threading.Lock()  # guards the fields below
        self.current: LoopThread | None = None
        self.generation = 0  # counted up in a forked child: older clients start afresh
        self.abandoned: list[object] = []  # a parent's objects a child must not use or finalize


_process = _Process()


class LoopThread:
    """A daemon thread running an event loop, shared by the clients attached to it."""

    __slots__ = ("clients", "loop", "thread")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clients = 0
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(started,), name="aiolock.sync", daemon=True
        )
        self.thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(started.set)
        loop.run_forever()
        # Stopped (its last client closed): a call still running there is cancelled, so that
        # its thread is told (RuntimeError) rather than left waiting for ever.  A call
        # cancelled in flight starts the read of its reply in a task of its own, cancelled in
        # the next round: none is left pending when the loop closes.
        for _ in range(_SHUTDOWN_ROUNDS):
            tasks = asyncio.all_tasks(loop)
            if not tasks:
                break
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())

    def stop(self) -> None:
        """Stop the loop and its thread (its clients have closed), and close the loop."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join()
            self.loop.close()


def loop_thread() -> LoopThread:
    """The process' loop thread, started if there is none, with one more client attached."""
    with _process.guard:
        if _process.current is None:
            _process.current = LoopThread()
        _process.current.clients += 1
        return _process.current


def detach(thread: LoopThread) -> None:
    """One client of ``thread`` closed: stop it with its last."""
    with _process.guard:
        thread.clients -= 1
        if thread.clients > 0 or thread is not _process.current:
            return
        _process.current = None
    thread.stop()


def generation() -> int:
    """The process' generation: it changes in a child after each ``os.fork()``."""
    return _process.generation


def abandon(thing: object) -> None:
    """Keep a parent's object alive, unused, in a forked child (see the module docstring)."""
    _process.abandoned.append(thing)


def _forked() -> None:
    _process.guard = threading.Lock()  # the parent's may have been held by another thread
    if _process.current is not None:
        abandon(_process.current)
    _process.current = None
    _process.generation += 1


os.register_at_fork(after_in_child=_forked)


# Whether another thread answers a call (see Call.reserve): no answer, one on its way, given.
_UNANSWERED, _RESERVED, _ANSWERED = 0, 1, 2
# Guards every call's answer, end and interrupt, and wakes an interrupted thread once an answer
# on its way is given or withdrawn (rare and short: one for all calls).
_answers = threading.Condition(threading.Lock())


class Call(Generic[T]):
    """One blocking call: ``work()`` run as a task on ``loop``, acting for an owner.

    ``before(task)`` runs on the loop right after the task is made, before it starts (it
    registers the task as acting for the calling thread).

    Another thread may answer the call before its task ends (:meth:`reserve`, then
    :meth:`answer` or :meth:`withdraw`): the release that granted a lock to the waiting thread
    tells it so at once (``_direct.py``).  The task still runs to its end, its outcome dropped.
    """

    __slots__ = (
        "_answer",
        "_cancel",
        "_done",
        "_ended",
        "_error",
        "_parked",
        "_running",
        "_task",
        "_value",
    )

    def __init__(self) -> None:
        self._done = threading.Lock()
        self._done.acquire()  # released by the task (see _told), or by an answer
        # Released by the calling thread once it runs again after its wait (see yield_to).
        self._running = threading.Lock()
        self._running.acquire()
        self._parked = False
        self._task: asyncio.Task[None] | None = None
        self._cancel = False
        self._ended = False  # set before _done is released: the outcome is in
        self._answer = _UNANSWERED
        self._value: Any = None
        self._error: BaseException | None = None

    def run(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[], Awaitable[T]],
        before: Callable[[asyncio.Task[Any]], object],
        undo: Callable[[T], Awaitable[object]] | None = None,
        flush: Callable[[], object] | None = None,
    ) -> T:
        """Run ``work`` on ``loop`` and wait for its outcome.

        Anything raised in the calling thread while it waits (``KeyboardInterrupt`` from a
        signal handler) cancels the task on the loop, and the call returns only once the task
        has settled (a grant in flight then is released by the async engine), then
        re-raises it.  ``undo(value)`` runs on the loop (and is waited for) when the task had
        already returned ``value`` (or an answer had given it) to a caller that was interrupted
        before it could take it, after ``flush()`` (the calling thread's posts to the loop
        run first: an answer's record of the hold among them).
        """
        try:
            # Inside: an interrupt may land right after the call is scheduled (or before).
            self._parked = True
            loop.call_soon_threadsafe(self._start, work, before)
            self._done.acquire()
            self._run_again()
        except BaseException:
            self._run_again()
            answered = self._interrupted()
            loop.call_soon_threadsafe(self._cancelled)
            if answered:
                self._settle_answered()
            else:
                self._settle()
            if undo is not None and (answered or (self._task is not None and self._error is None)):
                taken: T = self._value
                if flush is not None:
                    flush()
                # As the same owner: the undo releases what the call took for the thread.
                Call[object]().settle_after(loop, lambda: undo(taken), before)
            raise
        if self._error is not None:
            error, self._error = self._error, None  # no cycle through the traceback
            raise error
        value: T = self._value
        return value

    def _run_again(self) -> None:
        """The calling thread runs again after its wait: a :meth:`yield_to` waits no more.
        Once only (marked first: an interrupt between the two statements costs that wait its
        bound, never a second release)."""
        if self._parked:
            self._parked = False
            self._running.release()

    def _interrupted(self) -> bool:
        """Mark the call interrupted, once an answer on its way is given or withdrawn:
        whether it was answered."""
        self._cancel = True  # (read under _answers by reserve: one store, before the wait)
        _wait_uninterrupted(lambda: self._answer != _RESERVED)
        return self._answer == _ANSWERED

    def _settle(self) -> None:
        """Wait for the cancelled task to end, whatever else is raised meanwhile (the
        interrupt may also have come just after the wait succeeded: ``_ended`` tells)."""
        while not self._ended:
            try:
                self._done.acquire()
            except BaseException:  # a second Ctrl-C must not strand the task
                continue

    def _settle_answered(self) -> None:
        """:meth:`_settle` for a call an answer was given to (whose ``_done`` that answer
        released): wait for the task's end, which :meth:`_end` announces."""
        _wait_uninterrupted(lambda: self._ended)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The call's task on the loop, once made (any thread may read it)."""
        return self._task

    def reserve(self) -> bool:
        """From another thread, before it makes the answer true: hold off an interrupt of the
        waiting thread until :meth:`answer` or :meth:`withdraw`.  ``False``: the call can no
        longer be answered (interrupted, answered, or its task ended)."""
        with _answers:
            if self._cancel or self._ended or self._answer != _UNANSWERED:
                return False
            self._answer = _RESERVED
            return True

    def answer(self, value: T) -> None:
        """Tell the waiting thread ``value`` now (after :meth:`reserve`); the task's own
        outcome is dropped."""
        with _answers:
            self._answer = _ANSWERED
            # (Over the task's own outcome, if it ended meanwhile: a wait that ran out, say.)
            self._value, self._error = value, None
            _answers.notify_all()
        self._done.release()

    def yield_to(self) -> None:
        """Once the call is answered with a lock: let its thread run before the one that
        answered it (a releasing thread, or the loop reading a grant) goes on, waiting at
        most :data:`YIELD` for it to be scheduled; the answering thread then takes its turn at
        the GIL as any other.  The thread holding the lock would otherwise queue for the GIL
        until the other blocks: tens of µs, up to hundreds, on a hand-off
        (benchmarks/notes/hand-off.md).  A call's end on the loop does not yield: the loop
        would wait behind whatever the woken thread runs next."""
        if self._parked:
            self._running.acquire(timeout=YIELD)

    def withdraw(self) -> None:
        """No answer after all (after :meth:`reserve`): the task's outcome is the call's."""
        with _answers:
            self._answer = _UNANSWERED
            _answers.notify_all()
            ended = self._ended  # then its end left the thread's wake-up to this
        if ended:
            self._done.release()

    def settle_after(
        self,
        loop: asyncio.AbstractEventLoop,
        work: Callable[[], Awaitable[T]],
        before: Callable[[asyncio.Task[Any]], object] | None = None,
    ) -> None:
        """Run ``work()`` on the loop and wait for it to end, uninterrupted (``before``: as
        for :meth:`run`)."""
        loop.call_soon_threadsafe(self._start, work, _nothing if before is None else before)
        self._settle()

    def _start(
        self, work: Callable[[], Awaitable[T]], before: Callable[[asyncio.Task[Any]], object]
    ) -> None:
        if self._cancel:  # interrupted before the loop got to it: nothing was sent
            self._end()
            return
        try:
            coroutine = work()
        except BaseException as error:  # bad arguments, checked as the coroutine is made
            self._end(error=error)
            return
        task = asyncio.ensure_future(self._told(coroutine))
        before(task)
        self._task = task
        task.add_done_callback(functools.partial(self._told_cancelled, coroutine))

    async def _told(self, work: Awaitable[T]) -> None:
        """Run ``work`` and tell the calling thread its outcome in the same step as it ends
        (a done callback runs a pass of the loop later: a hand-off's last stretch)."""
        try:
            value = await work
        except asyncio.CancelledError:
            raise  # told by the done callback (which a task cancelled before it ran gets too)
        except BaseException as error:  # the thread raises it: the task ends quietly
            self._end(error=error)
            return
        self._end(value)

    def _told_cancelled(self, work: Awaitable[T], task: asyncio.Task[None]) -> None:
        if task.cancelled() and not self._ended:
            if inspect.iscoroutine(work):
                work.close()  # never started if the task never ran (else closed already)
            self._end(error=RuntimeError("the call was cancelled (its client was closed)"))

    def _cancelled(self) -> None:
        if self._task is not None:
            self._task.cancel()
        elif not self._ended:  # interrupted before ``_start`` was even scheduled
            self._end()

    def _end(self, value: Any = None, error: BaseException | None = None) -> None:
        with _answers:
            self._ended = True
            if self._answer == _ANSWERED:
                # The answer released ``_done``: its outcome is dropped, and an interrupted
                # thread waits for this end (_settle_answered).
                _answers.notify_all()
                return
            self._value, self._error = value, error
            if self._answer == _RESERVED:
                return  # the answer, or its withdrawal, wakes the thread
        self._done.release()


def _wait_uninterrupted(done: Callable[[], bool]) -> None:
    """Wait under :data:`_answers` until ``done()``, whatever is raised meanwhile (a second
    Ctrl-C must not strand a call)."""
    while True:
        try:
            with _answers:
                _answers.wait_for(done)
                return
        except BaseException:
            continue


def _nothing(_: object) -> None:
    return None


def refuse_in_loop(api: str) -> None:
    """Raise ``RuntimeError`` if the calling thread runs an event loop (see the docstring)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"a blocking aiolock.sync call was made on a thread that runs an event loop, which it "
        f"would block (or deadlock); in async code use the async API: {api}"
    )
