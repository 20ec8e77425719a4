"""Errors that teach (SPEC "Errors"): the habits users bring from redis-py's ``Lock`` and
``asyncio.Lock`` meet a message with the words they need.  No server: the clients point at a
port nobody listens on, so any I/O would raise a connection error instead.

The messages that need a server (a release by another task, a second event loop, a password
the server asks for) are in ``tests/integration/concerns/test_messages.py``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock._core.habits import REDIS_PY_KEYWORDS, teaching

pytestmark = pytest.mark.anyio

DEAD_URL = "redis://127.0.0.1:1/0"


@pytest.fixture
def clients() -> list[aiolock.Client]:
    return [aiolock.Client.from_url(DEAD_URL, key_prefix=f"p{n}") for n in range(3)]


def lock_kinds(clients: list[aiolock.Client]) -> dict[str, Any]:
    """One lock object of every kind whose ``acquire()`` yields a guard, by its public class."""
    client = clients[0]
    return {
        "AsyncRLock": client.lock("x"),
        "AsyncFairLock": client.fair_lock("x"),
        "AsyncSpinLock": client.spin_lock("x"),
        "AsyncReadLock": client.rw_lock("x").read_lock(),
        "AsyncWriteLock": client.rw_lock("x").write_lock(),
        "MultiLock": aiolock.MultiLock(client.lock("a"), client.lock("b")),
        "RedLock": aiolock.RedLock(clients, "x"),
    }


KINDS = [
    "AsyncRLock",
    "AsyncFairLock",
    "AsyncSpinLock",
    "AsyncReadLock",
    "AsyncWriteLock",
    "MultiLock",
    "RedLock",
]


# -- await lock.acquire() -------------------------------------------------------------------


async def test_a_type_checker_refuses_the_await_too(clients: list[aiolock.Client]) -> None:
    """mypy flags the await (``warn_unused_ignores`` under ``--strict`` keeps this ignore
    honest: test_static runs mypy over the tests); Python raises the message."""
    with pytest.raises(TypeError, match=r"async with lock\.acquire\(\.\.\.\)"):
        await clients[0].lock("x").acquire()  # type: ignore[misc]


@pytest.mark.parametrize("kind", KINDS)
async def test_awaiting_acquire_says_async_with_or_lock(
    clients: list[aiolock.Client], kind: str
) -> None:
    lock = lock_kinds(clients)[kind]
    with pytest.raises(TypeError) as refused:
        await lock.acquire(wait=1, lease=5)
    text = str(refused.value)
    assert text.startswith(f"{kind}.acquire() returns an async context manager"), text
    for words in ("async with lock.acquire(...)", "await lock.lock()", "await lock.try_lock()"):
        assert words in text, text


async def test_awaiting_a_semaphore_acquire_says_async_with_or_try_acquire(
    clients: list[aiolock.Client],
) -> None:
    with pytest.raises(TypeError) as refused:
        await clients[0].semaphore("s", 2).acquire(wait=1)  # type: ignore[misc]
    text = str(refused.value)
    assert text.startswith("AsyncSemaphore.acquire() returns an async context manager"), text
    for words in ("async with sem.acquire(...)", "await sem.try_acquire(", "permit.release()"):
        assert words in text, text


# -- redis-py's keywords --------------------------------------------------------------------


def calls(clients: list[aiolock.Client]) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every public call a redis-py habit may meet, by the name its message must show."""
    client = clients[0]
    yield "Client", lambda **kw: aiolock.Client(client.redis, **kw)
    yield "Client.from_url", lambda **kw: aiolock.Client.from_url(DEAD_URL, **kw)
    yield "Client.lock", lambda **kw: client.lock("x", **kw)
    yield "Client.fair_lock", lambda **kw: client.fair_lock("x", **kw)
    yield "Client.spin_lock", lambda **kw: client.spin_lock("x", **kw)
    yield "Client.rw_lock", lambda **kw: client.rw_lock("x", **kw)
    yield "Client.semaphore", lambda **kw: client.semaphore("x", 2, **kw)
    yield "Client.countdown_latch", lambda **kw: client.countdown_latch("x", **kw)
    yield "Client.locked", lambda **kw: client.locked("x", **kw)
    yield "AsyncReadWriteLock.read_lock", lambda **kw: client.rw_lock("x").read_lock(**kw)
    yield "AsyncReadWriteLock.write_lock", lambda **kw: client.rw_lock("x").write_lock(**kw)
    yield "MultiLock", lambda **kw: aiolock.MultiLock(client.lock("a"), client.lock("b"), **kw)
    yield "RedLock", lambda **kw: aiolock.RedLock(clients, "x", **kw)
    for kind, lock in lock_kinds(clients).items():
        for method in ("try_lock", "lock", "acquire", "unlock"):
            yield f"{kind}.{method}", getattr(lock, method)
    semaphore = client.semaphore("s", 2)
    yield "AsyncSemaphore.try_acquire", semaphore.try_acquire
    yield "AsyncSemaphore.acquire", semaphore.acquire


