"""The command line: ``inspect`` of every kind, ``unlock --force``, usage errors, a server that
cannot be reached, ``server`` in the foreground and ``demo``'s progress.

Most calls run the CLI in this process (in a thread: it runs its own event loop) against the
test server; a few run ``python -m aiolock`` as a subprocess where the process itself is what
is tested (exit codes, one line on stderr, real stdin, signals).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

import aiolock
from aiolock import _demo
from aiolock._cli import main
from aiolock._cli._inspect import inspect
from aiolock.testing.embedded import free_port
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import eventually, keys_of, services_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def cli(
    aiolock_server: ServerInfo,
    aiolock_client: aiolock.Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[..., Any]:
    """``await cli("inspect", "x", stdin=...)`` -> (exit code, stdout, stderr), run in-process
    on the test server with the test client's key prefix."""
    monkeypatch.delenv("REDIS_URL", raising=False)

    async def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        argv = [*args, "--url", aiolock_server.url, "--prefix", aiolock_client.key_prefix]
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


async def inspect_json(cli: Callable[..., Any], name: str, *options: str) -> dict[str, Any]:
    code, out, _ = await cli("inspect", name, "--json", *options)
    data: dict[str, Any] = json.loads(out)
    assert code == (0 if data["held"] else 1)
    return data


def python_m_aiolock(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        **options,
    )


# -- inspect -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "spin"])
async def test_inspect_a_reentered_lock_with_a_waiter(
    cli: Callable[..., Any],
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    kind: str,
) -> None:
    lock = aiolock_client.spin_lock("job") if kind == "spin" else aiolock_client.lock("job")
    other = make_client()
    async with lock.acquire() as guard, lock.acquire():
        theirs = (
            other.spin_lock("job", owner="next")
            if kind == "spin"
            else other.lock("job", owner="next")
        )
        waiter = asyncio.create_task(theirs.try_lock(wait=30))
        if kind == "lock":  # the waiting client is subscribed to the lock's channel

            async def subscribed() -> bool:
                report = await inspect(aiolock_client, kind, "job")
                return report.subscribers == 1

            await eventually(subscribed, what="the waiter subscribed")
        data = await inspect_json(cli, "job", "--kind", kind)
        assert data["held"] is True
        [holder] = data["holders"]
        assert holder["count"] == 2
        assert holder["owner"].startswith(aiolock_client.id + ":t")
        assert holder["token"] == guard.fencing_token == data["fencing_counter"]
        assert 0 < holder["lease"] <= aiolock_client.watchdog_timeout
        assert data["subscribers"] == (1 if kind == "lock" else None)

        code, out, _ = await cli("inspect", "job", "--kind", kind)
        assert code == 0
        assert f"{holder['owner']}  holds 2  lease" in out
        assert f"token {guard.fencing_token}" in out
        assert f"fencing counter: {guard.fencing_token}" in out
    assert await waiter
    await theirs.unlock()


async def test_inspect_not_held_exits_1(
    cli: Callable[..., Any], aiolock_client: aiolock.Client
) -> None:
    data = await inspect_json(cli, "never")
    assert data["held"] is False
    assert (data["holders"], data["fencing_counter"]) == ([], None)

    lock = aiolock_client.lock("once")
    async with lock.acquire() as guard:
        pass
    code, out, err = await cli("inspect", "once")
    assert code == 1, err
    assert "not held" in out
    assert f"fencing counter: {guard.fencing_token}" in out  # it outlives the lock


async def test_the_json_shape(cli: Callable[..., Any], aiolock_client: aiolock.Client) -> None:
    async with aiolock_client.lock("shape").acquire(lease=5):
        data = await inspect_json(cli, "shape")
    assert list(data) == [
        "kind",
        "name",
        "held",
        "key",
        "holders",
        "fencing_counter",
        "waiters",
        "subscribers",
        "permits",
    ]
    assert (data["kind"], data["name"]) == ("lock", "shape")
    assert data["key"] == keys_of(aiolock_client.lock("shape")).lock
    assert list(data["holders"][0]) == ["owner", "count", "lease", "token", "mode"]
    assert 4 < data["holders"][0]["lease"] <= 5
    assert (data["waiters"], data["permits"]) == ([], None)


