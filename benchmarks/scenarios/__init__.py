"""The scenarios, one module each, every one written once over :mod:`benchmarks.impls`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["attempt", "rotated"]

T = TypeVar("T")


def rotated(names: list[str], repeat: int) -> list[str]:
    """``names`` rotated by ``repeat``, so no implementation always runs first (or last)."""
    shift = repeat % len(names) if names else 0
    return names[shift:] + names[:shift]


def attempt(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``run()``, or ``{"error": ...}`` if it failed: one broken peer must not end the run."""
    try:
        return run()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
