"""``client.locked(...)``: run a coroutine function under a lock named from its arguments."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ._validate import check_lease, check_name, check_wait, template_fields

if TYPE_CHECKING:
    from .lock import AsyncRLock

__all__ = ["locked"]

P = ParamSpec("P")
R = TypeVar("R")


def locked(
    make_lock: Callable[[str], AsyncRLock],
    name_template: str,
    wait: float | None,
    lease: float | None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """The decorator behind :meth:`aiolock.Client.locked` (arguments checked here, at once)."""
    check_name(name_template, "name_template")
    wait_s, lease_s = check_wait(wait), check_lease(lease)
    fields = template_fields(name_template)

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"locked() decorates coroutine functions, not {function!r}")
        signature = inspect.signature(function)
        for root, field in fields.items():
            if root not in signature.parameters:
                raise ValueError(
                    f"name_template {name_template!r}: {{{field}}} names no parameter of "
                    f"{function.__qualname__}{signature}"
                )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            name = name_template.format(**bound.arguments)
            async with make_lock(name).acquire(wait=wait_s, lease=lease_s):
                return await function(*args, **kwargs)

        return wrapper

    return decorate
