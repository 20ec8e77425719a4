"""A loopback TCP proxy that can freeze: it stops forwarding but keeps both sockets open.

This is the fault that a closed connection does not model: a peer that vanished behind a NAT or
a stuck middlebox.  Nothing errors, nothing closes, bytes simply stop arriving, and only a
timeout or an application-level PING notices.  The proxy can also slow the path down (every
chunk waits ``delay`` seconds, in order), reset every connection at once, refuse new ones, and
cut one connection between a request and its reply (the server ran the command; the client
never learns what it did).
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["FreezableProxy", "HeldReply"]

_CHUNK = 65536

_Pair = tuple[asyncio.StreamWriter, asyncio.StreamWriter]  # (to the client, to the server)


class FreezableProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>``.

    >>> proxy = FreezableProxy(6379)
    >>> port = await proxy.start()
    >>> proxy.freeze()        # bytes stop flowing; sockets stay open
    >>> proxy.thaw()          # buffered bytes flow again (``reset=True``: abort them all)
    >>> proxy.refuse = True   # new connections are reset at once; open ones keep flowing
    >>> reply = proxy.cut_next_request(b"EVALSHA")  # one-shot, see below
    >>> await reply           # what the server answered, which the client never got
    >>> await proxy.next_request(b"EVALSHA")  # one-shot: such a request is on its way
    >>> held = proxy.hold_next_reply(b"EVALSHA")  # one-shot, see below
    >>> await held.arrived    # the server answered (the command ran); the client waits on
    >>> held.let_go()         # the reply flows on

    ``cut_next_request(match)`` arms a one-shot cut: the next client-to-server chunk that
    contains ``match`` (any chunk, by default) is forwarded to the server, and from then on
    nothing more flows on that connection in either direction.  When the server's reply starts
    arriving (so the command has surely run), the reply is dropped and both sides of the
    connection are aborted: the client sees its connection closed with no byte of the reply.
    The returned future gets the dropped reply chunk (``b""`` if the connection ended before
    the server answered).  Other connections, and later ones, flow as usual.

    ``hold_next_reply(match)`` arms a one-shot hold: the next client-to-server chunk containing
    ``match`` is forwarded as usual, but the server's reply to it waits at the proxy until
    ``let_go()``.  The client sees a slow reply, nothing else; its other connections flow, so
    a call it makes meanwhile can reach the server after the held one and be answered first.
    """

    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.upstream_port = upstream_port
        self.delay = 0.0
        self.refuse = False
        self.refused = 0  # connections reset at once while ``refuse`` was set
        self.port = 0  # where clients connect, once started
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # The armed cut, (match, future), until a request matches it; then the pair it cuts.
        self._cut_armed: tuple[bytes, asyncio.Future[bytes]] | None = None
        self._cutting: dict[_Pair, asyncio.Future[bytes]] = {}
        self._watched: list[tuple[bytes, asyncio.Future[None]]] = []
        self._hold_armed: tuple[bytes, HeldReply] | None = None
        self._holding: dict[_Pair, HeldReply] = {}

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

    def cut_next_request(self, match: bytes = b"") -> asyncio.Future[bytes]:
        """Cut the connection of the next request containing ``match`` before its reply.

        One-shot (see the class docstring); arming it again replaces a cut not yet matched.
        Returns a future of the reply chunk that the client never got.
        """
        if self._cut_armed is not None:
            self._cut_armed[1].cancel()
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._cut_armed = (match, reply)
        return reply

    def next_request(self, match: bytes = b"") -> asyncio.Future[None]:
        """A future set when the proxy reads the next client-to-server chunk containing
        ``match``: the client has written such a request, and it is on its way (a frozen or
        slowed path holds it).  One-shot; it does not change what flows."""
        seen: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watched.append((match, seen))
        return seen

    def hold_next_reply(self, match: bytes = b"") -> HeldReply:
        """Hold the reply to the next request containing ``match`` (see the class docstring)."""
        held = HeldReply()
        self._hold_armed = (match, held)
        return held

    def disarm_cut(self) -> None:
        """Drop an armed cut that no request has matched yet (its future is cancelled); a cut
        already under way still ends its connection."""
        if self._cut_armed is not None:
            self._cut_armed[1].cancel()
            self._cut_armed = None

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
            self.refused += 1
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
            asyncio.get_running_loop().create_task(self._pump(reader, up_writer, pair, True)),
            asyncio.get_running_loop().create_task(self._pump(up_reader, writer, pair, False)),
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
            cut = self._cutting.pop(pair, None)
            if cut is not None and not cut.done():
                cut.set_result(b"")  # the connection ended before the server answered

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: _Pair,
        to_server: bool,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(_CHUNK):
                if to_server and self._watched:
                    self._notice(data)
                await self._flowing.wait()  # frozen: hold the bytes, read nothing more
                if self.delay:
                    await asyncio.sleep(self.delay)
                    await self._flowing.wait()
                # No await from these checks to the write: a cut is decided atomically.
                cut = self._cutting.get(pair)
                if cut is not None:
                    if not to_server:  # the reply to the cut request: drop it, end the pair
                        if not cut.done():
                            cut.set_result(data)
                        for side in pair:
                            side.transport.abort()
                        return
                    continue  # nothing more reaches the server on a cut connection
                armed = self._cut_armed
                if to_server and armed is not None and armed[0] in data:
                    self._cut_armed = None
                    self._cutting[pair] = armed[1]
                hold = self._hold_armed
                if to_server and hold is not None and hold[0] in data:
                    self._hold_armed = None
                    self._holding[pair] = hold[1]
                if not to_server and (held := self._holding.pop(pair, None)) is not None:
                    held.arrived.set_result(None)
                    await held.released.wait()
                writer.write(data)
                await writer.drain()

    def _notice(self, data: bytes) -> None:
        """Set the ``next_request`` futures whose match ``data`` contains."""
        waiting = []
        for match, seen in self._watched:
            if match in data:
                if not seen.done():
                    seen.set_result(None)
            else:
                waiting.append((match, seen))
        self._watched = waiting


class HeldReply:
    """A reply the proxy holds back (:meth:`FreezableProxy.hold_next_reply`)."""

    def __init__(self) -> None:
        self.arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.released = asyncio.Event()

    def let_go(self) -> None:
        """Let the held reply (and everything after it on its connection) flow on."""
        self.released.set()
