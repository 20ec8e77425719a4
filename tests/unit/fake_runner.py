"""An in-memory :class:`~aiolock._redis.calls.Runner` that scripts the transport's outcomes.

As httpx's ``MockTransport`` stands in for its one-method transport, :class:`FakeRunner` stands in
for the client's script runner, so that what the engine does with each *outcome* of a call can
be tested without a server.  It does not emulate Redis or run Lua: the test says what each call
answers, and reads back what was sent.  The outcomes are the ones a real runner has
(``Runner.run`` lists them):

- :class:`Reply`: the call is written and answered;
- :class:`Fail`: it fails with an error, before it was written (nothing reached the server) or
  after (its outcome is unknown: ``orphan`` gets the error too, as the caller does);
- :class:`Resent`: a first copy is written on a connection that then fails, and a resend (with
  the resend mark, ``on_send(True)``) meets the next outcome;
- :class:`Held`: the call waits, written or not, until the test answers it or its caller is
  cancelled; a caller cancelled meanwhile leaves at once and ``orphan`` gets the outcome the
  test gives later (:class:`~aiolock._redis.calls.NotSent` if nothing was written, a
  connection error if it was cancelled between a failed copy and its resend).

Every call is matched by its script's name (``"lock/acquire"``) or its command (``"HDEL"``):
one-shot outcomes queued with :meth:`FakeRunner.script` come first, then a standing answer
(:meth:`FakeRunner.answer`).  A call with neither raises :class:`Unscripted` and is recorded in
:attr:`FakeRunner.unscripted`, which :func:`fake_services` checks is empty at the end.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from aiolock._core.holds import Holds
from aiolock._core.owners import Owners
from aiolock._core.services import Services
from aiolock._core.watchdog import Watchdog
from aiolock._redis.calls import Orphan, Runner, not_sent
from aiolock._redis.pubsub import OneServer, PubSub
from aiolock._scripts import Script

__all__ = [
    "Fail",
    "FakeRunner",
    "Held",
    "Outcome",
    "Reply",
    "Resent",
    "Sent",
    "Unscripted",
    "fake_services",
]


@dataclass(frozen=True, slots=True)
class Sent:
    """One copy of a call as it was written: a script's name or a command's, its KEYS and
    ARGV (a resend's with the resend mark the real runner adds), and whether it is a resend."""

    name: str
    keys: tuple[str, ...]
    args: tuple[Any, ...]
    resend: bool = False


class Unscripted(AssertionError):
    """A call the test gave no outcome for."""


class _Call:
    """One call in the fake runner: what its outcome plays on."""

    def __init__(
        self,
        runner: FakeRunner,
        name: str,
        *,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        orphan: Orphan | None,
        on_send: Callable[[bool], object] | None,
        mark: int,
    ) -> None:
        self.runner = runner
        self.name = name
        self.keys = keys
        self.args = args
        self.orphan = orphan
        self.on_send = on_send
        self.mark = mark
        self.copies = 0

    def write(self) -> None:
        """Write one copy (a resend if one went before), as the real runner does."""
        resend = self.copies > 0
        if self.on_send is not None:
            self.on_send(resend)
        args = (*self.args, self.mark) if resend and self.mark else self.args
        self.runner.sent.append(Sent(self.name, self.keys, args, resend))
        self.copies += 1

    def fail(self, error: Exception) -> Exception:
        """``error`` for the caller; the orphan gets it too once a copy was written."""
        if self.copies and self.orphan is not None:
            self.orphan(_failed(error))
        return error


class Outcome(abc.ABC):
    """What one call meets (see the module docstring)."""

    @abc.abstractmethod
    async def play(self, call: _Call) -> tuple[Any, int]:
        """Play the outcome on ``call``: its reply and how many replicas confirmed it."""


@dataclass(frozen=True)
class Reply(Outcome):
    """Written and answered ``value`` (``synced``: replicas that confirmed it, for a call with
    ``sync_replicas``)."""

    value: Any
    synced: int = 0

    async def play(self, call: _Call) -> tuple[Any, int]:
        call.write()
        return self.value, self.synced


@dataclass(frozen=True)
class Fail(Outcome):
    """Raises ``error``; ``written``: after a copy was written (its outcome is unknown)."""

    error: Exception
    written: bool = True

    async def play(self, call: _Call) -> tuple[Any, int]:
        if self.written:
            call.write()
        raise call.fail(self.error)


@dataclass(frozen=True)
class Resent(Outcome):
    """A copy written on a connection that failed, then a resend that meets ``then``."""

    then: Outcome

    async def play(self, call: _Call) -> tuple[Any, int]:
        call.write()
        return await self.then.play(call)


class Held(Outcome):
    """The call waits until the test answers it (:meth:`answer`, :meth:`fail`); ``written``:
    a copy is written first (else it waits for a connection, or, after :class:`Resent`'s first
    copy, for its resend).

    A caller cancelled meanwhile leaves at once.  Its orphan gets a future of what the test
    gives later (the late reply a real runner reads in the background) if this copy was
    written; :class:`~aiolock._redis.calls.NotSent` if no copy was; a connection error (the
    outcome is unknown) if only an earlier copy was.
    """

    def __init__(self, written: bool = True) -> None:
        self.written = written
        self.reached = asyncio.Event()  # the call is in flight (written, if ``written``)
        self._reply: asyncio.Future[Any] | None = None
        self._synced = 0

    @property
    def reply(self) -> asyncio.Future[Any]:
        if self._reply is None:
            self._reply = asyncio.get_running_loop().create_future()
        return self._reply

    def answer(self, value: Any, synced: int = 0) -> None:
        """The reply arrives (late, if the caller left)."""
        self._synced = synced
        self.reply.set_result(value)

    def fail(self, error: Exception) -> None:
        """The call fails: the connection dropped, the reply timed out."""
        self.reply.set_exception(error)

    def _left(self, call: _Call) -> asyncio.Future[Any]:
        """The outcome a caller cancelled now leaves to its orphan, as the real runner does."""
        if not call.copies:
            return not_sent()
        if not self.written:  # between a copy on a failed connection and its resend
            return _failed(RedisConnectionError("cancelled between attempts"))
        return self.reply

    async def play(self, call: _Call) -> tuple[Any, int]:
        if self.written:
            call.write()
        self.reached.set()
        call.runner.held.append(self)
        try:
            value = await asyncio.shield(self.reply)
        except asyncio.CancelledError:
            if call.orphan is not None:
                call.orphan(self._left(call))
            raise
        except Exception as error:
            raise call.fail(error) from None
        return value, self._synced


class FakeRunner(Runner):
    """The scripted runner (see the module docstring).

    :ivar sent: every copy written, in order.
    :ivar unscripted: the calls that met no outcome.
    """

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.unscripted: list[Sent] = []
        self.held: list[Held] = []
        self._queued: defaultdict[str, deque[Outcome]] = defaultdict(deque)
        self._standing: dict[str, Outcome] = {}

    def script(self, name: str, *outcomes: Outcome) -> None:
        """The next calls named ``name`` meet ``outcomes``, one each, in order."""
        self._queued[name].extend(outcomes)

    def answer(self, name: str, value: Any) -> None:
        """Every later call named ``name`` with no queued outcome is answered ``value``."""
        self.always(name, Reply(value))

    def always(self, name: str, outcome: Outcome) -> None:
        """Every later call named ``name`` with no queued outcome meets ``outcome``."""
        self._standing[name] = outcome

    def named(self, name: str) -> list[Sent]:
        """The copies written of calls named ``name``, in order."""
        return [sent for sent in self.sent if sent.name == name]

    def scripted(self, name: str) -> int:
        """How many queued outcomes for ``name`` no call has met yet."""
        return len(self._queued[name])

    async def run_synced(
        self,
        script: Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        *,
        sync: tuple[int, float] | None,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
        mark_resends: int = 0,
        no_resend: bool = False,
    ) -> tuple[Any, int]:
        return await self._play(
            script.name, keys=keys, args=args, orphan=orphan, on_send=on_send, mark=mark_resends
        )

    async def command(
        self,
        key: str,
        command: tuple[Any, ...],
        *,
        orphan: Orphan | None = None,
        on_send: Callable[[bool], object] | None = None,
    ) -> Any:
        reply, _ = await self._play(
            str(command[0]), keys=(key,), args=command[1:], orphan=orphan, on_send=on_send, mark=0
        )
        return reply

    async def publish(self, channel: str, message: str) -> None:
        await self.command(channel, ("PUBLISH", channel, message))

    async def aclose(self, grace: float) -> None:
        """Replies never given are lost with the connection (a real runner cancels the reads
        it still has in the background)."""
        for held in self.held:
            held.reply.cancel()

    async def _play(
        self,
        name: str,
        *,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        orphan: Orphan | None,
        on_send: Callable[[bool], object] | None,
        mark: int,
    ) -> tuple[Any, int]:
        queued = self._queued[name]
        outcome = queued.popleft() if queued else self._standing.get(name)
        if outcome is None:
            self.unscripted.append(Sent(name, keys, args))
            raise Unscripted(f"no outcome scripted for {name} {keys} {args}")
        call = _Call(self, name, keys=keys, args=args, orphan=orphan, on_send=on_send, mark=mark)
        return await outcome.play(call)


def _failed(error: BaseException) -> asyncio.Future[Any]:
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_exception(error)
    done.exception()  # retrieved: the orphan may ignore it
    return done


@contextlib.asynccontextmanager
async def fake_services(
    runner: FakeRunner,
    *,
    watchdog_timeout: float = 5.0,
    resend_window: float = 2.0,
    sync: tuple[int, float] | None = None,
) -> AsyncIterator[Services]:
    """A client's services (as ``Client`` wires them) on ``runner``: no connection is made.

    Closed as the client closes, and the runner must have met no unscripted call by then.
    """
    redis = Redis(host="fake.invalid")  # never connected: only its options are read
    holds = Holds()
    services = Services(
        redis=redis,
        calls=runner,
        pubsub=PubSub(OneServer(redis.connection_pool), concurrency=1),
        holds=holds,
        watchdog=Watchdog(runner, holds, lease=watchdog_timeout, sync=sync),
        owners=Owners("fake-client"),
        key_prefix="t",
        watchdog_timeout=watchdog_timeout,
        fair_wait_timeout=5.0,
        sync=sync,
    )
    services.resend_window_ms = round(resend_window * 1000)
    services.check_loop()
    try:
        yield services
        assert runner.unscripted == [], runner.unscripted
    finally:
        services.closed = True
        await services.pubsub.aclose()
        pending = holds.pending()
        if pending:
            await asyncio.wait(pending, timeout=watchdog_timeout)
        await services.watchdog.aclose()
        await runner.aclose(grace=0)
        holds.clear()
        await redis.aclose()
