"""The fault injector: a seeded schedule of faults, and the code that applies them.

The schedule is generated up front from the run's seed and printed, so a failing run can be
replayed with ``--seed``.  Faults run one after another (never two at once), each followed by a
short quiet gap; every kind of the phase appears at least once.

A Cluster run (:class:`ClusterInjector`) has faults of its own: the slot of one of the run's lock
names moved to another primary while its locks are held and waited for (``migrate``), one
primary killed mid-run so that its replica takes over (``failover``, exactly once), and a
stalled primary or dropped connections on the primaries.  Its workers reach the nodes
directly (a Cluster client learns the nodes' addresses from the nodes): no proxy faults.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.crc import key_slot

from aiolock import _scripts
from aiolock._core.keys import LockKeys
from aiolock.testing.embedded import EmbeddedCluster, EmbeddedServer

from .history import FaultEvent
from .proxy import FreezableProxy
from .worker import NESTED_OWNER

__all__ = [
    "CLUSTER_KINDS",
    "DURABLE_KINDS",
    "VOLATILE_KINDS",
    "ClusterInjector",
    "Fault",
    "Injector",
    "make_cluster_schedule",
    "make_schedule",
]

# Restarts keep the data (appendonly, fsync always) in the durable phase and lose it in the
# volatile one; both phases share every other kind.
DURABLE_KINDS = (
    "kill-normal",
    "kill-pubsub",
    "restart",
    "pause",
    "debug-sleep",
    "freeze",
    "slow-path",
    "cut-request",
)
VOLATILE_KINDS = ("amnesia-restart", "kill-normal", "kill-pubsub", "freeze", "cut-request")
# A Cluster run's kinds besides its one failover (see make_cluster_schedule).
CLUSTER_KINDS = ("migrate", "kill-normal", "kill-pubsub", "pause")
RESTARTS = frozenset({"restart", "amnesia-restart"})
# How long a failover takes at most (the node timeout, the election, the clients' refresh).
FAILOVER_S = 6.0
PROXY_FAULTS = frozenset({"freeze", "slow-path", "cut-request"})

# cut-request: which call the proxy cuts after the server ran it.  "any" is every EVALSHA
# (acquire, release, renew, leave); "nested" any call naming an explicit owner of the worker's
# "nested" mode (their reentrant acquires and releases, and theirs only, among others); the
# others one script, by its SHA in the request, or "plain-release" the bare command that is
# the last release of an uncontended plain or spin lock hold (HDEL).  The plain and the spin
# lock share the reentrant scripts; the fair lock has its own.
CUT_MATCHES = {
    "any": b"EVALSHA",
    "nested": b":x:" + NESTED_OWNER.encode(),
    "acquire": _scripts.LOCK_ACQUIRE.sha.encode(),
    "fair-acquire": _scripts.FAIR_ACQUIRE.sha.encode(),
    "release": _scripts.LOCK_RELEASE.sha.encode(),
    "fair-release": _scripts.FAIR_RELEASE.sha.encode(),
    "plain-release": b"HDEL",
}
CUTS_PER_FAULT = 4  # at most, one after another on one worker's proxy


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``at`` seconds after the phase starts, lasting ``duration``."""

    at: float
    kind: str
    duration: float = 0.0
    target: int = 0  # the worker whose proxy a proxy fault affects
    option: str = ""  # restart: graceful/sigkill; freeze: resume/reset; kill: all/one;
    # slow-path: the per-chunk delay in seconds; cut-request: keys of CUT_MATCHES, one a cut

    def __str__(self) -> str:
        parts = [f"+{self.at:7.2f}s {self.kind:<15}"]
        if self.duration:
            parts.append(f"for {self.duration:.2f}s")
        if self.kind in PROXY_FAULTS:
            parts.append(f"worker {self.target}")
        if self.option:
            parts.append(self.option)
        return " ".join(parts)


def make_schedule(
    seed: int, kinds: Sequence[str], *, span: float, lease: float, workers: int
) -> list[Fault]:
    """Faults for ``span`` seconds; stalls and freezes last shorter or longer than ``lease``."""
    rng = random.Random(seed)
    first = list(kinds)
    rng.shuffle(first)
    schedule: list[Fault] = []
    at = 1.0
    while True:
        kind = first.pop() if first else rng.choice(kinds)
        fault = _draw(rng, kind, at, lease, workers)
        if fault.at + fault.duration + 1.0 > span:
            return schedule
        schedule.append(fault)
        at = fault.at + fault.duration + (1.0 if kind in RESTARTS else 0.0) + rng.uniform(0.3, 1.2)


def make_cluster_schedule(
    seed: int, kinds: Sequence[str], *, span: float, lease: float, workers: int
) -> list[Fault]:
    """A Cluster run's schedule: ``kinds`` before and after one ``failover`` at mid-run."""
    middle = span / 2
    before = make_schedule(seed, kinds, span=middle, lease=lease, workers=workers)
    after_at = middle + FAILOVER_S
    after = make_schedule(seed + 1, kinds, span=span - after_at, lease=lease, workers=workers)
    shifted = [Fault(f.at + after_at, f.kind, f.duration, f.target, f.option) for f in after]
    return [*before, Fault(middle, "failover"), *shifted]


