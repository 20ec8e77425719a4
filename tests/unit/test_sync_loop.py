"""The hop to ``aiolock.sync``'s loop thread, without a server: outcomes, an interrupt during
the wait (the task is cancelled and settles first), a call on a loop's own thread; what a
thread's own calls post to the loop, and the lines they are sent on."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType

import pytest
from redis.asyncio.connection import Connection

from aiolock.sync import _loop
from aiolock.sync._line import Line, Posts
from aiolock.sync._loop import Call, detach, loop_thread, refuse_in_loop


class Interrupted(BaseException):
    pass


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    thread = loop_thread()
    yield thread.loop
    detach(thread)


def test_a_call_returns_or_raises_what_the_coroutine_did(loop: asyncio.AbstractEventLoop) -> None:
    async def value() -> int:
        await asyncio.sleep(0)
        return 42

    async def error() -> None:
        raise ValueError("from the loop")

    seen: list[asyncio.Task[object]] = []
    assert Call[int]().run(loop, value, seen.append) == 42
    assert len(seen) == 1  # ``before`` saw the task before it ran
    with pytest.raises(ValueError, match="from the loop"):
        Call[None]().run(loop, error, lambda _: None)


def test_a_task_cancelled_before_it_started_tells_its_thread(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A call's outcome reaches its thread from the task's last step, or, for a task that
    never ran a step (cancelled as it was made: an interrupt, the loop stopping), from its
    done callback: the thread is told either way."""
    ran: list[bool] = []

    async def work() -> int:
        ran.append(True)
        return 1

    def cancel_at_once(task: asyncio.Task[object]) -> None:
        task.cancel()

    with pytest.raises(RuntimeError, match="cancelled"):
        Call[int]().run(loop, work, cancel_at_once)
    assert ran == []


def test_an_interrupt_cancels_the_task_and_waits_for_it_to_settle(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert threading.current_thread() is threading.main_thread()
    # The interrupted thread runs again: the task's end on the loop does not wait for it.
    monkeypatch.setattr(_loop, "YIELD", 60.0)
    events: list[str] = []
    started = threading.Event()

    async def wait_long() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # its own cleanup takes a while: the caller waits for it
            events.append("settled")
            raise

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR2, raise_interrupted)
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:
        started.wait(10)
        signal.pthread_kill(main, signal.SIGUSR2)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    begun = time.monotonic()
    try:
        with pytest.raises(Interrupted):
            Call[None]().run(loop, wait_long, lambda _: None)
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR2, previous)
    assert events == ["settled"]
    assert time.monotonic() - begun < 30
    ran = threading.Event()
    loop.call_soon_threadsafe(ran.set)
    assert ran.wait(10)


