"""What the web frameworks' glue (:mod:`aiolock.fastapi`, :mod:`aiolock.aiohttp`) shares: the
kinds a handler can be held under, and the hold of one request (a lock or a permit)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Literal

from ._core.base import LockKind
from ._core.names import NameTemplate
from .client import Client

__all__ = ["LOCK_KINDS", "HeldKind", "check_kind", "check_permits", "hold_lock", "hold_permit"]

HeldKind = Literal["lock", "fair", "spin", "read", "write"]

LOCK_KINDS: Final[dict[str, Callable[[Client, str], LockKind]]] = {
    "lock": Client.lock,
    "fair": Client.fair_lock,
    "spin": Client.spin_lock,
    "read": lambda client, name: client.rw_lock(name).read_lock(),
    "write": lambda client, name: client.rw_lock(name).write_lock(),
}
"""Each ``kind=`` of the glue's ``held_lock``, and the lock it names (``read`` and ``write`` are
the two modes of ``client.rw_lock(name)``)."""


def check_kind(kind: object) -> Callable[[Client, str], LockKind]:
    """The lock factory of ``kind``; :class:`ValueError` naming ``kind`` for any other value."""
    factory = LOCK_KINDS.get(kind) if isinstance(kind, str) else None
    if factory is None:
        raise ValueError(f"kind must be one of {', '.join(map(repr, LOCK_KINDS))}, got {kind!r}")
    return factory


def check_permits(permits: object) -> int:
    """``permits`` if it is an ``int`` >= 1, checked at once, where the glue is written (the
    same check as ``client.semaphore``'s, which runs only at the first request)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be at least 1, got {permits}")
    return permits


def hold_lock(
    template: NameTemplate,
    factory: Callable[[Client, str], LockKind],
    client: Client,
    name: str,
) -> AbstractAsyncContextManager[Any]:
    """The hold of lock ``name`` of one kind, with the template's ``wait`` and ``lease``."""
    return factory(client, name).acquire(wait=template.wait, lease=template.lease)


def hold_permit(
    template: NameTemplate, permits: int, client: Client, name: str
) -> AbstractAsyncContextManager[Any]:
    """A permit of semaphore ``name``, with the template's ``wait`` and ``lease``."""
    return client.semaphore(name, permits).acquire(wait=template.wait, lease=template.lease)
