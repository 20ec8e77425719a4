"""Argument checks shared by every public entry point: they run before any I/O."""

from __future__ import annotations

import math
import re
import string

__all__ = [
    "MAX_PERMITS",
    "MAX_SECONDS",
    "check_lease",
    "check_name",
    "check_permits",
    "check_timeout",
    "check_wait",
    "template_fields",
]

# About 31 years.  Far beyond any real lease, and far below what Redis accepts: PEXPIRE fails
# once now + lease overflows, and it would fail inside the script after the lock was written.
MAX_SECONDS = 1e9


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


# A semaphore's count is kept on the server as a score, a double: exact far beyond any pool.
MAX_PERMITS = 10**12


def check_permits(permits: object) -> int:
    """A semaphore's count: an ``int`` from 1 to :data:`MAX_PERMITS`."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise TypeError(f"permits must be an int, not {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be at least 1, got {permits}")
    if permits > MAX_PERMITS:
        raise ValueError(f"permits must be at most {MAX_PERMITS}, got {permits}")
    return permits


def check_wait(wait: object) -> float | None:
    """``None`` waits forever; otherwise from 0 to :data:`MAX_SECONDS` seconds."""
    return None if wait is None else check_timeout(wait, "wait", minimum=0)


def check_lease(lease: object) -> float | None:
    """``None`` means the watchdog; otherwise from 1 ms to :data:`MAX_SECONDS`."""
    return None if lease is None else check_timeout(lease, "lease", minimum=0.001)


def check_timeout(value: object, param: str, *, minimum: float) -> float:
    """A duration from ``minimum`` to :data:`MAX_SECONDS` seconds."""
    seconds = _seconds(value, param)
    if seconds < minimum:
        raise ValueError(f"{param} must be at least {minimum} seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{param} must be at most {MAX_SECONDS:.0e} seconds, got {value!r}")
    return seconds


# "{order.id}" and "{items[0]}" name the arguments "order" and "items".
_ROOT = re.compile(r"[.\[]")


def template_fields(name_template: str) -> dict[str, str]:
    """The arguments a lock name template uses: each one's name, to the first placeholder that
    uses it (``"orders:{order.id}"`` -> ``{"order": "order.id"}``)."""
    fields: dict[str, str] = {}
    for _, field, _, _ in string.Formatter().parse(name_template):
        if field is not None:
            fields.setdefault(_ROOT.split(field, maxsplit=1)[0], field)
    return fields
