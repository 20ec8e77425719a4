"""Reading a results JSON (``benchmarks/run.py`` writes it): what the targets, the tables and
the charts all look up the same way."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["fmt", "main_level", "medians", "sweep_names", "tasks"]


def medians(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each implementation's median figures over the repeats of one run of a scenario."""
    return {name: data["median"] for name, data in section["impls"].items()}


def main_level(contended: dict[str, Any]) -> str:
    """The level of ``contended`` that its tables and targets are read at: 64 waiters in a full
    run, the middle one otherwise."""
    levels = list(contended["levels"])
    return "64" if "64" in levels else levels[len(levels) // 2]


def sweep_names(section: dict[str, Any]) -> list[str]:
    """The implementations of the sweep, in the order they first appear over its points."""
    names: list[str] = []
    for point in section["points"].values():
        names += [n for n in point["impls"] if n not in names]
    return names


def tasks(part: dict[str, Any]) -> int:
    """The tasks of a run: processes times tasks per process."""
    return int(part["processes"] * part["tasks_per_process"])


def fmt(value: object, digits: int = 1) -> str:
    """A table cell: yes/no, thousands separated, ``-`` for a figure that is missing."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)
