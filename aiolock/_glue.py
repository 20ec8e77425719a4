"""What the web frameworks' glue (:mod:`aiolock.fastapi`, :mod:`aiolock.aiohttp`) shares: the
kinds a handler can be held under, and the hold of one request (a lock or a permit)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final, Literal

from ._core.kind import LockKind
from ._core.names import NameTemplate
from ._core.validate import check_permits
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
