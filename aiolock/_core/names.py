"""Locks named from a call's arguments: ``client.locked(...)`` and the web frameworks' glue.

A :class:`NameTemplate` (``"orders:{order_id}"``) is checked once, where it is written; each
call then names its lock from its own arguments (a function's, or a request's path parameters)
and holds it with the template's ``wait`` and ``lease``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from .validate import check_lease, check_name, check_wait, template_fields

if TYPE_CHECKING:
    from ..lock import AsyncRLock
    from .guard import GuardContext

__all__ = ["NameTemplate", "locked"]

P = ParamSpec("P")
R = TypeVar("R")


class NameTemplate:
    """A lock name template with the ``wait`` and ``lease`` of its acquires, checked at once."""

    __slots__ = ("fields", "lease", "template", "wait")

    def __init__(self, template: str, wait: float | None, lease: float | None) -> None:
        check_name(template, "name_template")
        self.template = template
        self.wait, self.lease = check_wait(wait), check_lease(lease)
        # Each argument the template uses, to the first placeholder that uses it.
        self.fields = template_fields(template)

    def name(self, arguments: Mapping[str, Any], where: str) -> str:
        """The lock name for ``arguments``; :class:`LookupError` naming ``where`` (a request's
        path) when the template uses one they do not have."""
        missing = self.fields.keys() - arguments.keys()
        if missing:
            raise LookupError(
                f"name_template {self.template!r}: no path parameter {sorted(missing)} in {where!r}"
            )
        return self.template.format(**arguments)

    def acquire(self, lock: AsyncRLock) -> GuardContext[int]:
        """``lock.acquire()`` with the template's ``wait`` and ``lease``."""
        return lock.acquire(wait=self.wait, lease=self.lease)


def locked(
    make_lock: Callable[[str], AsyncRLock],
    name_template: str,
    wait: float | None,
    lease: float | None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """The decorator behind :meth:`aiolock.Client.locked` (arguments checked here, at once)."""
    template = NameTemplate(name_template, wait, lease)

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"locked() decorates coroutine functions, not {function!r}")
        signature = inspect.signature(function)
        for root, field in template.fields.items():
            if root not in signature.parameters:
                raise ValueError(
                    f"name_template {name_template!r}: {{{field}}} names no parameter of "
                    f"{function.__qualname__}{signature}"
                )

        @functools.wraps(function)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            name = template.name(bound.arguments, function.__qualname__)
            async with template.acquire(make_lock(name)):
                return await function(*args, **kwargs)

        return wrapper

    return decorate
