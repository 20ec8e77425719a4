"""Where one lock lives in Redis: its keys and channel, all in one Cluster hash slot."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LockKeys", "channel_of", "fence_of", "hash_tag"]

# Percent-encoding the three characters below keeps the tag free of braces (so Redis Cluster
# hashes exactly the tag) and keeps the mapping injective (so two names never share keys).
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})


def channel_of(lock_key: str) -> str:
    """The channel where releases of the lock at ``lock_key`` are published."""
    return f"{lock_key}:released"


def fence_of(prefix: str) -> str:
    """The fencing token counter of every lock under ``prefix`` (a string key, never expires).

    One counter for all names keeps the keyspace flat; a token from it is larger than every
    token handed out before it, so tokens strictly increase per name too.  (On a Cluster, a
    script may only touch keys of the lock's slot: there it will take one counter per slot.)
    """
    return f"{prefix}:fence"


def hash_tag(name: str) -> str:
    """Return ``{name}`` with braces escaped: the Redis Cluster hash tag of lock ``name``."""
    return "{" + name.translate(_ESCAPES) + "}"


@dataclass(frozen=True, slots=True, weakref_slot=True)
class LockKeys:
    """The Redis names used by one lock.

    ``lock``: a hash holding ``<owner> -> hold count`` plus the fields ``:fence`` (the current
    hold's fencing token) and ``:req`` (the last request applied, for resend safety).
    ``meta``: a hash that outlives the lock for a while only (``released``: the last request
    that deleted the lock; ``undone``: an acquire undone before it arrived), so that late
    copies of those calls are recognised.  ``channel``: where releases are published.
    ``fence``: the fencing token counter, one for every name under the key prefix: a lock
    leaves no key behind once released, however many names are used (per-entity names such
    as ``orders:{id}``), and tokens still strictly increase per name.
    """

    lock: str
    meta: str
    channel: str
    fence: str

    @classmethod
    def build(cls, prefix: str, name: str, kind: str | None = None) -> LockKeys:
        """The keys of lock ``name``; a ``kind`` other than the plain lock's gets a segment of
        its own, so that two kinds of one name never share a key."""
        base = f"{prefix}:{hash_tag(name)}" if kind is None else f"{prefix}:{kind}:{hash_tag(name)}"
        return cls(lock=base, meta=f"{base}:meta", channel=channel_of(base), fence=fence_of(prefix))
