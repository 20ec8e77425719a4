"""Every bad argument fails with TypeError/ValueError naming the parameter, before any I/O.

These run without a server: the client points at a port nobody listens on, so any I/O would
raise a connection error instead of the expected TypeError/ValueError.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aiolock
from aiolock._core.validate import check_lease, check_wait

pytestmark = pytest.mark.anyio

DEAD_URL = "redis://127.0.0.1:1/0"

BAD_SECONDS: list[tuple[Any, type[Exception]]] = [
    (-1, ValueError),
    (-0.001, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    (-math.inf, ValueError),
    (True, TypeError),
    (False, TypeError),
    ("1", TypeError),
    (b"1", TypeError),
    ([1], TypeError),
]


@pytest.fixture
def lock() -> aiolock.AsyncRLock:
    return aiolock.Client.from_url(DEAD_URL).lock("valid")


@pytest.mark.parametrize(
    ("name", "error"), [("", ValueError), (None, TypeError), (b"x", TypeError), (1, TypeError)]
)
def test_bad_names(name: Any, error: type[Exception]) -> None:
    client = aiolock.Client.from_url(DEAD_URL)
    with pytest.raises(error, match="name"):
        client.lock(name)
    if name is not None:  # owner=None is the default: the calling task
        with pytest.raises(error, match="owner"):
            client.lock("ok", owner=name)


@pytest.mark.parametrize(("value", "error"), [*BAD_SECONDS, (1e16, ValueError)])
async def test_bad_wait(lock: aiolock.AsyncRLock, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="wait"):
        await lock.try_lock(wait=value)
    with pytest.raises(error, match="wait"):
        lock.acquire(wait=value)


@pytest.mark.parametrize(
    ("value", "error"),
    [*BAD_SECONDS, (0, ValueError), (0.0, ValueError), (1e-4, ValueError), (1e16, ValueError)],
)
async def test_bad_lease(lock: aiolock.AsyncRLock, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="lease"):
        await lock.try_lock(lease=value)
    with pytest.raises(error, match="lease"):
        await lock.lock(lease=value)
    with pytest.raises(error, match="lease"):
        lock.acquire(lease=value)


def test_bad_cancel_on_loss(lock: aiolock.AsyncRLock) -> None:
    with pytest.raises(TypeError, match="cancel_on_loss"):
        lock.acquire(cancel_on_loss=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "param"),
    [
        ({"key_prefix": ""}, ValueError, "key_prefix"),
        ({"key_prefix": "a{b"}, ValueError, "key_prefix"),
        ({"key_prefix": 3}, TypeError, "key_prefix"),
        ({"watchdog_timeout": 0}, ValueError, "watchdog_timeout"),
        ({"watchdog_timeout": -1}, ValueError, "watchdog_timeout"),
        ({"watchdog_timeout": math.nan}, ValueError, "watchdog_timeout"),
        ({"watchdog_timeout": True}, TypeError, "watchdog_timeout"),
        ({"watchdog_timeout": 1e-300}, ValueError, "watchdog_timeout"),
        ({"watchdog_timeout": 2e9}, ValueError, "watchdog_timeout"),
        ({"subscribe_concurrency": 0}, ValueError, "subscribe_concurrency"),
        ({"subscribe_concurrency": 2.5}, TypeError, "subscribe_concurrency"),
        ({"subscribe_concurrency": True}, TypeError, "subscribe_concurrency"),
    ],
)
def test_bad_client_options(options: dict[str, Any], error: type[Exception], param: str) -> None:
    with pytest.raises(error, match=param):
        aiolock.Client.from_url(DEAD_URL, **options)


def test_client_needs_an_asyncio_redis() -> None:
    import redis

    with pytest.raises(TypeError, match="redis"):
        aiolock.Client(redis.Redis())  # type: ignore[arg-type]


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_finite_non_negative_waits_pass(value: float) -> None:
    assert check_wait(value) == value


@given(st.one_of(st.floats(max_value=-1e-12), st.just(math.nan), st.just(math.inf)))
def test_bad_floats_fail_for_both(value: float) -> None:
    with pytest.raises(ValueError, match="wait"):
        check_wait(value)
    with pytest.raises(ValueError, match="lease"):
        check_lease(value)
