"""The edges that threads bring: a call on a loop's thread, an interrupt during a wait, a
fork, closing, and an interpreter that exits with a client never closed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import pytest
import redis

import aiolock
import aiolock.sync
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import Interrupted, keys_of, wait_until


def loop_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "aiolock.sync"]


@pytest.mark.anyio
async def test_a_blocking_call_on_a_loop_thread_names_the_async_api(
    aiolock_sync_client: aiolock.sync.Client,
) -> None:
    lock = aiolock_sync_client.lock("in-loop")
    with pytest.raises(RuntimeError, match=r"async API: await lock\.try_lock\(\)"):
        lock.try_lock(0)
    with pytest.raises(RuntimeError, match=r"async with lock\.acquire\(\)"):
        lock.acquire(wait=0).__enter__()


@pytest.mark.parametrize("kind", ["lock", "fair_lock"])
def test_an_interrupt_during_a_wait_leaves_nothing_behind(
    aiolock_sync_client: aiolock.sync.Client, aiolock_server: ServerInfo, kind: str
) -> None:
    assert threading.current_thread() is threading.main_thread()
    client = aiolock_sync_client
    lock = getattr(client, kind)("interrupted")
    keys = keys_of(lock.target())
    holder = ThreadPoolExecutor(1)
    holder.submit(lambda: lock.lock(lease=30)).result(timeout=30)  # another thread holds it
    plain = redis.Redis.from_url(aiolock_server.url)

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, raise_interrupted)
    main = threading.main_thread().ident
    assert main is not None

    def interrupt_once_waiting() -> None:
        wait_until(lambda: lock.statistics().waiters == 1)  # the main thread waits
        signal.pthread_kill(main, signal.SIGUSR1)

    interrupter = threading.Thread(target=interrupt_once_waiting)
    interrupter.start()
    try:
        with pytest.raises(Interrupted):
            lock.try_lock(30)
    finally:
        interrupter.join()
        signal.signal(signal.SIGUSR1, previous)
    # The pending acquire was cancelled on the loop: no waiter left, in the client or in line.
    assert lock.statistics().waiters == 0
    if kind == "fair_lock":
        wait_until(lambda: plain.llen(keys.queue) == 0)  # type: ignore[attr-defined]
    holder.submit(lock.unlock).result(timeout=30)
    holder.shutdown()
    wait_until(lambda: not plain.exists(keys.lock))  # nothing granted to the interrupted thread
    assert not lock.is_held()
    with lock.acquire(wait=5):  # and the thread can take it again
        pass
    plain.close()


CTRL_C = """
import signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import redis
import aiolock.sync

url, prefix = sys.argv[1], sys.argv[2]
# Python's own Ctrl-C, whatever this process inherited (an ignored or blocked SIGINT survives
# exec: the handler would never run, and the wait below would just run out): said on stderr.
print("inherited:", signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []),
      file=sys.stderr)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
# A place not withdrawn would stay 30 s, past the 10 s this waits for the queue to empty.
with aiolock.sync.Client.from_url(url, key_prefix=prefix, fair_wait_timeout=30) as client:
    lock = client.fair_lock("ctrl-c")
    holder = ThreadPoolExecutor(1)
    holder.submit(lambda: lock.lock(lease=30)).result()
    main = threading.main_thread().ident
    plain = redis.Redis.from_url(url)
    queued = []

    def in_line():
        return [k for k in plain.scan_iter(match=prefix + ":*") if plain.type(k) == b"list"]

    def press_ctrl_c():
        while lock.statistics().waiters != 1 or not in_line():
            time.sleep(0.005)
        queued.extend(in_line())  # the waiting thread's place in the fair queue
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=press_ctrl_c).start()
    began = time.monotonic()
    try:
        print("granted?!" if lock.try_lock(30) else "timed out?!")
    except KeyboardInterrupt:
        print("interrupted")
    print(f"waited {time.monotonic() - began:.2f} s", file=sys.stderr)
    print("was in line:", len(queued))
    deadline = time.monotonic() + 10
    while any(plain.llen(key) for key in queued) and time.monotonic() < deadline:
        time.sleep(0.005)
    print("queue entries:", sum(plain.llen(key) for key in queued))
    holder.submit(lock.unlock).result()
    holder.shutdown()
    print("held after:", lock.is_held(), lock.is_locked())
