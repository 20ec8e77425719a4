"""``aiolock.sync.MultiLock`` and ``aiolock.sync.RedLock``: the async composites, blocking."""

from __future__ import annotations

from collections.abc import Sequence

from .._core.validate import check_name
from ..multi import MultiLock as AsyncMultiLock
from ..redlock import RedLock as AsyncRedLock
from ._client import Client
from ._locks import Lock

__all__ = ["MultiLock", "RedLock"]


def MultiLock(*locks: Lock) -> Lock:
    """All or nothing over two or more blocking locks of any kinds and clients (see
    :class:`aiolock.MultiLock`); the owner of every part is the calling thread (or the
    part's ``owner=``)."""
    for lock in locks:
        if not isinstance(lock, Lock):
            raise TypeError(f"MultiLock takes aiolock.sync lock objects, not {type(lock).__name__}")
    clients: list[Client] = []
    for lock in locks:
        clients.extend(client for client in lock.clients() if client not in clients)
    parts = list(locks)
    return Lock(
        clients, lambda _: AsyncMultiLock(*(part.target() for part in parts)), "aiolock.MultiLock"
    )


def RedLock(clients: Sequence[Client], name: str, *, owner: str | None = None) -> Lock:
    """A quorum lock over independent servers, one blocking client each (see
    :class:`aiolock.RedLock`)."""
    check_name(name)
    given = list(clients)
    for client in given:
        if not isinstance(client, Client):
            raise TypeError(
                f"clients must be aiolock.sync.Client objects, not {type(client).__name__}"
            )
    return Lock(given, lambda made: AsyncRedLock(made, name, owner=owner), "aiolock.RedLock")
