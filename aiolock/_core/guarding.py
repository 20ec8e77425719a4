"""What a :class:`~aiolock.LockGuard` asks of a kind's hold: extend its lease, or run a
transaction under it (the engine's :class:`Guarding` part)."""

from __future__ import annotations

import asyncio

from ..errors import LockLostError
from .guard import Holding
from .holds import CLOCK_MARGIN, Hold
from .release import Releasing
from .transaction import TransactionContext

__all__ = ["Guarding"]


class Guarding(Releasing):
    """A guard's extend and transaction (see the module docstring)."""

    __slots__ = ()

    def _transaction(self, holding: Holding[int]) -> TransactionContext:
        assert isinstance(holding, Hold)
        services = self._services
        if services.closed:
            raise RuntimeError("the aiolock client is closed")
        return TransactionContext(
            ready=services.check_open,  # entered on the client's loop (made anywhere: no I/O)
            name=self.name,
            hold=holding,
            check=self._transact_call(holding),
            calls=services.calls,
            holds=services.holds,
            table=services.command_table(),
            cluster=services.cluster,
        )

    async def _extend(self, holding: Holding[int], lease: float) -> None:
        assert isinstance(holding, Hold)
        if holding.watchdog:
            raise ValueError(
                f"{self.kind} {self.name!r} was acquired with lease=None: the watchdog renews "
                "it, so it has no lease to extend (acquire it with lease=<seconds> to extend it)"
            )
        if holding.check_lost() or holding.ended:
            raise LockLostError(
                f"{self.kind} {self.name!r} (token {holding.token}) cannot be extended: it is no "
                f"longer held ({holding.lost_reason or 'released'})"
            )
        services = self._services.check_open()
        sent = asyncio.get_running_loop().time()
        # Until the reply the server has the old lease or the new one, so the client counts on
        # the shorter (never longer than the server has it): a cancelled extend leaves that.
        services.holds.cap(holding, sent + lease - CLOCK_MARGIN)
        # In flight, its reply decides whether the lease ran out meanwhile, not the timer: a
        # hold the server extends must not be counted lost (and left there with no holder).
        with services.holds.answering(holding):
            reply = await services.calls.run(*self._extend_call(holding, round(lease * 1000)))
        if int(reply) and holding.lost:
            # Extended on the server, lost here all the same (forced by this client as the
            # call flew): nobody counts on it, so it goes back.
            services.holds.defer(self._keys.lock, holding.owner, self._give_back(holding.owner))
        if not int(reply) or holding.lost:
            if not holding.ended:  # (a release that ran meanwhile ended it: no loss)
                services.holds.lose(holding, "it was no longer held when extend() asked the server")
            raise LockLostError(
                f"{self.kind} {self.name!r} (token {holding.token}) was lost before extend(): "
                f"{holding.lost_reason or 'released meanwhile'}"
            )
        services.holds.relet(holding, sent, lease)

    async def _give_back(self, owner: str) -> None:
        """Release every hold of ``owner`` on the server: one the client no longer counts on."""
        await self.drop_all(owner)
