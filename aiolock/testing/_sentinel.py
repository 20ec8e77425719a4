"""An embedded Sentinel group (see :mod:`aiolock.testing.embedded`, which exports it)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ._server import EmbeddedServer, Managed, low_ports, poll, server_path

__all__ = ["EmbeddedSentinel"]


class EmbeddedSentinel(Managed):
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
        self._path = server_path(binary)
        # No pause before a (diskless) full sync: by default a primary waits 5 s for more.
        config: dict[str, Any] = {"repl-diskless-sync-delay": 0}
        ports = low_ports(1 + replicas + 3)
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

        poll(
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

        poll(promoted, deadline, lambda: f"the failover did not finish in time: {self!r}")
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
