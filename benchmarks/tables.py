"""The markdown report of a results JSON: the target checks, then one table per scenario."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.figures import fmt, main_level, medians, sweep_names
from benchmarks.scenarios.sync import table as threads_table
from benchmarks.targets import check

__all__ = ["markdown"]

Row = Sequence[object]


def _table(header: Row, rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _rows(
    found: dict[str, dict[str, Any]],
    labels: dict[str, str],
    columns: list[str],
    scale: dict[str, Callable[[float], float]] | None = None,
) -> list[Row]:
    rows: list[Row] = []
    for name, figures in found.items():
        if "error" in figures:
            rows.append([labels.get(name, name), f"failed: {figures['error']}"])
            continue
        convert = scale or {}
        rows.append(
            [labels.get(name, name)]
            + [convert.get(c, _same)(figures.get(c, float("nan"))) for c in columns]
        )
    return rows


def _same(value: float) -> float:
    return value


def _shared_tables(section: dict[str, Any], labels: dict[str, str]) -> list[str]:
    parts, out = section["parts"], []
    hold = f"hold {section['hold_s'] * 1000:g} ms, {section['duration_s']:g} s per run"
    percent = {"barging": lambda v: v * 100, "served": lambda v: v * 100}
    costs = [
        "commands_per_acquisition",
        "script_calls_per_acquisition",
        "publish_per_acquisition",
        "server_cpu_us_per_acquisition",
        "client_cpu_us_per_acquisition",
        "client_cpus",
    ]
    cost_header = [
        "server commands/acq",
        "EVAL(SHA) calls/acq",
        "PUBLISH/acq",
        "server CPU µs/acq",
        "client CPU µs/acq",
        "client cores",
    ]
    if "reads" in parts:
        part = parts["reads"]
        found = {name: dict(figures) for name, figures in medians(part).items()}
        plain = found.get("aiolock", {}).get("acquisitions_per_s", math.nan)
        for figures in found.values():
            if "acquisitions_per_s" in figures and plain:
                figures["x_plain"] = figures["acquisitions_per_s"] / plain
        out += [
            f"**shared, reads**: {part['processes']} processes x {part['tasks_per_process']} "
            f"tasks, each looping acquire / {hold}; the plain lock runs the same loop",
            "",
        ]
        out += _table(
            [
                "implementation",
                "acquisitions/s",
                "x plain lock",
                "peak holders",
                "mean holders",
                "served %",
                *cost_header,
            ],
            _rows(
                found,
                labels,
                [
                    "acquisitions_per_s",
                    "x_plain",
                    "peak_holders_max",
                    "mean_holders",
                    "served",
                    *costs,
                ],
                percent,
            ),
        )
    if "writes" in parts:
        part = parts["writes"]
        out += [
            f"**shared, writes**: writers only, {part['processes']} processes x "
            f"{part['tasks_per_process']} tasks, {hold}",
            "",
        ]
        out += _table(
            [
                "implementation",
                "acquisitions/s",
                "handoff gap p50 µs",
                "gap p99 µs",
                "barging %",
                "served %",
                *cost_header,
                "overlaps",
            ],
            _rows(
                medians(part),
                labels,
                [
                    "acquisitions_per_s",
                    "gap_p50_us",
                    "gap_p99_us",
                    "barging",
                    "served",
                    *costs,
                    "overlaps",
                ],
                percent,
            ),
        )
    if "semaphore" in parts:
        part = parts["semaphore"]
        out += [
            f"**shared, semaphore** (permits={section['permits']}): {part['processes']} "
            f"processes x {part['tasks_per_process']} tasks, {hold} (holders counted from the "
            "logs, a lower bound of the server's)",
            "",
        ]
        out += _table(
            [
                "implementation",
                "acquisitions/s",
                "peak holders",
                "mean holders",
                "served %",
                *cost_header,
            ],
            _rows(
                medians(part),
                labels,
                ["acquisitions_per_s", "peak_holders_max", "mean_holders", "served", *costs],
                percent,
            ),
        )
    return out


def markdown(results: dict[str, Any]) -> str:
    meta, scenarios = results["meta"], results["scenarios"]
    labels: dict[str, str] = meta["labels"]
    out = [
        f"Run {meta['date']} on {meta['machine']}; {meta['server']}; Python {meta['python']}, "
        f"redis-py {meta['redis_py']}, aiolock {meta['aiolock']}. "
        f"Medians of {meta['repeats']} repeats{' (quick mode)' if meta['quick'] else ''}."
        + "".join(f" Run again: {name} ({when})." for name, when in meta.get("reruns", {}).items()),
        "",
    ]
    checks = check(results)
    if checks:
        out += ["**Targets for aiolock**", ""]
        out += _table(["target", "measured", "holds"], [list(c) for c in checks])
    if "rtt" in scenarios:
        m = scenarios["rtt"]["median"]
        out += ["**rtt** (redis.asyncio, one connection)", ""]
        out += _table(
            ["PING p50 µs", "PING p99 µs", "SET NX PX + DEL p50 µs", "SET NX PX + DEL p99 µs"],
            [[m["ping_p50_us"], m["ping_p99_us"], m["set_del_p50_us"], m["set_del_p99_us"]]],
        )
    if "floor" in scenarios:
        section = scenarios["floor"]
        ping = scenarios.get("rtt", {}).get("median", {}).get("ping_p50_us")
        out += [
            f"**floor**: a token passed round {section['processes']} processes, one PUBLISH "
            f"per pass, each held {section['hold_s'] * 1e3:g} ms (no lock: the least any "
            "one-message hand-off costs here)",
            "",
        ]
        floor_rows: list[Sequence[object]] = []
        for client, figures in section["clients"].items():
            gap = figures["median"].get("gap_p50_us")
            ratio = f"{gap / ping:.2f}" if gap is not None and ping else "-"
            floor_rows.append([client, gap if gap is not None else "-", ratio])
        pause = section["ping_after_pause_p50_us"]
        floor_rows.append(
            [
                f"PING after a {section['hold_s'] * 1e3:g} ms pause",
                pause,
                f"{pause / ping:.2f}" if ping else "-",
            ]
        )
        out += _table(["client", "hand-off gap p50 µs", "x PING p50 (rtt)"], floor_rows)
    if "uncontended" in scenarios:
        section = scenarios["uncontended"]
        out += [f"**uncontended**: one task, {section['cycles']:,} acquire + release cycles", ""]
        columns = [
            "cycles_per_s",
            "p50_us",
            "p99_us",
            "ping_p50_us",
            "p50_over_ping",
            "client_cpu_us_per_cycle",
            "server_cpu_us_per_cycle",
            "commands_per_cycle",
        ]
        out += _table(
            [
                "implementation",
                "cycles/s",
                "p50 µs",
                "p99 µs",
                "PING p50 µs (between its cycles)",
                "p50 / PING p50",
                "client CPU µs/cycle",
                "server CPU µs/cycle",
                "server commands/cycle",
            ],
            _rows(medians(section), labels, columns),
        )
    if "contended" in scenarios:
        section = scenarios["contended"]
        main = main_level(section)
        level = section["levels"][main]
        out += [
            f"**contended**: {level['processes']} processes x {level['tasks_per_process']} tasks, "
            f"hold {section['hold_s'] * 1000:g} ms, {section['duration_s']:g} s per run",
            "",
        ]
        columns = [
            "acquisitions_per_s",
            "gap_p50_us",
            "gap_p99_us",
            "barging",
            "served",
            "commands_per_acquisition",
            "server_cpu_us_per_acquisition",
            "overlaps",
        ]
        percent = {"barging": lambda v: v * 100, "served": lambda v: v * 100}
        out += _table(
            [
                "implementation",
                "acquisitions/s",
                "handoff gap p50 µs",
                "gap p99 µs",
                "barging %",
                "served %",
                "server commands/acq",
                "server CPU µs/acq",
                "overlaps",
            ],
            _rows(medians(level), labels, columns, percent),
        )
        names = list(level["impls"])
        counts = list(section["levels"])
        out += [
            "**contended, growing the waiters**: acquisitions/s and server commands per "
            "acquisition at " + ", ".join(counts) + " waiters",
            "",
        ]
        rows: list[Row] = []
        for name in names:
            figures = [medians(section["levels"][n]).get(name, {}) for n in counts]
            rows.append(
                [labels.get(name, name)]
                + [f.get("acquisitions_per_s", math.nan) for f in figures]
                + [f.get("commands_per_acquisition", math.nan) for f in figures]
            )
        out += _table(
            ["implementation"]
            + [f"acq/s @{n}" for n in counts]
            + [f"cmds/acq @{n}" for n in counts],
            rows,
        )
    if "sweep" in scenarios:
        out += _sweep_table(scenarios["sweep"], labels)
    if "shared" in scenarios:
        out += _shared_tables(scenarios["shared"], labels)
    if "fanin" in scenarios:
        section = scenarios["fanin"]
        out += [
            f"**fanin**: {section['waiters']:,} tasks wait on {section['locks']} held locks in "
            f"one process (a bare asyncio task waiting on an event: "
            f"{section['bare_task'].get('rss_kb_per_waiter', math.nan):.2f} KB)",
            "",
        ]
        columns = [
            "connections",
            "pubsub_connections",
            "channels",
            "commands_per_s_holding",
            "commands_per_s_waiting",
            "rss_kb_per_waiter",
            "drain_s",
            "acquired_share",
        ]
        out += _table(
            [
                "implementation",
                "connections",
                "pub/sub connections",
                "channels",
                "commands/s, holders alone",
                "commands/s while waiting",
                "RSS KB/waiter",
                "all acquired after (s)",
                "acquired %",
            ],
            _rows(medians(section), labels, columns, {"acquired_share": lambda v: v * 100}),
        )
    if "names" in scenarios:
        out += _names_table(scenarios["names"], labels)
    if "cluster" in scenarios:
        out += _cluster_table(scenarios["cluster"])
    if "sync" in scenarios:
        out += threads_table(scenarios["sync"])
    return "\n".join(out)


def _names_table(section: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = [
        f"**names**: {section['processes']} processes x {section['tasks_per_process']} tasks, "
        f"each looping: pick one of {section['names']:,} names at random, acquire it, release "
        f"it at once; {section['duration_s']:g} s per run.  Keys left: the run's keys (and "
        "aiolock's fencing counter) per 10,000 names, once the workers closed their clients "
        "and once every key with a TTL had expired",
        "",
    ]
    columns = [
        "cycles_per_s",
        "names_used",
        "acquire_p50_us",
        "acquire_p99_us",
        "commands_per_cycle",
        "server_cpu_us_per_cycle",
        "client_cpu_us_per_cycle",
        "overlaps",
        "keys_left_per_10k_names",
        "keys_max_ttl_s",
        "keys_settled_per_10k_names",
        "settled_after_s",
        "dbsize_delta",
    ]
    header = [
        "implementation",
        "cycles/s",
        "names used",
        "acquire p50 µs",
        "acquire p99 µs",
        "server commands/cycle",
        "server CPU µs/cycle",
        "client CPU µs/cycle",
        "overlaps",
        "keys left /10k names",
        "longest TTL left s",
        "keys for good /10k names",
        "all expired after s",
        "DBSIZE delta",
    ]
    return out + _table(header, _rows(medians(section), labels, columns))


def _cluster_table(section: dict[str, Any]) -> list[str]:
    """Acquisitions/s over the cluster, then per node: share, CPU and commands per acquisition
    of the node's own locks; free-running, then paced at one rate (see the scenario's module)."""
    out = [
        f"**cluster**: {section['locks']:,} locks, {section['processes']} processes x "
        f"{section['tasks_per_process']} tasks, each picking a lock at random and holding it "
        f"{section['hold_s'] * 1000:g} ms, {section['duration_s']:g} s per run, on a 3-primary "
        f"{section['binary']} cluster",
        "",
    ]
    out += _cluster_rows(section, medians(section), "free-running")
    paced = section.get("paced") or {}
    if paced.get("impls"):
        paced_figures = {name: entry["median"] for name, entry in paced["impls"].items()}
        how = f"paced at {paced['rate']:,.0f} acquisitions/s in all"
        out += ["", *_cluster_rows(section, paced_figures, how)]
    return out


def _cluster_rows(
    section: dict[str, Any], figures_by_impl: dict[str, dict[str, Any]], how: str
) -> list[str]:
    rows: list[Row] = []
    for name, figures in figures_by_impl.items():
        label = section["labels"].get(name, name)
        if "error" in figures:
            rows.append([label, f"failed: {figures['error']}"])
            continue
        for node in range(3):
            rows.append(
                [
                    label if node == 0 else "",
                    fmt(figures.get("acquisitions_per_s", math.nan), 0) if node == 0 else "",
                    fmt(figures.get("served", math.nan) * 100) if node == 0 else "",
                    fmt(figures.get("overlaps", math.nan), 0) if node == 0 else "",
                    fmt(figures.get("server_cpu_us_per_acquisition", math.nan), 0)
                    if node == 0
                    else "",
                    node,
                    figures.get(f"node{node}_share", math.nan) * 100,
                    figures.get(f"node{node}_cpu_us_per_own_acquisition", math.nan),
                    figures.get(f"node{node}_commands_per_own_acquisition", math.nan),
                    figures.get(f"node{node}_cpu_share", math.nan) * 100,
                ]
            )
    header = [
        "implementation",
        "acq/s",
        "served %",
        "overlaps",
        "server CPU µs/acq, all nodes",
        "node",
        "share of acq %",
        "server CPU µs/own acq",
        "commands/own acq",
        "node CPU %",
    ]
    out = [f"{how}:", "", *_table(header, rows)]
    base = figures_by_impl.get("redispy-0.001", {}).get("server_cpu_us_per_acquisition")
    if base:
        ratios = [
            f"{section['labels'].get(name, name)} "
            f"{figures['server_cpu_us_per_acquisition'] / base:.2f} x"
            for name, figures in figures_by_impl.items()
            if name != "redispy-0.001" and figures.get("server_cpu_us_per_acquisition")
        ]
        if ratios:
            out += [
                "",
                f"Server CPU per acquisition over redis-py's ({how}): " + "; ".join(ratios) + ".",
            ]
    return out


def _sweep_table(section: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = [
        f"**sweep**: 4 to 16 processes x {section['tasks_per_process']} tasks on one lock "
        "(`32x2`: 32 processes x 2 tasks), "
        f"hold {section['hold_s'] * 1000:g} ms, {section['duration_s']:g} s per point "
        "(commands counted by `INFO commandstats`, those scripts run included)",
        "",
    ]
    columns = [
        "acquisitions_per_s",
        "gap_p50_us",
        "gap_p99_us",
        "barging",
        "served",
        "commands_per_acquisition",
        "script_calls_per_acquisition",
        "publish_per_acquisition",
        "server_cpu_us_per_acquisition",
        "overlaps",
    ]
    rows: list[Row] = []
    for name in sweep_names(section):
        for count, point in section["points"].items():
            figures = medians(point).get(name)
            if figures is None:
                continue
            percent = {"barging": lambda v: v * 100, "served": lambda v: v * 100}
            for row in _rows({name: figures}, labels, columns, percent):
                rows.append([row[0], count, *row[1:]])
    out += _table(
        [
            "implementation",
            "processes",
            "acquisitions/s",
            "handoff gap p50 µs",
            "gap p99 µs",
            "barging %",
            "served %",
            "server commands/acq",
            "EVAL(SHA) calls/acq",
            "PUBLISH/acq",
            "server CPU µs/acq",
            "overlaps",
        ],
        rows,
    )
    return out