@pytest.mark.parametrize("keyword", sorted(REDIS_PY_KEYWORDS))
def test_redis_py_keywords_name_aiolock_s_own(clients: list[aiolock.Client], keyword: str) -> None:
    own = "`owner=`" if keyword in ("thread_local", "token") else "`wait=`"
    for where, call in calls(clients):
        with pytest.raises(TypeError) as refused:
            call(**{keyword: 1})
        text = str(refused.value)
        assert text.startswith(f"{where}() got redis-py's keyword {keyword!r}: "), text
        assert own in text, text
        if keyword == "timeout":
            assert "`lease=`" in text, text
        # A call that takes neither wait nor lease (a factory) says where they go.
        timing = where.rpartition(".")[2] in ("try_lock", "lock", "acquire", "try_acquire")
        if own == "`wait=`" and (where == "Client.lock" or not timing) and where != "Client.locked":
            assert "acquire(wait=5, lease=30)" in text, text


def test_the_timeout_message_is_the_spec_s(clients: list[aiolock.Client]) -> None:
    with pytest.raises(TypeError) as refused:
        clients[0].lock("x").try_lock(timeout=10)  # type: ignore[call-arg,unused-coroutine]
    assert str(refused.value).startswith(
        "AsyncRLock.try_lock() got redis-py's keyword 'timeout': aiolock calls the lock's "
        "time to live `lease=` (seconds"
    )
    assert "the time to wait for it `wait=`" in str(refused.value)


def test_other_unexpected_arguments_name_the_public_class(clients: list[aiolock.Client]) -> None:
    lock = clients[0].fair_lock("x")
    with pytest.raises(TypeError, match=r"^AsyncFairLock\.try_lock\(\) got an unexpected keyword"):
        lock.try_lock(walt=1)  # type: ignore[call-arg,unused-coroutine]
    with pytest.raises(TypeError, match=r"^AsyncFairLock\.lock\(\) takes from 1 to 2 positional"):
        lock.lock(1, 2)  # type: ignore[call-arg,unused-coroutine]
    with pytest.raises(TypeError, match=r"^Client\(\) got an unexpected keyword argument 'prefix'"):
        aiolock.Client(clients[0].redis, prefix="x")  # type: ignore[call-arg]


def test_argument_checks_keep_their_own_messages(clients: list[aiolock.Client]) -> None:
    lock = clients[0].lock("x")
    with pytest.raises(ValueError, match=r"^lease must not be negative"):
        lock.lock(lease=-1)  # type: ignore[unused-coroutine]
    with pytest.raises(TypeError, match=r"^wait must be a number of seconds"):
        lock.acquire(wait="5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^name must be a str"):
        clients[0].lock(b"x")  # type: ignore[arg-type]


def test_a_taught_call_keeps_its_signature_and_name(clients: list[aiolock.Client]) -> None:
    lock = clients[0].lock("x")
    assert str(inspect.signature(lock.try_lock)) == (
        "(wait: 'float | None' = 0, lease: 'float | None' = None) -> 'Coroutine[Any, Any, bool]'"
    )
    assert str(inspect.signature(aiolock.Client.lock)) == (
        "(self, name: 'str', *, owner: 'str | None' = None) -> 'AsyncRLock'"
    )
    assert lock.try_lock.__name__ == "try_lock"
    assert "Acquire the lock" in (lock.try_lock.__doc__ or "")


def test_teaching_adds_nothing_to_a_call_that_binds() -> None:
    seen: list[tuple[Any, ...]] = []

    @teaching
    def call(a: int, *, b: int = 0) -> int:
        seen.append((a, b))
        return a + b

    assert call(1, b=2) == 3
    assert seen == [(1, 2)]
    with pytest.raises(TypeError, match=r"\.call\(\) got redis-py's keyword 'sleep'"):
        call(1, sleep=0.1)  # type: ignore[call-arg]
    assert seen == [(1, 2)]


# -- a second event loop (the rest, with a server, in the integration tests) -----------------


async def test_a_client_whose_loop_closed_says_so() -> None:
    client = aiolock.Client.from_url(DEAD_URL, retry=None)

    async def first() -> None:
        with pytest.raises(RedisConnectionError):  # nobody listens: the call binds all the same
            await client.lock("x").try_lock()

    def first_loop() -> None:
        asyncio.run(first())  # the client's loop, closed when it returns

    await asyncio.to_thread(first_loop)
    with pytest.raises(RuntimeError) as refused:
        await client.lock("x").try_lock()
    text = str(refused.value)
    assert "belongs to the event loop that first used it, which has closed since" in text, text
    assert "one client per event loop" in text, text
