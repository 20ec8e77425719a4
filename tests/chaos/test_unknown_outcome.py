"""Script calls whose reply is lost after the server ran them: the outcome is settled exactly.

The proxy forwards one acquire (or release) to the server and cuts the connection before a byte
of the reply comes back, so the call raises redis-py's ``ConnectionError`` although the script
ran.  A grant the caller never saw must be undone (issue 15: a nested acquire of a held lock
left the server count one above the client's, and the lock stayed held after the owner left
its block); a release must be recorded as done.  Every test reads the dropped reply, so it
knows what the server did, and then checks the server and the client against it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock import _scripts
from tests.helpers import eventually, held_by_another_task, keys_of, services_of

from .proxy import FreezableProxy

pytestmark = pytest.mark.anyio

ACQUIRE = _scripts.LOCK_ACQUIRE.sha.encode()
RELEASE = _scripts.LOCK_RELEASE.sha.encode()
PLAIN_RELEASE = b"HDEL"  # the last release of an uncontended hold: a plain HDEL of its fields

Acquire = Callable[[aiolock.AsyncRLock], Awaitable[None]]


async def by_try_lock(lock: aiolock.AsyncRLock) -> None:
    await lock.try_lock(wait=0)


async def by_acquire(lock: aiolock.AsyncRLock) -> None:
    async with lock.acquire(wait=1):
        pytest.fail("the block was entered although the acquire failed")


async def by_lock(lock: aiolock.AsyncRLock) -> None:
    await lock.lock()


ACQUIRES = pytest.mark.parametrize(
    "acquire", [by_try_lock, by_acquire, by_lock], ids=["try_lock", "acquire", "lock"]
)


@pytest.fixture
async def client(proxied: Callable[..., aiolock.Client], redis: Redis) -> aiolock.Client:
    """A client behind the proxy; no resends, so a lost reply reaches the caller as an error."""
    # Cached up front: a cut EVALSHA must be answered by the script, not by NOSCRIPT.
    for script in (_scripts.LOCK_ACQUIRE, _scripts.LOCK_RELEASE):
        await redis.script_load(script.source)
    return proxied(retry=Retry(NoBackoff(), 0))


async def dropped(reply: asyncio.Future[bytes]) -> bytes:
    """The reply the server sent to the cut request (the client never got it)."""
    async with asyncio.timeout(5):
        return await reply


def grant(reply: bytes) -> tuple[int, int]:
    """``(token, count)`` of an acquire script's RESP reply: ``{token, count, pttl}``, or the
    token alone for a fault-free fresh hold (count 1)."""
    lines = reply.split(b"\r\n")
    if lines[0].startswith(b":"):
        return int(lines[0][1:]), 1
    assert lines[0] == b"*3", f"not a grant: {reply!r}"
    return int(lines[1][1:]), int(lines[2][1:])


async def server_counts(redis: Redis, lock: aiolock.AsyncRLock) -> list[int]:
    """The hold counts in the lock hash, one per owner (its ``f:``/``r:`` fields aside)."""
    fields = await redis.hgetall(keys_of(lock).lock)
    return [
        int(count)
        for field, count in fields.items()
        if not str(field).startswith((":", "f:", "r:", "x:"))
    ]


async def settled(client: aiolock.Client) -> None:
    await eventually(lambda: client.statistics().pending == 0, what="pending settlements")


async def assert_free(redis: Redis, lock: aiolock.AsyncRLock) -> None:
    assert not await redis.exists(keys_of(lock).lock)
    assert not await lock.is_locked()
    assert lock.statistics().held == 0


@pytest.fixture
def no_unknown_holds(caplog: pytest.LogCaptureFixture) -> Callable[[], None]:
    """Fails if a release found holds that the client did not know of (a settlement missed)."""
    caplog.set_level(logging.ERROR, logger="aiolock.lock")

    def check() -> None:
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]

    return check


# -- the proxy's cut --------------------------------------------------------------------------


async def test_cut_request_runs_on_the_server_but_its_reply_never_arrives(
    proxy: FreezableProxy, redis: Redis, aiolock_client: aiolock.Client
) -> None:
    key = f"{aiolock_client.key_prefix}:cut"
    async with Redis(port=proxy.port, retry=Retry(NoBackoff(), 0)) as through:
        assert await through.ping()
        reply = proxy.cut_next_request(b"INCRBY")
        assert await through.ping()  # no match: it flows
        with pytest.raises(RedisConnectionError):
            await through.incr(key)
        assert await dropped(reply) == b":1\r\n"  # the server answered; the client saw nothing
        assert await redis.get(key) == "1"  # it ran once
        await eventually(lambda: proxy.connections == 0, what="the cut connection closed")
        assert await through.incr(key) == 2  # one-shot: a new connection flows again


# -- acquires whose reply is lost -------------------------------------------------------------


@ACQUIRES
async def test_a_fresh_grant_with_a_lost_reply_is_undone(
    client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    acquire: Acquire,
    no_unknown_holds: Callable[[], None],
) -> None:
    lock = client.lock("fresh")
    reply = proxy.cut_next_request(ACQUIRE)
    with pytest.raises(RedisConnectionError):
        await acquire(lock)
    _, count = grant(await dropped(reply))
    assert count == 1  # the server granted it
    await settled(client)
    await assert_free(redis, lock)
    assert client.statistics().holds == 0
    no_unknown_holds()


@ACQUIRES
async def test_b_a_reentrant_grant_with_a_lost_reply_is_undone(
    client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    acquire: Acquire,
    no_unknown_holds: Callable[[], None],
) -> None:
    """Issue 15: the owner leaves its outer block and the lock must be free."""
    lock = client.lock("nested")
    async with lock.acquire() as guard:  # lease=None: no lease will end a leaked hold soon
        reply = proxy.cut_next_request(ACQUIRE)
        with pytest.raises(RedisConnectionError):
            await acquire(lock)
        assert grant(await dropped(reply)) == (guard.fencing_token, 2)  # it re-entered
        await settled(client)
        # Once settled, the server has the holds the client believes in, no more.
        assert await server_counts(redis, lock) == [1]
        assert lock.statistics().held == 1
        assert not guard.lost
    await settled(client)
    await assert_free(redis, lock)
    no_unknown_holds()


@pytest.mark.parametrize("nested", [False, True], ids=["fresh", "reentrant"])
async def test_c_the_next_fresh_grant_gets_a_larger_token(
    client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    nested: bool,
    no_unknown_holds: Callable[[], None],
) -> None:
    lock = client.lock("tokens")
    handed: list[int] = []
    async with lock.acquire() as guard:
        handed.append(guard.fencing_token)
    if nested:
        await lock.lock()
        handed.append(lock.caller_hold().token)
    reply = proxy.cut_next_request(ACQUIRE)
    with pytest.raises(RedisConnectionError):
        await lock.try_lock(wait=0)
    token, count = grant(await dropped(reply))
    assert count == (2 if nested else 1)
    handed.append(token)
    await settled(client)
    if nested:
        await lock.unlock()
        await settled(client)

    async def other_task() -> int:
        async with client.lock("tokens").acquire(wait=0) as guard:
            assert not guard.lost
        return guard.fencing_token

    fresh = await asyncio.create_task(other_task())
    assert fresh > max(handed), (fresh, handed)
    await settled(client)
    await assert_free(redis, lock)
    no_unknown_holds()


# -- releases whose reply is lost -------------------------------------------------------------


@pytest.mark.parametrize("holds", [1, 2])
async def test_d_a_release_with_a_lost_reply_is_completed(
    client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    holds: int,
    no_unknown_holds: Callable[[], None],
) -> None:
    lock = client.lock("release")
    for _ in range(holds):
        assert await lock.try_lock(wait=0)
    reply = proxy.cut_next_request(RELEASE if holds > 1 else PLAIN_RELEASE)
    with pytest.raises(RedisConnectionError):
        await lock.unlock()
    # The server released one hold: the script answers the holds left, HDEL the fields removed.
    assert await dropped(reply) == (b":%d\r\n" % (holds - 1) if holds > 1 else b":3\r\n")
    await settled(client)
    assert lock.statistics().held == holds - 1
    assert await server_counts(redis, lock) == ([holds - 1] if holds > 1 else [])
    assert not lock.statistics().lost
    if holds > 1:
        await lock.unlock()
        await settled(client)
    await assert_free(redis, lock)
    assert client.statistics().holds == 0
    no_unknown_holds()


async def test_d_a_block_exit_with_a_lost_release_reply_leaves_the_lock_free(
    client: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    no_unknown_holds: Callable[[], None],
) -> None:
    lock = client.lock("exit")
    with pytest.raises(RedisConnectionError):
        async with lock.acquire():
            reply = proxy.cut_next_request(PLAIN_RELEASE)
    assert await dropped(reply) == b":3\r\n"  # the hold's three fields
    await settled(client)
    await assert_free(redis, lock)
    assert client.statistics().holds == 0
    # The owner can take it again at once: nothing of the lost release is left behind.
    async with lock.acquire(wait=0):
        assert await server_counts(redis, lock) == [1]
    await settled(client)
    await assert_free(redis, lock)
    no_unknown_holds()


# -- acquires whose resend answered ----------------------------------------------------------


@pytest.fixture
async def resending(proxied: Callable[..., aiolock.Client], redis: Redis) -> aiolock.Client:
    """A client behind the proxy whose calls redis-py resends once after a lost reply."""
    # Cached up front: a cut EVALSHA must be answered by the script, not by NOSCRIPT.
    for script in (_scripts.VOID, _scripts.LOCK_ACQUIRE, _scripts.LOCK_RELEASE):
        await redis.script_load(script.source)
    return proxied(retry=Retry(NoBackoff(), 1))


async def test_e_a_resent_grant_is_voided_before_its_release(
    resending: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    aiolock_client: aiolock.Client,
    no_unknown_holds: Callable[[], None],
) -> None:
    """The acquire's first copy ran, its connection was cut before the reply, and redis-py
    resent it on a new connection, whose answer granted the lock.  A copy of that request may
    still be on its way (a slow path delivers it late): the client voids it before the
    release that ends the hold, so that the copy grants nothing afterwards, even once another
    owner's release has replaced the marker of the owner's own."""
    client = resending
    lock = client.lock("resent")
    reply = proxy.cut_next_request(ACQUIRE)
    await lock.lock()  # the resend's answer
    token, count = grant(await dropped(reply))
    assert count == 1
    owner, _ = lock.current_owner()
    hold = lock.hold(owner)
    assert hold is not None
    assert hold.token == token  # the same grant, answered twice
    assert len(hold.resent) == 1
    request = hold.resent[0]
    # The resend's own mark lives a minute: as if this hold had outlived it.
    assert await redis.hdel(lock.keys.meta, f"{owner}/{request}") == 1
    await lock.unlock()
    assert await redis.hget(lock.keys.meta, f"{owner}/{request}") is not None  # voided
    await assert_free(redis, lock)

    async def another_owner() -> None:
        async with aiolock_client.lock("resent").acquire(wait=1):
            pass

    await asyncio.create_task(another_owner())
    late = lock.attempt_call(owner, request, 30_000)  # the first copy, arriving now
    assert lock.grant_of(await services_of(aiolock_client).calls.run(*late), 30_000) is None
    await assert_free(redis, lock)
    no_unknown_holds()


async def test_e_a_resent_try_that_was_refused_is_voided_at_once(
    resending: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    aiolock_client: aiolock.Client,
) -> None:
    """A try found the lock held; its connection was cut before the reply, and the resend
    was refused as well.  Its first copy may still arrive once the lock is free: the resend
    carried the mark of one, so its script voided the request as it refused it, and the
    first copy then grants nothing."""
    client = resending
    lock = client.lock("resent-try")
    async with held_by_another_task(aiolock_client.lock("resent-try")):
        reply = proxy.cut_next_request(ACQUIRE)
        assert not await lock.try_lock(wait=0)  # the resend's answer: busy
        assert (await dropped(reply)).startswith(b"*1\r\n")  # the first copy: busy too, {pttl}
        assert client.statistics().pending == 0  # no void call of the client's: the script's
    owner, _ = lock.current_owner()
    voided = [
        field for field in await redis.hkeys(lock.keys.meta) if str(field).startswith(f"{owner}/")
    ]
    assert len(voided) == 1
    request = int(str(voided[0]).rsplit("/", 1)[1])
    late = lock.attempt_call(owner, request, 30_000)  # the first copy, arriving once it is free
    assert lock.grant_of(await services_of(aiolock_client).calls.run(*late), 30_000) is None
    await assert_free(redis, lock)


async def test_e_a_resent_grant_whose_lease_ran_out_is_voided_when_lost(
    resending: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    aiolock_client: aiolock.Client,
) -> None:
    """A resent grant with a fixed lease was never released: its lease ran out, and the
    client took it for lost.  The resend's own mark had run out too (a hold may outlive its
    minute), and no release will void the first copy, so the loss does: that copy,
    arriving once the lock is gone, grants nothing."""
    client = resending
    lock = client.lock("resent-lost")
    reply = proxy.cut_next_request(ACQUIRE)
    await lock.lock(lease=0.3)  # the resend's answer
    grant(await dropped(reply))
    owner, _ = lock.current_owner()
    hold = lock.hold(owner)
    assert hold is not None
    request = hold.resent[0]
    # The resend's own mark lives a minute: as if this hold had outlived it.
    assert await redis.hdel(lock.keys.meta, f"{owner}/{request}") == 1
    await eventually(hold.check_lost, what="the lease to run out")
    await settled(client)
    assert await redis.hget(lock.keys.meta, f"{owner}/{request}") is not None  # voided
    await eventually(lambda: _gone(redis, lock), what="the lock to expire on the server")
    late = lock.attempt_call(owner, request, 30_000)  # the first copy, arriving now
    assert lock.grant_of(await services_of(aiolock_client).calls.run(*late), 30_000) is None
    await assert_free(redis, lock)


async def _gone(redis: Redis, lock: aiolock.AsyncRLock) -> bool:
    return not await redis.exists(keys_of(lock).lock)


# -- a resend that meets an empty script cache -------------------------------------------------


async def test_f_a_resend_answered_noscript_still_settles_its_first_copy(
    resending: aiolock.Client,
    proxy: FreezableProxy,
    redis: Redis,
    no_unknown_holds: Callable[[], None],
) -> None:
    """A restart empties the server's script cache (AOF keeps the data, not the scripts).  A
    nested acquire's first copy ran, its connection was cut before the reply, and redis-py's
    resend met the empty cache: NOSCRIPT.  That answer speaks for the resend only, so the
    first copy's grant is still unknown; the caller, cancelled (its ``wait`` ran out) while
    the resend was in flight, must leave that grant settled, not take NOSCRIPT for 'nothing
    ran'.  (The long chaos run's unexplained extra hold: a nested ``try_lock`` timed out across
    a restart, and the outer release found one hold left.)"""
    client = resending
    lock = client.lock("noscript", owner="nest")
    await lock.lock()
    cut = proxy.cut_next_request(ACQUIRE)
    cut.add_done_callback(lambda _: proxy.freeze())  # the resend waits for the flush
    nested = asyncio.create_task(lock.try_lock(wait=30))
    _, count = grant(await dropped(cut))
    assert count == 2  # the first copy re-entered the lock
    await redis.script_flush()
    resend = proxy.next_request(ACQUIRE)
    proxy.delay = 0.05  # the NOSCRIPT answer comes after the caller has gone
    proxy.thaw()
    async with asyncio.timeout(5):
        await resend
    nested.cancel()
    with pytest.raises(asyncio.CancelledError):
        await nested
    await settled(client)
    assert await server_counts(redis, lock) == [1]  # the first copy's grant was undone
    await lock.unlock()
    await assert_free(redis, lock)
    no_unknown_holds()