async def test_inspect_the_fair_lock_shows_its_queue_in_order(
    cli: Callable[..., Any],
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
) -> None:
    other = make_client()
    lock = aiolock_client.fair_lock("fifo", owner="boss")
    await lock.lock()
    first = asyncio.create_task(other.fair_lock("fifo", owner="first").try_lock(wait=30))

    async def queued(count: int) -> bool:
        return len((await inspect(aiolock_client, "fair", "fifo")).waiters) == count

    await eventually(lambda: queued(1), what="one waiter queued")
    second = asyncio.create_task(other.fair_lock("fifo", owner="second").try_lock(wait=30))
    await eventually(lambda: queued(2), what="two waiters queued")

    data = await inspect_json(cli, "fifo", "--kind", "fair")
    assert [h["owner"] for h in data["holders"]] == [f"{aiolock_client.id}:x:boss"]
    assert [(w["position"], w["owner"]) for w in data["waiters"]] == [
        (1, f"{other.id}:x:first"),
        (2, f"{other.id}:x:second"),
    ]
    assert all(0 < w["expires_in"] <= services_of(other).fair_wait_timeout for w in data["waiters"])
    assert data["subscribers"] is None

    code, out, _ = await cli("inspect", "fifo", "--kind", "fair")
    assert code == 0
    assert f"1. {other.id}:x:first" in out
    assert f"2. {other.id}:x:second" in out
    await lock.unlock()
    assert await first
    await other.fair_lock("fifo", owner="first").unlock()
    assert await second
    await other.fair_lock("fifo", owner="second").unlock()


async def test_inspect_shows_a_fair_waiter_past_its_try_while_its_client_keeps_it(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], redis: Redis
) -> None:
    """Past its try's deadline a parked fair waiter is live while its client's alive key
    lasts: it is listed, expiring with that key (the client sets it every half timeout)."""
    other = make_client(fair_wait_timeout=0.3)
    lock = aiolock_client.fair_lock("kept-shown", owner="boss")
    await lock.lock()
    waiter = asyncio.create_task(other.fair_lock("kept-shown", owner="w").try_lock(wait=30))
    queue = f"{keys_of(lock).lock}:ql"

    async def past_its_try() -> bool:
        members = [str(m).split(" ", 4) for m in await redis.lrange(queue, 0, -1)]
        seconds, micros = await redis.time()
        now = seconds * 1000 + micros // 1000
        return any(m[4] == f"{other.id}:x:w" and int(m[3]) < now for m in members)

    await eventually(past_its_try, what="the waiter's try's deadline passed")
    report = await inspect(aiolock_client, "fair", "kept-shown")
    assert [w.owner for w in report.waiters] == [f"{other.id}:x:w"]
    assert 0 < report.waiters[0].expires_in <= 0.3
    await lock.unlock()
    assert await waiter
    await other.fair_lock("kept-shown", owner="w").unlock()


async def test_inspect_the_rw_lock_shows_readers_writer_and_waiting_writers(
    cli: Callable[..., Any],
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
) -> None:
    rw = aiolock_client.rw_lock("doc")
    await rw.read_lock(owner="a").lock()
    await rw.read_lock(owner="a").lock()
    await rw.read_lock(owner="b").lock(lease=7)
    other = make_client()
    writer = asyncio.create_task(other.rw_lock("doc").write_lock(owner="w").try_lock(wait=30))

    async def writer_waits() -> bool:
        return len((await inspect(aiolock_client, "rw", "doc")).waiters) == 1

    await eventually(writer_waits, what="the writer registered as waiting")
    data = await inspect_json(cli, "doc", "--kind", "rw")
    readers = {h["owner"]: h for h in data["holders"]}
    a, b = f"{aiolock_client.id}:x:a", f"{aiolock_client.id}:x:b"
    assert sorted(readers) == sorted([a, b])
    assert {h["mode"] for h in data["holders"]} == {"read"}
    assert (readers[a]["count"], readers[b]["count"]) == (2, 1)
    assert 6 < readers[b]["lease"] <= 7
    assert data["fencing_counter"] == max(readers[a]["token"], readers[b]["token"])
    assert [w["owner"] for w in data["waiters"]] == [f"{other.id}:x:w"]
    assert data["subscribers"] == 1  # the writer's client, on the writers' channel

    for owner in ("a", "a", "b"):
        await rw.read_lock(owner=owner).unlock()
    assert await writer
    writing = other.rw_lock("doc").write_lock(owner="w")
    await writing.lock()  # re-entered
    data = await inspect_json(cli, "doc", "--kind", "rw")
    [holder] = data["holders"]
    assert (holder["owner"], holder["mode"], holder["count"]) == (f"{other.id}:x:w", "write", 2)
    assert holder["token"] == data["fencing_counter"]
    code, out, _ = await cli("inspect", "doc", "--kind", "rw")
    assert code == 0
    assert f"write  {other.id}:x:w  holds 2" in out
    await writing.unlock()
    await writing.unlock()
    assert (await inspect_json(cli, "doc", "--kind", "rw"))["held"] is False