def _draw(rng: random.Random, kind: str, at: float, lease: float, workers: int) -> Fault:
    def around_lease() -> float:
        # Half the stalls end well inside the lease, half outlast it.
        if rng.random() < 0.5:
            return round(rng.uniform(0.15, 0.5) * lease, 2)
        return round(rng.uniform(1.3, 2.0) * lease, 2)

    target = rng.randrange(workers)
    match kind:
        case "kill-normal":
            return Fault(at, kind, option=rng.choice(("all", "one")))
        case "restart" | "amnesia-restart":
            return Fault(at, kind, option=rng.choice(("graceful", "sigkill")))
        case "pause" | "debug-sleep":
            return Fault(at, kind, around_lease())
        case "freeze":
            return Fault(at, kind, around_lease(), target, rng.choice(("resume", "reset")))
        case "slow-path":
            delay = round(rng.uniform(0.05, 0.4), 2)
            return Fault(at, kind, round(rng.uniform(0.5, 1.5), 2), target, str(delay))
        case "cut-request":
            # Up to CUTS_PER_FAULT requests cut one after another within the duration, each
            # matching its own key of CUT_MATCHES.  Nested holders' calls weigh most: a cut
            # reentrant acquire (a reentrant grant whose reply is lost) is issue 15.
            matches = rng.choices(
                tuple(CUT_MATCHES), weights=(2, 6, 2, 2, 1, 1, 2), k=CUTS_PER_FAULT
            )
            return Fault(at, kind, round(rng.uniform(0.5, 2.0), 2), target, ",".join(matches))
        case _:
            return Fault(at, kind)


class _Scheduled:
    """Runs a schedule, each fault at its time, recording what it did; a subclass applies it."""

    def __init__(self, *, seed: int) -> None:
        self._rng = random.Random(seed)
        self.events: list[FaultEvent] = []
        self.amnesia: list[tuple[int, int]] = []

    async def run(self, schedule: Sequence[Fault], start_ns: int) -> None:
        for fault in schedule:
            delay = start_ns / 1e9 + fault.at - time.monotonic_ns() / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            began = time.monotonic_ns()
            detail = await self._apply(fault)
            ended = time.monotonic_ns()
            self.events.append(FaultEvent(fault.kind, began, ended, detail))
            if fault.kind == "amnesia-restart":  # a restart that lost every lock
                self.amnesia.append((began, ended))

    async def _apply(self, fault: Fault) -> str:
        raise NotImplementedError


class Injector(_Scheduled):
    """Applies a schedule to one server and the workers' proxies (see the module docstring)."""

    def __init__(
        self, server: EmbeddedServer, proxies: Sequence[FreezableProxy], *, seed: int
    ) -> None:
        super().__init__(seed=seed)
        self._server = server
        self._proxies = proxies

    async def heal(self) -> None:
        """Undo whatever is still in effect: thaw and speed up proxies, unpause the server."""
        for proxy in self._proxies:
            proxy.delay = 0.0
            proxy.disarm_cut()
            proxy.thaw()
        if not self._server.running:
            await asyncio.to_thread(self._server.start)
        await self._command("CLIENT", "UNPAUSE")

    def _redis(self) -> Redis:
        return Redis(host=self._server.host, port=self._server.port)

    async def _command(self, *args: str | int | float) -> object:
        async with self._redis() as redis:
            return await redis.execute_command(*args)  # type: ignore[no-untyped-call]

    async def _kill_one(self) -> str:
        async with self._redis() as redis:
            me = await redis.client_id()
            listing = await redis.client_list(_type="normal")
            others = [client["id"] for client in listing if client["id"] != str(me)]
            if not others:
                return "no connection to kill"
            victim = self._rng.choice(sorted(others))
            await redis.client_kill_filter(_id=victim)
            return f"killed connection {victim}"

    async def _cut_requests(self, fault: Fault) -> str:
        """Cut the requests matching ``fault.option`` on one proxy, one after another, for
        ``fault.duration`` seconds: each ran on the server, and its reply never arrived."""
        proxy = self._proxies[fault.target]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + fault.duration
        dropped: list[str] = []
        try:
            for match in fault.option.split(","):
                left = deadline - loop.time()
                if left <= 0:
                    break
                reply = proxy.cut_next_request(CUT_MATCHES[match])
                try:
                    # A matched cut ends when the reply comes (or the connection ends).
                    data = await asyncio.wait_for(asyncio.shield(reply), left)
                except TimeoutError:
                    dropped.append(f"{match}: none")
                    continue
                dropped.append(f"{match}: {describe_reply(data)}")
        finally:
            proxy.disarm_cut()
        return f"cut {'; '.join(dropped) or 'nothing'}"

    async def _apply(self, fault: Fault) -> str:
        match fault.kind:
            case "kill-normal" if fault.option == "one":
                return await self._kill_one()
            case "kill-normal" | "kill-pubsub":
                kind = fault.kind.removeprefix("kill-")
                async with self._redis() as redis:
                    killed = await redis.client_kill_filter(_type=kind, skipme=True)
                return f"killed {killed} {kind} connections"
            case "restart" | "amnesia-restart":
                kill = fault.option == "sigkill"
                await asyncio.to_thread(self._server.restart, kill=kill)
                return f"pid {self._server.pid}"
            case "pause":
                await self._command("CLIENT", "PAUSE", round(fault.duration * 1000), "ALL")
                await asyncio.sleep(fault.duration)
                return ""
            case "debug-sleep":
                await self._command("DEBUG", "SLEEP", fault.duration)
                return ""
            case "freeze":
                proxy = self._proxies[fault.target]
                proxy.freeze()
                await asyncio.sleep(fault.duration)
                proxy.thaw(reset=fault.option == "reset")
                return f"{proxy.connections} connections"
            case "slow-path":
                proxy = self._proxies[fault.target]
                proxy.delay = float(fault.option)
                await asyncio.sleep(fault.duration)
                proxy.delay = 0.0
                return ""
            case "cut-request":
                return await self._cut_requests(fault)
        raise ValueError(f"unknown fault kind {fault.kind!r}")


