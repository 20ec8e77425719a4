"""A loopback TCP proxy that can freeze: it stops forwarding but keeps both sockets open.

This is the fault that a closed connection does not model: a peer that vanished behind a NAT or
a stuck middlebox.  Nothing errors, nothing closes, bytes simply stop arriving, and only a
timeout or an application-level PING notices.  The proxy can also slow the path down (every
chunk waits ``delay`` seconds, in order), reset every connection at once, and refuse new ones.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FreezableProxy"]

_CHUNK = 65536


class FreezableProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>``.

    >>> proxy = FreezableProxy(6379)
    >>> port = await proxy.start()
    >>> proxy.freeze()        # bytes stop flowing; sockets stay open
    >>> proxy.thaw()          # buffered bytes flow again (``reset=True``: abort them all)
    >>> proxy.refuse = True   # new connections are reset at once; open ones keep flowing
    """

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.refuse = False
        self.port = 0  # where clients connect, once started
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def frozen(self) -> bool:
        return not self._flowing.is_set()

    @property
    def connections(self) -> int:
        return len(self._pairs)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self, *, reset: bool = False) -> None:
        if reset:
            self.reset()
        self._flowing.set()

    def reset(self) -> None:
        """Abort every proxied connection (both sides see a reset)."""
        for pair in list(self._pairs):
            for writer in pair:
                writer.transport.abort()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        self._flowing.set()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        pumps = [
            asyncio.get_running_loop().create_task(self._pump(reader, up_writer)),
            asyncio.get_running_loop().create_task(self._pump(up_reader, writer)),
        ]
        self._tasks.update(pumps)
        try:
            # When either direction ends, the whole connection ends.
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            self._pairs.discard(pair)
            for side in pair:
                side.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(_CHUNK):
                await self._flowing.wait()  # frozen: hold the bytes, read nothing more
                if self.delay:
                    await asyncio.sleep(self.delay)
                    await self._flowing.wait()
                writer.write(data)
                await writer.drain()
