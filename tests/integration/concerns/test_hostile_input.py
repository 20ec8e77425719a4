"""Hostile input: odd lock names and bad numbers, checked with hypothesis.

- Any non-empty ``str`` is a lock name: braces, ``%``, newlines, NUL, non-ASCII, very long, or
  the spelling of another lock's key.  Distinct names never share a key, a name's keys share one
  Cluster slot, and a lock never disturbs another whose name looks like its key.
- A bad argument fails before any I/O with a ``TypeError``/``ValueError`` naming the parameter
  (proved on a client whose server does not exist: a valid call gets as far as a connection
  error or a timeout), and a bad call leaves a held lock exactly as it was.
- Names reach the Lua scripts as KEYS/ARGV only: the server's script cache does not grow with
  the names used, and a name written as Lua code stays a name.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

import aiolock
from aiolock._core.validate import MAX_SECONDS
from aiolock.testing.embedded import free_port
from tests.helpers import keys_of, lock_keys

pytestmark = pytest.mark.anyio

# Tests that take the function-scoped ``aiolock_client`` share it across examples: each example
# uses names of its own and releases what it took.
ON_SERVER = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

NASTY = "{}%:\n\r\x00 \\\"'[]=-.*?$#@é中🔒"
NAMES = st.one_of(
    st.text(min_size=1),
    st.text(alphabet=NASTY, min_size=1),
    # Long names: a short pattern repeated up to ~16 KiB.
    st.builds(
        lambda part, times: part * times, st.text(min_size=1, max_size=8), st.integers(1, 2000)
    ),
)
NOT_STR = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.text(), max_size=2)
)
NUMBERS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.0, 0.0005, 0.001, 0.01, 1e-300, MAX_SECONDS, 1e9 + 1, 1e300]),
    st.text(max_size=4),
    st.complex_numbers(max_magnitude=10),
)
# (method, parameter) pairs of every call that takes seconds.
CALLS = [
    ("try_lock", "wait"),
    ("try_lock", "lease"),
    ("lock", "lease"),
    ("acquire", "wait"),
    ("acquire", "lease"),
]


MINIMUM = {"wait": 0.0, "lease": 0.001, "watchdog_timeout": 0.01}


def is_valid(param: str, value: object) -> bool:
    """SPEC.md: ``None`` or a finite, non-negative number that is not a bool; a lease > 0.

    The library also bounds every duration by ``MAX_SECONDS`` (beyond it Redis would fail inside
    the script), a lease below (a millisecond rounds to no lease at all) and the watchdog's.
    """
    if value is None:
        return param != "watchdog_timeout"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if not math.isfinite(value):
        return False
    return MINIMUM[param] <= value <= MAX_SECONDS


async def call(lock: aiolock.AsyncRLock, method: str, param: str, value: object) -> None:
    kwargs: dict[str, Any] = {param: value}
    if method == "acquire":
        async with lock.acquire(**kwargs):
            pass
    elif method == "lock":
        await lock.lock(**kwargs)
    else:
        await lock.try_lock(**kwargs)


def offline_client() -> aiolock.Client:
    """A client of a server that is not there: any I/O fails at once with ConnectionError."""
    redis = Redis(host="127.0.0.1", port=free_port(), retry=Retry(NoBackoff(), 0))
    return aiolock.Client(redis)


@pytest.fixture
def offline() -> aiolock.Client:
    """:func:`offline_client`, for the tests that make no call on it (a client belongs to the
    event loop that first used it: one that calls makes its own per example)."""
    return offline_client()


async def fence(redis: Redis | RedisCluster, lock: aiolock.AsyncRLock) -> int:
    """The fencing token stored in ``lock``'s hash (its holder's ``f:<owner>``)."""
    fields = await redis.hgetall(keys_of(lock).lock)
    [token] = [
        value
        for field, value in fields.items()
        if (field.decode() if isinstance(field, bytes) else field).startswith("f:")
    ]
    assert token is not None
    return int(token)


def lookalikes(client: aiolock.Client, name: str) -> set[str]:
    """Names spelled like the keys, channel or hash tag of lock ``name``."""
    keys = keys_of(client.lock(name))
    tag = keys.lock.removeprefix(f"{client.key_prefix}:")
    return {
        keys.lock,
        keys.meta,
        keys.channel,
        tag,
        tag[1:-1],
        "{" + name + "}",
        name + "}:meta",
        f"{name}:released",
    } - {name}


# -- names ------------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=NAMES, b=NAMES)
@example(a="{a}", b="%7Ba%7D")
@example(a="a}:meta", b="a")
@example(a="x\x00", b="x")
def test_distinct_names_never_share_keys_and_each_stays_in_one_slot(
    offline: aiolock.Client, a: str, b: str
) -> None:
    ka, kb = keys_of(offline.lock(a)), keys_of(offline.lock(b))
    for keys in (ka, kb):
        assert key_slot(keys.lock.encode()) == key_slot(keys.meta.encode())
        assert key_slot(keys.lock.encode()) == key_slot(keys.channel.encode())
        # The hash tag is the whole escaped name: no brace inside it.
        tag = keys.lock.removeprefix(f"{offline.key_prefix}:")
        assert tag[0] + tag[-1] == "{}"
        assert not {"{", "}"} & set(tag[1:-1])
    if a != b:
        assert {ka.lock, ka.meta, ka.channel}.isdisjoint({kb.lock, kb.meta, kb.channel})


@ON_SERVER
@given(name=NAMES)
@example(name="x" * 100_000)
@example(name="\x00")
@example(name="line\nbreak\r\n")
async def test_any_name_locks_and_unlocks(
    aiolock_client: aiolock.Client, redis: Redis, name: str
) -> None:
    lock = aiolock_client.lock(name)
    async with lock.acquire(wait=1, lease=5) as guard:
        assert await lock.hold_count() == 1
        raw = aiolock_client.redis
        assert await raw.exists(keys_of(lock).lock) == 1
        assert await fence(raw, lock) == guard.fencing_token
        assert repr(lock).startswith("<AsyncRLock ")
    assert not await lock.is_locked()
    assert await lock_keys(redis, aiolock_client) == []


@ON_SERVER
@given(name=NAMES)
@example(name="orders:42")
@example(name="{a}")
async def test_lookalike_names_do_not_disturb_a_held_lock(
    aiolock_client: aiolock.Client, name: str
) -> None:
    lock = aiolock_client.lock(name)
    async with lock.acquire(wait=1, lease=30) as guard:
        for other_name in lookalikes(aiolock_client, name):
            other = aiolock_client.lock(other_name)
            assert not await other.is_locked(), other_name
            assert await other.try_lock(lease=5), other_name
            await other.unlock()
            assert await other.force_unlock() is False
        assert await lock.hold_count() == 1
        assert not guard.lost
        assert await fence(aiolock_client.redis, lock) == guard.fencing_token


# -- bad arguments ------------------------------------------------------------------------------


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=NOT_STR | st.just(""))
async def test_bad_names_fail_before_io(offline: aiolock.Client, name: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="name"):
        offline.lock(name)
    if name is not None:  # owner=None is the default: the calling task
        with pytest.raises((TypeError, ValueError), match="owner"):
            offline.lock("ok", owner=name)


@given(value=NUMBERS, target=st.sampled_from(CALLS))
async def test_numbers_are_checked_before_io(value: Any, target: tuple[str, str]) -> None:
    method, param = target
    lock = offline_client().lock("numbers")
    if is_valid(param, value):
        # Validation passed: the call went on to talk to the (absent) server, unless a tiny
        # wait ran out first.
        with contextlib.suppress(RedisConnectionError, aiolock.LockTimeoutError):
            await call(lock, method, param, value)
    else:
        with pytest.raises((TypeError, ValueError), match=param):
            await call(lock, method, param, value)


# Large concurrencies are left out: the client builds one semaphore per unit up front, so
# subscribe_concurrency=10**9 would exhaust memory (see the chaos report).
@settings(deadline=None)
@given(
    value=NUMBERS.filter(lambda v: not (isinstance(v, int) and v > 10_000)),
    option=st.sampled_from(["watchdog_timeout", "subscribe_concurrency"]),
)
def test_client_options_are_checked(value: Any, option: str) -> None:
    redis = Redis(host="127.0.0.1", port=free_port())
    valid = (
        is_valid(option, value)
        if option == "watchdog_timeout"
        else isinstance(value, int) and not isinstance(value, bool) and value >= 1
    )
    if valid:
        aiolock.Client(redis, **{option: value})
    else:
        with pytest.raises((TypeError, ValueError), match=option):
            aiolock.Client(redis, **{option: value})


@ON_SERVER
@given(
    value=NUMBERS.filter(lambda v: not is_valid("lease", v) or not is_valid("wait", v)),
    target=st.sampled_from(CALLS),
)
async def test_a_bad_call_leaves_a_held_lock_alone(
    aiolock_client: aiolock.Client, value: Any, target: tuple[str, str]
) -> None:
    method, param = target
    if is_valid(param, value):
        return  # only the bad calls are of interest here
    lock = aiolock_client.lock("held")
    async with lock.acquire(wait=1) as guard:
        for victim in (lock, aiolock_client.lock("held")):  # the same object, and another one
            with pytest.raises((TypeError, ValueError), match=param):
                await call(victim, method, param, value)
        assert await lock.hold_count() == 1
        assert not guard.lost
        assert lock.statistics().held == 1
        raw = aiolock_client.redis
        assert await fence(raw, lock) == guard.fencing_token


@ON_SERVER
@given(lease=st.floats(min_value=1e5, max_value=1e300) | st.integers(10**5, 10**40))
@example(lease=1e16)
async def test_a_huge_lease_never_leaves_a_lock_without_expiry(
    aiolock_client: aiolock.Client, lease: float
) -> None:
    """A finite lease is valid per SPEC.md; one Redis cannot store must fail before any write."""
    lock = aiolock_client.lock("huge")
    raw = aiolock_client.redis
    outcome: bool | Exception
    try:
        outcome = await lock.try_lock(lease=lease)
    except (ValueError, ResponseError) as exc:
        outcome = exc
    pttl = await raw.pttl(keys_of(lock).lock)
    await raw.delete(keys_of(lock).lock)  # never leave an immortal lock to the next example
    assert pttl != -1, f"lease={lease!r} ({outcome!r}) left a lock that never expires"
    assert not isinstance(outcome, ResponseError), f"lease={lease!r} failed after I/O: {outcome}"
    if isinstance(outcome, ValueError):
        assert "lease" in str(outcome)
    else:
        assert outcome
        assert pttl > 0


# -- what reaches Lua ------------------------------------------------------------------------


LUA_LOOKING = [
    "]] redis.call('FLUSHALL') --[[",
    "'); redis.call('FLUSHALL'); --",
    "\"..redis.call('FLUSHALL')..\"",
    "KEYS[1]",
    "ARGV[2]",
    "\n return 1 \n",
]


async def script_cache_size(redis: Redis) -> int:
    info = await redis.info("memory")
    return int(info.get("number_of_cached_scripts", 0))


async def test_names_reach_lua_only_as_keys_and_argv(
    aiolock_client: aiolock.Client, redis: Redis
) -> None:
    sentinel = f"{aiolock_client.key_prefix}-sentinel"
    await redis.set(sentinel, "still here")
    await aiolock_client.lock("warm-up").force_unlock()
    async with aiolock_client.lock("warm-up"):
        pass
    before = await script_cache_size(redis)
    for name in [*LUA_LOOKING, *(f"name-{i}" for i in range(20))]:
        lock = aiolock_client.lock(name)
        async with lock.acquire(wait=1):
            assert await lock.hold_count() == 1
        assert await lock.force_unlock() is False
    assert await redis.get(sentinel) == "still here"
    assert await script_cache_size(redis) == before  # no script was built from a name
    await redis.delete(sentinel)
