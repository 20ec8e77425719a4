"""Where a Cluster run's cyclic garbage comes from, fault by fault (issue 42, item 5).

Contended cycles of the plain lock on an embedded 3-primary Cluster, with the collector off and
DEBUG_SAVEALL: gc.collect() then lists every object that only a cycle kept alive.  Phases:
fault-free; connection drops (CLIENT KILL TYPE normal on every primary); cancelled acquires;
a slot migration under load.  Prints objects per cycle / per fault and where they come from.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import sys
import types

from redis.asyncio import Redis

import aiolock
from aiolock.testing.embedded import EmbeddedCluster

TASKS = 4


def attribute(garbage: list[object]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    kinds: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[str] = collections.Counter()
    ids = {id(o) for o in garbage}
    for obj in garbage:
        if isinstance(obj, types.FrameType):
            code = obj.f_code
            where = f"{code.co_filename.rsplit('/site-packages/', 1)[-1]}:{code.co_qualname}"
            for var, value in obj.f_locals.items():
                if isinstance(value, BaseException) and id(value) in ids:
                    frames[f"HOLDS {where} local {var} = {type(value).__name__}"] += 1
        name = type(obj).__qualname__
        module = type(obj).__module__
        if isinstance(obj, BaseException):
            name = f"exception {module}.{name}"
        elif module not in ("builtins",):
            name = f"{module}.{name}"
        kinds[name] += 1
        if isinstance(obj, types.FrameType):
            code = obj.f_code
            frames[f"{code.co_filename.rsplit('/site-packages/', 1)[-1]}:{code.co_qualname}"] += 1
    return kinds, frames


async def measure(label: str, events: str, body) -> None:
    gc.collect()
    gc.garbage.clear()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        cycles, count = await body()
        found = gc.collect()
        kinds, frames = attribute(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    print(
        f"== {label}: {cycles} cycles, {count} {events}: {found} objects in cycles, "
        f"{found / max(1, cycles):.3f}/cycle"
        + (f", {found / count:.0f}/{events[:-1]}" if count else "")
    )
    for name, n in kinds.most_common(12):
        print(f"   {n:6d} {name}")
    if frames:
        print("   frames:")
        for name, n in frames.most_common(25):
            print(f"   {n:6d} {name}")


async def contend(client: aiolock.Client, name: str, cycles: int, cancel: bool = False) -> int:
    done = 0
    cancelled = 0

    async def task(k: int) -> None:
        nonlocal done, cancelled
        lock = client.lock(name, owner=f"owner-{k}") if cancel else client.lock(name)
        for i in range(cycles // TASKS):
            if cancel and i % 10 == k:
                waiter = asyncio.ensure_future(lock.lock())
                await asyncio.sleep(0.0005 * (i % 4))
                waiter.cancel()
                try:
                    await waiter
                except asyncio.CancelledError:
                    cancelled += 1
                else:
                    await lock.unlock()
                continue
            try:
                await lock.lock()
                await asyncio.sleep(0)
                await lock.unlock()
                done += 1
            except Exception as exc:  # a fault reached the caller (RedisError, LockError)
                errors[type(exc).__name__] += 1

    errors: collections.Counter[str] = collections.Counter()
    await asyncio.gather(*(task(k) for k in range(TASKS)))
    if errors:
        print(f"   errors reaching callers: {dict(errors)}")
    return cancelled


async def main(binary: str) -> None:
    cluster = EmbeddedCluster(primaries=3, binary=binary)
    await asyncio.to_thread(cluster.start)
    try:
        client = aiolock.Client.from_url(cluster.primaries[0].url, cluster=True, key_prefix="gcf")
        admin = [Redis(host=n.host, port=n.port) for n in cluster.primaries]
        names = ["gc-a", "gc-b", "gc-c"]
        await contend(client, names[0], 200)

        async def clean():
            await asyncio.gather(*(contend(client, n, 1000) for n in names))
            return 3000, 0

        async def kills():
            stop = asyncio.Event()
            kills = 0

            async def killer():
                nonlocal kills
                while not stop.is_set():
                    await asyncio.sleep(0.1)
                    for r in admin:
                        await r.execute_command("CLIENT", "KILL", "TYPE", "normal")
                    kills += 1

            k = asyncio.create_task(killer())
            await asyncio.gather(*(contend(client, n, 1000) for n in names))
            stop.set()
            await k
            return 3000, kills

        async def cancels():
            got = await asyncio.gather(*(contend(client, n, 1000, cancel=True) for n in names))
            return 3000, sum(got)

        async def migrate():
            # Move the slot of gc-a's keys to another primary and back, repeatedly, under load.
            from redis.crc import key_slot

            from aiolock._core.keys import LockKeys

            slot = key_slot(LockKeys.build("gcf", names[0]).lock.encode())
            ids = [(await r.execute_command("CLUSTER", "MYID")).decode() for r in admin]
            ports = [n.port for n in cluster.primaries]
            slots = await admin[0].execute_command("CLUSTER", "SLOTS")
            owner = next(ports.index(int(r[2][1])) for r in slots if r[0] <= slot <= r[1])
            stop = asyncio.Event()
            moves = 0

            async def mover():
                nonlocal owner, moves
                while not stop.is_set():
                    await asyncio.sleep(0.2)
                    target = (owner + 1) % 3
                    src, dst = admin[owner], admin[target]
                    await dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[owner])
                    await src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
                    while keys := await src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
                        n = cluster.primaries[target]
                        await src.execute_command(
                            "MIGRATE", n.host, n.port, "", 0, 5000, "KEYS", *keys
                        )
                    for r in admin:
                        await r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", ids[target])
                    owner, moves = target, moves + 1

            m = asyncio.create_task(mover())
            await contend(client, names[0], 3000)
            stop.set()
            await m
            return 3000, moves

        await measure("fault-free", "events", clean)
        await measure(
            "connection drops (CLIENT KILL TYPE normal, every primary, every 100 ms)",
            "kills",
            kills,
        )
        await measure("cancelled acquires (1 in 10, within 0-1.5 ms)", "cancels", cancels)
        await measure("slot migrations under load (every 200 ms)", "moves", migrate)
        await client.aclose()
        for r in admin:
            await r.aclose()
    finally:
        await asyncio.to_thread(cluster.stop)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "valkey"))
