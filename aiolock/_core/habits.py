"""Errors that teach: the habits users bring from redis-py's ``Lock`` and ``asyncio.Lock``,
met with a message that names aiolock's own way.

- :func:`teaching` wraps a public call so that a keyword it does not take (redis-py's
  ``timeout=``, ``blocking_timeout=``...) raises a :class:`TypeError` that says what aiolock
  calls it, under the public class's name rather than the internal one that defines the call.
- :func:`not_awaitable` is the message of ``await lock.acquire()``, which is an async context
  manager, not an awaitable.
- :func:`held_by_another_task` is the message of a release by a task that did not acquire
  the lock while another task of the same client holds it (``asyncio.create_task(
  lock.unlock())``, ``asyncio.gather(...)``): the owner is the task, not the client.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final, ParamSpec, TypeVar

__all__ = [
    "REDIS_PY_KEYWORDS",
    "held_by_another_task",
    "not_awaitable",
    "redis_py_keyword",
    "teaching",
]

P = ParamSpec("P")
R = TypeVar("R")

# What each of redis-py's lock keywords is called here, in a sentence that follows
# "<call>() got redis-py's keyword '<name>': ".
REDIS_PY_KEYWORDS: Final[Mapping[str, str]] = {
    "timeout": (
        "aiolock calls the lock's time to live `lease=` (seconds; None: the watchdog renews "
        "it while held) and the time to wait for it `wait=`"
    ),
    "blocking_timeout": (
        "aiolock calls the time to wait for the lock `wait=` (seconds; None: as long as it "
        "takes), and its time to live `lease=`"
    ),
    "blocking": (
        "aiolock says how long to wait with `wait=`: `wait=0` tries once (blocking=False), "
        "`wait=None` waits as long as it takes; the lock's time to live is `lease=`"
    ),
    "sleep": (
        "aiolock does not poll: a waiter is woken by the release; the time to wait is `wait=` "
        "and the lock's time to live `lease=`"
    ),
    "thread_local": (
        "aiolock's owner is the calling task, not a thread; `owner=` names an owner that "
        "several tasks share: client.lock(name, owner=...)"
    ),
    "token": (
        "aiolock's owner is the calling task; `owner=` names an owner that several tasks "
        "share: client.lock(name, owner=...)"
    ),
}

# In ``aiolock.sync`` the owner is the calling thread.
_THREADS: Final[Mapping[str, str]] = {
    "thread_local": (
        "aiolock.sync's owner is the calling thread already; `owner=` names an owner that "
        "several threads share: client.lock(name, owner=...)"
    ),
    "token": (
        "aiolock.sync's owner is the calling thread; `owner=` names an owner that several "
        "threads share: client.lock(name, owner=...)"
    ),
}

# The habits about waiting and leases: a call that takes neither ``wait`` nor ``lease`` (a
# factory) says where they go.
_TIMING: Final = frozenset({"timeout", "blocking_timeout", "blocking", "sleep"})

# Marks the wrapper of a coroutine function as one (Python 3.12+), for inspect and frameworks.
_mark_coroutine: Callable[[Callable[..., Any]], Any] | None = getattr(
    inspect, "markcoroutinefunction", None
)


def teaching(method: Callable[P, R]) -> Callable[P, R]:
    """``method``, whose wrong arguments raise a :class:`TypeError` that teaches.

    The call itself is untouched: only when Python refuses to bind the arguments (the
    :class:`TypeError` comes from the call, not from inside ``method``) is the error rewritten,
    so the signature stays ``method``'s own for type checkers and IDEs, and a call that binds
    costs one function call more.
    """
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    parameters = inspect.signature(method).parameters
    accepted = frozenset(name for name, p in parameters.items() if p.kind not in variadic)
    bound = next(iter(parameters), None) in ("self", "cls")  # named by its class when called

    @functools.wraps(method)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except TypeError as exc:
            trace = exc.__traceback__
            if trace is None or trace.tb_next is not None:
                raise  # raised inside the method (an argument check): its own message
            raise _taught(method, accepted, args if bound else (), kwargs, exc) from None

    if _mark_coroutine is not None and inspect.iscoroutinefunction(method):
        _mark_coroutine(checked)
    return checked


def _taught(
    method: Callable[..., Any],
    accepted: frozenset[str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    exc: TypeError,
) -> TypeError:
    """The error for arguments ``method`` refused: a redis-py habit explained, else Python's
    own message under the public name."""
    where = _public_name(method, args)
    threads = method.__module__.startswith("aiolock.sync")
    for keyword in kwargs:
        if keyword not in accepted and keyword in REDIS_PY_KEYWORDS:
            return TypeError(redis_py_keyword(f"{where}()", keyword, accepted, threads=threads))
    return TypeError(str(exc).replace(f"{method.__qualname__}()", f"{where}()", 1))


def redis_py_keyword(
    call: str, keyword: str, accepted: Collection[str] = (), *, threads: bool = False
) -> str:
    """The message for redis-py's ``keyword`` given to ``call``, which takes the arguments
    ``accepted`` (saying where ``wait`` and ``lease`` go when it takes neither); ``threads``:
    a call of ``aiolock.sync``, whose owner is the thread."""
    meaning = (_THREADS if threads else {}).get(keyword) or REDIS_PY_KEYWORDS[keyword]
    text = f"{call} got redis-py's keyword {keyword!r}: {meaning}"
    if keyword in _TIMING and not {"wait", "lease"}.intersection(accepted):
        text += "; they are arguments of the lock's own calls: acquire(wait=5, lease=30)"
    return text


def _public_name(method: Callable[..., Any], args: tuple[Any, ...]) -> str:
    """``AsyncRLock.try_lock`` for a call of a method defined on an internal base, the class
    alone for a constructor (``Client``); ``args``: the call's, empty for a function that is
    no method."""
    if not args:
        return method.__qualname__  # a function, not a method
    bound = args[0]
    cls = bound if isinstance(bound, type) else type(bound)
    return cls.__name__ if method.__name__ == "__init__" else f"{cls.__name__}.{method.__name__}"


def not_awaitable(call: str, use: str) -> str:
    """The message of ``await`` on the async context manager that ``call`` returned:
    ``use`` says what to write instead."""
    return f"{call} returns an async context manager, not an awaitable: {use}"


def held_by_another_task(what: str) -> str:
    """The message of a release of ``what`` (``lock 'x'``) by a task that does not hold it,
    while another task of the same client does."""
    return (
        f"{what} is held by another task of this client, not by this one: a lock belongs to "
        "the task that acquired it (asyncio.create_task() and asyncio.gather() run a call in "
        "a task of its own); to release it from another task, make the lock with an explicit "
        "owner in both tasks: client.lock(name, owner=...)"
    )
