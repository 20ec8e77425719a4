"""Moved to :mod:`aiolock.testing.embedded`; this name keeps working."""

from .testing.embedded import (
    EmbeddedCluster,
    EmbeddedSentinel,
    EmbeddedServer,
    free_port,
    redis_server_binary,
)

__all__ = [
    "EmbeddedCluster",
    "EmbeddedSentinel",
    "EmbeddedServer",
    "free_port",
    "redis_server_binary",
]
