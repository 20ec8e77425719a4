"""Where one lock lives in Redis: its keys and channel, all in one Cluster hash slot."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from redis.crc import key_slot

__all__ = [
    "KeyParts",
    "LockKeys",
    "alive_of",
    "channel_of",
    "fence_of",
    "hash_tag",
    "marks_of",
    "parts_of",
    "slot_tag",
]

# Percent-encoding the three characters below keeps the tag free of braces (so Redis Cluster
# hashes exactly the tag) and keeps the mapping injective (so two names never share keys).
_ESCAPES = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_UNESCAPES = {"%25": "%", "%7B": "{", "%7D": "}"}
_ESCAPED = re.compile("|".join(_UNESCAPES))


def channel_of(lock_key: str) -> str:
    """The channel where releases of the lock at ``lock_key`` are published."""
    return f"{lock_key}:released"


def marks_of(keys: LockKeys) -> str:
    """A semaphore's void marks (a sorted set, in the permits' slot): written after a fault
    only, and kept for the client's resend window, apart from the permits, whose set lives as
    long as the longest lease granted."""
    return f"{keys.lock}:marks"


def fence_of(prefix: str, lock_key: str | None = None) -> str:
    """The fencing token counter of the locks under ``prefix`` (a string key, never expires).

    One counter for all names keeps the keyspace flat; a token from it is larger than every
    token handed out before it, so tokens strictly increase per name too.  On a Cluster a
    script may only touch keys of one slot: there each slot has its counter, named with a hash
    tag of that slot (``lock_key`` gives the slot).
    """
    if lock_key is None:
        return f"{prefix}:fence"
    return f"{prefix}:fence{{{slot_tag(key_slot(lock_key.encode()))}}}"


def alive_of(prefix: str, lock_key: str | None = None) -> str:
    """The prefix of the fair locks' alive keys (``<prefix><client id>``): one key per client,
    set by its keep-alive while it has fair waiters, keeps them all in line (see
    ``scripts/fair/_queue.lua``).  On a Cluster one per slot, as :func:`fence_of`."""
    if lock_key is None:
        return f"{prefix}:fair:alive:"
    return f"{prefix}:fair:alive{{{slot_tag(key_slot(lock_key.encode()))}}}:"


# A Cluster slot is CRC16/XMODEM of the hash tag, mod 16384.  That CRC is linear over GF(2) for
# messages of one length, so a tag for any slot is found by solving a small linear system: four
# characters from '@' to '_' (0x40 | 5 free bits each; no braces) give 20 bits to pick.
_TAG_BASE = b"@@@@"


@functools.cache
def _tag_basis() -> tuple[int, list[tuple[int, int]]]:
    """The base tag's slot, and the slot-bit effect of each free bit, reduced to echelon form:
    ``(pivot bit of the effect, (effect, the tag bits that cause it))``."""
    base = key_slot(_TAG_BASE)
    rows: list[tuple[int, int]] = []  # (effect on the slot, free bits), reduced as they come
    for bit in range(20):
        flipped = bytearray(_TAG_BASE)
        flipped[bit // 5] ^= 1 << (bit % 5)
        effect, cause = key_slot(bytes(flipped)) ^ base, 1 << bit
        for row_effect, row_cause in rows:
            if effect ^ row_effect < effect:  # the row's top bit is set in effect: clear it
                effect, cause = effect ^ row_effect, cause ^ row_cause
        if effect:
            rows.append((effect, cause))
            rows.sort(reverse=True)
    return base, rows


@functools.cache
def slot_tag(slot: int) -> str:
    """A short hash tag whose Redis Cluster slot is ``slot`` (computed, not searched)."""
    base, rows = _tag_basis()
    want, cause = slot ^ base, 0
    for row_effect, row_cause in rows:
        if want ^ row_effect < want:
            want, cause = want ^ row_effect, cause ^ row_cause
    if want:  # pragma: no cover - the 20 bits span all 14 slot bits
        raise ValueError(f"no tag for slot {slot}")
    return bytes(_TAG_BASE[i] | ((cause >> (5 * i)) & 0x1F) for i in range(len(_TAG_BASE))).decode()


def hash_tag(name: str) -> str:
    """Return ``{name}`` with braces escaped: the Redis Cluster hash tag of lock ``name``."""
    return "{" + name.translate(_ESCAPES) + "}"


@dataclass(frozen=True, slots=True)
class KeyParts:
    """What :meth:`LockKeys.build` put into a key: ``kind`` (``None`` for the plain lock, whose
    keys carry no kind segment), the object's ``name``, and the ``suffix`` after its hash tag
    (``""`` for the object's main key, ``":meta"``, ``":readers"``...)."""

    kind: str | None
    name: str
    suffix: str


def parts_of(prefix: str, key: str) -> KeyParts | None:
    """Read back the kind and name of a key that :meth:`LockKeys.build` made under ``prefix``
    (or a key derived from it); ``None`` for any other key (a fencing counter, an alive key,
    a key of another prefix).

    Exact for every name: the tag is the first ``{...}`` after the kind segment (an escaped
    name has no braces), and a tag that :func:`hash_tag` would not have written (a stray
    ``%``) is refused rather than guessed at.
    """
    head = f"{prefix}:"
    if not key.startswith(head):
        return None
    rest = key[len(head) :]
    kind: str | None = None
    if not rest.startswith("{"):
        kind, colon, rest = rest.partition(":")
        if not colon or not kind or not rest.startswith("{"):
            return None
    end = rest.find("}")
    if end < 0:
        return None
    tag = rest[: end + 1]
    name = _ESCAPED.sub(lambda match: _UNESCAPES[match.group()], tag[1:-1])
    if not name or hash_tag(name) != tag:
        return None
    return KeyParts(kind, name, rest[end + 1 :])


@dataclass(frozen=True, slots=True, weakref_slot=True)
class LockKeys:
    """The Redis names used by one lock.

    ``lock``: a hash holding ``<owner> -> hold count`` plus the fields ``f:<owner>`` (that
    hold's fencing token) and ``r:<owner>`` (its last request applied, for resend safety); after a
    fault only, ``:late:<owner>`` (releases its client resent, whose late copies it refuses).
    ``meta``: a hash written only after a fault, for the client's resend window
    (``<owner>/<n>``: an acquire undone before it arrived, or resent and voided by its
    client), so that late copies of those calls are recognised; a fault-free use leaves none.
    ``channel``: where releases are published.
    ``fence``: the fencing token counter, one for every name under the key prefix: a lock
    leaves no key behind once released, however many names are used (per-entity names such
    as ``orders:{id}``), and tokens still strictly increase per name.
    ``waiting``: the plain lock's waiting owners (one per client at a time), a sorted set that
    lives while clients wait (``scripts/lock/_waiting.lua``).
    """

    lock: str
    meta: str
    channel: str
    fence: str
    waiting: str

    @classmethod
    def build(
        cls, prefix: str, name: str, kind: str | None = None, *, cluster: bool = False
    ) -> LockKeys:
        """The keys of lock ``name``; a ``kind`` other than the plain lock's gets a segment of
        its own, so that two kinds of one name never share a key.  On a ``cluster`` the fencing
        counter is the one of the lock's slot."""
        base = f"{prefix}:{hash_tag(name)}" if kind is None else f"{prefix}:{kind}:{hash_tag(name)}"
        fence = fence_of(prefix, base if cluster else None)
        return cls(
            lock=base,
            meta=f"{base}:meta",
            channel=channel_of(base),
            fence=fence,
            waiting=f"{base}:waiting",
        )
