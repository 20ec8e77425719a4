"""One release, and the wake-ups it owes: the engine's :class:`Releasing` part.

A release of one hold goes one of three ways, chosen before it is sent:

- the kind's release script (:meth:`~KindHooks.release_call`), which publishes its own
  wake-up: any hold, and every one a fault touched;
- the owner's last hold, fault-free, ended by one bare command
  (:meth:`~KindHooks._last_release_command`, an ``HDEL`` of the owner's fields): the client
  publishes the wake-up the command cannot;
- the owner's last hold, fault-free, ended by a kind's own script that hands the lock over in
  the same call (:meth:`~KindHooks._last_release_script`, the fair lock's).

The last two answer alike (the number of fields removed) and are read alike.  Calls whose
reply the caller never saw are settled by :mod:`aiolock._core.settlement`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from redis.exceptions import RedisError, ResponseError

from .._redis.calls import Orphan, not_sent
from .._redis.info import uptime
from .._scripts import Call
from .holds import Hold
from .hooks import KindHooks
from .keys import LockKeys
from .services import Services
from .settlement import ReleaseCopies, Settlement, check_applied, holds_left

__all__ = ["Releasing"]

logger = logging.getLogger("aiolock.lock")


class Releasing(KindHooks):
    """Release and wake-ups (see the module docstring)."""

    __slots__ = ()

    # -- what the settlement, the composites and the command line read ----------------------

    @property
    def keys(self) -> LockKeys:
        """The lock's Redis keys."""
        return self._keys

    @property
    def services(self) -> Services:
        """The services of the lock's client."""
        return self._services

    @property
    def registry_key(self) -> str:
        """What the client's registries know the lock's holds by (distinct per mode)."""
        return self._registry_key

    @property
    def settlement(self) -> Settlement:
        """The settlement of this lock's calls whose outcome is unknown (made when needed: it
        is two small objects, and most calls have nothing to settle)."""
        return Settlement(self)

    # -- one release -------------------------------------------------------------------------

    async def release_one(self, owner: str) -> int | None:
        """Release one hold of ``owner``: the holds left, or ``None`` if it held none.

        The release completes even if the caller is cancelled or the reply is lost.
        """
        services = self._services
        registry_key = self._registry_key
        request = services.owners.next_request()
        settlement = self.settlement
        copies = ReleaseCopies()  # on_send of the call: whether it was resent

        def unknown(work: asyncio.Future[Any]) -> None:
            settlement.release_unknown(owner, request, work, copies)

        try:
            await services.holds.wait_pending(self._keys.lock, owner)
            hold = services.holds.get(registry_key, owner)
            expected_left = None if hold is None else hold.count - 1
            command, script = self._last_release(hold, owner)
            if hold is not None and expected_left == 0 and hold.resent:
                # In the background, like a settlement: a cancellation of this call must not
                # lose it (the release is then settled after it).
                voided, hold.resent = hold.resent, []
                services.holds.defer(self._keys.lock, owner, settlement.void(owner, voided))
                await services.holds.wait_pending(self._keys.lock, owner)
        except asyncio.CancelledError:
            unknown(not_sent())
            raise
        # While it is in flight, a renewal of this hold may be answered "not held" because of
        # it: the watchdog leaves the verdict to this reply (Holds.in_release).
        sent = asyncio.get_running_loop().time()
        services.holds.release_begun(registry_key, owner, sent)
        try:
            if command is not None:
                reply = await self._release_by_command(command, owner, request, copies)
            elif script is not None:
                reply = await self._release_by_script(script, owner, request, copies)
            else:
                reply = await self._release_by_kind(owner, request, copies, unknown)
        finally:
            services.holds.release_ended(registry_key, owner, sent)
        settlement.released_copies(owner, request, copies)
        remaining = holds_left(reply)
        # No marker outlives the lock, so a resend of the release that deleted it finds it
        # gone.  The owner's critical section ended before it sent the release, and its lease
        # had not run out as the client counts: only a force_unlock (which reports itself to
        # its own caller) or a server that lost the hold in between would have made it a loss.
        # The resend usually follows a restart: the server is asked, after the hold is no
        # longer tracked (a renewal or a new hold of the owner must not meet it meanwhile).
        maybe_ended_earlier = (
            remaining is None
            and copies.resent
            and expected_left == 0
            and hold is not None
            and sent < hold.expires_at
        )
        services.holds.released(registry_key, owner, 0 if maybe_ended_earlier else remaining)
        settlement.check_count(owner, expected_left, remaining)
        if maybe_ended_earlier and hold is not None:
            kept = False
            try:
                kept = await self._server_kept(hold)
            finally:  # a cancellation of that question leaves it a loss, recorded all the same
                if not kept:
                    services.holds.lose(hold, "the server restarted or changed since it held it")
            remaining = 0 if kept else None
        return remaining

    async def _release_by_kind(
        self, owner: str, request: int, copies: ReleaseCopies, unknown: Orphan
    ) -> Any:
        """Release one hold of ``owner`` with the kind's release script: its reply."""
        call = self.release_call(owner, request, None)
        orphaned = False

        def orphan(work: asyncio.Future[Any]) -> None:
            nonlocal orphaned
            orphaned = True
            work.add_done_callback(lambda _: self.release_settled(call))
            unknown(work)

        try:
            reply = await self._services.calls.run(*call, orphan=orphan, on_send=copies.sending)
        except ResponseError:
            self.release_unapplied(call)
            raise
        finally:
            if not orphaned:  # else once the call's outcome is known
                self.release_settled(call)
        self.deliver_reply_grant(reply)
        check_applied(self, call, reply, copies)
        return reply

    def _last_release(
        self, hold: Hold | None, owner: str
    ) -> tuple[tuple[Any, ...] | None, Call | None]:
        """How the owner's last hold, fault-free, ends: by a bare command or by the kind's
        own script (see the module docstring); neither for any other release."""
        if hold is None or hold.count != 1 or hold.resent:
            return None, None
        if self._services.holds.late_releases(self._keys.lock, owner):
            return None, None
        command = self._last_release_command(hold)
        return command, None if command is not None else self._last_release_script(hold)

    async def _server_kept(self, hold: Hold) -> bool:
        """Whether the server that answers for the lock now has been up since ``hold`` was
        last confirmed on it (so it may not have lost it since); ``False`` when it cannot tell.

        Asked only after a resend.  The server counts its uptime between two whole-second
        clock readings: it started before now less ``uptime - 1`` seconds.
        """
        seconds = await uptime(self._services.calls, self._keys.lock)
        if seconds is None:
            return False
        return asyncio.get_running_loop().time() - (seconds - 1) < hold.confirmed_at

    # -- the owner's last hold, fault-free ---------------------------------------------------

    def _release_by_command(
        self, command: tuple[Any, ...], owner: str, request: int, copies: ReleaseCopies
    ) -> Awaitable[int | None]:
        """End the owner's last hold with a bare ``command`` (see the module docstring)."""
        sent = self._services.calls.command(
            self._keys.lock,
            command,
            orphan=self._last_unknown(owner, request, copies),
            on_send=copies.sending,
        )
        return self._last_released(sent, owner, request, copies)

    def _release_by_script(
        self, call: Call, owner: str, request: int, copies: ReleaseCopies
    ) -> Awaitable[int | None]:
        """End the owner's last hold with the kind's own script (see the module docstring)."""
        sent = self._services.calls.run(
            *call, orphan=self._last_unknown(owner, request, copies), on_send=copies.sending
        )
        return self._last_released(sent, owner, request, copies)

    async def _last_released(
        self, sent: Awaitable[Any], owner: str, request: int, copies: ReleaseCopies
    ) -> int | None:
        """Read the reply of a last release: 0 when it ended the hold, ``None`` when the owner
        held nothing (a release script's reply).

        It removes the owner's fields and ``:w``, so it answers 3 or more when the hold was
        there, 1 or 0 when it was not (one other owner's ``:w``, at most: no other field is
        named by this owner then).  An answer other than 0 or 3 may mean a waiter was refused
        (``:w``): the client publishes the wake-up the script would have.  A copy of it that
        may arrive late (it was resent, or its outcome is unknown) would end the owner's next
        hold, which goes by another id for the resend window (:meth:`Holds.alias`).
        """
        removed = int(await sent)
        if copies.resent:
            window = self._services.resend_window_ms / 1000
            self._services.holds.realias(self._keys.lock, owner, request, window)
        return self._read_removed(removed, owner)

    def _read_removed(self, removed: int, owner: str) -> int | None:
        if removed not in (0, 3):
            # In the background: the owner's next call on the lock waits for it.
            self._services.holds.defer(self._keys.lock, owner, self.wake_others())
        return 0 if removed >= 3 else None

    def _last_unknown(self, owner: str, request: int, copies: ReleaseCopies) -> Orphan:
        """The ``orphan`` of a last release: its outcome, once known, read as a release
        script's reply (and the wake-up it owes sent) for the settlement."""
        services = self._services
        settlement = self.settlement
        window = services.resend_window_ms / 1000

        def unknown(work: asyncio.Future[Any]) -> None:
            services.holds.realias(self._keys.lock, owner, request, window)
            outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

            def done(work: asyncio.Future[Any]) -> None:
                if work.cancelled():
                    outcome.cancel()
                elif (error := work.exception()) is not None:
                    outcome.set_exception(error)
                else:
                    outcome.set_result(self._read_removed(int(work.result()), owner))

            work.add_done_callback(done)
            settlement.release_unknown(owner, request, outcome, copies)

        return unknown

    # -- the release made off the loop (aiolock.sync) ----------------------------------------
    #
    # A blocking caller may send the release of the owner's one fault-free hold itself (the
    # plain command, ``ReentrantKind.plain_release``, or :meth:`release_call`), and post the
    # outcome here; see ``Acquiring.first_try_off_loop`` for the first try.

    def releasing_off_loop(self, owner: str, now: float) -> int | None:
        """From any thread: the request id of a release of ``owner``'s one hold (its acquire
        never resent) that its caller sends itself, marked in flight from ``now`` (the loop's
        clock) as :meth:`release_one` marks its own (a renewal answered meanwhile is no
        verdict); or ``None`` when the release must be the loop's (the client is closed, or a
        fault left something on record for the owner).  :meth:`released_off_loop` or
        :meth:`release_failed_off_loop` ends it, on the loop."""
        services = self._services
        if services.closed or not services.holds.quiet(self._keys.lock, owner):
            return None
        services.holds.release_begun(self._registry_key, owner, now)
        return services.owners.next_request()

    def released_off_loop(self, owner: str, began: float, reply: Any, *, by_command: bool) -> None:
        """On the loop: the release :meth:`releasing_off_loop` marked was answered ``reply``,
        read as :meth:`release_one` reads it: the plain command's (the fields it removed, as
        :meth:`_release_by_command`), or the release script's (``by_command=False``)."""
        holds = self._services.holds
        key = self._registry_key
        holds.release_ended(key, owner, began)
        if by_command:
            remaining = self._read_removed(int(reply), owner)
        else:
            self.deliver_reply_grant(reply)
            remaining = holds_left(reply)
        holds.released(key, owner, remaining)
        self.settlement.check_count(owner, 0, remaining)

    def release_failed_off_loop(
        self, owner: str, request: int, began: float, error: Exception | None, *, by_command: bool
    ) -> None:
        """On the loop: the release :meth:`releasing_off_loop` marked failed: ``None``, it
        was never written (its caller goes on to the loop path); else ``error`` left its
        outcome unknown, and settlement completes it, as for a caller of :meth:`release_one`
        that left (the plain command's as :meth:`_last_unknown` hands it over)."""
        holds = self._services.holds
        key = self._registry_key
        if error is not None:
            copies = ReleaseCopies()
            copies.sending(False)
            work: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            work.set_exception(error)
            if by_command:
                self._last_unknown(owner, request, copies)(work)
            else:
                self.settlement.release_unknown(owner, request, work, copies)
        holds.release_ended(key, owner, began)

    # -- releases made for the owner ---------------------------------------------------------

    async def drop_all(self, owner: str) -> bool:
        """Release every hold of ``owner`` on the server; ``True`` once none is left."""
        return await self.settlement.drop_all(owner)

    async def _release_ended(self, hold: Hold) -> None:
        """Release every hold of ``hold``'s owner, whose task ended holding it (see
        :meth:`Holds.tie`); if that fails the lease ends it."""
        try:
            while await self.release_one(hold.owner):
                pass
        except (RedisError, OSError) as exc:
            self._services.holds.forget(hold)
            logger.warning(
                "could not release %r, held by a task that ended; its lease ends it: %r",
                self.name,
                exc,
            )
