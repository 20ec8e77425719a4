"""A kind overrides the override points :class:`~aiolock._core.hooks.KindHooks` lists, and
none of the engine's own steps (the wait loop, one attempt, one release)."""

from __future__ import annotations

import inspect

import pytest

import aiolock
from aiolock import semaphore
from aiolock._core.acquire import Acquiring
from aiolock._core.guarding import Guarding
from aiolock._core.hooks import KindHooks
from aiolock._core.kind import HoldKind, LockKind
from aiolock._core.release import Releasing


def hooks() -> set[str]:
    return {name for name in vars(KindHooks) if not name.startswith("__")} | {"_force_call"}


def engine_steps() -> set[str]:
    """What the engine defines that is not an override point nor a public call of SPEC's."""
    steps = set()
    for part in (Acquiring, Releasing, Guarding):
        steps |= set(vars(part))
    steps |= {name for name in vars(HoldKind) if name.startswith("_")}
    steps |= {"explicit_owner", "order", "hold"}
    return {name for name in steps if not name.startswith("__")} - hooks()


def kind_classes() -> list[type]:
    """Every class between a kind and the engine (the reentrant lock's shared scripts, the
    read-write lock's modes, the semaphore's permits)."""
    found: list[type] = []
    for kind in (
        aiolock.AsyncRLock,
        aiolock.AsyncSpinLock,
        aiolock.AsyncFairLock,
        aiolock.AsyncReadLock,
        aiolock.AsyncWriteLock,
    ):
        found.extend(
            cls for cls in kind.__mro__ if issubclass(cls, LockKind) and cls is not LockKind
        )
    found.extend(
        value
        for value in vars(semaphore).values()
        if isinstance(value, type) and issubclass(value, HoldKind) and value is not HoldKind
    )
    return list(dict.fromkeys(found))


@pytest.mark.parametrize("kind", kind_classes(), ids=lambda cls: cls.__name__)
def test_a_kind_overrides_no_step_of_the_engine(kind: type) -> None:
    assert not set(vars(kind)) & engine_steps()


def test_every_override_point_says_what_it_is() -> None:
    methods = [
        name
        for name in hooks() - {"_force_call"}
        if inspect.isfunction(member := inspect.getattr_static(KindHooks, name))
        or isinstance(member, classmethod)
    ]
    assert len(methods) >= 12
    for name in methods:
        assert inspect.getdoc(getattr(KindHooks, name)), name
    assert inspect.getdoc(LockKind._force_call)
