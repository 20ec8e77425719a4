"""The fair lock's queue on the server: its keys, and what a member of it says.

The layout is the scripts' (``scripts/fair/_queue.lua``): a list of waiters, first in line at
the head, each member ``'<lease ms> <request n> <wait ms> <deadline> <owner>'``.  Past its
try's deadline (server ms) a waiter is live while its client's alive key lasts
(``<alive><client id>``).  This module is the one place in Python that reads a member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .._core.keys import LockKeys

__all__ = ["FairKeys", "Member", "parse_member"]


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
    wait_ms: int
    deadline: int  # the server time (ms) until which the try that queued it keeps it in line
    owner: str


def parse_member(member: str) -> Member | None:
    """The fields of a member of the queue, or ``None`` for a member of another shape."""
    parts = member.split(" ", 4)
    if len(parts) < 5 or not all(part.isdigit() for part in parts[:4]):
        return None
    return Member(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4])