def test_another_thread_answers_a_call_before_its_task_ends(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """An answer returns the call at once; the task runs on to its end, its outcome dropped."""
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    async def wait_for_release() -> bool:
        started.set()
        await asyncio.to_thread(release.wait, 10)
        ended.set()
        return False

    call = Call[bool]()

    def answer() -> None:
        started.wait(10)
        assert call.reserve()
        call.answer(True)
        assert not call.reserve()  # answered once

    answerer = threading.Thread(target=answer)
    answerer.start()
    try:
        assert call.run(loop, wait_for_release, lambda _: None) is True
        assert not ended.is_set()  # returned before the task ended
    finally:
        release.set()
        answerer.join()
    assert ended.wait(10)
    # The task's own outcome (False) changed nothing; a later call is not disturbed.
    assert Call[int]().run(loop, _value(7), lambda _: None) == 7


def test_a_task_that_ends_while_an_answer_is_on_its_way_waits_for_it(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The answer, or its withdrawal, decides: a task's end meanwhile does not return first."""
    for answered in (True, False):
        call = Call[bool]()
        reserved, done = threading.Event(), threading.Event()

        async def end_once_reserved(reserved: threading.Event = reserved) -> bool:
            await asyncio.to_thread(reserved.wait, 10)
            return False

        def watch(task: asyncio.Task[object], done: threading.Event = done) -> None:
            task.add_done_callback(lambda _: done.set())  # after the step the task ended in

        def settle(
            call: Call[bool] = call,
            answered: bool = answered,
            reserved: threading.Event = reserved,
            done: threading.Event = done,
        ) -> None:
            assert call.reserve()
            reserved.set()
            assert done.wait(10)  # the task has ended: the thread is still held back
            if answered:
                call.answer(True)
            else:
                call.withdraw()

        decider = threading.Thread(target=settle)
        decider.start()
        try:
            assert call.run(loop, end_once_reserved, watch) is answered
        finally:
            decider.join()


def test_an_interrupt_after_an_answer_undoes_what_was_answered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Interrupted as an answer lands (or once one is on its way), the thread waits for the
    task's end, then runs ``undo`` with the answer: nothing it was given stays behind."""
    assert threading.current_thread() is threading.main_thread()
    undone: list[object] = []
    started = threading.Event()

    async def wait_long() -> bool:
        started.set()
        await asyncio.sleep(60)
        return False

    async def undo(value: bool) -> None:
        undone.append(value)

    interrupted = threading.Event()

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        interrupted.set()
        raise Interrupted

    previous = signal.signal(signal.SIGUSR2, raise_interrupted)
    main = threading.main_thread().ident
    assert main is not None
    call = Call[bool]()

    def answer_then_interrupt() -> None:
        started.wait(10)
        assert call.reserve()
        signal.pthread_kill(main, signal.SIGUSR2)
        assert interrupted.wait(10)  # raised while the answer is on its way
        call.answer(True)

    interrupter = threading.Thread(target=answer_then_interrupt)
    interrupter.start()
    try:
        with pytest.raises(Interrupted):
            call.run(loop, wait_long, lambda _: None, undo)
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR2, previous)
    assert undone == [True]


def test_an_answer_waits_for_the_answered_thread_to_run_and_no_longer(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer waits for the answered thread to be scheduled (``Call.yield_to``), bounded by
    ``YIELD``: made a minute here, so that a path that left the wait unmet would stall the
    answering thread (or the loop) past the checks below.  A call's end on the loop, and a
    call nobody waits on, wait for nothing."""
    monkeypatch.setattr(_loop, "YIELD", 60.0)

    def loop_responds() -> bool:
        ran = threading.Event()
        loop.call_soon_threadsafe(ran.set)
        return ran.wait(10)

    async def error() -> None:
        raise ValueError("from the loop")

    # A call's end: its thread runs again, and the loop goes on.
    assert Call[int]().run(loop, _value(3), lambda _: None) == 3
    with pytest.raises(ValueError, match="from the loop"):
        Call[None]().run(loop, error, lambda _: None)
    assert loop_responds()

    # An answer: the answering thread goes on once the answered one runs.
    started = threading.Event()
    call = Call[bool]()

    async def wait_long() -> bool:
        started.set()
        await asyncio.sleep(60)
        return False

    def answer() -> None:
        assert started.wait(10)
        assert call.reserve()
        call.answer(True)
        call.yield_to()

    answerer = threading.Thread(target=answer)
    answerer.start()
    assert call.run(loop, wait_long, lambda _: None) is True
    answerer.join(10)
    assert not answerer.is_alive()

    # A call nobody waits on (never run, or run by ``settle_after``) waits for nothing.
    idle = threading.Thread(target=Call[None]().yield_to)
    idle.start()
    idle.join(10)
    assert not idle.is_alive()
    Call[int]().settle_after(loop, _value(1))
    assert loop_responds()


def _value(value: int) -> Callable[[], Awaitable[int]]:
    async def get() -> int:
        return value

    return get


@pytest.mark.anyio
async def test_a_call_on_a_loops_thread_is_refused() -> None:
    with pytest.raises(RuntimeError, match="use the async API: await x"):
        refuse_in_loop("await x")


def test_posts_run_in_order_in_batches_and_before_what_is_queued_after_a_flush(
    loop: asyncio.AbstractEventLoop,
) -> None:
    posts = Posts(loop)
    ran: list[str] = []
    done = threading.Event()

    def last(text: str) -> None:
        ran.append(text)
        done.set()

    for n in range(5):
        posts.post(lambda n=n: ran.append(f"post {n}"))  # type: ignore[misc]
    # A batch is due BATCH after the loop woke: a call queued now, after a flush, still runs
    # after every post.
    posts.flush()
    loop.call_soon_threadsafe(last, "queued after")
    assert done.wait(10)
    assert ran == [*(f"post {n}" for n in range(5)), "queued after"]
    # Without a flush the batch runs on its own, once, BATCH later.
    ran.clear()
    done.clear()
    posts.post(lambda: ran.append("a"))
    posts.post(lambda: last("b"))
    assert done.wait(10)
    assert ran == ["a", "b"]
    # An urgent post runs the batch at once, and a failing callback stops none after it.
    ran.clear()
    done.clear()
    posts.post(lambda: 1 / 0)
    posts.post(lambda: last("urgent"), urgent=True)
    assert done.wait(10)
    assert ran == ["urgent"]
    # Posts that do not wake the loop run, in order, once it is woken.
    ran.clear()
    done.clear()
    posts.post(lambda: ran.append("quiet"), wake=False)
    posts.post(lambda: last("quiet too"), wake=False)
    posts.wake()
    assert done.wait(10)
    assert ran == ["quiet", "quiet too"]


def test_a_line_is_made_for_one_server_only() -> None:
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.connection import ConnectionPool

    loop = asyncio.new_event_loop()
    try:
        plain = Redis.from_url("redis://127.0.0.1:1/0", socket_timeout=1.5)
        assert Line.of(plain, loop) is not None
        # A connection class the line has no blocking counterpart of (a sentinel's, say).
        pool = ConnectionPool(connection_class=type("Custom", (Connection,), {}))
        assert Line.of(Redis(connection_pool=pool), loop) is None
        cluster = RedisCluster.__new__(RedisCluster)  # never connected: its type is the point
        assert Line.of(cluster, loop) is None
    finally:
        loop.close()
