"""The plain lock's waiters in one client, and their owners' places in the lock's waiting set.

A release of the plain lock grants it to the first member of the lock's waiting set itself
(``scripts/lock/_waiting.lua``) and publishes ``=<token> <member>`` on the channel of the
member's client (``<lock>:c:<client id>``), where a member is ``<lease ms> <n> <client id>
<owner>``: the owner's client takes the grant with no further call, and no other client wakes.
A client keeps one :class:`Line` per plain lock it waits for:

- the **calls** waiting in it, in the order they entered (:class:`ClientWait`, the wait loop's
  strategy: the tasks of one client are served in order, and a task that arrives while others
  wait parks behind them instead of trying);
- the **places** its owners have in the set (:class:`Place`): an owner enters by a refused try
  of its own, or by the release of a holder of this client while it waits behind (the release
  names the first waiting call whose owner has no place, when none has one: one member per
  client, not one per waiting task).  A member's order is when its call began to wait, by its
  client's clock: across clients, waiters are served about in the order they came (nothing is
  promised: clocks differ, and a newcomer may take a lock that is free).

A grant message wakes the calls of the owner it names, and the first of them takes it
(:class:`LineGrant`, recorded by the kind if it can count on it; else its try takes the grant on
the server).  An owner whose last call leaves without the lock withdraws its place
(``lock/wake.lua``), which also gives back a grant its client never took.

A waiting call parked behind a hold of its own client that the watchdog renews needs no
deadline: the client hears of that hold's end (its release hands the lock over, its loss wakes
one), and the call makes no command while it waits.  Once it ended, they wait no longer than a
grant's lease (:data:`GRANT_LEASE_MS`): the release may have granted the lock to another client
that then died.  Behind another client's hold, a call tries again when the lease its try met
runs out, as an expiry publishes nothing.

A holder's release may be sent from another thread (``aiolock.sync``), and enters the next
owner there: a line's records change under its mutex.  When that release grants the lock to a
thread of the same client whose one call is parked here, the releasing thread claims the grant
(:meth:`Line.claim`) and tells the waiting thread at once, without waiting for the loop.  The
call and its owner's place leave the line then (no release enters it again, nothing withdraws
the grant); the call is marked with the grant, which the first to run of its wait loop and the
releasing thread's post records (:meth:`ClientWait.hand`), and it leaves as granted, however
its wait ends.  The mutex orders the claim against the call's next look at its grants
(:meth:`ClientWait.woken`): a call woken before the claim was not parked, and is not claimed.
A grant message is offered to the same claim first (``Line.answer``, set by aiolock.sync),
on the loop, before it wakes any call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from .._redis.entry import Contention, Entry
from .acquire import countable
from .holds import NameCounters
from .waiting import ChannelWait

if TYPE_CHECKING:
    from .services import Services

__all__ = [
    "GRANT_LEASE_MS",
    "ClientWait",
    "Line",
    "LineEntry",
    "LineGrant",
    "Place",
    "grant_fields",
]

# The longest lease a grant from the waiting set gets (ms): a grant to a waiter whose client
# died blocks the lock no longer.  A waiter that asked for more takes it by a try, which sets
# the lease it asked for; a lease=None hold is renewed early.
GRANT_LEASE_MS: Final = 5000


class LineGrant(NamedTuple):
    """A grant from the waiting set, as its message told it: fencing token ``token``, for
    ``lease_ms``, on behalf of the owner's request ``request``; granted after loop time
    ``since`` (when the client last sent a call that entered the owner, or kept it in).
    ``claimed``: for a thread told of it already (:meth:`Line.claim`), recorded as it is;
    ``hold``: that record, if the claiming thread's post made it before the call looked."""

    token: int
    lease_ms: int
    request: int
    since: float
    claimed: bool = False
    hold: Any = None


