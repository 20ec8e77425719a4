"""Argument checks shared by every public entry point: they run before any I/O."""

from __future__ import annotations

import math

__all__ = ["check_lease", "check_name", "check_positive", "check_wait"]


def _seconds(value: object, param: str) -> float:
    # bool is an int subclass; ``lease=True`` is a bug, not one second.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{param} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{param} must be finite, got {value!r}")
    if seconds < 0:
        raise ValueError(f"{param} must not be negative, got {value!r}")
    return seconds


def check_name(name: object, param: str = "name") -> str:
    if not isinstance(name, str):
        raise TypeError(f"{param} must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError(f"{param} must not be empty")
    return name


def check_wait(wait: object) -> float | None:
    """``None`` waits forever; otherwise a finite, non-negative number of seconds."""
    return None if wait is None else _seconds(wait, "wait")


def check_lease(lease: object) -> float | None:
    """``None`` means the watchdog; otherwise a finite number of seconds, at least 1 ms."""
    if lease is None:
        return None
    seconds = _seconds(lease, "lease")
    if seconds < 0.001:
        raise ValueError(f"lease must be at least 0.001 seconds, got {lease!r}")
    return seconds


def check_positive(value: object, param: str) -> float:
    seconds = _seconds(value, param)
    if seconds == 0:
        raise ValueError(f"{param} must be positive, got {value!r}")
    return seconds
