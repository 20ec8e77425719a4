"""``floor``: what a hand-off costs on this machine before any lock runs.

The contended scenario's shape (P processes, a 1 ms hold) with no lock at all: the processes
pass a token round a ring, and each pass is exactly one message, the floor of any hand-off
(a release's bytes to the server, the server's message to the next holder).  Each process
holds the token for ``hold`` seconds (``asyncio.sleep``, as the contended tasks do), then
PUBLISHes it to the next process's channel; the gap is from the moment the sender starts the
call to the moment the receiver has read the message.  Two clients:

- ``raw``: asyncio streams and hand-written RESP, nothing between the event loop and the
  socket: the floor of the machine (its loopback, its scheduler, the server);
- ``redis-py``: ``redis.asyncio``'s ``PUBLISH`` and ``PubSub``: the floor of a lock built on it.

Also the PING p50 after a pause of ``hold`` seconds (one connection, one process): a process
that has slept answers later than the back-to-back PING of ``rtt``, the unit of the hand-off
targets, and every hand-off wakes two processes that slept (the server, and the next holder).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from urllib.parse import urlparse

import redis.asyncio as aioredis

from ..stats import median_of_runs, percentile
from ..workers import WorkerPool
from .contended import HOLD_S

__all__ = ["ring", "run"]

_SETUP_S = 1.0
_CLIENTS = ("raw", "redis-py")


def _resp(*parts: str | int) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Raw:
    """One process's two connections, over asyncio streams: a subscriber and a publisher."""

    def __init__(self, url: str) -> None:
        parsed = urlparse(url)
        self._host, self._port = parsed.hostname or "127.0.0.1", parsed.port or 6379
        self._buffer = b""

    async def open(self, channel: str) -> None:
        self._sub = await asyncio.open_connection(self._host, self._port)
        self._pub = await asyncio.open_connection(self._host, self._port)
        self._sub[1].write(_resp("SUBSCRIBE", channel))
        for _ in range(6):  # the confirmation: '*3', '$9', 'subscribe', the channel's two, ':1'
            await self._sub[0].readuntil(b"\r\n")

    async def publish(self, channel: str, payload: str) -> None:
        reader, writer = self._pub
        writer.write(_resp("PUBLISH", channel, payload))
        await reader.readuntil(b"\r\n")  # ':<receivers>'

    async def receive(self, within: float) -> str | None:
        """The next message's payload.  A message is seven lines ('*3', '$7', 'message', the
        channel's length and name, the payload's length and the payload: digits, no CRLF)."""
        reader = self._sub[0]
        while self._buffer.count(b"\r\n") < 7:
            try:
                chunk = await asyncio.wait_for(reader.read(4096), within)
            except TimeoutError:
                return None
            if not chunk:
                return None
            self._buffer += chunk
        lines = self._buffer.split(b"\r\n", 7)
        self._buffer = lines[7]
        return lines[6].decode()

    async def aclose(self) -> None:
        for _, writer in (self._sub, self._pub):
            writer.close()


class _RedisPy:
    """The same over ``redis.asyncio``: ``PUBLISH`` on the client, ``PubSub`` to receive."""

    def __init__(self, url: str) -> None:
        self._client = aioredis.Redis.from_url(url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)

    async def open(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)
        await self._client.ping()
        while await self._pubsub.get_message(timeout=0.05) is not None:
            pass  # the confirmation

    async def publish(self, channel: str, payload: str) -> None:
        await self._client.publish(channel, payload)

    async def receive(self, within: float) -> str | None:
        deadline = time.perf_counter() + within
        while (left := deadline - time.perf_counter()) > 0:
            message = await self._pubsub.get_message(timeout=left)
            if message is not None:
                data: bytes = message["data"]
                return data.decode()
        return None

    async def aclose(self) -> None:
        await self._pubsub.aclose()  # type: ignore[no-untyped-call]
        await self._client.aclose()


async def ring(
    *,
    client: str,
    url: str,
    prefix: str,
    index: int,
    processes: int,
    hold_s: float,
    start_ns: int,
    end_ns: int,
) -> dict[str, Any]:
    """Process ``index``'s share: receive the token, hold it, pass it on; log the gaps."""
    peer = _Raw(url) if client == "raw" else _RedisPy(url)
    await peer.open(f"{prefix}:{index}")
    following = f"{prefix}:{(index + 1) % processes}"
    gaps: list[int] = []
    try:
        await asyncio.sleep(max(0.0, (start_ns - time.perf_counter_ns()) / 1e9))
        if index == 0:
            await peer.publish(following, str(time.perf_counter_ns()))
        while time.perf_counter_ns() < end_ns:
            payload = await peer.receive(within=(end_ns - time.perf_counter_ns()) / 1e9 + 0.5)
            if payload is None:
                break
            received = time.perf_counter_ns()
            if received < end_ns:
                gaps.append(received - int(payload))
            await asyncio.sleep(hold_s)
            await peer.publish(following, str(time.perf_counter_ns()))
    finally:
        await peer.aclose()
    return {"gaps": gaps}


def _one_run(
    pool: WorkerPool, *, client: str, url: str, hold_s: float, duration_s: float
) -> dict[str, Any]:
    processes = len(pool)
    start_ns = time.perf_counter_ns() + int(_SETUP_S * 1e9)
    end_ns = start_ns + int(duration_s * 1e9)
    prefix = f"bench:floor:{uuid.uuid4().hex}"
    pool.send(
        [
            (
                ring,
                {
                    "client": client,
                    "url": url,
                    "prefix": prefix,
                    "index": index,
                    "processes": processes,
                    "hold_s": hold_s,
                    "start_ns": start_ns,
                    "end_ns": end_ns,
                },
            )
            for index in range(processes)
        ]
    )
    replies = pool.gather(timeout=_SETUP_S + duration_s + 10)
    errors = [reply["error"] for reply in replies if "error" in reply]
    if errors:
        return {"error": errors[0]}
    gaps = [gap for reply in replies for gap in reply["gaps"]]
    return {"handoffs": len(gaps), "gap_p50_us": percentile(gaps, 50) / 1e3}


async def _ping_after_pause(url: str, pause_s: float, n: int) -> float:
    client = aioredis.Redis.from_url(url)
    try:
        await client.ping()
        latencies = []
        for _ in range(n):
            await asyncio.sleep(pause_s)
            started = time.perf_counter_ns()
            await client.ping()
            latencies.append(time.perf_counter_ns() - started)
        return percentile(latencies, 50) / 1e3
    finally:
        await client.aclose()


def run(
    url: str, *, repeats: int, quick: bool, processes: int = 4, duration_s: float = 3.0
) -> dict[str, Any]:
    if quick:
        processes, duration_s = 2, 0.5
    clients: dict[str, Any] = {}
    with WorkerPool(processes) as pool:
        pool.wait_ready()
        for client in _CLIENTS:
            runs = [
                _one_run(pool, client=client, url=url, hold_s=HOLD_S, duration_s=duration_s)
                for _ in range(repeats)
            ]
            clients[client] = {"runs": runs, "median": median_of_runs(runs)}
    pauses = [asyncio.run(_ping_after_pause(url, HOLD_S, 200 if quick else 1000))]
    return {
        "processes": processes,
        "hold_s": HOLD_S,
        "duration_s": duration_s,
        "clients": clients,
        "ping_after_pause_p50_us": sorted(pauses)[len(pauses) // 2],
    }