class Place:
    """An owner's member in the lock's waiting set, as this client entered it."""

    __slots__ = ("entered", "floor", "grant", "member", "request", "since")

    def __init__(self, member: str, request: int, since: float, *, entered: bool) -> None:
        self.member = member
        self.request = request
        # A grant to it comes after loop time ``since`` (before the call that entered or kept
        # it was sent), with a token above ``floor`` (see Line.next_entry).
        self.since = since
        self.floor = 0
        # A grant a message (or the reply of the release that made it) brought, not taken yet.
        self.grant: LineGrant | None = None
        # Whether a call that enters it was answered (or is in flight): a place whose call
        # failed is entered by the next release of this client, not taken as in the set.
        self.entered = entered


class Line:
    """A client's waiting calls on one plain lock, and its owners' places (module docstring)."""

    __slots__ = (
        "__weakref__",
        "_calls",
        "_carried",
        "_carried_out",
        "_client",
        "_entry_type",
        "_mutex",
        "_places",
        "_time",
        "answer",
        "held_here",
        "trying",
    )

    def __init__(
        self,
        client: str,
        time: Callable[[], float],
        held_here: Callable[[], bool],
        answer: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._client = client
        self._time = time  # the loop's clock, which any thread may read
        # Whether an owner of this client holds the lock with the watchdog (module docstring).
        self.held_here = held_here
        # Sees a grant message first, and tells a thread waiting for it at once (True), by a
        # claim as a thread's release makes (aiolock.sync): then its call is not woken.
        self.answer = answer
        self._mutex = threading.Lock()
        self._calls: dict[ClientWait, None] = {}  # in the order they entered
        self._places: dict[str, Place] = {}
        # Members that releases of this client in flight enter in the set, how many each, and
        # what a withdraw of one waits on (see after_carried).
        self._carried: dict[str, int] = {}
        self._carried_out: dict[str, concurrent.futures.Future[None]] = {}
        self.trying = 0  # calls of this line with a try out
        self._entry_type = functools.partial(LineEntry, line=self)

    @property
    def entry_type(self) -> Callable[[bytes, Contention | None], Entry]:
        """The factory of this line's entry on the lock's channel."""
        return self._entry_type

    def waiting(self) -> bool:
        """Whether calls wait in this line (any thread may ask)."""
        return bool(self._calls)

    def join(self, call: ClientWait) -> None:
        with self._mutex:
            self._calls[call] = None

    def leave(self, call: ClientWait) -> None:
        with self._mutex:
            self._calls.pop(call, None)

    def place_for(self, owner: str, request: int, lease_ms: int) -> tuple[int, str, bool] | None:
        """For a try of ``owner`` with ``request``: the order and member of the owner's place
        (made from them if it has none yet), and whether it had one already; ``None`` when no
        call of the owner waits here (a try that parks nobody)."""
        with self._mutex:
            first = next((call for call in self._calls if call.owner == owner), None)
            if first is None:
                return None
            place = self._places.get(owner)
            if place is not None:
                return first.entered, place.member, True
            member = f"{lease_ms} {request} {self._client} {owner}"
            self._places[owner] = Place(member, request, self._time(), entered=False)
            return first.entered, member, False

    def refused(self, owner: str, sent_at: float) -> None:
        """A try of ``owner`` sent at ``sent_at`` was refused: a grant to its place came
        after it (one that came before, the try would have taken)."""
        with self._mutex:
            place = self._places.get(owner)
            if place is not None:
                place.since = max(place.since, sent_at)
                place.entered = True

    def granted(self, owner: str) -> None:
        """``owner`` holds the lock: its place (if any) is used up."""
        with self._mutex:
            self._places.pop(owner, None)

    def withdraw(self, owner: str) -> str | None:
        """``owner`` stops waiting: its member to withdraw, if it has a place."""
        with self._mutex:
            place = self._places.pop(owner, None)
        return None if place is None else place.member

    def next_entry(
        self,
        releasing: str,
        kept: str,
        next_request: int,
        held: tuple[float, int] | None,
        *,
        kept_ms: int,
    ) -> str:
        """For a release by ``releasing``: the entry (``<order> <kept> <member>``) of the
        first waiting call whose owner should enter the set, in the order of when it began to
        wait; ``+`` when an owner of this line has a place already (the release hands over,
        marked waited for or not), or that place's entry again when the release keeps the set
        alive (``kept`` is no ``-``): a call parked behind a hold of its client tries no more,
        so the set its try entered may have expired since; also when no call that entered the
        place was answered (``kept_ms`` then keeps the set); ``''`` when no call waits behind.

        ``held``: when the releasing hold was last found on the server (loop time) and its
        token.  No grant to a place here was alive then (the lock was that hold's): a grant
        that is, or will be, came after, with a greater token, and a message of one with a
        lesser token is stale (its lease ran out untaken)."""
        with self._mutex:
            if held is not None:
                for place in self._places.values():
                    place.since = max(place.since, held[0])
                    place.floor = max(place.floor, held[1])
            if self._places:
                owner, place = next(iter(self._places.items()))  # one owner per client
                first = next((call for call in self._calls if call.owner == owner), None)
                if first is None or owner == releasing or (kept == "-" and place.entered):
                    return "+"
                place.entered = True
                self._carry(place.member)
                return f"{first.entered} {kept_ms if kept == '-' else kept} {place.member}"
            for call in self._calls:
                if call.owner != releasing and not call.reentering:
                    member = f"{call.lease_ms} {next_request} {self._client} {call.owner}"
                    place = Place(member, next_request, self._time(), entered=True)
                    self._places[call.owner] = place
                    self._carry(member)
                    return f"{call.entered} {kept} {member}"
        return ""

    def _carry(self, member: str) -> None:
        """A release about to be sent enters ``member`` (under the mutex)."""
        self._carried[member] = self._carried.get(member, 0) + 1

    def carried(self, entry: str) -> None:
        """The release that carried ``entry`` (:meth:`next_entry`'s) was answered, refused,
        or its outcome is settled: it no longer enters anyone.  From any thread."""
        member = _entry_member(entry)
        if member is None:
            return
        with self._mutex:
            count = self._carried.get(member)
            if count is None:
                return
            if count > 1:
                self._carried[member] = count - 1
                return
            del self._carried[member]
            out = self._carried_out.pop(member, None)
        if out is not None:
            out.set_result(None)

    def after_carried(self, member: str) -> concurrent.futures.Future[None] | None:
        """What a withdraw of ``member`` waits for before it is sent: the end of the releases
        of this client in flight that enter it in the set again (``None`` if none is).

        Sent before them, the withdraw would find nothing to take back, and the release then
        grants the lock to a member nobody waits as any more: it would stay blocked for the
        grant's lease (docs/internals.md, "A grant nobody takes")."""
        with self._mutex:
            if member not in self._carried:
                return None
            out = self._carried_out.get(member)
            if out is None:
                out = self._carried_out[member] = concurrent.futures.Future()
            return out

    def not_entered(self, entry: str) -> None:
        """A release carrying ``entry`` (:meth:`next_entry`'s) surely entered nobody: it was
        refused (``NOSCRIPT`` after a restart, say) or released nothing.  The place it made
        is entered by the next release of this client, or by its owner's next try; taken as
        in the set, it would leave the owner out of every hand-off."""
        member = _entry_member(entry)
        if member is None:
            return
        with self._mutex:
            for place in self._places.values():
                if place.member == member:
                    place.entered = False

    def deliver_grant(self, payload: bytes, *, from_reply: bool = False) -> bool:
        """Read a grant message (``=<token> <member>``): wake the calls of the owner it names
        in this client.  ``False`` if it is no grant message.  ``from_reply``: read from the
        reply of the release that made the grant, so the message itself, when it comes, is
        stale."""
        fields = grant_fields(payload)
        if fields is None:
            return False
        token, lease_ms, request, client, owner = fields
        if client != self._client:
            return True  # another client's
        with self._mutex:
            place = self._live_place(owner, request, token)
            if place is None:
                return True
            place.grant = LineGrant(token, lease_ms, place.request, place.since)
            if from_reply:
                place.floor = token
            calls = [call for call in self._calls if call.owner == owner]
        for call in calls:
            call.nudge()
        return True

    def _live_place(self, owner: str, request: bytes, token: int) -> Place | None:
        """The place a grant with ``token`` for ``owner``'s ``request`` is for, if it still
        waits for it (under the mutex)."""
        place = self._places.get(owner)
        if place is None or str(place.request).encode() != request:
            return None  # given up: its withdraw gives the grant back
        if token <= place.floor:
            return None  # stale: made before a hold of this client that has ended since
        return place

    def claim(self, payload: bytes, task: object) -> tuple[ClientWait, LineGrant] | None:
        """From the thread whose release made the grant ``payload`` tells (aiolock.sync):
        take it for the owner's one waiting call, if that call is ``task``'s, parked, and the
        grant can be recorded as it is, so that the call's thread may be told it holds the
        lock now (see the module docstring).  The call leaves the line at once: whatever it
        does until it runs, it waits for nothing more.  ``None``: deliver it as any other."""
        fields = grant_fields(payload)
        if fields is None:
            return None
        token, lease_ms, request, client, owner = fields
        if client != self._client:
            return None
        with self._mutex:
            place = self._live_place(owner, request, token)
            calls = [call for call in self._calls if call.owner == owner]
            if place is None or len(calls) != 1 or calls[0].task is not task:
                return None
            call = calls[0]
            if not call.parked():
                return None
            left = place.since + lease_ms / 1000 - self._time()
            if not countable(lease_ms, call.asked_ms, watchdog=call.watchdog, left=left):
                return None
            del self._places[owner]  # nothing withdraws it now: the thread holds the lock
            del self._calls[call]  # no release enters it again, no grant wakes it
            grant = call.claimed = LineGrant(
                token, lease_ms, place.request, place.since, claimed=True
            )
        return call, grant

    def owner_trying(self, owner: str) -> bool:
        """Whether a try of ``owner`` is out: it may take a grant to the owner on the server
        (its place), so a message's grant must be taken by a try too (see ``_accept``)."""
        if not self.trying:
            return False
        with self._mutex:
            return any(call.trying for call in self._calls if call.owner == owner)

    def take_grant(self, call: ClientWait) -> LineGrant | None:
        """The grant claimed for ``call``, or else the one a message (or a release's reply)
        brought its owner, if any (taken once)."""
        with self._mutex:
            if call.claimed is not None:
                grant, call.claimed = call.claimed, None
                if call.handed is None:
                    return grant
                token, lease_ms, request, since, claimed, _ = grant
                return LineGrant(token, lease_ms, request, since, claimed, call.handed)
            place = self._places.get(call.owner)
            if place is None or place.grant is None:
                return None
            grant, place.grant = place.grant, None
            return grant

    def wake_placed(self) -> bool:
        """Wake the calls of the owners with a place: a grant published before this client's
        subscription was lost, and their try takes it.  ``False`` if none has a place."""
        with self._mutex:
            calls = [call for call in self._calls if call.owner in self._places]
        for call in calls:
            call.nudge()
        return bool(calls)


class LineEntry(Entry):
    """The plain lock's channel in one client: a grant message names the owner it wakes
    (:meth:`Line.deliver_grant`); any other message (``forced``) wakes one waiter here, as in
    every client; the confirmation of the SUBSCRIBE also wakes the owners with a place."""

    __slots__ = ("line",)

    def __init__(self, channel: bytes, contention: Contention | None, line: Line) -> None:
        super().__init__(channel, contention)
        self.line = line

    def deliver(self, payload: bytes) -> None:
        if payload[:1] != b"=":
            self.wake_one()
            return
        answer = self.line.answer
        if answer is not None and answer(payload):
            return
        if not self.line.deliver_grant(payload):
            self.wake_one()

    def confirm(self) -> None:
        # The owners with a place try (a grant may have been published before); with none,
        # one waiter tries, as after any message.
        self.confirmed = True
        if not self.line.wake_placed():
            self.wake_one()

    def hold_ended(self) -> None:
        # Its release granted the lock to the first owner of the set, which may be another
        # client's: the calls parked behind it with no deadline wait no longer than that
        # grant's lease (its client may have died); a grant to this client wakes them first.
        self.bound(asyncio.get_running_loop().time() + GRANT_LEASE_MS / 1000)


class ClientWait(ChannelWait):
    """:class:`ChannelWait` in a :class:`Line`: woken by a grant to its owner, which
    :meth:`woken` hands to the wait loop."""

    __slots__ = (
        "asked_ms",
        "claimed",
        "entered",
        "handed",
        "lease_ms",
        "line",
        "owner",
        "reentering",
        "task",
        "trying",
        "watchdog",
    )

    def __init__(
        self,
        services: Services,
        channel: str,
        counters: NameCounters,
        *,
        reentering: bool,
        line: Line,
        owner: str,
        asked_ms: int,
        watchdog: bool,
    ) -> None:
        # A call that a releasing thread claimed (Line.claim) is out of the line at once, but
        # counts among the contenders until its wait loop leaves, which may be after its thread
        # released the lock: a newcomer parked behind it would wait for a hand-over that came
        # and went.  So the calls in the line say whether others wait.
        super().__init__(
            services,
            channel,
            counters,
            reentering=reentering,
            entry_type=line.entry_type,
            others=line.waiting(),
        )
        self.line = line
        self.owner = owner
        self.asked_ms = asked_ms  # the lease it asked for (the watchdog's, for lease=None)
        self.lease_ms = min(asked_ms, GRANT_LEASE_MS)  # the lease a grant to it from the set gets
        self.watchdog = watchdog  # the hold it gets is renewed (lease=None)
        # A grant claimed for it by the thread that released the lock (see Line.claim), and
        # the hold that thread's post recorded for it, if the call had not taken it first.
        self.claimed: LineGrant | None = None
        self.handed: Any = None
        self.task = asyncio.current_task()  # the call's (a thread's blocking call, say)
        self.reentering = reentering
        self.trying = False  # a try of this call is out
        # When it began to wait (the client's clock, µs): its owner's order in the waiting set.
        self.entered = time.time_ns() // 1_000
        line.join(self)

    def turn(self) -> None:
        self.trying = True
        self.line.trying += 1

    def tried(self) -> None:
        self.trying = False
        self.line.trying -= 1

    def park(self, pause: float) -> asyncio.Future[Any]:
        # Behind a hold of this client that the watchdog renews: no deadline (module docstring).
        return super().park(math.inf if self.line.held_here() else pause)

    def woken(self) -> LineGrant | None:
        super().woken()
        return self.line.take_grant(self)

    def granted(self, until: float) -> None:
        if self.handed is not None:
            return  # told by the post that recorded the claimed grant (which may have ended)
        # A renewed hold: the others wait for its end, which this client hears of.
        super().granted(math.inf if self.watchdog else until)
        self.line.granted(self.owner)

    def handed_over(self) -> bool:
        # Claimed for its thread, which holds the lock (recorded by whichever of this call and
        # the claiming thread's post comes first): never withdraw its owner's place, which is
        # the owner's next call's by now.
        return self.claimed is not None or self.handed is not None

    def hand(self, hold: Any) -> None:
        """On the loop: the claimed grant, not taken by this call yet, was recorded as
        ``hold`` (by the post of the thread that claimed it, in that thread's order): the
        call is told it got the lock, and leaves with it when it next runs, recording
        nothing (the hold may have ended by then)."""
        if self.claimed is None:
            return  # taken by the call itself, which recorded it
        self.granted(hold.expires_at)
        self.handed = hold
        self.nudge()

    def leave(self, granted: bool) -> None:
        self.line.leave(self)
        super().leave(granted)


def grant_fields(payload: bytes) -> tuple[int, int, bytes, str, str] | None:
    """A grant message's token, lease (ms), request, client id and owner; ``None`` if
    ``payload`` is not one (``=<token> <member>``, a member ``<lease ms> <n> <client> <owner>``)."""
    token, _, member = payload[1:].partition(b" ")
    fields = member.split(b" ", 3)
    if len(fields) != 4 or not token.isdigit() or not fields[0].isdigit():
        return None
    client, owner = (field.decode(errors="replace") for field in fields[2:])
    return int(token), int(fields[0]), fields[1], client, owner


def _entry_member(entry: str) -> str | None:
    """The member an entry of :meth:`Line.next_entry` enters (``<order> <kept> <member>``);
    ``None`` for one that enters nobody (``''``, ``+``)."""
    parts = entry.split(" ", 2)
    return parts[2] if len(parts) == 3 else None
