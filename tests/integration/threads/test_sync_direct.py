"""The plain lock's first try and release sent by the calling thread itself (``aiolock.sync``'s
``_direct.py``): taken without a hop to the loop, recorded there all the same (renewed by the
watchdog), one lock with the async face, and nothing left behind by an interrupt or a fault
in the middle of such a call."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import FrameType
from typing import Any

import pytest
import redis

import aiolock
import aiolock.sync
from aiolock._core.line import LineEntry
from aiolock._core.metrics import Tracing
from aiolock._scripts import LOCK_RELEASE
from aiolock.lock import ReentrantKind
from aiolock.sync._loop import Call
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import Interrupted, keys_of, settled, wait_until

# A script that keeps the server busy (it runs one command at a time) for a while, so that a
# call sent meanwhile waits for its reply.
BUSY = """
local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
repeat
    t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= stop
return 1
"""


@pytest.fixture(autouse=True)
def no_recording_tracer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A span per call needs the loop: a thread sends its own calls only while no tracer
    provider may record.  One set by an earlier test (the process keeps the first provider
    set) would send every call here through the loop."""
    monkeypatch.setattr(Tracing, "recording", lambda self: False)


@pytest.fixture
def plain(aiolock_server: ServerInfo) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(aiolock_server.url)
    yield client
    client.close()


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many calls went to the loop thread (``Call.run``, the hop), counted."""
    counted = [0]
    run = Call.run

    def counting(self: Call[Any], *args: Any, **kwargs: Any) -> Any:
        counted[0] += 1
        return run(self, *args, **kwargs)

    monkeypatch.setattr(Call, "run", counting)
    return counted


def calls_of(plain: redis.Redis, command: str) -> int:
    stats: dict[str, Any] = plain.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_an_uncontended_cycle_from_a_thread_is_one_evalsha_and_one_hdel_and_no_hop(
    aiolock_sync_client: aiolock.sync.Client, plain: redis.Redis, hops: list[int]
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    assert lock.try_lock(1)  # the first call starts the client on the loop
    lock.unlock()
    before = {command: calls_of(plain, command) for command in ("evalsha", "hdel", "eval")}
    hopped = hops[0]
    for _ in range(50):
        assert lock.try_lock(1)
        lock.unlock()
        lock.lock(lease=5)
        lock.unlock()
    assert hops[0] == hopped  # never went through the loop thread
    after = {command: calls_of(plain, command) for command in ("evalsha", "hdel", "eval")}
    # The INFO calls of this test are the only other commands; nothing else ran.
    assert {c: after[c] - before[c] for c in after} == {"evalsha": 100, "hdel": 100, "eval": 0}
    # The loop recorded every grant and release, as if it had made them.
    wait_until(lambda: lock.statistics().acquisitions == 101 and lock.statistics().held == 0)
    assert not lock.is_locked()


def test_the_loop_path_finds_the_threads_own_calls_recorded(
    aiolock_sync_client: aiolock.sync.Client, hops: list[int]
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    assert lock.try_lock(1)
    lock.unlock()
    hopped = hops[0]
    for held in range(1, 20):
        assert lock.try_lock(0)  # the thread's own grant, posted to the loop in a batch
        assert hops[0] == hopped
        # A call through the loop runs after what the thread posted: no waiting for it.
        stats = lock.statistics()
        hopped = hops[0]
        assert (stats.held, stats.acquisitions) == (1, 1 + held)
        lock.unlock()
        assert lock.statistics().held == 0
        hopped = hops[0]


def test_a_re_entry_and_a_contended_try_go_through_the_loop(
    aiolock_sync_client: aiolock.sync.Client, hops: list[int]
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    assert lock.try_lock(1)
    hopped = hops[0]
    assert lock.try_lock(0)  # a re-entry: the loop's
    assert hops[0] == hopped + 1
    assert lock.hold_count() == 2
    hopped = hops[0]
    lock.unlock()  # an inner release: the loop's
    assert hops[0] == hopped + 1
    assert lock.hold_count() == 1
    hopped = hops[0]
    lock.unlock()  # the thread's one hold left: its own release again
    assert hops[0] == hopped
    assert not lock.is_locked()
    with ThreadPoolExecutor(1) as other:
        assert other.submit(lambda: lock.try_lock(1, lease=5)).result(timeout=30)
        hopped = hops[0]
        assert not lock.try_lock(0.05)  # refused on the thread, then the loop's wait
        assert hops[0] == hopped + 1
        other.submit(lock.unlock).result(timeout=30)
    assert lock.try_lock(1)
    lock.unlock()
    assert not lock.is_locked()


def test_a_hold_taken_by_the_thread_is_renewed_by_the_watchdog(
    aiolock_server: ServerInfo, plain: redis.Redis, hops: list[int]
) -> None:
    with aiolock.sync.Client.from_url(
        aiolock_server.url, key_prefix=f"direct-{uuid.uuid4().hex}", watchdog_timeout=0.3
    ) as client:
        lock = client.lock("renewed")
        client.lock("warm").try_lock(0)  # starts the client: the try below is the thread's
        hopped = hops[0]
        assert lock.try_lock(0)  # lease=None: the watchdog's
        assert hops[0] == hopped
        # Renewed well past the lease it was granted with (0.3 s), never lost.
        wait_until(lambda: lock.statistics().renewals >= 4)
        assert lock.statistics().held == 1
        assert lock.statistics().losses == 0
        assert 0 < plain.pttl(keys_of(lock.target()).lock) <= 300
        lock.unlock()
        assert not lock.is_locked()
        assert lock.statistics().losses == 0


@pytest.mark.anyio
async def test_threads_and_tasks_exclude_each_other_on_one_lock(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client
) -> None:
    name = f"direct:{uuid.uuid4().hex}"
    sync = aiolock.sync.Client.from_url(aiolock_server.url, key_prefix=aiolock_client.key_prefix)
    inside = 0
    most = 0
    counted = threading.Lock()

    def enter() -> None:
        nonlocal inside, most
        with counted:
            inside += 1
            most = max(most, inside)

    def leave() -> None:
        nonlocal inside
        with counted:
            inside -= 1

    # Every wait well under a grant's lease (5 s): a thread of the client that a releasing
    # thread answered holds the lock at once, and one that arrives then is not left behind it.
    def thread_side() -> None:
        lock = sync.lock(name)
        for _ in range(60):
            assert lock.try_lock(2.5)
            enter()
            time.sleep(0)
            leave()
            lock.unlock()

    async def task_side() -> None:
        lock = aiolock_client.lock(name)
        for _ in range(60):
            assert await lock.try_lock(2.5)
            enter()
            await asyncio.sleep(0)
            leave()
            await lock.unlock()

    try:
        await asyncio.gather(
            *(asyncio.to_thread(thread_side) for _ in range(3)), task_side(), task_side()
        )
    finally:
        await asyncio.to_thread(sync.close)
    assert most == 1
    assert not await aiolock_client.lock(name).is_locked()


@contextlib.contextmanager
def interrupt_in_read(started: Callable[[], None]) -> Iterator[None]:
    """Raise :class:`Interrupted` in the main thread once it reads a reply on its own
    connection (``started()`` has sent the server to sleep first, so the reply waits)."""
    main = threading.main_thread()
    assert threading.current_thread() is main
    assert main.ident is not None

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    def reading() -> bool:
        frame: FrameType | None = sys._current_frames().get(main.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "read_response":
                return True
            frame = frame.f_back
        return False

    def interrupt() -> None:
        wait_until(reading)
        signal.pthread_kill(main.ident or 0, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    started()
    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        yield
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR1, previous)


def busy_server(url: str, microseconds: int) -> Callable[[], None]:
    """A ``started()`` for :func:`interrupt_in_read`: the server runs :data:`BUSY` for that
    long, from another thread (started once a probe finds the server not answering)."""

    def start() -> None:
        worker = redis.Redis.from_url(url, socket_timeout=30)

        def run() -> None:
            with worker:
                worker.eval(BUSY, 0, microseconds)

        threading.Thread(target=run, daemon=True).start()
        probe = redis.Redis.from_url(url, socket_timeout=0.05)

        def busy() -> bool:
            try:
                probe.ping()
            except redis.TimeoutError:
                return True
            return False

        wait_until(busy)
        probe.close()

    return start


@pytest.mark.parametrize("call", ["try_lock", "unlock"])
def test_an_interrupt_in_a_threads_own_call_leaves_nothing_behind(
    aiolock_sync_client: aiolock.sync.Client,
    aiolock_server: ServerInfo,
    plain: redis.Redis,
    hops: list[int],
    call: str,
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    key = keys_of(lock.target()).lock
    lock.try_lock(0)  # warm: the line's connection is made
    lock.unlock()
    if call == "unlock":
        hopped = hops[0]
        assert lock.try_lock(0, lease=30)
        assert hops[0] == hopped  # the thread's own grant
    with pytest.raises(Interrupted):
        with interrupt_in_read(busy_server(aiolock_server.url, 400_000)):
            getattr(lock, call)()
    # Settled before the interrupt was raised: an acquire undone, a release completed.
    assert not plain.exists(key)
    assert lock.statistics().held == 0
    with ThreadPoolExecutor(1) as other:  # anyone can take it now
        assert other.submit(lambda: lock.try_lock(0)).result(timeout=30)
        other.submit(lock.unlock).result(timeout=30)
    assert lock.try_lock(0)  # and the thread too, afresh
    assert lock.hold_count() == 1
    lock.unlock()
    assert not plain.exists(key)


@pytest.mark.parametrize("call", ["try_lock", "unlock"])
def test_a_connection_fault_in_a_threads_own_call_is_settled(
    aiolock_server: ServerInfo, plain: redis.Redis, hops: list[int], call: str
) -> None:
    # The reply of a call sent while the server is busy times out: its outcome is unknown.
    with aiolock.sync.Client.from_url(
        aiolock_server.url, key_prefix=f"direct-{uuid.uuid4().hex}", socket_timeout=0.1
    ) as client:
        lock = client.lock("faulty")
        key = keys_of(lock.target()).lock
        lock.try_lock(0)
        lock.unlock()
        hopped = hops[0]
        if call == "try_lock":
            busy_server(aiolock_server.url, 400_000)()
            # The thread's own try times out; its grant (applied once the server is free) is
            # undone exactly, and the loop path, which waits for that first, takes the lock
            # once.
            assert lock.try_lock(10)
            assert hops[0] == hopped + 1
            assert lock.hold_count() == 1
            lock.unlock()
        else:
            assert lock.try_lock(0)
            assert hops[0] == hopped  # the thread's own grant
            busy_server(aiolock_server.url, 400_000)()
            # A release that times out raises (as the async unlock does); it is completed.
            with pytest.raises(redis.TimeoutError):
                lock.unlock()
            assert hops[0] == hopped
        wait_until(lambda: not plain.exists(key))
        wait_until(lambda: lock.statistics().held == 0)
        assert lock.try_lock(0)  # the thread's next hold is a fresh one
        assert lock.hold_count() == 1
        lock.unlock()
        assert not plain.exists(key)
        assert lock.statistics().losses == 0


def test_a_wait_bounds_the_threads_own_try_against_a_stalled_server(
    aiolock_sync_client: aiolock.sync.Client, aiolock_server: ServerInfo, plain: redis.Redis
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    key = keys_of(lock.target()).lock
    lock.try_lock(0)
    lock.unlock()
    busy_server(aiolock_server.url, 2_000_000)()
    began = time.monotonic()
    assert lock.try_lock(0.2) is False  # its own try's reply is waited for 0.2 s at most
    assert time.monotonic() - began < 1.5  # well before the server answers again
    # The grant the server made once it was free again is undone: nothing stays.
    wait_until(lambda: plain.exists(key) == 0 and lock.statistics().held == 0)
    assert lock.try_lock(0)
    lock.unlock()


def test_a_guard_block_is_the_threads_own_first_try_and_release(
    aiolock_sync_client: aiolock.sync.Client, plain: redis.Redis, hops: list[int]
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    with lock.acquire(wait=1) as first:  # starts the client
        pass
    before = {command: calls_of(plain, command) for command in ("evalsha", "hdel")}
    hopped = hops[0]
    tokens = []
    for _ in range(10):
        with lock.acquire(wait=5, lease=5) as guard:
            tokens.append(guard.fencing_token)
        with lock as guard:  # ``with lock:`` too
            tokens.append(guard.fencing_token)
    assert hops[0] == hopped
    after = {command: calls_of(plain, command) for command in ("evalsha", "hdel")}
    assert {c: after[c] - before[c] for c in after} == {"evalsha": 20, "hdel": 20}
    assert tokens == sorted(tokens)
    assert tokens[0] > first.fencing_token
    # The guard's reads go to the loop, which has recorded the hold by then.
    with lock.acquire(wait=5, lease=5) as guard:
        assert not guard.lost
        assert 0 < guard.valid_for() <= 5
        assert lock.statistics().held == 1
    assert not lock.is_locked()


def test_a_guard_the_thread_took_reports_a_loss_on_leaving(
    aiolock_sync_client: aiolock.sync.Client, plain: redis.Redis
) -> None:
    lock = aiolock_sync_client.lock(f"direct:{uuid.uuid4().hex}")
    key = keys_of(lock.target()).lock
    lock.try_lock(0)
    lock.unlock()
    # Taken from under the holder: its own release finds nothing, and says so.
    with pytest.raises(aiolock.LockLostError, match="no longer held"):
        with lock.acquire(wait=5) as guard:
            plain.delete(key)
    assert guard.lost
    # Its lease ran out in the block: nothing is sent at the exit (a new holder may hold it).
    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        with lock.acquire(wait=5, lease=0.05) as guard:
            wait_until(lambda: guard.lost)
            with ThreadPoolExecutor(1) as other:  # someone else takes it meanwhile
                assert other.submit(lambda: lock.try_lock(5, lease=30)).result(timeout=30)
    assert plain.exists(key)  # the new holder's hold is untouched
    assert lock.force_unlock()
    # A loss in a block that raised is a note on its exception.
    with pytest.raises(KeyError) as raised:
        with lock.acquire(wait=5) as guard:
            plain.delete(key)
            raise KeyError("in the block")
    assert any("was lost while held" in note for note in raised.value.__notes__)
    assert lock.try_lock(0)
    lock.unlock()


def test_a_waiter_named_by_a_threads_refused_release_is_entered_by_the_loops(
    aiolock_server: ServerInfo, plain: redis.Redis
) -> None:
    """A contended release that the thread sends itself enters the next waiting owner of its
    client in the lock's waiting set, and hands the lock over to the set's first member.
    Refused (``NOSCRIPT``: a restart emptied the server's script cache), it is sent again by
    the loop, which enters that owner all the same: taken as entered, it was left out of every
    hand-off while its calls parked behind their client's hold."""
    url = aiolock_server.url
    name = f"direct:{uuid.uuid4().hex}"
    # One thread per owner (an owner is its thread): each runs its acquire and its release.
    holder, first, second, theirs = (ThreadPoolExecutor(1) for _ in range(4))
    with aiolock.sync.Client.from_url(url) as mine, aiolock.sync.Client.from_url(url) as other:
        lock, their_lock = mine.lock(name), other.lock(name)
        keys = keys_of(lock.target())
        waiting = keys.waiting
        assert holder.submit(lock.try_lock, 5).result(timeout=30)
        got_first = first.submit(lock.try_lock, 60)  # refused: enters the set
        wait_until(lambda: plain.zcard(waiting) == 1)
        got_second = second.submit(lock.try_lock, 60)  # parks behind the first, no try
        wait_until(lambda: lock.statistics().waiters == 2)
        got_theirs = theirs.submit(their_lock.try_lock, 60)  # refused: enters behind them
        wait_until(lambda: plain.zcard(waiting) == 2)
        holder.submit(lock.unlock).result(timeout=30)
        assert got_first.result(timeout=30)  # the set's first member
        plain.script_flush()
        # Enters the second (which came before theirs) and hands it the lock, refused first.
        first.submit(lock.unlock).result(timeout=30)
        assert got_second.result(timeout=30)
        assert not got_theirs.done()
        assert plain.zcard(waiting) == 1  # theirs still waits in the set
        second.submit(lock.unlock).result(timeout=30)
        assert got_theirs.result(timeout=30)
        theirs.submit(their_lock.unlock).result(timeout=30)
    for pool in (holder, first, second, theirs):
        pool.shutdown()
    assert not plain.exists(keys.lock, waiting)


def test_a_threads_release_hands_a_waiter_of_its_client_the_grant_from_its_reply(
    aiolock_server: ServerInfo, plain: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release a thread sends itself names, in its reply, the waiting owner it granted the
    lock to; a waiter of the same client takes the grant from there, with no try, even when
    the message itself is never read (dropped here: parked behind its own client's hold, the
    waiter would otherwise try only once a grant's lease passed)."""
    deliver = LineEntry.deliver

    def drop_grants(entry: LineEntry, payload: bytes) -> None:
        if payload[:1] != b"=":
            deliver(entry, payload)

    monkeypatch.setattr(LineEntry, "deliver", drop_grants)
    name = f"direct:{uuid.uuid4().hex}"
    holder, waiter = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    with aiolock.sync.Client.from_url(aiolock_server.url) as client:
        lock = client.lock(name)
        keys = keys_of(lock.target())
        assert holder.submit(lock.try_lock, 5).result(timeout=30)
        got = waiter.submit(lock.try_lock, 60)
        wait_until(lambda: plain.zcard(keys.waiting) == 1)
        # Parked again after the try its subscription's confirmation makes (see settled).
        wait_until(lambda: settled(client.engine()[0], lock.target()))
        tries, messages = calls_of(plain, "exists"), calls_of(plain, "publish")
        holder.submit(lock.unlock).result(timeout=30)
        assert got.result(timeout=30)
        assert calls_of(plain, "exists") == tries  # every try runs EXISTS first
        assert calls_of(plain, "publish") == messages + 1  # published all the same
        waiter.submit(lock.unlock).result(timeout=30)
    for pool in (holder, waiter):
        pool.shutdown()
    assert not plain.exists(keys.lock, keys.waiting)


def park_behind(
    plain: redis.Redis,
    client: aiolock.sync.Client,
    lock: aiolock.sync.Lock,
    waiter: ThreadPoolExecutor,
    face: str,
) -> tuple[Future[Any], Any]:
    """A thread of ``waiter`` waiting for ``lock`` (of ``client``) behind a holder, by
    ``try_lock`` or ``with lock.acquire()`` (``face``), once parked on its loop with its owner
    in the waiting set: its pending call and the block's context manager."""
    keys = keys_of(lock.target())
    context = lock.acquire(wait=60)
    got = (
        waiter.submit(lock.try_lock, 60) if face == "try_lock" else waiter.submit(context.__enter__)
    )
    wait_until(lambda: plain.zcard(keys.waiting) == 1)
    wait_until(lambda: settled(client.engine()[0], lock.target()))
    return got, context


@pytest.mark.parametrize("face", ["try_lock", "acquire"])
def test_a_threads_release_answers_a_waiting_thread_of_its_client_itself(
    aiolock_server: ServerInfo, plain: redis.Redis, face: str
) -> None:
    """The release a thread sends itself, granting the lock to a thread of the same client
    parked on the loop, tells that thread at once: it returns holding the lock while the loop
    thread is busy (held here), and the loop records the hold once free (renewed by the
    watchdog past the grant's lease, released by one unlock)."""
    name = f"direct:{uuid.uuid4().hex}"
    holder, waiter = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    with aiolock.sync.Client.from_url(aiolock_server.url, watchdog_timeout=1.0) as client:
        lock = client.lock(name)
        keys = keys_of(lock.target())
        assert holder.submit(lock.try_lock, 5).result(timeout=30)
        got, context = park_behind(plain, client, lock, waiter, face)
        busy, free = threading.Event(), threading.Event()

        def occupy() -> None:
            busy.set()
            free.wait(30)

        # The thread's release is an EVALSHA: a server that never ran the script answers
        # NOSCRIPT, and the release goes through the loop, which is busy (run alone, no test
        # before this one loaded it).
        plain.script_load(LOCK_RELEASE.source)
        client.engine()[1].call_soon_threadsafe(occupy)
        assert busy.wait(10)
        try:
            holder.submit(lock.unlock).result(timeout=30)
            answer: Any = got.result(timeout=30)  # the loop thread is still busy
            fields = plain.hgetall(keys.lock)
            token = next(int(value) for field, value in fields.items() if field[:2] == b"f:")
        finally:
            free.set()
        if face == "try_lock":
            assert answer is True
        else:
            assert answer.fencing_token == token > 0
        assert waiter.submit(lock.is_held).result(timeout=30)
        assert waiter.submit(lock.hold_count).result(timeout=30) == 1
        # Renewed by the watchdog (a third of a lease of 1 s, the grant's own): still held
        # after three renewals.
        renewed = calls_of(plain, "evalsha")
        wait_until(lambda: calls_of(plain, "evalsha") >= renewed + 3, timeout=10)
        assert waiter.submit(lock.is_held).result(timeout=30)
        assert plain.pttl(keys.lock) > 0
        if face == "try_lock":
            waiter.submit(lock.unlock).result(timeout=30)
        else:
            assert answer.valid_for() > 0
            waiter.submit(context.__exit__, None, None, None).result(timeout=30)
        assert not waiter.submit(lock.is_held).result(timeout=30)
    for pool in (holder, waiter):
        pool.shutdown()
    assert not plain.exists(keys.lock, keys.waiting)


@pytest.mark.parametrize("face", ["try_lock", "acquire"])
def test_a_grant_message_to_a_waiting_thread_is_told_by_its_loop_at_once(
    aiolock_server: ServerInfo,
    plain: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    face: str,
) -> None:
    """A release by another client grants the lock to a thread parked on its client's loop:
    the loop tells that thread as it reads the grant's message (``answer_message``), without
    waking the call first; the hold is recorded all the same (renewed by the watchdog past
    the grant's lease, released by one unlock)."""
    told: list[bool] = []
    answer = aiolock.sync._direct.answer_message

    def counted(*args: Any) -> bool:
        told.append(answer(*args))
        return told[-1]

    monkeypatch.setattr(aiolock.sync._direct, "answer_message", counted)
    name = f"direct:{uuid.uuid4().hex}"
    holder, waiter = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    with (
        aiolock.sync.Client.from_url(aiolock_server.url) as first,
        aiolock.sync.Client.from_url(aiolock_server.url, watchdog_timeout=1.0) as second,
    ):
        held, lock = first.lock(name), second.lock(name)
        keys = keys_of(lock.target())
        assert holder.submit(held.try_lock, 5).result(timeout=30)
        got, context = park_behind(plain, second, lock, waiter, face)
        holder.submit(held.unlock).result(timeout=30)
        answered: Any = got.result(timeout=30)
        # (Noted once answer_message returned, after the answered thread ran.)
        wait_until(lambda: True in told)
        assert told.count(True) == 1
        fields = plain.hgetall(keys.lock)
        token = next(int(value) for field, value in fields.items() if field[:2] == b"f:")
        if face == "try_lock":
            assert answered is True
        else:
            assert answered.fencing_token == token > 0
        assert waiter.submit(lock.hold_count).result(timeout=30) == 1
        renewed = calls_of(plain, "evalsha")
        wait_until(lambda: calls_of(plain, "evalsha") >= renewed + 3, timeout=10)
        assert waiter.submit(lock.is_held).result(timeout=30)
        if face == "try_lock":
            waiter.submit(lock.unlock).result(timeout=30)
        else:
            waiter.submit(context.__exit__, None, None, None).result(timeout=30)
        assert not waiter.submit(lock.is_held).result(timeout=30)
    for pool in (holder, waiter):
        pool.shutdown()
    assert not plain.exists(keys.lock, keys.waiting)


def test_a_record_that_fails_as_the_loop_answers_a_message_leaves_its_reader_reading(
    aiolock_server: ServerInfo,
    plain: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The loop records a grant it told a thread of in the pub/sub reader's step: a failure
    there (a bug) is logged, and the reader goes on delivering the next grant (another lock's,
    to another thread)."""
    settle = ReentrantKind.settle_claimed
    failed: list[bool] = []

    def fail_once(*args: Any) -> Any:
        if not failed:
            failed.append(True)
            raise RuntimeError("a bug")
        return settle(*args)

    monkeypatch.setattr(ReentrantKind, "settle_claimed", fail_once)
    plain.script_load(LOCK_RELEASE.source)  # (the thread's release is an EVALSHA)
    names = [f"direct:{uuid.uuid4().hex}" for _ in range(2)]
    holder = ThreadPoolExecutor(1)
    with (
        aiolock.sync.Client.from_url(aiolock_server.url) as first,
        aiolock.sync.Client.from_url(aiolock_server.url) as second,
    ):
        for name in names:
            waiter = ThreadPoolExecutor(1)
            held, lock = first.lock(name), second.lock(name)
            keys = keys_of(lock.target())
            assert holder.submit(held.try_lock, 5).result(timeout=30)
            got = waiter.submit(lock.try_lock, 60)
            wait_until(lambda keys=keys: plain.zcard(keys.waiting) == 1)  # type: ignore[misc]
            wait_until(lambda lock=lock: settled(second.engine()[0], lock.target()))  # type: ignore[misc]
            holder.submit(held.unlock).result(timeout=30)
            assert got.result(timeout=30) is True
            waiter.submit(lock.unlock).result(timeout=30)
            waiter.shutdown()
            assert not plain.exists(keys.lock)
        assert failed == [True]
    holder.shutdown()
    assert any("could not be recorded" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("face", ["try_lock", "lock", "acquire"])
@pytest.mark.parametrize("by", ["message", "release"])
def test_a_thread_interrupted_as_it_is_answered_leaves_no_hold(
    aiolock_server: ServerInfo,
    plain: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    *,
    face: str,
    by: str,
) -> None:
    """An interrupt that lands as a waiting thread is answered (by the loop reading another
    client's grant message, or by a release of a thread of its own client) undoes the grant:
    the hold is recorded before the undo releases it, so none is left recorded (a hold
    recorded after its release would be renewed, found lost, and reported)."""
    main = threading.main_thread()
    assert threading.current_thread() is main
    assert main.ident is not None
    fired: list[bool] = []
    answer = Call.answer

    def answer_then_interrupt(call: Call[Any], value: Any) -> None:
        answer(call, value)
        if not fired:
            fired.append(True)
            signal.pthread_kill(main.ident or 0, signal.SIGUSR1)

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    name = f"direct:{uuid.uuid4().hex}"
    holder = ThreadPoolExecutor(1)
    with (
        aiolock.sync.Client.from_url(aiolock_server.url) as first,
        aiolock.sync.Client.from_url(aiolock_server.url) as second,
    ):
        lock = second.lock(name)
        held = first.lock(name) if by == "message" else lock
        keys = keys_of(lock.target())
        plain.script_load(LOCK_RELEASE.source)  # (the thread's release is an EVALSHA)
        assert holder.submit(held.try_lock, 5).result(timeout=30)

        def release_once_parked() -> None:
            wait_until(lambda: plain.zcard(keys.waiting) == 1)
            wait_until(lambda: settled(second.engine()[0], lock.target()))
            held.unlock()

        monkeypatch.setattr(Call, "answer", answer_then_interrupt)
        previous = signal.signal(signal.SIGUSR1, raise_interrupted)
        try:
            released = holder.submit(release_once_parked)
            with pytest.raises(Interrupted):
                if face == "try_lock":
                    lock.try_lock(60)
                elif face == "lock":
                    lock.lock()
                else:
                    with lock.acquire(wait=60):
                        pytest.fail("entered the block")
            released.result(timeout=30)
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert fired == [True]
        assert not plain.exists(keys.lock)
        # The loop runs the thread's posts first, then answers from its records.
        assert lock.hold_count() == 0
        assert not lock.is_held()
        assert lock.try_lock(0)
        lock.unlock()
    holder.shutdown()
    assert not plain.exists(keys.lock, keys.waiting)
    assert [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []


def test_threads_whose_waits_run_out_as_they_are_answered_never_overlap(
    aiolock_server: ServerInfo, plain: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads of two clients take one lock over and over, most waits short enough to run out
    about when a release answers them (``try_lock`` and ``with lock.acquire()``): never two
    holders at once, answers given, and the lock free again at once: well within a grant's
    lease (5 s), which a grant nobody takes would block it for (a wait that runs out as a
    release of its own client enters its owner again: see docs/internals.md)."""
    answered = [0]
    tell = aiolock.sync._direct._tell

    def counted(*args: Any) -> Any:
        record = tell(*args)
        answered[0] += record is not None
        return record

    monkeypatch.setattr(aiolock.sync._direct, "_tell", counted)
    name = f"direct:{uuid.uuid4().hex}"
    inside, overlaps, taken = [0], [0], [0]
    mutex = threading.Lock()
    with (
        aiolock.sync.Client.from_url(aiolock_server.url) as first,
        aiolock.sync.Client.from_url(aiolock_server.url) as second,
    ):
        locks = [first.lock(name), second.lock(name)]
        keys = keys_of(locks[0].target())
        end = time.monotonic() + 3

        def hold() -> None:
            with mutex:
                inside[0] += 1
                overlaps[0] += inside[0] != 1
                taken[0] += 1
            time.sleep(0)  # let the others queue up behind
            with mutex:
                inside[0] -= 1

        def work(index: int) -> None:
            lock = locks[index % 2]
            waits = (0.001, 0.003, 0.01, 0.5)
            turn = index
            while time.monotonic() < end:
                turn += 1
                wait = waits[turn % len(waits)]
                if index % 3 == 0:
                    try:
                        with lock.acquire(wait=wait):
                            hold()
                    except aiolock.LockTimeoutError:
                        pass
                elif lock.try_lock(wait):
                    try:
                        hold()
                    finally:
                        lock.unlock()

        with ThreadPoolExecutor(8) as pool:
            for future in [pool.submit(work, index) for index in range(8)]:
                future.result(timeout=60)
        assert overlaps == [0]
        assert taken[0] > 50
        assert answered[0] > 0
        wait_until(lambda: not plain.exists(keys.lock), timeout=2.5)
    wait_until(lambda: not plain.exists(keys.waiting), timeout=40)
