"""The Lua scripts, loaded once from package files (``_calls`` runs them by SHA).

They live in ``scripts/<kind>/<operation>.lua``, each opening with its KEYS, ARGV and returns.
They publish with classic ``PUBLISH``; on a Cluster whose nodes have sharded pub/sub the
router runs their :func:`sharded` variant instead, which publishes with ``SPUBLISH``.  A variant
(a second source, with its own SHA) rather than an ARGV flag: the command is fixed per client,
so no call carries it and no script branches on it, the scripts keep one text to read, and the
choice lives in the one place that knows the topology (:mod:`aiolock._redis.cluster`).  Their
channels share the hash tag of their keys, so a SPUBLISH goes to the slot the script runs in.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

__all__ = [
    "FAIR_ACQUIRE",
    "FAIR_FORCE",
    "FAIR_KEEP",
    "FAIR_LAST",
    "FAIR_RELEASE",
    "FAIR_WITHDRAW",
    "LATCH_COUNT_DOWN",
    "LATCH_SET",
    "LOCK_ACQUIRE",
    "LOCK_EXTEND",
    "LOCK_FORCE",
    "LOCK_RELEASE",
    "LOCK_RENEW",
    "LOCK_TRANSACT",
    "LOCK_WAKE",
    "READ",
    "RW_EXTEND_READ",
    "RW_EXTEND_WRITE",
    "RW_FORCE",
    "RW_READ",
    "RW_RELEASE_READ",
    "RW_RELEASE_WRITE",
    "RW_RENEW_READ",
    "RW_RENEW_WRITE",
    "RW_STATE",
    "RW_TRANSACT_READ",
    "RW_TRANSACT_WRITE",
    "RW_WRITE",
    "RW_WITHDRAW",
    "SEMAPHORE_ACQUIRE",
    "SEMAPHORE_EXTEND",
    "SEMAPHORE_HELD",
    "SEMAPHORE_RELEASE",
    "SEMAPHORE_RENEW",
    "SEMAPHORE_SET_PERMITS",
    "SEMAPHORE_TRANSACT",
    "SEMAPHORE_VOID",
    "VOID",
    "Call",
    "Script",
    "sharded",
]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, kind: str, operation: str) -> Script:
        """Load ``scripts/<kind>/<operation>.lua``; a line ``--@include <folder>/<file>`` is
        replaced by ``scripts/<folder>/<file>.lua`` (helpers shared by several scripts)."""
        scripts = resources.files(__package__).joinpath("scripts")
        lines = scripts.joinpath(kind, f"{operation}.lua").read_text("utf-8").splitlines(True)
        source = "".join(
            scripts.joinpath(f"{line.split()[1]}.lua").read_text("utf-8")
            if line.startswith(_INCLUDE)
            else line
            for line in lines
        )
        return cls(f"{kind}/{operation}", source, hashlib.sha1(source.encode()).hexdigest())


Call = tuple[Script, tuple[str, ...], tuple[Any, ...]]
"""A script call, ready to run: the script, its KEYS and its ARGV."""


_INCLUDE = "--@include "
_PUBLISH = "redis.call('PUBLISH', "


@functools.cache
def sharded(script: Script) -> Script:
    """``script`` with every ``PUBLISH`` made a ``SPUBLISH``: the message reaches only the
    node that serves the channel's slot (the lock's own slot: channels share its hash tag),
    instead of being broadcast over the whole Cluster bus."""
    if _PUBLISH not in script.source:
        return script
    source = script.source.replace(_PUBLISH, "redis.call('SPUBLISH', ")
    return Script(script.name, source, hashlib.sha1(source.encode()).hexdigest())


READ = Script.load("common", "read")
VOID = Script.load("common", "void")

LOCK_ACQUIRE = Script.load("lock", "acquire")
LOCK_RELEASE = Script.load("lock", "release")
LOCK_RENEW = Script.load("lock", "renew")
LOCK_FORCE = Script.load("lock", "force")
LOCK_TRANSACT = Script.load("lock", "transact")
LOCK_EXTEND = Script.load("lock", "extend")
LOCK_WAKE = Script.load("lock", "wake")

FAIR_ACQUIRE = Script.load("fair", "acquire")
FAIR_RELEASE = Script.load("fair", "release")
FAIR_LAST = Script.load("fair", "last")
FAIR_WITHDRAW = Script.load("fair", "withdraw")
FAIR_FORCE = Script.load("fair", "force")
FAIR_KEEP = Script.load("fair", "keep")

LATCH_SET = Script.load("latch", "set")
LATCH_COUNT_DOWN = Script.load("latch", "count_down")

SEMAPHORE_ACQUIRE = Script.load("semaphore", "acquire")
SEMAPHORE_RELEASE = Script.load("semaphore", "release")
SEMAPHORE_RENEW = Script.load("semaphore", "renew")
SEMAPHORE_HELD = Script.load("semaphore", "held")
SEMAPHORE_VOID = Script.load("semaphore", "void")
SEMAPHORE_TRANSACT = Script.load("semaphore", "transact")
SEMAPHORE_EXTEND = Script.load("semaphore", "extend")
SEMAPHORE_SET_PERMITS = Script.load("semaphore", "set_permits")

RW_READ = Script.load("rw", "read")
RW_WRITE = Script.load("rw", "write")
RW_RELEASE_READ = Script.load("rw", "release_read")
RW_RELEASE_WRITE = Script.load("rw", "release_write")
RW_RENEW_READ = Script.load("rw", "renew_read")
RW_RENEW_WRITE = Script.load("rw", "renew_write")
RW_FORCE = Script.load("rw", "force")
RW_WITHDRAW = Script.load("rw", "withdraw")
RW_STATE = Script.load("rw", "state")
RW_TRANSACT_READ = Script.load("rw", "transact_read")
RW_TRANSACT_WRITE = Script.load("rw", "transact_write")
RW_EXTEND_READ = Script.load("rw", "extend_read")
RW_EXTEND_WRITE = Script.load("rw", "extend_write")
