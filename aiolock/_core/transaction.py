"""``guard.transaction()``: writes that land only while the hold lasts.

The block queues commands with redis-py's own command methods (``tx.sadd(...)``); a clean exit
sends them in **one** script call that first checks the hold (this owner, this fencing token:
the kind's ``transact`` script) and then runs them, or runs none.  Redis runs a script
atomically, so no other client's command comes between the check and the writes: a holder
paused past its lease, whose lock another client holds now, has its writes refused instead of
landing on data the new holder guards.

What is checked before anything is sent, so that a refused block costs no I/O:

- a command a script may not run (MULTI, SUBSCRIBE, WAIT, EVAL, a blocking pop...) is refused
  as it is queued (:data:`FORBIDDEN`, and the server's own ``noscript`` and ``blocking`` flags);
- the keys of each command are found as redis-py finds them to route a command on a Cluster
  (its commands parser, over the server's ``COMMAND`` table), passed as the script's KEYS, and
  on a Cluster each must hash to the lock's slot (one script runs on one node).

The command table is read from the server once per client (a Cluster client has it already),
when the first transaction block is entered.

The call is sent once: a transaction is not idempotent, so unlike the lock scripts it is never
resent after a connection failed with it written.  Its outcome is then unknown (run once, or
not at all) and the caller gets the connection error, as from a MULTI/EXEC.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from redis.asyncio import Redis, RedisCluster
from redis.commands import AsyncCoreCommands
from redis.crc import key_slot
from redis.exceptions import ResponseError

from .._redis.calls import Runner
from .._redis.redispy import AsyncCommandsParser, commands_parser
from ..errors import LockLostError

if TYPE_CHECKING:
    from .._scripts import Script
    from .holds import Hold, Holds

__all__ = ["FORBIDDEN", "CommandTable", "Transaction", "TransactionContext"]

FORBIDDEN: Final = frozenset(
    {
        # A script is a transaction already, and cannot watch or wait.
        "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH", "WAIT", "WAITAOF",
        # Scripts and functions do not nest.
        "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO", "SCRIPT", "FUNCTION",
        # A script never blocks: these would return at once, unlike those commands sent alone.
        "BLPOP", "BRPOP", "BRPOPLPUSH", "BLMOVE", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP",
        # Pub/sub sessions, connection state and server administration.
        "SUBSCRIBE", "UNSUBSCRIBE", "PSUBSCRIBE", "PUNSUBSCRIBE", "SSUBSCRIBE", "SUNSUBSCRIBE",
        "MONITOR", "SYNC", "PSYNC", "REPLCONF", "AUTH", "HELLO", "RESET", "QUIT", "SELECT",
        "CLIENT", "SHUTDOWN", "FAILOVER", "REPLICAOF", "SLAVEOF", "SAVE", "BGSAVE",
        "BGREWRITEAOF", "DEBUG", "ROLE",
    }
)  # fmt: skip
"""Commands refused as they are queued: a script may not run them (most are flagged
``noscript`` by the server, which is checked too), or would run them differently."""

# Lua's unpack() takes at most about 8000 values: a longer command could not be called.
_MAX_ARGS: Final = 7900

# redis-py's markers in a command's options (redis.client.NEVER_DECODE / EMPTY_RESPONSE).
_NEVER_DECODE: Final = "NEVER_DECODE"
_EMPTY_RESPONSE: Final = "EMPTY_RESPONSE"


def _word(arg: Any) -> str:
    """A command word as text, upper case (redis-py passes some as bytes: ``b"BLOCK"``)."""
    return (arg.decode(errors="replace") if isinstance(arg, bytes) else str(arg)).upper()


def _moves(parser: AsyncCommandsParser, command: tuple[Any, ...]) -> bool:
    """Whether the server must be asked where ``command``'s keys are (``movablekeys``)."""
    info = parser.commands.get(_word(command[0]).lower())
    return isinstance(info, dict) and "movablekeys" in info["flags"]


class CommandTable:
    """What a client knows of its server's commands, for transactions: redis-py's commands
    parser (key positions and flags from ``COMMAND``) and its reply parsers."""

    def __init__(self, redis: Redis | RedisCluster) -> None:
        self._redis = redis
        self._parser: AsyncCommandsParser | None = None
        self._loading: asyncio.Lock | None = None
        self.connection_kwargs: dict[str, Any] = redis.get_connection_kwargs()
        self.callbacks = _script_reply_callbacks(self.connection_kwargs)
        self.encoder = redis.get_encoder()

    async def parser(self) -> AsyncCommandsParser:
        """The parser, with the server's command table (read once per client)."""
        if self._parser is not None:
            return self._parser
        if self._loading is None:
            self._loading = asyncio.Lock()
        async with self._loading:
            if self._parser is None:
                redis = self._redis
                if isinstance(redis, RedisCluster):
                    await redis.initialize()  # a no-op once the client knows its cluster
                    self._parser = redis.commands_parser
                else:
                    parser = commands_parser()
                    await parser.initialize(redis)  # type: ignore[arg-type]
                    self._parser = parser
        return self._parser


