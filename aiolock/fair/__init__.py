"""The fair lock, in one package: first come, first served across every client.

- :mod:`~aiolock.fair.lock`: :class:`AsyncFairLock`, the kind: its keys, its scripts
  (``scripts/fair/``), and how a grant a message brought is recorded;
- :mod:`~aiolock.fair.queue`: the queue's keys and what a member of it says (also read by
  ``aiolock inspect``);
- :mod:`~aiolock.fair.entry`: the hand-off messages on a client's channel of the lock, read
  by the channel's entry (the transport carries them, and reads none);
- :mod:`~aiolock.fair.waiting`: how one waiting call parks until a message names it, and the
  bound on the tries in flight;
- :mod:`~aiolock.fair.watch` and :mod:`~aiolock.fair.alive`: how a client keeps its
  parked waiters in line with one call for all of them.
"""

from .alive import AliveKey as AliveKey
from .lock import AsyncFairLock as AsyncFairLock
from .queue import FairKeys as FairKeys
from .waiting import Turns as Turns
from .watch import QueueWatch as QueueWatch

__all__ = ["AliveKey", "AsyncFairLock", "QueueWatch", "Turns"]