async def test_inspect_the_semaphore_shows_permits(
    cli: Callable[..., Any], aiolock_client: aiolock.Client
) -> None:
    semaphore = aiolock_client.semaphore("pool", 3)
    permits = [await semaphore.try_acquire(), await semaphore.try_acquire(lease=9)]
    data = await inspect_json(cli, "pool", "--kind", "semaphore", "--permits", "3")
    assert data["permits"] == {"held": 2, "limit": 3, "available": 1}
    assert sorted(h["owner"] for h in data["holders"]) == sorted(p.id for p in permits if p)
    assert {(h["count"], h["token"]) for h in data["holders"]} == {(1, None)}
    assert data["fencing_counter"] is None
    data = await inspect_json(cli, "pool", "--kind", "semaphore")
    assert data["permits"] == {"held": 2, "limit": None, "available": None}
    code, out, _ = await cli("inspect", "pool", "--kind", "semaphore", "--permits", "3")
    assert (code, "permits: 2 held, 1 available of 3" in out) == (0, True)
    for permit in permits:
        assert permit is not None
        await permit.release()
    data = await inspect_json(cli, "pool", "--kind", "semaphore", "--permits", "3")
    assert data["permits"] == {"held": 0, "limit": 3, "available": 3}


# -- unlock --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lock", "fair", "rw"])
async def test_unlock_with_yes_forces_the_kind(
    cli: Callable[..., Any], aiolock_client: aiolock.Client, kind: str
) -> None:
    if kind == "rw":
        lock: Any = aiolock_client.rw_lock("stuck").write_lock(owner="gone")
    elif kind == "fair":
        lock = aiolock_client.fair_lock("stuck", owner="gone")
    else:
        lock = aiolock_client.lock("stuck", owner="gone")
    await lock.lock(lease=60)
    code, out, err = await cli("unlock", "stuck", "--force", "--yes", "--kind", kind)
    assert code == 0, err
    assert "force-unlocked" in out
    assert "[y/N]" not in err
    assert not await lock.is_locked()
    code, out, _ = await cli("unlock", "stuck", "--force", "--yes", "--kind", kind)
    assert code == 1
    assert "not held" in out


async def test_unlock_of_an_rw_lock_ends_its_readers_and_its_writer(
    cli: Callable[..., Any], aiolock_client: aiolock.Client
) -> None:
    # Each mode's force_unlock ends that mode's holds only: the command forces both.
    rw = aiolock_client.rw_lock("both")
    for owner in ("a", "b"):
        await rw.read_lock(owner=owner).lock(lease=60)
    code, out, err = await cli("unlock", "both", "--force", "--yes", "--kind", "rw")
    assert code == 0, err
    assert "force-unlocked" in out
    assert not await rw.read_lock().is_locked()
    await rw.write_lock(owner="w").lock(lease=60)
    await rw.read_lock(owner="w").lock(lease=60)  # the writer reads too
    code, out, err = await cli("unlock", "both", "--force", "--yes", "--kind", "rw")
    assert code == 0, err
    assert not await rw.read_lock().is_locked()
    assert not await rw.write_lock().is_locked()


async def test_unlock_asks_first(cli: Callable[..., Any], aiolock_client: aiolock.Client) -> None:
    lock = aiolock_client.lock("ask", owner="holder")
    await lock.lock(lease=60)
    for refusal in ("n\n", "\n", "", "whatever\n"):
        code, _, err = await cli("unlock", "ask", "--force", stdin=refusal)
        assert code == 1, err
        assert "[y/N]" in err
        assert f"{aiolock_client.id}:x:holder (1 holds)" in err
        assert await lock.is_locked()
    code, out, _ = await cli("unlock", "ask", "--force", stdin="yes\n")
    assert code == 0
    assert "force-unlocked" in out
    assert not await lock.is_locked()


