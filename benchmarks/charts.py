"""The PNG charts of a results JSON: ``summary.png``, one panel per scenario that ran, and
``sweep.png``, the sweep's figures against the number of processes (matplotlib, imported when
drawing: the ``bench`` extra)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from benchmarks.figures import main_level, medians, sweep_names
from benchmarks.targets import LIMIT

__all__ = ["charts"]


def _sweep_chart(results: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    section, labels = results["scenarios"]["sweep"], results["meta"]["labels"]
    # The points of T tasks per process, by processes (a last point of other sizes, 32x2, is in
    # the table only: its x would not mean the same).
    counts = [count for count in section["points"] if count.isdigit()]
    panels = [
        ("commands_per_acquisition", "server commands per acquisition", True),
        ("acquisitions_per_s", "acquisitions/s", False),
        ("gap_p50_us", "handoff gap p50 (µs)", True),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.8), dpi=90, squeeze=False)
    for ax, (field, title, log_y) in zip(axes[0], panels, strict=True):
        for name in sweep_names(section):
            xs, ys = [], []
            for count in counts:
                value = medians(section["points"][count]).get(name, {}).get(field)
                if isinstance(value, int | float) and not math.isnan(value):
                    xs.append(int(count))
                    ys.append(value)
            if not xs:
                continue
            ours = name.startswith("aiolock")
            style = {"linewidth": 2.5} if ours else {"alpha": 0.8, "linestyle": "--"}
            ax.plot(xs, ys, marker="o", label=labels.get(name, name), **style)
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks([int(n) for n in counts], counts)
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(f"processes (x {section['tasks_per_process']} tasks each)", fontsize=9)
        ax.set_title(title, fontsize=11)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    quick = " (quick run)" if results["meta"].get("quick") else ""
    fig.suptitle(
        f"sweep: one lock, hold {section['hold_s'] * 1000:g} ms, "
        f"{section['duration_s']:g} s per point{quick}",
        fontsize=11,
    )
    fig.tight_layout()
    path = out_dir / "sweep.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def charts(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """PNG charts next to the JSON; ``summary.png`` has one panel per scenario that ran,
    ``sweep.png`` the sweep's figures against the number of processes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios, labels = results["scenarios"], results["meta"]["labels"]
    written = [_sweep_chart(results, out_dir)] if "sweep" in scenarios else []
    panels = [s for s in ("uncontended", "contended", "fanin") if s in scenarios]
    if not panels:
        return written
    count = len(panels) + ("contended" in panels)
    fig, axes = plt.subplots(1, count, figsize=(4.6 * count, 4.2), dpi=90, squeeze=False)
    axes_iter = iter(axes[0])

    def bars(ax: Any, figures: dict[str, dict[str, Any]], field: str, title: str) -> None:
        names = [n for n, f in figures.items() if field in f]
        values = [figures[n][field] for n in names]
        colors = ["tab:green" if n.startswith("aiolock") else "tab:gray" for n in names]
        ax.barh([labels.get(n, n) for n in names], values, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)

    if "uncontended" in scenarios:
        ax = next(axes_iter)
        bars(
            ax,
            medians(scenarios["uncontended"]),
            "p50_over_ping",
            "uncontended: cycle p50 / PING p50",
        )
        # Two round trips (acquire, release) cannot take less than two PINGs.
        ax.axvline(2.0, color="black", linestyle=":", label="floor 2.0")
        goal = LIMIT["uncontended_p50_x_ping"]
        ax.axvline(goal, color="tab:red", linestyle="--", label=f"target {goal:g}")
        ax.legend(fontsize=7)
    if "contended" in scenarios:
        section = scenarios["contended"]
        main = main_level(section)
        bars(
            next(axes_iter),
            medians(section["levels"][main]),
            "acquisitions_per_s",
            f"contended @{main} waiters: acquisitions/s",
        )
        ax = next(axes_iter)
        counts = list(section["levels"])
        for name in section["levels"][main]["impls"]:
            ys = [
                medians(section["levels"][n]).get(name, {}).get("commands_per_acquisition")
                for n in counts
            ]
            if any(y is None for y in ys):
                continue
            style = {"linewidth": 2.5} if name.startswith("aiolock") else {"alpha": 0.8}
            ax.plot([int(n) for n in counts], ys, marker="o", label=labels.get(name, name), **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks([int(n) for n in counts], counts)
        ax.minorticks_off()
        ax.set_xlabel("waiters", fontsize=8)
        ax.set_title("server commands per acquisition", fontsize=10)
        ax.legend(fontsize=6)
        ax.tick_params(labelsize=8)
    if "fanin" in scenarios:
        ax = next(axes_iter)
        fanin = medians(scenarios["fanin"])
        bars(
            ax,
            {
                n: {"v": max(f.get("commands_per_s_waiting", 0), 0.1)}
                for n, f in fanin.items()
                if "error" not in f
            },
            "v",
            f"fan-in: commands/s while {scenarios['fanin']['waiters']:,} wait",
        )
        ax.set_xscale("log")
    fig.tight_layout()
    path = out_dir / "summary.png"
    fig.savefig(path)
    plt.close(fig)
    return [path, *written]
