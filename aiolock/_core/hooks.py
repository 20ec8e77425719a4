"""What a kind supplies to the engine every kind shares: :class:`KindHooks`, the override points.

A kind (the plain, spin, fair and read-write locks, the semaphore's permits) is its keys, its
scripts and how its waiters wait; the engine (:mod:`.release`, :mod:`.acquire`, :mod:`.kind`)
is the rest.  A kind overrides the methods and class attributes listed here and nothing else:
the engine's own steps (the wait loop, one attempt, one release) are not override points.

:class:`KindHooks` also declares the state the engine keeps for every lock object (set by
:meth:`aiolock._core.kind.HoldKind.__init__`), which the hooks read; a kind does not set it.
The engine's classes subclass it, which gives every kind the defaults written here.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from redis.exceptions import RedisError, ResponseError

from .. import _scripts
from .._scripts import Call, Script
from .holds import Hold, NameCounters
from .keys import LockKeys
from .services import Services
from .waiting import MessageGrant, WaitStrategy

if TYPE_CHECKING:
    from .settlement import Attempt
    from .state import NameState

__all__ = ["Call", "KindHooks", "release_args"]

logger = logging.getLogger("aiolock.lock")


class KindHooks(Protocol):
    """The override points of a kind, each with its default where it has one.

    Every kind supplies :meth:`attempt_call`, :meth:`release_call` and :meth:`_wait_strategy` (and
    a lock kind :meth:`~aiolock._core.kind.LockKind._force_call`).  The rest have defaults that
    fit the reentrant lock hash, which the plain, spin and fair locks share.
    """

    __slots__ = ()

    # -- the state the engine keeps for one lock object (not overridden) ---------------------

    name: str
    _services: Services
    _keys: LockKeys
    _counters: NameCounters
    _state: NameState
    _explicit_owner: str | None
    _registry_key: str

    # -- data --------------------------------------------------------------------------------

    kind: ClassVar[str]
    """The kind's name: part of its keys (so kinds never share keys) and of its registries."""
    _renew: ClassVar[Script]
    """The script the watchdog renews the kind's holds with (see :meth:`_renew_keys`)."""
    _ends_with_task: ClassVar[bool] = True
    """Whether a task-owned hold is released when its task ends (SPEC); a semaphore's permit,
    which any task may release, keeps the lease rule."""
    _registry_suffix: ClassVar[str] = ""
    """Appended to the lock key to make the key of the kind's holds in the client's registries
    (a read-write lock's modes, which one owner may hold at once, differ by it)."""

    # -- keys --------------------------------------------------------------------------------

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        """The Redis keys of the lock ``name`` of this kind."""
        return LockKeys.build(services.key_prefix, name, cls.kind, cluster=services.cluster)

    def _renew_keys(self) -> tuple[str, ...]:
        """The KEYS the kind's renew script takes for one hold."""
        return (self._keys.lock,)

    def _channels(self) -> tuple[str, ...]:
        """Where the client wakes the waiters of every client when a hold ends unpublished."""
        return ()

    # -- acquiring ---------------------------------------------------------------------------

    def attempt_call(self, owner: str, request: int, lease_ms: int) -> Call:
        """One try of ``owner`` as request ``request``: its script answers a grant (see
        :meth:`grant_of`) or what :meth:`_refusal_pause` reads."""
        ...

    def grant_of(self, reply: Any, lease_ms: int) -> list[Any] | None:
        """The grant an acquire's ``reply`` answers, as ``[token, count, pttl]`` (``lease_ms``:
        the lease the call asked); ``None``: it was refused."""
        return reply if isinstance(reply, list) else None

    def _refusal_pause(self, attempt: Attempt, reply: Any) -> float:
        """The seconds a refused ``attempt`` waits before the next (``inf``: no bound)."""
        pttl = int(reply)
        return float("inf") if pttl < 0 else pttl / 1000

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        """How one waiting call of ``owner`` (for ``lease``) parks and is woken
        (:mod:`aiolock._core.waiting`)."""
        ...

    def _accept(
        self,
        owner: str,
        task: asyncio.Task[Any] | None,
        lease: float | None,
        started: float,
        grant: MessageGrant,
    ) -> Hold | None:
        """Record a grant a message brought the waiting ``owner`` (the hand-off of the plain
        and fair locks), if it can be counted on: the hold, or ``None`` to try instead."""
        return None

    def _single_try(self, owner: str) -> AbstractContextManager[None]:
        """What one try made outside the wait loop (``wait=0``, a composite's part) runs in."""
        return nullcontext()

    async def _after_error(
        self, owner: str, task: asyncio.Task[Any] | None, error: ResponseError
    ) -> bool:
        """An attempt's script raised ``error``: ``True`` to try again (the kind removed the
        cause), ``False`` to raise it to the caller."""
        return False

    async def wake_others(self) -> None:
        """Wake the waiters a release that could not do so itself owes (a command removed the
        owner's fields, or a resend found nothing to say so): by default a message on the
        lock's channels, for the waiters of every client; the plain lock hands the lock
        over to the first owner of its waiting set instead."""
        for channel in self._channels():
            try:
                await self._services.calls.publish(channel, "released")
            except RedisError as exc:  # the waiters' own pause bounds their wait
                logger.warning("could not publish a release of %r: %r", self.name, exc)

    def withdraw_call(self, owner: str) -> Call | None:
        """What a waiter of ``owner`` that gives up sends, if the kind keeps waiters on the
        server (the fair queue, the waiting writers)."""
        return None

    def withdraw_after(self, call: Call) -> asyncio.Future[None] | None:
        """On the loop: what a withdraw ``call`` (:meth:`withdraw_call`'s) waits for before it
        is sent, if anything: releases of this client in flight that enter its owner on the
        server again (the plain lock's), which must land first."""
        return None

    def _withdraw_lost(self, owner: str) -> None:
        """A withdraw of ``owner`` never landed: its entry may stay on the server a while."""
        return

    def void_call(self, owner: str, requests: list[int]) -> Call:
        """Void the owner's acquire ``requests`` (mark them as ones that must never grant) for
        the client's resend window: by default in the meta hash (``common/void.lua``), which
        the acquire scripts read."""
        window = self._services.resend_window_ms
        return (_scripts.VOID, (self._keys.meta,), (owner, window, *requests))

    # -- holding and releasing ---------------------------------------------------------------

    def _transact_call(self, hold: Hold) -> Call:
        """The kind's check before a transaction's commands (``<kind>/transact.lua``): its
        script, the lock keys it reads, and its ARGV head (owner, fencing token)."""
        return _scripts.LOCK_TRANSACT, (self._keys.lock,), (hold.owner, hold.token)

    def _extend_call(self, hold: Hold, lease_ms: int) -> Call:
        """The kind's extend (``<kind>/extend.lua``): set ``hold``'s lease to ``lease_ms`` from
        now if its owner still holds it with its fencing token; answers 1, or 0 when not held."""
        return _scripts.LOCK_EXTEND, (self._keys.lock,), (lease_ms, hold.owner, hold.token)

    def release_call(self, owner: str, request: int, undo: int | None) -> Call:
        """Release one hold of ``owner`` as request ``request``; with ``undo``, only if that
        acquire request was applied (see :func:`release_args`)."""
        ...

    def release_unapplied(self, call: Call) -> None:
        """A :meth:`release_call` ``call`` surely changed nothing (refused, or the owner held
        nothing): what the kind's client counted on it doing is undone (the plain lock's
        entry of a waiting owner)."""
        return

    def release_settled(self, call: Call) -> None:
        """A :meth:`release_call` ``call`` was answered or refused, or its outcome is settled
        otherwise: it changes nothing more on the server.  From any thread (aiolock.sync's
        releases)."""
        return

    def deliver_reply_grant(self, reply: Any) -> None:
        """On the loop: a :meth:`release_call`'s ``reply``, which may name the waiter it
        granted the lock to (the plain lock's): a waiter of this client takes it at once, not
        when the message that tells it arrives."""
        return

    def _last_release_command(self, hold: Hold) -> tuple[Any, ...] | None:
        """A bare command (not a script) that ends ``hold``, its owner's last and fault-free,
        when every field of the kind's holds is named by its owner; it answers the number of
        fields it removed, 3 or more when the hold was there (see :mod:`aiolock._core.release`)."""
        return None

    def _last_release_script(self, hold: Hold) -> Call | None:
        """A script that ends ``hold``, its owner's last and fault-free, and hands the lock
        over in the same call, with the reply :meth:`_last_release_command` gives."""
        return None


def release_args(owner: str, request: int, undo: int | None) -> tuple[Any, ...]:
    """ARGV of every kind's release script: owner, request, and the acquire to undo, if any."""
    return (owner, request) if undo is None else (owner, request, undo)