"""


def test_ctrl_c_during_a_wait_leaves_nothing_behind(aiolock_server: ServerInfo) -> None:
    """A real SIGINT: Python's own handler raises KeyboardInterrupt in the waiting thread."""
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C, aiolock_server.url, "aiolock-test-ctrl-c"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "interrupted",
        "was in line: 1",
        "queue entries: 0",
        "held after: False False",
    ], done.stdout + done.stderr


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_after_a_fork_the_child_starts_afresh_and_the_parent_keeps_its_holds(
    aiolock_sync_client: aiolock.sync.Client,
) -> None:
    client = aiolock_sync_client
    parents = client.lock("parent's")
    with parents.acquire(wait=5) as guard:  # watched: the parent's watchdog renews it
        parent_id = client.id
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            os.close(read)
            try:
                report = [
                    client.id != parent_id,  # a new async client: new owner ids
                    not parents.is_held(),  # holds none of the parent's locks
                    parents.try_lock(0) is False,  # and cannot take the parent's lock
                ]
                with client.lock("child's").acquire(wait=5) as child_guard:
                    report.append(child_guard.fencing_token >= 1)
                report.append(len(loop_threads()) == 1)  # a loop thread of its own
                client.close()
                os.write(write, ("ok " + " ".join(map(str, report))).encode())
            except BaseException as error:
                os.write(write, f"error {error!r}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            said = pipe.read()
        os.waitpid(pid, 0)
        assert said == "ok True True True True True"
        assert parents.is_held()  # undisturbed: the connections and the loop still work
        assert not guard.lost
        assert client.lock("child's").try_lock(0)
    assert not parents.is_locked()


def test_closing_stops_the_loop_thread(aiolock_server: ServerInfo) -> None:
    before = len(loop_threads())
    client = aiolock.sync.Client.from_url(aiolock_server.url, key_prefix="aiolock-test-close")
    with client:
        assert client.lock("x").try_lock(0)
        assert len(loop_threads()) == 1
        assert loop_threads()[0].daemon
    if before == 0:  # no other blocking client open in this process
        assert loop_threads() == []
    assert client.closed
    with pytest.raises(RuntimeError, match="closed"):
        client.lock("x").try_lock(0)
    client.close()  # twice is fine


def test_closing_tells_a_thread_still_waiting(aiolock_server: ServerInfo) -> None:
    client = aiolock.sync.Client.from_url(aiolock_server.url, key_prefix="aiolock-test-close")
    lock = client.lock("busy")
    assert lock.try_lock(0, lease=5)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lambda: lock.try_lock(60))
        wait_until(lambda: lock.statistics().waiters == 1)
        client.close()
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whatever ends it, it ends
            waiting.result(timeout=30)
    assert not isinstance(raised.value, TimeoutError)


def run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a new interpreter with this one's path; it must exit with 0."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    return done


# Run in a process of its own: a task left pending when the loop closed is found among the
# objects the interpreter still has (it would only be reported at its exit, if at all).
CLOSE_IN_FLIGHT = """
import asyncio, gc, sys, threading, time
import redis
import aiolock.sync
url = sys.argv[1]
client = aiolock.sync.Client.from_url(url, key_prefix="close-in-flight", sync_replicas=1,
                                      sync_timeout=30)
lock = client.lock("x")
def acquire():
    try:
        lock.try_lock(60)
    except RuntimeError:
        pass  # told the client closed
thread = threading.Thread(target=acquire)
thread.start()
probe = redis.Redis.from_url(url)
deadline = time.monotonic() + 30
while probe.info("clients")["blocked_clients"] < 1:  # its WAIT (no replica) blocks
    assert time.monotonic() < deadline, "the WAIT never blocked"
    time.sleep(0.002)
client.close()
thread.join()
gc.collect()
print([repr(task) for task in gc.get_objects()
       if isinstance(task, asyncio.Task) and not task.done()])
"""


def test_closing_with_a_call_in_flight_leaves_no_task_pending(
    aiolock_server: ServerInfo,
) -> None:
    """The loop's last round cancels the calls still running; one cancelled in flight reads
    its reply in a task of its own, which must end too before the loop closes (it was left
    pending: "Task was destroyed but it is pending" at the interpreter's exit)."""
    done = run_python(CLOSE_IN_FLIGHT, aiolock_server.url)
    assert done.stdout == "[]\n", done.stdout
    assert "never awaited" not in done.stderr
    assert "pending" not in done.stderr


def test_a_client_never_closed_does_not_keep_the_interpreter_alive(
    aiolock_server: ServerInfo,
) -> None:
    script = (
        "import aiolock.sync, sys\n"
        f"client = aiolock.sync.Client.from_url({aiolock_server.url!r}, key_prefix='exit')\n"
        "client.lock('never-released').lock(lease=1)\n"
        "print('held')\n"
    )
    done = run_python(script)
    assert done.stdout == "held\n"