def _script_reply_callbacks(kwargs: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """redis-py's reply parsers for RESP2-shaped replies, which is what a command run inside
    a script returns whatever protocol the connection speaks (scripts call with RESP2): those
    of a RESP2 client with the same options (made without I/O, never connected)."""
    options: dict[str, Any] = {"protocol": 2}
    if "legacy_responses" in kwargs:  # redis-py 8.1
        options["legacy_responses"] = kwargs["legacy_responses"]
    parsers = Redis(**options).response_callbacks
    return {str(name).upper(): parse for name, parse in parsers.items()}


class Transaction(AsyncCoreCommands):
    """Commands queued for one atomic call, yielded by ``guard.transaction()``.

    Queue commands with redis-py's methods, as on a pipeline (``tx.sadd(key, member)``); each
    returns the transaction, so calls chain, and may be awaited, as on redis-py's asyncio
    pipeline.  Nothing is sent until the block exits cleanly.

    :ivar results: the replies, in the order queued, parsed as redis-py parses them; ``None``
        until the block's exit ran the commands.  A command that failed (a wrong type, say)
        has its :class:`redis.exceptions.ResponseError` in its place, and the exit raised the
        first such error, as ``pipeline.execute()`` does; the others ran.
    """

    # Read by redis-py's command methods for its observability hooks, which a queue has none of.
    _event_dispatcher: Any = None
    # redis-py's typing marker: its command methods are typed as an async client's, as for its
    # own asyncio pipeline (each returns the transaction, in fact, so that calls chain).
    _is_async_client: Literal[True] = True

    def __init__(self, name: str, parser: AsyncCommandsParser, table: CommandTable) -> None:
        self._name = name
        self._parser = parser
        self._table = table
        self._queue: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._closed = False
        self.results: list[Any] | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def __await__(self) -> Generator[Any, None, Transaction]:
        """``await tx.sadd(...)`` queues the command too and gives the transaction, as on
        redis-py's asyncio pipeline (whose typing calls the command methods awaitable)."""
        return self._itself().__await__()

    async def _itself(self) -> Transaction:
        return self

    def get_encoder(self) -> Any:
        """The client's encoder (some of redis-py's command methods ask for it)."""
        return self._table.encoder

    def get_connection_kwargs(self) -> dict[str, Any]:
        """The client's connection options (some of redis-py's command methods ask)."""
        return self._table.connection_kwargs

    def execute_command(self, *args: Any, **options: Any) -> Transaction:
        """Queue one command (what redis-py's command methods call)."""
        if self._closed:
            raise RuntimeError("this transaction was sent already: queue in its block")
        if not args:
            raise ValueError("a command needs a name")
        # redis-py sends a name such as "MEMORY USAGE" as two arguments: so does the script.
        command = (*_word(args[0]).split(), *args[1:])
        name = command[0].upper()
        self._check(name, command, options)
        self._queue.append((command, options))
        return self

    def _check(self, name: str, command: tuple[Any, ...], options: dict[str, Any]) -> None:
        info = self._parser.commands.get(name.lower())
        if info is None:
            raise ValueError(f"unknown command {name!r}: the server has no such command")
        flags = info["flags"] if isinstance(info, dict) else ()
        # XREAD blocks only with BLOCK; other commands a server flags blocking always would.
        if name in ("XREAD", "XREADGROUP"):
            blocking = any(_word(arg) == "BLOCK" for arg in command[1:])
        else:
            blocking = "blocking" in flags
        if name in FORBIDDEN or "noscript" in flags or blocking:
            raise ValueError(
                f"command {name} cannot run in a transaction: a Lua script may not run it "
                "(or would not block)"
            )
        if len(command) > _MAX_ARGS:
            raise ValueError(f"command {name} has {len(command)} arguments; at most {_MAX_ARGS}")
        if _NEVER_DECODE in options and self._table.encoder.decode_responses:
            raise ValueError(
                f"command {name} returns bytes that a decoding client cannot hand back "
                "through a script; use a client made with decode_responses=False"
            )

    def __repr__(self) -> str:
        state = "sent" if self.results is not None else f"{len(self._queue)} queued"
        return f"<Transaction of {self._name!r} [{state}]>"


class TransactionContext:
    """The async context manager behind ``guard.transaction()`` (see the module docstring)."""

    __slots__ = (
        "_calls",
        "_check",
        "_cluster",
        "_hold",
        "_holds",
        "_name",
        "_ready",
        "_table",
        "_tx",
    )

    def __init__(
        self,
        *,
        ready: Callable[[], object],
        name: str,
        hold: Hold,
        check: tuple[Script, tuple[str, ...], tuple[Any, ...]],
        calls: Runner,
        holds: Holds,
        table: CommandTable,
        cluster: bool,
    ) -> None:
        self._ready = ready  # raises if the client may make no call now (closed, another loop)
        self._name = name
        self._hold = hold
        self._check = check  # the kind's transact script, its lock keys and its ARGV head
        self._calls = calls
        self._holds = holds
        self._table = table
        self._cluster = cluster
        self._tx: Transaction | None = None

    async def __aenter__(self) -> Transaction:
        if self._tx is not None:
            raise RuntimeError("this transaction() context is already in use")
        self._ready()
        parser = await self._table.parser()
        self._tx = Transaction(self._name, parser, self._table)
        return self._tx

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tx = self._tx
        assert tx is not None, "__aexit__ without __aenter__"
        tx._closed = True
        if exc is not None:
            return  # the block failed: nothing is sent
        hold = self._hold
        if hold.check_lost():
            raise self._lost()
        if hold.ended:  # released (or its release's outcome unknown): not the client's to use
            raise RuntimeError(
                f"the hold of lock {self._name!r} has ended: a guard's transaction runs only "
                "while the guard's hold lasts (inside its block)"
            )
        queue = tx._queue
        sent = [(command, options) for command, options in queue if _EMPTY_RESPONSE not in options]
        keys = await self._keys(tx._parser, [command for command, _ in sent])
        script, lock_keys, head = self._check
        argv: list[Any] = [*head, len(sent)]
        for command, _ in sent:
            argv += (len(command), *command)
        reply = await self._calls.run(script, (*lock_keys, *keys), tuple(argv), no_resend=True)
        if int(reply[0]) != 1:
            if not hold.ended:  # else released meanwhile (an explicit owner's other task)
                self._holds.lose(hold, "a transaction found it gone (expired, forced or taken)")
            raise self._lost()
        replies = iter(reply[1])
        results = [
            options[_EMPTY_RESPONSE] if _EMPTY_RESPONSE in options else next(replies)
            for _, options in queue
        ]
        tx.results = [
            await self._parse(result, command, options)
            for result, (command, options) in zip(results, queue, strict=True)
        ]
        for index, result in enumerate(tx.results):
            if isinstance(result, ResponseError):
                shown = " ".join(str(arg) for arg in queue[index][0][:3])
                result.args = (f"Command #{index + 1} ({shown}) of the transaction: {result}",)
                raise result

    async def _keys(
        self, parser: AsyncCommandsParser, commands: list[tuple[Any, ...]]
    ) -> list[Any]:
        """Every key the commands touch, once each, in order; on a Cluster each must be in the
        lock's slot.

        The keys of most commands are at fixed places, found with no I/O; those of a command
        whose keys move (ZUNIONSTORE, SORT ... STORE) are asked of the server (``COMMAND
        GETKEYS``), as redis-py's Cluster client does: so those are found last, once every
        other key passed the check.
        """
        encode = self._table.encoder.encode
        slot = key_slot(encode(self._check[1][0])) if self._cluster else None
        moving = [_moves(parser, command) for command in commands]
        keys: list[list[Any]] = [[] for _ in commands]
        for looking_at_moving in (False, True):
            for index, command in enumerate(commands):
                if moving[index] is not looking_at_moving:
                    continue
                keys[index] = list(await parser.get_keys(*command) or ())
                for key in keys[index]:
                    if slot is not None and key_slot(encode(key)) != slot:
                        raise ValueError(
                            f"key {key!r} is not in the slot of lock {self._name!r}: on a "
                            "Cluster every key of a transaction must share the lock's hash "
                            "tag (lock.hash_tag)"
                        )
        found: dict[bytes, Any] = {}
        for command_keys in keys:
            for key in command_keys:
                found.setdefault(encode(key), key)
        return list(found.values())

    async def _parse(self, result: Any, command: tuple[Any, ...], options: dict[str, Any]) -> Any:
        """A reply as redis-py's pipeline hands it back: its command's reply parser applied."""
        if isinstance(result, Exception):
            return result
        options = {k: v for k, v in options.items() if k not in ("keys", _NEVER_DECODE)}
        options.pop(_EMPTY_RESPONSE, None)
        callback: Callable[..., Any] | None = self._table.callbacks.get(str(command[0]).upper())
        if callback is None:
            return result
        parsed = callback(result, **options)
        if inspect.isawaitable(parsed):
            parsed = await parsed
        return parsed

    def _lost(self) -> LockLostError:
        hold = self._hold
        return LockLostError(
            f"lock {self._name!r} (token {hold.token}) was lost: the transaction ran none of "
            f"its commands ({hold.lost_reason})"
        )
