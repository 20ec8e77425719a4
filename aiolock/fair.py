"""``AsyncFairLock``: first come, first served across every client, with the queue in Redis.

A kind on the shared base (:mod:`aiolock._base`) with the scripts in ``scripts/fair/``: the
lock hash of the plain lock, plus a queue of waiting owners (tickets) and their deadlines on
the server's clock.  A try that does not get the lock takes (or keeps) the owner's place and
moves its deadline on; a release wakes exactly the next waiter, with one message on the
channel of that waiter's client, naming it (:class:`~aiolock._waiting.NamedWait`), so there is
no herd however many clients wait, and no channel per waiting task.

Waiters that give up leave the queue at once (a ``leave`` script, settled in the background
like any call whose caller has gone); one whose process died stops moving its deadline on and
is dropped by the next try or release after ``fair_wait_timeout``.  A live waiter tries again
at least every third of it, so it is never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from . import _scripts
from ._base import Call, LockKind, release_args
from ._keys import LockKeys
from ._services import Services
from ._waiting import NamedWait, Waiting

__all__ = ["AsyncFairLock"]


@dataclass(frozen=True, slots=True)
class FairKeys(LockKeys):
    """The plain lock's keys, plus the queue: ``queue`` (owner -> ticket), ``deadlines`` (owner
    -> server time in ms), and the wake-up channels ``<wake_prefix><client id>``; ``channel``
    is this client's."""

    queue: str
    deadlines: str
    wake_prefix: str

    def script_keys(self) -> tuple[str, ...]:
        return (self.lock, self.meta, self.queue, self.deadlines, self.wake_prefix, self.fence)


class AsyncFairLock(LockKind):
    """A reentrant lock granted in the order waiters first asked, across all clients.

    Create it with :meth:`aiolock.Client.fair_lock`; it offers every call of
    :class:`~aiolock.AsyncRLock` with the same semantics.  Choose it when waiters in many
    processes contend for one lock: each hand-off costs one message to one client, where the
    plain lock wakes one waiter in every client and lets them race.

    A waiter that gives up leaves the queue at once; one that vanished (its process killed)
    delays those behind it by at most the client's ``fair_wait_timeout``.  Deadlines in the
    queue use the server's clock, so clock skew between clients cannot reorder or stall it.
    """

    __slots__ = ()

    kind: ClassVar[str] = "fair"
    _renew = _scripts.LOCK_RENEW

    @classmethod
    def _build_keys(cls, services: Services, name: str) -> LockKeys:
        base = LockKeys.build(services.key_prefix, name, cls.kind, cluster=services.cluster)
        wake_prefix = f"{base.lock}:c:"
        return FairKeys(
            lock=base.lock,
            meta=base.meta,
            fence=base.fence,
            channel=wake_prefix + services.owners.client_id,
            queue=f"{base.lock}:q",
            deadlines=f"{base.lock}:qd",
            wake_prefix=wake_prefix,
        )

    def _script_keys(self) -> tuple[str, ...]:
        keys = self._keys
        assert isinstance(keys, FairKeys)
        return keys.script_keys()

    def _attempt(self, owner: str, request: int, lease_ms: int) -> Call:
        wait_ms = round(self._services.fair_wait_timeout * 1000)
        return _scripts.FAIR_ACQUIRE, self._script_keys(), (lease_ms, owner, request, wait_ms)

    def _release_call(self, owner: str, request: int, undo: int | None) -> Call:
        args = release_args(owner, request, undo)
        return _scripts.FAIR_RELEASE, self._script_keys(), args

    def _force_call(self) -> Call:
        return _scripts.FAIR_FORCE, self._script_keys(), ()

    def _waiting(self, owner: str) -> Waiting:
        return NamedWait(self._services, self._keys.channel, self._counters, owner)

    def _leave_call(self, owner: str) -> Call:
        return _scripts.FAIR_LEAVE, self._script_keys(), (owner,)
