"""``AsyncSpinLock``: the reentrant lock for deployments without pub/sub.

Some proxies and managed services do not offer SUBSCRIBE.  This kind has the plain lock's
semantics and scripts, under keys of its own, and never subscribes: between tries it sleeps a
full-jitter exponential backoff (:class:`~aiolock._core.waiting.Backoff`), bounded by the lock's
remaining lease and the caller's deadline.
"""

from __future__ import annotations

from typing import ClassVar

from ._core.services import Services
from ._core.waiting import Backoff, WaitStrategy
from .lock import ReentrantKind

__all__ = ["AsyncSpinLock"]


class AsyncSpinLock(ReentrantKind):
    """A reentrant lock that waits by sleeping, never by subscribing.

    Create it with :meth:`aiolock.Client.spin_lock`.  Everything :class:`~aiolock.AsyncRLock`
    offers works the same (owner per task or explicit, leases and the watchdog, fencing tokens,
    loss reporting); only waiting differs.  Each pause between tries is drawn uniformly from
    ``[0, delay]``, where ``delay`` starts at ``initial_delay`` and doubles up to ``max_delay``
    ("full jitter"), and is never longer than the lock's remaining lease.  It costs more Redis
    calls than a pub/sub wait under contention, and a release is noticed up to one pause late.
    """

    __slots__ = ("_initial_delay", "_max_delay")

    kind: ClassVar[str] = "spin"

    def __init__(
        self,
        services: Services,
        name: str,
        owner: str | None,
        *,
        initial_delay: float,
        max_delay: float,
    ) -> None:
        super().__init__(services, name, owner)
        self._initial_delay = initial_delay
        self._max_delay = max_delay

    def _published(self) -> tuple[str, ...]:
        return ()  # nobody subscribes: a release publishes nothing

    def _wait_strategy(self, owner: str, lease: float | None) -> WaitStrategy:
        return Backoff(
            self._services, self._counters, initial=self._initial_delay, maximum=self._max_delay
        )
