"""The first try and the release of a plain lock, sent by the calling thread itself.

A blocking call that hops to the loop thread and back costs two thread switches, more than the
call to Redis on loopback.  So for the plain and spin locks (``ReentrantKind``, its owner the
thread), the calling thread sends the owner's first try itself, over a blocking connection of
the client's own (:class:`Line`, made with the async pool's connection options), with the
call the engine builds (``first_try_off_loop``: the same script and arguments), and posts a
fresh grant to the loop without waiting for it (``record_off_loop``): the loop records it as
a grant of its own (the watchdog renews it, its timer, statistics).  The release of the
owner's one hold goes the same way, however it was taken: the plain command
(``plain_release``) or the release script (``release_call``) when others wait, marked in
flight first (``releasing_off_loop``), its outcome posted (``released_off_loop``).
Everything else is the loop's: a refusal (the wait loop parks), a re-entry, a fault, any
other reply.

A thread whose first try was refused waits on the loop, as a :class:`Waiting` the client's
line knows of (``waiting``): when a thread's own release grants the lock to it (the release
script answers the grant it made), the releasing thread claims the grant for the parked call
(``ReentrantKind.claim``), posts its record, and answers the waiting thread at once
(``_answer``), instead of leaving the wake-up to the loop thread, which would first have to
take the GIL from the releasing thread.  A grant another client's release made comes as a
message, which the loop hands to ``answer_message`` before it wakes the call: the same claim
and answer, without the wait loop's steps.  Either way the one who answered lets the answered
thread take the GIL before it goes on (``Call.yield_to``).  The answered thread keeps its own
record of the hold (:class:`Taken`), as for a first try.

Who sees what when: the posts run on the loop in the order the thread made them
(``_line.Posts``, in batches), and before any call the thread queues on the loop later
(``Client.flush``), so the loop path always finds the thread's holds recorded and released.
The thread keeps its own record of the hold it took here (:class:`Taken`, per lock), since
the loop may not have run the post yet when the thread releases or acquires again.

An outcome the thread cannot know (a fault or an interrupt once the call was written) is the
loop's settlement's: posted as ``settlement.acquire_unknown`` (the grant undone exactly, if
there was one) or ``release_failed_off_loop`` with the error (the release completed).  An
interrupt waits for that settlement before it is raised, so that nothing is left behind; any
other fault goes on to the loop path, which waits for it first (or, for a release, is raised,
as the async ``unlock()`` raises it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

import redis
from redis.exceptions import ResponseError

from .._core.holds import CLOCK_MARGIN, Hold
from .._core.line import grant_fields
from .._core.settlement import Attempt, grant_message
from ..errors import LockNotOwnedError
from ..lock import ReentrantKind
from ._line import Line, Waiting
from ._run import settle

if TYPE_CHECKING:
    from ._client import Client

__all__ = [
    "Taken",
    "acquire",
    "answered",
    "release",
    "unexpired",
    "waiting",
]

logger = logging.getLogger("aiolock")

# redis-py 5.1 and later read a reply within a timeout of the call's own.
_READ_TIMEOUT: Final = "timeout" in inspect.signature(redis.Connection.read_response).parameters


class Taken:
    """What the calling thread knows of the hold it took on one lock by its own first try.

    :ivar token: the hold's fencing token.
    :ivar expires_at: when its first lease ends at the earliest (the loop's clock), until the
        loop's record of it says more.
    :ivar released: its release was sent here too (the loop may not have recorded it yet).
    """

    __slots__ = ("expires_at", "released", "token")

    def __init__(self, token: int, expires_at: float) -> None:
        self.token = token
        self.expires_at = expires_at - CLOCK_MARGIN
        self.released = False


@contextlib.contextmanager
def waiting(
    client: Client, target: ReentrantKind, lease: float | None, value: Any
) -> Iterator[Waiting]:
    """The calling thread's acquire of ``target``, waiting on the loop for the block: a release
    by another thread of ``client`` may answer it with ``value`` (see :func:`answered`)."""
    owner, loop, line = _owner(client)
    entry = Waiting(target, lease, loop.time(), value)
    key = (target.registry_key, owner)
    line.waiting[key] = entry
    try:
        yield entry
    finally:
        del line.waiting[key]


def answered(client: Client, target: ReentrantKind, entry: Waiting) -> bool:
    """Whether a release answered ``entry`` (after its call returned): the thread then holds
    ``target``, and keeps its own record of the hold until the loop's."""
    grant = entry.grant
    if grant is None:
        return False
    client.taken()[target.registry_key] = Taken(grant.token, grant.since + grant.lease_ms / 1000)
    return True


def _answer(line: Line, target: ReentrantKind, reply: Any) -> Waiting | None:
    """The release script's ``reply`` may name the grant it made: if a thread of this client
    waits here for it, answer it (:func:`_tell`, its record posted first, without waking the
    loop); the entry answered, if one was.  The caller yields to it, then wakes the loop."""
    message = grant_message(reply)  # (a plain command's reply, a count, names no grant)
    if message is None or not line.waiting:
        return None
    fields = grant_fields(message)
    if fields is None:
        return None
    entry = line.waiting.get((target.registry_key, fields[4]))
    if entry is None:
        return None
    record = _tell(entry, message, lambda record: line.post(record, wake=False))
    return None if record is None else entry


def answer_message(line: Line, registry_key: str, message: bytes) -> bool:
    """On the loop, a grant ``message`` of the lock ``registry_key`` before it wakes the
    waiting call: if a thread waits here for it, answer it (:func:`_tell`), let it run, then
    record its hold (before anything the thread queues on the loop meanwhile); ``True`` once
    answered (the call is not woken then)."""
    if not line.waiting:
        return False
    fields = grant_fields(message)
    if fields is None:
        return False
    entry = line.waiting.get((registry_key, fields[4]))
    if entry is None:
        return False
    record = _tell(entry, message, lambda record: None)
    if record is None:
        return False
    entry.call.yield_to()
    try:
        record()
    except Exception:  # a bug: the pub/sub reader this runs in must go on
        logger.exception("the hold of a grant told to a waiting thread could not be recorded")
    return True


def _tell(
    entry: Waiting, message: bytes, keep: Callable[[Callable[[], None]], object]
) -> Callable[[], None] | None:
    """Claim the grant ``message`` for ``entry``'s parked call and answer its thread; the
    record of its hold for the loop to run (``None``: not answered), handed to ``keep``
    before the answer."""
    if not entry.call.reserve():
        return None
    target: ReentrantKind = entry.target
    told = False
    try:
        claimed = target.claim(message, entry.call.task)
        if claimed is None:
            return None
        call, grant = claimed

        def record() -> None:
            entry.kept.append(target.settle_claimed(call, entry.lease, entry.started, grant))

        keep(record)  # before the answer: what the answered thread posts runs after it
        entry.grant = grant
        entry.call.answer(entry.value)
        told = True
    except Exception:  # a bug: the grant stands, and its wake-up is the loop's
        logger.exception("a waiting thread could not be told of its grant")
    finally:
        if not told:  # (after a claim: the call's own wait loop records the grant)
            entry.call.withdraw()
    return record if told else None


class _Unknown(Exception):
    """What settlement is told of a call whose outcome the thread could not read."""


def unexpired(client: Client, target: ReentrantKind, hold: Hold | None) -> bool:
    """Whether the hold the calling thread took by its own first try is surely not lost yet:
    not marked lost by the loop (``hold``, its record, once made), and its lease not run out by
    the client's clock (no I/O; what ``Hold.lost`` would say without running the expiry)."""
    mine = client.taken().get(target.registry_key)
    if mine is None or mine.released:
        return False
    if hold is not None and hold.lost:
        return False
    expires_at = mine.expires_at if hold is None else hold.expires_at
    return client.engine()[1].time() < expires_at


def _owner(client: Client) -> tuple[str, asyncio.AbstractEventLoop, Line]:
    """The calling thread's owner id, the loop and the client's line."""
    made, loop = client.engine()
    line = client.line()
    assert line is not None
    return client.thread_owner(made), loop, line


def acquire(
    client: Client,
    target: ReentrantKind,
    lease: float | None,
    within: float | None = None,
    kept: list[Hold] | None = None,
) -> bool:
    """The calling thread's first try of ``target``, sent by itself: ``True`` once it holds
    the lock; ``False`` when the loop path must acquire (after anything but a fresh grant, with
    an unknown outcome handed to settlement first).  An interrupt is raised once settled.

    ``within``: the reply is waited for that many seconds at most (a caller's ``wait`` bounds
    its whole acquire, a stalled server included), then its outcome is settlement's.
    ``kept``: the loop's record of the hold is appended to it once the loop has made it."""
    if within is not None and not _READ_TIMEOUT:
        return False  # an older redis-py: the loop path bounds the call
    owner, loop, line = _owner(client)
    taken = client.taken()
    if not _may_try(target, owner, taken.get(target.registry_key)):
        return False
    started = loop.time()
    prepared = target.first_try_off_loop(owner, lease, started)
    if prepared is None:
        return False
    attempt, (script, keys, args) = prepared
    try:
        conn = line.borrow()
    except Exception:
        return False
    # Until the grant is posted, an interrupt or a fault leaves an outcome the loop must settle
    # (undo it, if granted); once posted, the hold is the loop's like any other.
    unknown = posted = False
    try:
        attempt.sent_at = loop.time()
        unknown = True
        conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
        reply = _reply(conn, within)
        grant = target.grant_of(reply, attempt.lease_ms)
        if grant is None:
            return False  # refused: the loop's wait
        if not target.fresh_off_loop(attempt, grant):
            unknown = False
            _acquire_unknown(line, target, attempt, reply, None)  # undone exactly
            return False
        waited = loop.time() - started
        taken[target.registry_key] = Taken(int(grant[0]), attempt.sent_at + attempt.lease)

        def record() -> None:
            hold = target.record_off_loop(attempt, grant, waited, watchdog=lease is None)
            if kept is not None:
                kept.append(hold)

        line.post(record)
        posted = True
    except ResponseError:
        return False  # a reply (NOSCRIPT, a server's refusal): the loop path sends it again
    except BaseException as error:
        conn.disconnect()
        if posted:  # interrupted on the way out: the caller never takes the hold
            taken.pop(target.registry_key, None)
            settle([client], lambda: target.release_one(owner))
        elif unknown:
            _acquire_unknown(line, target, attempt, None, error)
            if not isinstance(error, Exception):  # an interrupt: nothing may stay behind
                settle(
                    [client], lambda: target.services.holds.wait_pending(target.keys.lock, owner)
                )
        if not isinstance(error, Exception):
            raise
        return False
    finally:
        line.give_back(conn)
    return True


def _reply(conn: Any, within: float | None) -> Any:
    """The reply on ``conn``, waited for ``within`` seconds at most (and the socket's own
    timeout)."""
    if within is None:
        return conn.read_response()
    limit = conn.socket_timeout
    return conn.read_response(timeout=within if limit is None else min(within, limit))


def _may_try(target: ReentrantKind, owner: str, mine: Taken | None) -> bool:
    """Whether the owner's try would be a first one: no hold of the thread's to re-enter."""
    if mine is not None and not mine.released:
        return False  # a re-entry: the loop's
    hold = target.hold(owner)
    # A hold the loop path made is re-entered on the loop.  (One up to the token of the
    # thread's own last hold is one whose release the thread posted: the loop forgets it first.)
    return hold is None or (mine is not None and hold.token <= mine.token)


def _acquire_unknown(
    line: Line,
    target: ReentrantKind,
    attempt: Attempt,
    reply: Any,
    error: BaseException | None,
) -> None:
    """Post an acquire whose grant nobody takes: its reply, or the error that left it unknown
    (settlement undoes a grant exactly; the owner's next call waits for it)."""
    failure = None if error is None else _Unknown(f"a thread's own first try failed: {error!r}")

    def hand_over() -> None:
        work: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if failure is None:
            work.set_result(reply)
        else:
            work.set_exception(failure)
        target.settlement.acquire_unknown(attempt, work)

    line.post(hand_over, urgent=True)


def release(client: Client, target: ReentrantKind) -> bool:
    """Release the calling thread's one hold of ``target`` by a call sent by itself (the plain
    command, or the release script when others wait): ``True`` once released; ``False`` when
    the loop path must (a re-entered hold, one whose acquire was resent, a fault on record).

    :raises LockNotOwnedError: the hold was gone (a loss, recorded on the loop).
    :raises redis.RedisError: the connection failed with the release written: settlement
        completes it (as for ``AsyncRLock.unlock``).
    """
    owner, loop, line = _owner(client)
    taken = client.taken()
    releasable = _releasable(target, owner, taken.get(target.registry_key))
    if releasable is None:
        return False
    token, hold = releasable
    command = target.plain_release(owner, contended=hold is not None and hold.contended)
    try:
        conn = line.borrow()
    except Exception:
        return False
    began = loop.time()
    request = target.releasing_off_loop(owner, began)
    if request is None:
        line.give_back(conn)
        return False
    by_command = command is not None
    call = None
    if command is None:
        call, command = _release_script(target, owner, request)
    # Until the outcome is posted, an interrupt or a fault once written leaves it unknown.
    unknown = False
    try:
        unknown = True
        conn.send_command(*command)
        reply = conn.read_response()
        _record_release(line, target, owner, began, reply, by_command=by_command)
        unknown = False
    except ResponseError:
        # A reply (NOSCRIPT, a replica's refusal): nothing changed; the loop path sends it.
        if call is not None:
            target.release_unapplied(call)
        line.post(
            lambda: target.release_failed_off_loop(
                owner, request, began, None, by_command=by_command
            ),
            urgent=True,
        )
        return False
    except BaseException as error:
        conn.disconnect()
        taken[target.registry_key] = _released(token)
        if not unknown:  # interrupted on the way out, its outcome posted: the release is done
            raise
        failure = _Unknown(f"a thread's own release failed: {error!r}")
        line.post(
            lambda: target.release_failed_off_loop(
                owner, request, began, failure, by_command=by_command
            ),
            urgent=True,
        )
        if not isinstance(error, Exception):  # an interrupt: nothing may stay behind
            settle([client], lambda: target.services.holds.wait_pending(target.keys.lock, owner))
        raise
    finally:
        _sent(line, conn, target, call)
    taken[target.registry_key] = _released(token)
    if call is not None and reply is None:
        target.release_unapplied(call)
    if (int(reply) < 3) if by_command else (reply is None):
        raise LockNotOwnedError(f"lock {target.name!r} is not held by this owner")
    return True


def _record_release(
    line: Line, target: ReentrantKind, owner: str, began: float, reply: Any, *, by_command: bool
) -> None:
    """Answer a waiting thread of this client that a thread's release granted the lock to
    (:func:`_answer`), and post the loop's record of the release."""
    told = _answer(line, target, reply)
    # A plain release that removed a waiter's mark owes the wake-up the script would have
    # published, and a release script that granted the lock may have named a waiter of this
    # client (see deliver_reply_grant): at once, unless this thread told that waiter itself.
    owes = reply != 3 if by_command else grant_message(reply) is not None
    line.post(
        lambda: target.released_off_loop(owner, began, reply, by_command=by_command),
        urgent=owes and told is None,
        wake=told is None,
    )
    if told is not None:
        # The answered thread holds the lock: it takes the GIL now, not once this thread
        # blocks in its next call, and before the loop wakes for the posts
        # (benchmarks/notes/hand-off.md).
        told.call.yield_to()
        line.wake()


def _sent(line: Line, conn: Any, target: ReentrantKind, call: tuple[Any, ...] | None) -> None:
    """A thread's release has its outcome: its connection goes back to the line, and a
    release script's entry of a waiting owner is settled (a withdraw of it may go now)."""
    line.give_back(conn)
    if call is not None:
        target.release_settled(call)


def _release_script(
    target: ReentrantKind, owner: str, request: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The release script the loop would send, and its ``EVALSHA`` (it also keeps the lock's
    waiting set alive now and then: a time the thread may write as well as the loop, either
    keeps it)."""
    call = script, keys, args = target.release_call(owner, request, None)
    return call, ("EVALSHA", script.sha, len(keys), *keys, *args)


def _releasable(
    target: ReentrantKind, owner: str, mine: Taken | None
) -> tuple[int, Hold | None] | None:
    """The token of the owner's one hold that the thread may release itself, and the loop's
    record of it if the loop has one yet; ``None`` when the loop path must release."""
    hold = target.hold(owner)
    if mine is not None:
        if mine.released:
            return None  # released already: the loop path says so
        if hold is not None and hold.token < mine.token:
            hold = None  # an earlier hold of the thread's, whose release the loop has yet to read
        if hold is not None and (hold.token != mine.token or hold.count != 1):
            return None
        return mine.token, hold
    if hold is None or hold.count != 1 or hold.resent:
        # The loop's record of a hold it made is up to date: the thread's call that made it
        # returned once it was written.
        return None
    return hold.token, hold


def _released(token: int) -> Taken:
    """The thread's record of a hold whose release it sent (the loop may not have read it)."""
    taken = Taken(token, 0.0)
    taken.released = True
    return taken
