"""A client's long-lived loops survive a bug: each runs under the supervisor
(``aiolock._redis.tasks.supervise``), which logs the failure with its traceback and restarts it.

A failure is injected into each loop in turn (a method it calls raises once, when called from
that loop's task, :func:`fail_once_in`), and the waiters and holds that depend on the loop are
still served: a waiter parked on a lock another client released (the subscriber's reader), a
fair waiter whose turn came when the holder's lease ran out (the fair keep-alive), and a
watched hold renewed past its watchdog lease (the watchdog).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from aiolock._core.line import LineEntry
from tests.helpers import entry_of, eventually, services_of, settled

pytestmark = pytest.mark.anyio


class InjectedFault(Exception):
    """The bug a test injects into a loop: no Redis or connection error, which loops handle."""


def fail_once_in(
    monkeypatch: pytest.MonkeyPatch, task: str, target: Any, method: str
) -> asyncio.Event:
    """Make ``target.method`` raise :class:`InjectedFault` once, the first time the task named
    ``task`` calls it (other callers are served as before); the event is set then."""
    original = getattr(target, method)
    failed = asyncio.Event()

    def failing(*args: Any, **kwargs: Any) -> Any:
        current = asyncio.current_task()
        if not failed.is_set() and current is not None and current.get_name() == task:
            failed.set()
            raise InjectedFault(f"injected into {task}")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, method, failing)
    return failed


def assert_logged_with_traceback(caplog: pytest.LogCaptureFixture, task: str) -> None:
    records = [
        record
        for record in caplog.records
        if record.name == "aiolock"
        and isinstance(record.args, tuple)
        and record.args[:1] == (task,)
    ]
    assert len(records) == 1, caplog.text
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None
    assert isinstance(records[0].exc_info[1], InjectedFault)
    assert f"{task} failed; restarting it" in caplog.text
    assert "Traceback" in caplog.text


async def test_a_reader_that_fails_is_restarted_and_its_waiter_served(
    make_client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The release's message makes the reader fail: restarted, it subscribes again, and the
    confirmation wakes the waiter (a release may have been missed).  Without the restart
    the waiter would park until the holder's lease (30 s) ran out."""
    holder, waiter = make_client(), make_client()
    held = holder.lock("reader-fails")
    await held.lock()
    lock = waiter.lock("reader-fails", owner="waiter")  # granted in a task, released here
    waiting = asyncio.create_task(lock.lock())
    await eventually(lambda: settled(waiter, lock), what="the waiter parked, subscribed")
    failed = fail_once_in(monkeypatch, "aiolock-pubsub-reader", LineEntry, "deliver")
    await held.unlock()
    await asyncio.wait_for(failed.wait(), timeout=5)
    await asyncio.wait_for(waiting, timeout=5)  # granted: the restarted reader woke it
    assert_logged_with_traceback(caplog, "aiolock-pubsub-reader")
    await lock.unlock()
    # The reader goes on serving: the next release wakes the next waiter as usual.
    await held.lock()
    waiting = asyncio.create_task(lock.lock())
    await eventually(lambda: settled(waiter, lock), what="parked again")
    await held.unlock()
    await asyncio.wait_for(waiting, timeout=5)
    await lock.unlock()


async def test_a_keep_alive_that_fails_is_restarted_and_the_fair_waiter_served(
    make_client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The holder's lease runs out with no release (expiry publishes nothing): the waiter's
    turn comes by its client's keep-alive, which looks at the lock then.  That look fails
    (before its call goes out); restarted, the keep-alive looks again and hands the lock over.
    A queued fair waiter parks with no timeout of its own: without the restart it would
    wait forever."""
    holder, waiter = make_client(), make_client(fair_wait_timeout=2.0)
    await holder.fair_lock("keeper-fails").lock(lease=2.0)  # never released: it runs out
    lock = waiter.fair_lock("keeper-fails", owner="waiter")
    failed = fail_once_in(monkeypatch, "aiolock-fair-keepalive", services_of(waiter).calls, "run")
    waiting = asyncio.create_task(lock.lock())
    await eventually(lambda: entry_of(waiter, lock) is not None, what="the waiter parked")
    await asyncio.wait_for(failed.wait(), timeout=5)
    assert not waiting.done()
    await asyncio.wait_for(waiting, timeout=5)  # its turn: handed over by the keep-alive
    assert_logged_with_traceback(caplog, "aiolock-fair-keepalive")
    assert await lock.is_held()
    await lock.unlock()


async def test_a_watchdog_that_fails_is_restarted_and_renews_past_its_lease(
    make_client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The watchdog's loop fails as it reads the holds for a round; restarted, it renews the
    hold for more than a whole lease after the failure (1.5 s, a round every 0.5 s)."""
    client = make_client(watchdog_timeout=1.5)
    lock = client.lock("watchdog-fails")
    async with lock.acquire() as guard:
        holds = services_of(client).holds
        failed = fail_once_in(monkeypatch, "aiolock-watchdog", holds, "watched")
        await asyncio.wait_for(failed.wait(), timeout=5)
        renewals = client.statistics().renewals
        # Four rounds after the failure: 2 s, past the 1.5 s lease of the last renewal before.
        await eventually(
            lambda: client.statistics().renewals >= renewals + 4, timeout=10, what="renewed"
        )
        assert not guard.lost
        assert await lock.is_held()
    assert_logged_with_traceback(caplog, "aiolock-watchdog")


async def test_a_restarted_loop_ends_with_its_client(
    make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closing the client ends a supervised loop even in its pause after a failure."""
    client = make_client(watchdog_timeout=1.5)
    lock = client.lock("closing")
    await lock.lock()
    failed = fail_once_in(monkeypatch, "aiolock-watchdog", services_of(client).holds, "watched")
    await asyncio.wait_for(failed.wait(), timeout=5)
    watchdog = [task for task in asyncio.all_tasks() if task.get_name() == "aiolock-watchdog"]
    assert len(watchdog) == 1
    await asyncio.wait_for(client.aclose(), timeout=5)
    assert watchdog[0].done()