def describe_reply(data: bytes) -> str:
    """What a cut request's dropped reply said: a grant (with its hold count: 2 or more is a
    reentrant grant), busy (the pause in ms), a number (an acquire: a fresh hold's token; a
    release: the holds left), nil..."""
    lines = data.split(b"\r\n")
    if not data:
        return "no reply"
    if lines[0] == b"*3" and len(lines) >= 3:
        return f"grant(token={lines[1][1:].decode()}, count={lines[2][1:].decode()})"
    if lines[0] == b"*1" and len(lines) >= 2:
        return f"busy {lines[1][1:].decode()}"
    if data.startswith(b":"):
        return f"int {lines[0][1:].decode()}"
    if data.startswith((b"$-1", b"_", b"*-1")):
        return "nil"
    if data.startswith(b"-"):
        return f"error {lines[0][1:40].decode(errors='replace')}"
    return repr(data[:40])


class ClusterInjector(_Scheduled):
    """Applies a Cluster run's schedule (see the module docstring) to ``cluster``; ``names``
    are the run's lock names, whose slots ``migrate`` moves."""

    def __init__(
        self, cluster: EmbeddedCluster, names: Sequence[str], prefix: str, *, seed: int
    ) -> None:
        super().__init__(seed=seed)  # a synced failover forgets no hold: amnesia stays empty
        self._cluster = cluster
        self._slots = sorted(
            {key_slot(LockKeys.build(prefix, name).lock.encode()) for name in names}
        )

    async def heal(self) -> None:
        """Unpause every primary."""
        for node in self._cluster.primaries:
            await self._command(node, "CLIENT", "UNPAUSE")

    @staticmethod
    async def _command(node: EmbeddedServer, *args: str | int | float) -> object:
        async with Redis(host=node.host, port=node.port) as redis:
            return await redis.execute_command(*args)  # type: ignore[no-untyped-call]

    async def _apply(self, fault: Fault) -> str:
        primaries = self._cluster.primaries
        match fault.kind:
            case "migrate":
                slot = self._rng.choice(self._slots)
                new = await asyncio.to_thread(self._cluster.move_slot, slot)
                return f"slot {slot} moved to {new.port}"
            case "failover":
                old = self._rng.choice(primaries)
                new = await asyncio.to_thread(self._cluster.failover, old)
                # Until the killed node is back as its replica, the new primary confirms no
                # grant to sync_replicas=1: every grant there waits sync_timeout, then fails.
                await asyncio.to_thread(self._cluster.rejoin, old)
                return f"{old.port} killed, {new.port} took over, {old.port} rejoined"
            case "kill-normal" if fault.option == "one":
                node = self._rng.choice(primaries)
                async with Redis(host=node.host, port=node.port) as redis:
                    me = await redis.client_id()
                    listing = await redis.client_list(_type="normal")
                    others = sorted(c["id"] for c in listing if c["id"] != str(me))
                    if not others:
                        return f"no connection to kill on {node.port}"
                    victim = self._rng.choice(others)
                    await redis.client_kill_filter(_id=victim)
                    return f"killed connection {victim} on {node.port}"
            case "kill-normal" | "kill-pubsub":
                kind = fault.kind.removeprefix("kill-")
                killed = 0
                for node in primaries:
                    async with Redis(host=node.host, port=node.port) as redis:
                        killed += await redis.client_kill_filter(_type=kind, skipme=True)
                return f"killed {killed} {kind} connections on every primary"
            case "pause":
                node = self._rng.choice(primaries)
                await self._command(node, "CLIENT", "PAUSE", round(fault.duration * 1000), "ALL")
                await asyncio.sleep(fault.duration)
                return f"paused {node.port}"
        raise ValueError(f"unknown fault kind {fault.kind!r}")
