"""Where a moment of the server's clock falls on this client's loop clock: a safe lower bound.

A fair lock's release may grant the lock to a waiter itself (``fair/_queue.lua``); the waiter
hears of it by a message that names the server time of the grant, and must count the lease
from a moment no later than the grant's on its own clock, whatever the message's delay.  A
call sent at loop time ``t0`` whose script read the server's clock as ``S`` (ms) and whose
reply came at ``t1`` says that ``S`` happened within ``[t0, t1]``.  Scripts read the clock in
whole milliseconds, rounded down: the moment read as ``S`` fell before ``S + 1`` and the one
read as ``S'`` at or after ``S'``.  So every server moment ``S'`` happened no earlier than
``t0 + (S' - S - 1) / 1000``, up to the rate at which the two clocks drift apart, which the
bound pays for by ageing (:data:`DRIFT`).

The other side of the same sample bounds the server's clock from below: ``S`` happened no
later than ``t1``, so at loop time ``t`` the server's clock reads at least
``S + (t - t1) * 1000``, aged the same way.  A client that releases a fair lock stamps the grant
it makes with that bound instead of the server reading its clock (one command less), and the
waiter's lower bound of that earlier moment is earlier still: the lease it counts still ends
before the server's.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["DRIFT", "ServerClock"]

DRIFT: Final = 1e-3
"""How fast the server's and the loop's clocks may drift apart (seconds per second), for which
a sample's bound is aged: NTP keeps real clocks two orders of magnitude closer."""


class ServerClock:
    """The latest sample of one server's clock against the loop's (see the module docstring).

    Invariant: ``offset`` is ``None`` (no sample yet) or ``t0 - (S + 1) / 1000`` of the latest
    sample, taken at loop time ``at``, and ``read_at - S / 1000`` is ``since``, its reply read
    at loop time ``read_at``; a later sample replaces it, so that a server the name moved to (a
    Cluster slot migrated) counts from its own clock after one call.
    """

    __slots__ = ("_at", "_offset", "_read_at", "_since")

    def __init__(self) -> None:
        self._offset: float | None = None
        self._at = 0.0
        self._since = 0.0
        self._read_at = 0.0

    def __repr__(self) -> str:
        state = "no sample" if self._offset is None else f"offset={self._offset:.6f}"
        return f"<ServerClock [{state}]>"

    def sample(self, sent_at: float, server_ms: int, read_at: float) -> None:
        """A call written at loop time ``sent_at`` read the server's clock as ``server_ms``,
        and its reply was read at loop time ``read_at``."""
        self._offset = sent_at - (server_ms + 1) / 1000  # read rounded down: before S + 1
        self._at = sent_at
        self._since = read_at - server_ms / 1000
        self._read_at = read_at

    def age(self, now: float) -> float:
        """Seconds since the latest sample's reply (``inf`` with none)."""
        return math.inf if self._offset is None else now - self._read_at

    def server_ms_at_least(self, now: float) -> int | None:
        """A lower bound of the server's clock in ms at loop time ``now``, or ``None`` with
        no sample."""
        if self._offset is None:
            return None
        elapsed = max(now - self._read_at, 0.0)
        return math.floor((now - self._since - DRIFT * elapsed) * 1000)

    def lower_bound(self, server_ms: int, now: float) -> float | None:
        """The earliest loop time the server moment ``server_ms`` may have happened at (``now``:
        the loop time, for ageing), or ``None`` with no sample."""
        if self._offset is None:
            return None
        return server_ms / 1000 + self._offset - DRIFT * max(now - self._at, 0.0)
