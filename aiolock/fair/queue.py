"""The fair lock's queue on the server: its keys, and what a member of it says.

The layout is the scripts' (``scripts/fair/_queue.lua``): a list of waiters, first in line at
the head, each member ``'<lease ms> <request n> <wait ms> <deadline> <owner>'``.  Past its
try's deadline (server ms) a waiter is live while its client's alive key lasts
(``<alive><client id>``).  This module is the one place in Python that reads a member: for
``aiolock inspect`` (:func:`describe`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from redis.asyncio.client import Pipeline

from .._core.inspection import (
    ServerState,
    Snapshot,
    Waiter,
    as_int,
    as_str,
    hash_holders,
    queue_fencing_counter,
    seconds,
    server_ms,
)
from .._core.keys import LockKeys

__all__ = ["FairKeys", "Member", "describe", "parse_member"]


@dataclass(frozen=True, slots=True)
class FairKeys(LockKeys):
    """The plain lock's keys, plus the queue: ``queue`` (a list of waiters, each with what a
    grant from the queue needs and the server time in ms until which the try that queued it
    keeps it in line: ``scripts/fair/_queue.lua``), the wake-up channels
    ``<wake_prefix><client id>`` and the alive keys ``<alive><client id>`` of the lock's
    slot; ``channel`` is this client's."""

    queue: str
    wake_prefix: str
    alive: str

    def script_keys(self) -> tuple[str, ...]:
        return (self.lock, self.meta, self.queue, self.wake_prefix, self.fence, self.alive)


class Member(NamedTuple):
    """One member of the queue, as ``scripts/fair/_queue.lua`` writes it."""

    lease_ms: int
    request: int
    wait_timeout_ms: int  # the client's fair_wait_timeout, in ms
    deadline: int  # the server time (ms) until which the try that queued it keeps it in line
    owner: str


def parse_member(member: str) -> Member | None:
    """The fields of a member of the queue, or ``None`` for a member of another shape."""
    parts = member.split(" ", 4)
    if len(parts) < 5 or not all(part.isdigit() for part in parts[:4]):
        return None
    return Member(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4])


async def describe(keys: FairKeys, snapshot: Snapshot) -> ServerState:
    """The lock's holders and its live waiters in line, first in line first (an owner's first
    member), each with the seconds until the server drops it; its waiters subscribe to no
    channel of the lock (their places are in the queue), so no subscribers are counted."""

    def reads(pipe: Pipeline) -> None:
        pipe.time()
        pipe.hgetall(keys.lock)
        pipe.pttl(keys.lock)
        queue_fencing_counter(pipe, keys)
        pipe.lrange(keys.queue, 0, -1)

    (time, fields, pttl, counter, queue), _ = await snapshot(reads)
    now = server_ms(time)
    ends: dict[str, int] = {}  # in line, first in line first
    for member in map(parse_member, map(as_str, queue)):
        if member is not None and member.owner not in ends:
            ends[member.owner] = member.deadline
    # Past its try's deadline, a waiter is live while its client's alive key lasts; one that
    # is neither has vanished: the next look drops it.
    clients = sorted({owner.partition(":")[0] for owner, end in ends.items() if end <= now})
    if clients:

        def alive_reads(pipe: Pipeline) -> None:
            for client_id in clients:
                pipe.pttl(keys.alive + client_id)

        alive, _ = await snapshot(alive_reads)
        lasts = {c: now + int(ms) for c, ms in zip(clients, alive, strict=True) if int(ms) > 0}
        for owner, end in ends.items():
            ends[owner] = max(end, lasts.get(owner.partition(":")[0], 0))
    live = [owner for owner, end in ends.items() if end > now]
    waiters = [
        Waiter(owner, position, seconds(ends[owner] - now))
        for position, owner in enumerate(live, 1)
    ]
    return ServerState(hash_holders(fields, pttl), as_int(counter), waiters)