async def test_unlock_reads_the_answer_from_stdin_of_the_process(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client
) -> None:
    lock = aiolock_client.lock("piped", owner="holder")
    await lock.lock(lease=60)
    args = ("unlock", "piped", "--force", "--url", aiolock_server.url)
    prefix = ("--prefix", aiolock_client.key_prefix)
    refused = await asyncio.to_thread(python_m_aiolock, *args, *prefix, input="n\n")
    assert refused.returncode == 1, refused.stderr
    assert await lock.is_locked()
    accepted = await asyncio.to_thread(python_m_aiolock, *args, *prefix, input="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert not await lock.is_locked()


# -- list ----------------------------------------------------------------------------------------

# Names with glob-special characters, braces, a kind segment, percent escapes and spaces.
AWKWARD = ("orders:{42}", "}{", "a*b?[c]", "%7B", "100%", "x:fair:{y}", "名前 with spaces")


async def hold_every_kind(
    client: aiolock.Client, stack: contextlib.AsyncExitStack, names: tuple[str, ...]
) -> dict[tuple[str, str], int]:
    """Hold one lock of each kind under each of ``names`` (the kinds in turn, so that names
    and kinds mix): ``(kind, name) -> holders``; every hold is ended when ``stack`` closes."""
    held: dict[tuple[str, str], int] = {}
    for index, name in enumerate(names):
        kind = ("lock", "fair", "spin", "rw", "semaphore")[index % 5]
        if kind == "semaphore":
            semaphore = client.semaphore(name, 3)
            for _ in range(2):
                permit = await semaphore.try_acquire(lease=60)
                assert permit is not None
                stack.push_async_callback(permit.release)
            held[kind, name] = 2
            continue
        if kind == "rw":
            lock: Any = client.rw_lock(name).read_lock(owner="o")
        else:
            lock = {"lock": client.lock, "fair": client.fair_lock, "spin": client.spin_lock}[kind](
                name, owner="o"
            )
        await lock.lock(lease=60)
        await lock.lock(lease=60)  # re-entered: shown as x2
        stack.push_async_callback(lock.unlock)
        stack.push_async_callback(lock.unlock)
        held[kind, name] = 1
    return held


async def test_list_every_kind_with_awkward_names_and_patterns(
    cli: Callable[..., Any],
    aiolock_client: aiolock.Client,
    make_client: Callable[..., aiolock.Client],
    redis: Redis,
) -> None:
    other = make_client()
    async with contextlib.AsyncExitStack() as stack:
        held = await hold_every_kind(aiolock_client, stack, AWKWARD)
        # One name under two kinds: two locks ("orders:{42}" is a plain lock above).
        held.update(await hold_every_kind(aiolock_client, stack, ("orders:7", "orders:{42}")))
        assert ("fair", "orders:{42}") in held
        # Waiters: a client subscribed to a plain lock, a fair waiter in its queue.
        waiter = asyncio.create_task(other.lock("orders:{42}", owner="w").try_lock(wait=30))
        queued = asyncio.create_task(other.fair_lock("}{", owner="w").try_lock(wait=30))

        async def waiting() -> bool:
            plain = await inspect(aiolock_client, "lock", "orders:{42}")
            fair = await inspect(aiolock_client, "fair", "}{")
            return (plain.subscribers, len(fair.waiters)) == (1, 1)

        await eventually(waiting, what="a subscribed waiter and a queued one")
        # Not listed: a released lock (its fencing counter stays), a latch, a key that is no
        # lock's, and a lock under another prefix.
        async with aiolock_client.lock("released").acquire():
            pass
        assert await aiolock_client.countdown_latch("latch").try_set_count(2)
        await redis.set(f"{aiolock_client.key_prefix}:{{stray", "x")
        stranger = make_client(key_prefix=aiolock_client.key_prefix + "-other")
        strangers = stranger.lock("orders:1")
        await strangers.lock(lease=60)
        stack.push_async_callback(strangers.unlock)

        code, out, err = await cli("list", "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert [(entry["kind"], entry["name"]) for entry in listed] == sorted(
            held, key=lambda kind_name: (kind_name[1], kind_name[0])
        )
        for entry in listed:  # each entry is what inspect --json prints
            assert entry["held"] is True
            assert list(entry) == list(
                await inspect_json(cli, entry["name"], "--kind", entry["kind"])
            )
            assert len(entry["holders"]) == held[entry["kind"], entry["name"]]
            if entry["kind"] != "semaphore":
                assert [holder["count"] for holder in entry["holders"]] == [2]
                assert entry["holders"][0]["owner"] == f"{aiolock_client.id}:x:o"
            assert all(0 < holder["lease"] <= 60 for holder in entry["holders"])
        by_key = {(entry["kind"], entry["name"]): entry for entry in listed}
        assert by_key["lock", "orders:{42}"]["subscribers"] == 1
        assert [w["owner"] for w in by_key["fair", "}{"]["waiters"]] == [f"{other.id}:x:w"]

        async def names(pattern: str) -> list[tuple[str, str]]:
            code, out, err = await cli("list", pattern, "--json")
            assert code == 0, err
            return [(entry["kind"], entry["name"]) for entry in json.loads(out)]

        assert await names("orders:*") == [
            ("lock", "orders:7"),
            ("fair", "orders:{42}"),
            ("lock", "orders:{42}"),
        ]
        assert await names("orders:{*}") == [("fair", "orders:{42}"), ("lock", "orders:{42}")]
        assert await names("a\\*b\\?\\[c]") == [("spin", "a*b?[c]")]
        assert await names("[{}]*") == [("fair", "}{")]
        assert await names("%7B") == [("rw", "%7B")]  # the name, never a brace's escape
        assert await names("*%") == [("semaphore", "100%")]
        assert await names("x:fair:*") == [("lock", "x:fair:{y}")]
        assert await names("名前*") == [("fair", "名前 with spaces")]
        assert await names("nothing*") == []

        code, out, err = await cli("list", "orders:*")
        assert code == 0, err
        head, *rows = out.splitlines()
        assert head.split() == ["NAME", "KIND", "HOLDERS", "LEASE", "WAITERS"]
        assert [row.split()[:2] for row in rows] == [
            ["orders:7", "lock"],
            ["orders:{42}", "fair"],
            ["orders:{42}", "lock"],
        ]
        plain = rows[2].split()
        assert plain[2:4] == [f"{aiolock_client.id}:x:o", "x2"]
        assert plain[4].endswith("s")
        assert 0 < float(plain[4][:-1]) <= 60
        assert plain[5] == "1"  # the waiting client
        code, out, err = await cli("list", "nothing*")
        assert (code, out, err) == (
            0,
            f"no lock under the prefix {aiolock_client.key_prefix!r} matches 'nothing*'\n",
            "",
        )
    # The holds ended: the waiters have their locks, and once they are done nothing is listed.
    assert await waiter
    assert await queued
    code, out, _ = await cli("list", "--json")
    assert {(entry["kind"], entry["name"]) for entry in json.loads(out)} == {
        ("lock", "orders:{42}"),
        ("fair", "}{"),
    }
    await other.lock("orders:{42}", owner="w").unlock()
    await other.fair_lock("}{", owner="w").unlock()
    assert await cli("list", "--json") == (0, "[]\n", "")


async def test_list_on_a_cluster_reads_every_primary(
    aiolock_cluster: ServerInfo,
    cluster_client: aiolock.Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    prefix = cluster_client.key_prefix

    async def cli(*args: str) -> tuple[int, str, str]:
        argv = [*args, "--url", aiolock_cluster.url, "--cluster", "--prefix", prefix]
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    names = (*AWKWARD, *(f"orders:{n}" for n in range(10)))
    async with contextlib.AsyncExitStack() as stack:
        held = await hold_every_kind(cluster_client, stack, names)
        redis = cluster_client.redis
        assert isinstance(redis, RedisCluster)
        nodes = {redis.get_node_from_key(keys_of(cluster_client.lock(n)).lock) for n in names}
        assert None not in nodes
        assert len(nodes) > 1  # the locks live on more than one primary

        code, out, err = await cli("list", "--json")
        assert code == 0, err
        listed = json.loads(out)
        assert {(entry["kind"], entry["name"]) for entry in listed} == set(held)
        assert all(len(entry["holders"]) == held[entry["kind"], entry["name"]] for entry in listed)
        code, out, err = await cli("list", "orders:[0-4]", "--json")
        assert code == 0, err
        assert sorted(entry["name"] for entry in json.loads(out)) == [
            f"orders:{n}" for n in range(5)
        ]
        code, out, err = await cli("list")
        assert code == 0, err
        assert len(out.splitlines()) == 1 + len(held)
    assert await cli("list", "--json") == (0, "[]\n", "")


def python_m_aiolock_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m aiolock`` with stdout a pipe whose reader is gone before it writes
    (``aiolock list | head -1`` once head has its line)."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "aiolock", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    finally:
        os.close(write)


async def test_a_closed_stdout_is_not_an_error(
    aiolock_server: ServerInfo, aiolock_client: aiolock.Client
) -> None:
    """No message, and the exit code the command would have had: 0 for list, 0 or 1 for
    inspect (held or not); a server that cannot be reached is still exit 3."""
    where = ("--url", aiolock_server.url, "--prefix", aiolock_client.key_prefix)
    async with aiolock_client.lock("piped").acquire():
        for argv, expected in (
            (("list",), 0),
            (("list", "--json"), 0),
            (("inspect", "piped", "--json"), 0),
            (("inspect", "piped"), 0),
            (("inspect", "free", "--json"), 1),
        ):
            run = await asyncio.to_thread(python_m_aiolock_into_a_closed_pipe, *argv, *where)
            assert (run.returncode, run.stderr) == (expected, ""), argv
    url = f"redis://127.0.0.1:{free_port()}/0"
    run = await asyncio.to_thread(python_m_aiolock_into_a_closed_pipe, "list", "--url", url)
    assert run.returncode == 3
    assert run.stderr.startswith("aiolock: cannot connect to")


# -- usage errors, connection failures -----------------------------------------------------------


@pytest.fixture
async def cluster_client(aiolock_cluster: ServerInfo) -> AsyncIterator[aiolock.Client]:
    client = aiolock.Client.from_url(
        aiolock_cluster.url, cluster=True, key_prefix=f"aiolock-cli-{uuid.uuid4().hex[:8]}"
    )
    yield client
    await client.aclose()


async def test_inspect_and_unlock_on_a_cluster(
    aiolock_cluster: ServerInfo,
    cluster_client: aiolock.Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--cluster``: the lock's keys and its slot's fencing counter are read in one MULTI on
    the node that serves the slot; waiting clients are counted on every node."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    prefix = cluster_client.key_prefix

    async def cli(*args: str) -> tuple[int, str, str]:
        argv = [*args, "--url", aiolock_cluster.url, "--cluster", "--prefix", prefix]
        code = await asyncio.to_thread(main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    other = aiolock.Client.from_url(aiolock_cluster.url, cluster=True, key_prefix=prefix)
    try:
        for name in ("orders:1", "orders:2", "orders:3"):  # slots on more than one node
            lock = cluster_client.lock(name, owner="stuck")
            await lock.lock(lease=60)
            await lock.lock(lease=60)
            token = (await inspect(cluster_client, "lock", name)).holders[0].token
            assert token is not None
            waiter = asyncio.create_task(other.lock(name, owner="next").try_lock(wait=30))

            async def subscribed(name: str = name) -> bool:
                return (await inspect(cluster_client, "lock", name)).subscribers == 1

            await eventually(subscribed, what="the waiter subscribed")
            code, out, err = await cli("inspect", name, "--json")
            assert code == 0, err
            data = json.loads(out)
            [holder] = data["holders"]
            assert holder["owner"] == f"{cluster_client.id}:x:stuck"
            assert holder["count"] == 2
            assert holder["token"] == token == data["fencing_counter"]
            assert 59 < holder["lease"] <= 60
            assert data["subscribers"] == 1

            code, out, err = await cli("unlock", name, "--force", "--yes")
            assert code == 0, err
            assert "force-unlocked" in out
            assert await asyncio.wait_for(waiter, 10)  # woken by the force
            code, out, _ = await cli("inspect", name)
            assert code == 0  # the waiter holds it now
            assert f"{other.id}:x:next  holds 1" in out
            assert f"fencing counter: {token + 1}" in out
            await other.lock(name, owner="next").unlock()
        # Every kind reads its keys on the node of its slot.
        async with (
            cluster_client.fair_lock("f").acquire(),
            cluster_client.rw_lock("rw").read_lock().acquire(),
        ):
            permit = await cluster_client.semaphore("s", 2).try_acquire(wait=0)
            assert permit is not None
            for kind, name in (("fair", "f"), ("rw", "rw"), ("semaphore", "s")):
                code, out, err = await cli("inspect", name, "--kind", kind, "--json")
                assert code == 0, err
                assert len(json.loads(out)["holders"]) == 1
            await permit.release()
    finally:
        await other.aclose()


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["inspect"],
        ["inspect", ""],
        ["inspect", "x", "--kind", "queue", "--url", "redis://127.0.0.1:1"],
        ["inspect", "x", "--permits", "3", "--url", "redis://127.0.0.1:1"],
        ["inspect", "x", "--kind", "semaphore", "--permits", "0", "--url", "redis://127.0.0.1:1"],
        ["inspect", "x", "--url", "http://127.0.0.1:1"],
        ["inspect", "x"],  # no URL: only demo and server start a server of their own
        ["list"],  # no URL
        ["list", "a*", "b*", "--url", "redis://127.0.0.1:1"],
        ["list", "x", "--kind", "fair", "--url", "redis://127.0.0.1:1"],
        ["unlock", "x", "--url", "redis://127.0.0.1:1"],  # no --force
        ["unlock", "x", "--force", "--kind", "semaphore", "--url", "redis://127.0.0.1:1"],
        ["--url", "redis://127.0.0.1:1", "server"],
        ["server", "--port", "70000"],
        ["server", "--cluster", "3", "--port", "7000"],
        ["server", "--cluster", "0"],
        ["demo", "--processes", "0"],
    ],
)
def test_usage_errors_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert main(argv) == 2
    _, err = capsys.readouterr()
    assert "usage:" in err
    assert "Traceback" not in err


def test_an_unreachable_server_exits_3_with_one_line() -> None:
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    for argv in (
        ["inspect", "x", "--json"],
        ["list", "--json"],
        ["unlock", "x", "--force", "--yes"],
    ):
        run = python_m_aiolock(*argv, "--url", url)
        assert run.returncode == 3, run.stderr
        assert run.stdout == ""
        [line] = run.stderr.splitlines()
        assert line.startswith("aiolock: cannot connect to redis://user:***@127.0.0.1:")
        assert "secret" not in line


async def test_the_url_may_come_from_redis_url(
    aiolock_server: ServerInfo,
    aiolock_client: aiolock.Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDIS_URL", aiolock_server.url)
    async with aiolock_client.lock("env").acquire(lease=5):
        argv = ["inspect", "env", "--json", "--prefix", aiolock_client.key_prefix]
        code = await asyncio.to_thread(main, argv)
    assert code == 0
    assert json.loads(capsys.readouterr().out)["held"] is True


# -- server and demo -----------------------------------------------------------------------------


@contextlib.contextmanager
def _popen(*args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "aiolock", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


async def test_server_prints_its_url_serves_and_stops_on_sigint() -> None:
    with _popen("server") as process:
        assert process.stdout is not None
        url = (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)).strip()
        assert url.startswith("redis://127.0.0.1:")
        async with aiolock.Client.from_url(url) as client:
            async with client.lock("served").acquire(wait=5) as guard:
                assert guard.fencing_token == 1
            assert await client.redis.ping()
        process.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(process.wait, 30)
        assert code == 0, process.stderr.read() if process.stderr else ""
    probe = Redis.from_url(url, socket_connect_timeout=1)
    try:
        with pytest.raises(RedisConnectionError):  # the embedded server went with it
            await probe.ping()
    finally:
        await probe.aclose()


async def test_server_stops_on_sigterm_too() -> None:
    with _popen("server") as process:
        assert process.stdout is not None
        url = (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 30)).strip()
        assert url.startswith("redis://")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 30) == 0


async def test_server_runs_a_cluster() -> None:
    with _popen("server", "--cluster", "3") as process:
        assert process.stdout is not None
        url = (await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), 60)).strip()
        assert url.startswith("redis://127.0.0.1:")
        async with aiolock.Client.from_url(url, cluster=True) as client:
            for name in ("a", "b", "c", "d"):  # over several nodes
                async with client.lock(name).acquire(wait=5):
                    pass
            assert len(client.redis.get_primaries()) == 3  # type: ignore[union-attr]
        process.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(process.wait, 30)
        assert code == 0, process.stderr.read() if process.stderr else ""


def test_demo_with_processes_shows_progress(aiolock_server: ServerInfo) -> None:
    if aiolock_server.server is not None and aiolock_server.server.binary != "valkey":
        pytest.skip("the demo is the same on every server: run it once")
    lines: list[str] = []
    assert _demo.run(aiolock_server.url, requests=20, processes=2, progress=lines.append) == 0
    assert lines == [
        "sending 20 requests from 2 processes...",
        "  1/2 processes done",
        "  2/2 processes done",
    ]
