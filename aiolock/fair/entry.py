"""The fair lock's hand-off messages: one channel per client, each message naming its waiter.

A release of the fair lock grants the lock to the next waiter itself and publishes one message
on the channel of that waiter's client (``<lock>:c:<client id>``, see ``scripts/fair/_queue.lua``).
The transport (:mod:`aiolock._redis.pubsub`) carries the message to the channel's entry; this
module reads it.  The messages, each naming an owner:

- ``=<token> <lease ms> <server time ms> <request n> <owner>``: a grant from the queue
  (:class:`Grant`), which wakes the owner's calls and is kept until one of them takes it;
- ``+<ms> <owner>``: a bound: the hold in front of the owner ends within that many ms;
- ``<owner>``: a wake-up: the owner tries (it lost its place, or is next with no grant).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import NamedTuple

from .._redis.entry import Contention, Entry

__all__ = ["Grant", "NamedCall", "NamedEntry"]


class Grant(NamedTuple):
    """A grant from the fair lock's queue, as its message told it (``=<token> <lease ms>
    <server time ms> <request n> <owner>``, see ``fair/_queue.lua``): the lock was granted to
    the owner at ``server_ms`` of the server's clock, for ``lease_ms``, on behalf of its
    acquire request ``request``."""

    token: int
    lease_ms: int
    server_ms: int
    request: int


class NamedCall:
    """One waiting call on a :class:`NamedEntry`: its owner's name, and where the call is.

    Calls that name the same owner are one owner, and each is woken by a message naming it.
    """

    __slots__ = ("bound", "name", "parked")

    def __init__(self, name: str) -> None:
        self.name = name
        # Its parked future; ``None`` between two parks; ``True``: woken before it parked.
        self.parked: asyncio.Future[bool] | bool | None = None
        self.bound = math.inf  # the loop time its next park ends by at the latest


class NamedEntry(Entry):
    """A channel whose messages name the one waiter to wake (the fair lock's hand-off).

    Each waiting call registers under its owner's name for the whole of its wait (:meth:`add`
    .. :meth:`discard`), so that a message naming it while it is between two tries is kept for
    its next park instead of lost; an owner with several calls has each of them woken.  A bound
    message (``+<ms> <owner>``) shortens that owner's parks instead of waking it.  A grant
    message (``=<token> ...``, :class:`Grant`) wakes its owner's calls and is kept until one of
    them takes it (:meth:`take_grant`) or the last leaves; one for an owner not waiting here is
    dropped (its withdraw takes the grant back on the server).  Anything else that is not a
    named hand-off (the confirmation of the SUBSCRIBE, a reconnect, a loss) wakes every waiter:
    each tries, and only the next in the queue can win.
    """

    __slots__ = ("_grants", "_named")
    expires_one = False  # each deadline is its own owner's bound

    def __init__(self, channel: bytes, contention: Contention | None = None) -> None:
        super().__init__(channel, contention)
        # owner -> its one waiting call, or a list of them when it has several (two tasks that
        # share an explicit owner).  Keyed by the owner's id as the call has it (no copy per
        # waiter; a message decodes).
        self._named: dict[str, NamedCall | list[NamedCall]] = {}
        # owner -> the last grant from the queue a message brought it, not taken yet.
        self._grants: dict[str, Grant] = {}

    def add(self, call: NamedCall) -> None:
        present = self._named.get(call.name)
        if present is None:
            self._named[call.name] = call
        elif isinstance(present, list):
            present.append(call)
        else:
            self._named[call.name] = [present, call]

    def discard(self, call: NamedCall) -> None:
        present = self._named.get(call.name)
        if present is call:
            del self._named[call.name]
            self._grants.pop(call.name, None)
        elif isinstance(present, list) and call in present:
            present.remove(call)  # a grant stays for the owner's other calls
            if len(present) == 1:
                self._named[call.name] = present[0]

    def _calls(self, name: str) -> Sequence[NamedCall]:
        present = self._named.get(name)
        if present is None:
            return ()
        return present if isinstance(present, list) else (present,)

    def names(self) -> list[str]:
        """The owners waiting here (parked, or between two tries)."""
        return list(self._named)

    def take_grant(self, name: str) -> Grant | None:
        """The grant a message brought the owner ``name`` since it last took one, if any."""
        return self._grants.pop(name, None) if self._grants else None

    def deliver(self, payload: bytes) -> None:
        if payload[:1] == b"=":  # '=<token> <lease ms> <server ms> <n> <owner>': a grant
            fields = payload[1:].split(b" ", 4)
            if len(fields) == 5 and all(field.isdigit() for field in fields[:4]):
                owner = fields[4].decode(errors="replace")
                if owner in self._named:
                    self._grants[owner] = Grant(*(int(field) for field in fields[:4]))
                    self.wake_named(owner)
            return
        ms, _, name = payload.partition(b" ")
        if ms[:1] == b"+" and ms[1:].isdigit():  # '+<ms> <owner>': a bound, not a hand-off
            self.bound_named(name.decode(errors="replace"), int(ms[1:]) / 1000)
        else:  # anything else names the owner to wake (or nobody waiting here)
            self.wake_named(payload.decode(errors="replace"))

    def bound_named(self, name: str, seconds: float) -> None:
        """The hold in front of the owner ``name`` ends within ``seconds`` (the lock was just
        granted to the waiter before it): its calls park no longer than that, now or at their
        next park.

        Counted from the message's arrival, after the grant: never before that hold's end.
        """
        calls = self._calls(name)
        if not calls:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        for call in calls:
            waiter = call.parked
            if isinstance(waiter, asyncio.Future) and not waiter.done():
                loop.call_at(until, self.expire, waiter)
            else:
                call.bound = min(call.bound, until)

    def wake_named(self, name: str) -> None:
        """Wake the calls of the owner ``name`` waiting here (each at its next park if it is
        not parked)."""
        for call in self._calls(name):
            self.wake_call(call)

    def wake_call(self, call: NamedCall) -> None:
        """Wake one waiting call (at its next park if it is not parked)."""
        waiter = call.parked
        if isinstance(waiter, asyncio.Future) and not waiter.done():
            self.wake(waiter)
            call.parked = None
        else:
            call.parked = True

    def wake_one(self) -> None:
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every parked waiter, and mark those between two tries as woken: exactly one
        more try each (no spare wake-ups, unlike :meth:`Entry.wake_all`)."""
        for present in self._named.values():
            for call in present if isinstance(present, list) else (present,):
                waiter = call.parked
                if isinstance(waiter, asyncio.Future) and not waiter.done():
                    self.wake(waiter)
                    call.parked = None
                elif waiter is None:
                    call.parked = True

    def park_named(self, call: NamedCall, deadline: float) -> asyncio.Future[bool]:
        """:meth:`Entry.park` for ``call``, which a message naming its owner wakes."""
        if call.parked is True:
            call.parked = None
            woken: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            woken.set_result(True)
            return woken
        bound, call.bound = call.bound, math.inf
        waiter = call.parked = self.park(min(deadline, bound))
        return waiter
