"""From a results JSON to a markdown report, the target checks and PNG charts.

``python benchmarks/report.py benchmarks/results/latest.json`` redraws them without rerunning.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["charts", "markdown", "targets", "write"]

Row = Sequence[object]


def _fmt(value: object, digits: int = 1) -> str:
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


def _table(header: Row, rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def _medians(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: data["median"] for name, data in section["impls"].items()}


def _rows(
    medians: dict[str, dict[str, Any]],
    labels: dict[str, str],
    columns: list[str],
    scale: dict[str, Callable[[float], float]] | None = None,
) -> list[Row]:
    rows: list[Row] = []
    for name, figures in medians.items():
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


def _main_level(contended: dict[str, Any]) -> str:
    levels = list(contended["levels"])
    return "64" if "64" in levels else levels[len(levels) // 2]


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, holds) for aiolock, from whatever scenarios the results hold."""
    checks: list[tuple[str, str, bool]] = []
    scenarios = results["scenarios"]
    if "uncontended" in scenarios:
        ours = _medians(scenarios["uncontended"]).get("aiolock", {})
        ratio = ours.get("p50_over_ping", math.nan)
        checks.append(("uncontended cycle p50 <= 2.3 x PING p50", f"{ratio:.2f} x", ratio <= 2.3))
    if "contended" in scenarios:
        levels = scenarios["contended"]["levels"]
        main_level = _main_level(scenarios["contended"])
        main = _medians(levels[main_level])
        ours, spin = main.get("aiolock", {}), main.get("spin", {})
        rate, spin_rate = ours.get("acquisitions_per_s", 0.0), spin.get("acquisitions_per_s", 0.0)
        checks.append(
            (
                f"contended ({main_level} waiters): acquisitions/s >= spin",
                f"{rate:,.0f} vs {spin_rate:,.0f}",
                rate >= spin_rate,
            )
        )
        per_level = {n: _medians(level).get("aiolock", {}) for n, level in levels.items()}
        served = min(f.get("served", 0.0) for f in per_level.values())
        checks.append(("contended: every worker served", f"min {served:.0%}", served >= 1.0))
        barging = max(f.get("barging", 1.0) for f in per_level.values())
        checks.append(("contended: barging <= 50 %", f"max {barging:.0%}", barging <= 0.5))
        costs = [f.get("commands_per_acquisition", math.nan) for f in per_level.values()]
        spread = max(costs) / min(costs) if costs and min(costs) > 0 else math.nan
        checks.append(
            (
                f"contended: commands/acquisition flat within 20 % ({', '.join(levels)} waiters)",
                " / ".join(f"{c:.1f}" for c in costs) + f" (x{spread:.2f})",
                spread <= 1.2,
            )
        )
        overlaps = sum(
            int(figures.get("overlaps", 0))
            for level in levels.values()
            for figures in _medians(level).values()
        )
        checks.append(
            ("contended: overlapping holds, every implementation", str(overlaps), overlaps == 0)
        )
    if "sweep" in scenarios:
        points = scenarios["sweep"]["points"]
        fair = {n: _medians(point).get("aiolock-fair", {}) for n, point in points.items()}
        if fair and all("commands_per_acquisition" in f for f in fair.values()):
            costs = [f["commands_per_acquisition"] for f in fair.values()]
            spread = max(costs) / min(costs) if min(costs) > 0 else math.nan
            checks.append(
                (
                    "sweep: fair_lock commands/acquisition flat within 20 % "
                    f"({', '.join(points)} processes)",
                    " / ".join(f"{c:.1f}" for c in costs) + f" (x{spread:.2f})",
                    spread <= 1.2,
                )
            )
            served = min(f.get("served", 0.0) for f in fair.values())
            checks.append(
                ("sweep: fair_lock serves every worker", f"min {served:.0%}", served >= 1.0)
            )
    if "shared" in scenarios:
        checks += _shared_targets(scenarios["shared"])
    if "fanin" in scenarios:
        fanin = scenarios["fanin"]
        ours = _medians(fanin).get("aiolock", {})
        conns, channels = ours.get("pubsub_connections", -1), ours.get("channels", -1)
        checks.append(
            (
                f"fan-in: 1 pub/sub connection and {fanin['locks']} channels",
                f"{conns:.0f} and {channels:.0f}",
                conns == 1 and channels == fanin["locks"],
            )
        )
        rate = ours.get("commands_per_s_waiting", math.inf)
        checks.append(("fan-in: <= 100 commands/s while waiting", f"{rate:.1f}/s", rate <= 100))
        rss = ours.get("rss_kb_per_waiter", math.inf)
        floor = fanin["bare_task"].get("rss_kb_per_waiter", math.nan)
        checks.append(
            (
                "fan-in: <= 2 KB RSS per waiter",
                f"{rss:.2f} KB (a bare waiting task: {floor:.2f} KB)",
                rss <= 2.0,
            )
        )
    checks += _perf2_targets(results)
    return checks


# Issue 14's targets ("perf 2"), each from the scenario it needs when that scenario ran.
_KINDS = {"aiolock": "plain lock", "aiolock-fair": "fair_lock"}
PERF2_GAP_X_PING = {"aiolock-fair": 3.0, "aiolock": 5.0}  # contended hand-off gap p50 / PING p50
PERF2_FAIR_OVER_PEERS = 1.25  # fair_lock acquisitions/s over the best peer's (contended)
PERF2_FAIR_COMMANDS = 8.0  # fair_lock server commands per acquisition, every sweep point
PERF2_UNCONTENDED_COMMANDS = 6.0  # the plain lock's server commands per cycle
PERF2_UNCONTENDED_CPU = 1.2  # the plain lock's server CPU per cycle over redis-py Lock's
PERF2_NAMES_OVER_REDISPY = 1.3  # names: cycles/s over redis-py Lock sleep=0.001's
PERF2_NAMES_KEYS = 10  # names: keys left once the resend markers expired, 10,000 names
PERF2_RSS_KB = 2.0  # fan-in RSS per waiter
PERF2_UNCONTENDED_P50 = 2.0  # uncontended cycle p50 / PING p50


def _perf2_targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    scenarios, labels = results["scenarios"], results["meta"]["labels"]
    checks: list[tuple[str, str, bool]] = []
    if "contended" in scenarios:
        checks += _perf2_contended(scenarios, labels)
    if "sweep" in scenarios:
        points = scenarios["sweep"]["points"]
        fair = [_medians(p).get("aiolock-fair", {}) for p in points.values()]
        if fair and all("commands_per_acquisition" in f for f in fair):
            costs = [f["commands_per_acquisition"] for f in fair]
            plain = [
                _medians(p).get("aiolock", {}).get("commands_per_acquisition", math.nan)
                for p in points.values()
            ]
            checks.append(
                (
                    f"perf 2: sweep: fair_lock commands/acquisition <= {PERF2_FAIR_COMMANDS:g} "
                    f"at every point ({', '.join(points)} processes)",
                    " / ".join(f"{c:.1f}" for c in costs)
                    + " (plain lock "
                    + " / ".join(_fmt(c) for c in plain)
                    + ")",
                    max(costs) <= PERF2_FAIR_COMMANDS,
                )
            )
    if "uncontended" in scenarios:
        checks += _perf2_uncontended_costs(_medians(scenarios["uncontended"]), labels)
    if "names" in scenarios:
        checks += _perf2_names(scenarios["names"], labels)
    if "fanin" in scenarios:
        medians = _medians(scenarios["fanin"])
        rss = {
            name: medians[name]["rss_kb_per_waiter"]
            for name in _KINDS
            if "rss_kb_per_waiter" in medians.get(name, {})
        }
        if rss:
            checks.append(
                (
                    f"perf 2: fan-in: <= {PERF2_RSS_KB:g} KB RSS per waiter "
                    f"({', '.join(_KINDS[n] for n in rss)})",
                    ", ".join(f"{_KINDS[n]} {v:.2f} KB" for n, v in rss.items()),
                    all(v <= PERF2_RSS_KB for v in rss.values()),
                )
            )
    if "uncontended" in scenarios:
        ratio = _medians(scenarios["uncontended"]).get("aiolock", {}).get("p50_over_ping")
        if ratio is not None:
            checks.append(
                (
                    f"perf 2: uncontended: cycle p50 <= {PERF2_UNCONTENDED_P50:g} x PING p50",
                    f"{ratio:.2f} x",
                    ratio <= PERF2_UNCONTENDED_P50,
                )
            )
    return checks


def _perf2_contended(
    scenarios: dict[str, Any], labels: dict[str, str]
) -> list[tuple[str, str, bool]]:
    """The hand-off gap against PING (from ``rtt``) and the rates against the peers that serve
    every worker, at the main level of ``contended`` (64 waiters in a full run)."""
    checks: list[tuple[str, str, bool]] = []
    section = scenarios["contended"]
    level = _main_level(section)
    medians = _medians(section["levels"][level])
    where = f"perf 2: contended ({level} waiters)"
    ping = scenarios.get("rtt", {}).get("median", {}).get("ping_p50_us")
    for name, factor in PERF2_GAP_X_PING.items():
        figures = medians.get(name, {})
        if not ping or "gap_p50_us" not in figures:
            continue
        gap, served = figures["gap_p50_us"], figures.get("served", 0.0)
        checks.append(
            (
                f"{where}: {_KINDS[name]} hand-off gap p50 <= {factor:g} x PING p50, "
                "every worker served",
                f"{gap:,.0f} µs = {gap / ping:.2f} x PING ({ping:.0f} µs), served {served:.0%}",
                gap <= factor * ping and served >= 1.0,
            )
        )
    peers = {
        name: figures["acquisitions_per_s"]
        for name, figures in medians.items()
        if not name.startswith("aiolock")
        and figures.get("served", 0.0) >= 1.0
        and "acquisitions_per_s" in figures
    }
    best = max(peers, key=peers.__getitem__, default=None)
    best_rate = peers[best] if best is not None else 0.0
    versus = (
        f"{labels.get(best, best)} {best_rate:,.0f}"
        if best is not None
        else "no peer serves every worker"
    )
    for name, factor, goal in (
        ("aiolock-fair", PERF2_FAIR_OVER_PEERS, f"{PERF2_FAIR_OVER_PEERS:g} x the best peer"),
        ("aiolock", 1.0, "every peer"),
    ):
        rate = medians.get(name, {}).get("acquisitions_per_s")
        if rate is None:
            continue
        ratio = f" (x{rate / best_rate:.2f})" if best_rate else ""
        checks.append(
            (
                f"{where}: {_KINDS[name]} acquisitions/s >= {goal} that serves every worker",
                f"{rate:,.0f} vs {versus}{ratio}",
                rate >= factor * best_rate,
            )
        )
    return checks


def _perf2_uncontended_costs(
    medians: dict[str, dict[str, Any]], labels: dict[str, str]
) -> list[tuple[str, str, bool]]:
    checks: list[tuple[str, str, bool]] = []
    ours = medians.get("aiolock", {})
    commands = ours.get("commands_per_cycle")
    if commands is not None:
        checks.append(
            (
                f"perf 2: uncontended: server commands/cycle <= {PERF2_UNCONTENDED_COMMANDS:g}",
                f"{commands:.1f}",
                commands <= PERF2_UNCONTENDED_COMMANDS,
            )
        )
    peer = next(
        (
            n
            for n in ("redispy-0.001", "redispy-0.1")
            if "server_cpu_us_per_cycle" in medians.get(n, {})
        ),
        None,
    )
    cpu = ours.get("server_cpu_us_per_cycle")
    if peer is not None and cpu is not None:
        theirs = medians[peer]["server_cpu_us_per_cycle"]
        ratio = cpu / theirs if theirs else math.inf
        checks.append(
            (
                f"perf 2: uncontended: server CPU/cycle <= {PERF2_UNCONTENDED_CPU:g} x "
                "redis-py Lock's",
                f"{cpu:.1f} µs vs {theirs:.1f} µs ({labels.get(peer, peer)}, x{ratio:.2f})",
                ratio <= PERF2_UNCONTENDED_CPU,
            )
        )
    return checks


def _perf2_names(section: dict[str, Any], labels: dict[str, str]) -> list[tuple[str, str, bool]]:
    checks: list[tuple[str, str, bool]] = []
    medians = _medians(section)
    ours, peer = medians.get("aiolock", {}), medians.get("redispy-0.001", {})
    if "cycles_per_s" in ours and "cycles_per_s" in peer:
        rate, theirs = ours["cycles_per_s"], peer["cycles_per_s"]
        ratio = rate / theirs if theirs else math.inf
        checks.append(
            (
                f"perf 2: names: cycles/s >= {PERF2_NAMES_OVER_REDISPY:g} x "
                f"{labels.get('redispy-0.001', 'redis-py Lock')}'s",
                f"{rate:,.0f} vs {theirs:,.0f} (x{ratio:.2f})",
                ratio >= PERF2_NAMES_OVER_REDISPY,
            )
        )
    if "keys_settled" in ours:
        left, now = ours["keys_settled"], ours.get("keys_left", math.nan)
        checks.append(
            (
                f"perf 2: names: keys left flat (<= {PERF2_NAMES_KEYS} for "
                f"{section['names']:,} names, once the resend markers expired)",
                f"{left:,.0f} after {ours.get('settled_after_s', math.nan):.0f} s; right after "
                f"the window: {now:,.0f} (the longest TTL {ours.get('keys_max_ttl_s', 0):.0f} s)",
                left <= PERF2_NAMES_KEYS and ours.get("keys_settled_expiring", 0) == 0,
            )
        )
    return checks


READ_SCALING = 5.0  # the read lock's reads/s over the plain lock's, 64 tasks on one lock


def _shared_targets(section: dict[str, Any]) -> list[tuple[str, str, bool]]:
    checks: list[tuple[str, str, bool]] = []
    parts = section["parts"]
    if "reads" in parts:
        reads = _medians(parts["reads"])
        rate = reads.get("aiolock-read", {}).get("acquisitions_per_s", math.nan)
        plain = reads.get("aiolock", {}).get("acquisitions_per_s", math.nan)
        ratio = rate / plain if plain else math.nan
        checks.append(
            (
                f"shared: read lock reads/s >= {READ_SCALING:g} x the plain lock's "
                f"({_tasks(parts['reads'])} tasks)",
                f"{rate:,.0f} vs {plain:,.0f} (x{ratio:.1f})",
                ratio >= READ_SCALING,
            )
        )
    if "writes" in parts:
        ours = _medians(parts["writes"]).get("aiolock-write", {})
        overlaps, served = ours.get("overlaps", math.nan), ours.get("served", 0.0)
        checks.append(
            (
                "shared: write lock, every writer served and no overlapping holds",
                f"served {served:.0%}, overlaps {overlaps:.0f}",
                served >= 1.0 and overlaps == 0,
            )
        )
    if "semaphore" in parts:
        medians = _medians(parts["semaphore"])
        peaks = {n: f.get("peak_holders_max", math.nan) for n, f in medians.items()}
        worst = max(peaks.values(), default=math.nan)
        checks.append(
            (
                f"shared: semaphore holders <= {section['permits']}, every implementation",
                "peak " + ", ".join(f"{v:.0f}" for v in peaks.values()),
                worst <= section["permits"],
            )
        )
    return checks


def _tasks(part: dict[str, Any]) -> int:
    return int(part["processes"] * part["tasks_per_process"])


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
        medians = {name: dict(figures) for name, figures in _medians(part).items()}
        plain = medians.get("aiolock", {}).get("acquisitions_per_s", math.nan)
        for figures in medians.values():
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
                medians,
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
                _medians(part),
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
                _medians(part),
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
        f"Medians of {meta['repeats']} repeats{' (quick mode)' if meta['quick'] else ''}.",
        "",
    ]
    checks = targets(results)
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
    if "uncontended" in scenarios:
        section = scenarios["uncontended"]
        out += [f"**uncontended**: one task, {section['cycles']:,} acquire + release cycles", ""]
        columns = [
            "cycles_per_s",
            "p50_us",
            "p99_us",
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
                "p50 / PING p50",
                "client CPU µs/cycle",
                "server CPU µs/cycle",
                "server commands/cycle",
            ],
            _rows(_medians(section), labels, columns),
        )
    if "contended" in scenarios:
        section = scenarios["contended"]
        main = _main_level(section)
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
            _rows(_medians(level), labels, columns, percent),
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
            figures = [_medians(section["levels"][n]).get(name, {}) for n in counts]
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
                "commands/s while waiting",
                "RSS KB/waiter",
                "all acquired after (s)",
                "acquired %",
            ],
            _rows(_medians(section), labels, columns, {"acquired_share": lambda v: v * 100}),
        )
    if "names" in scenarios:
        out += _names_table(scenarios["names"], labels)
    if "cluster" in scenarios:
        out += _cluster_table(scenarios["cluster"])
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
    return out + _table(header, _rows(_medians(section), labels, columns))


def _cluster_table(section: dict[str, Any]) -> list[str]:
    """Acquisitions/s over the cluster, then per node: share, CPU and commands per acquisition
    of the node's own locks."""
    out = [
        f"**cluster**: {section['locks']:,} locks, {section['processes']} processes x "
        f"{section['tasks_per_process']} tasks, each picking a lock at random and holding it "
        f"{section['hold_s'] * 1000:g} ms, {section['duration_s']:g} s per run, on a 3-primary "
        f"{section['binary']} cluster",
        "",
    ]
    rows: list[Row] = []
    for name, figures in _medians(section).items():
        label = section["labels"].get(name, name)
        if "error" in figures:
            rows.append([label, f"failed: {figures['error']}"])
            continue
        for node in range(3):
            rows.append(
                [
                    label if node == 0 else "",
                    _fmt(figures.get("acquisitions_per_s", math.nan), 0) if node == 0 else "",
                    _fmt(figures.get("served", math.nan) * 100) if node == 0 else "",
                    _fmt(figures.get("overlaps", math.nan), 0) if node == 0 else "",
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
        "node",
        "share of acq %",
        "server CPU µs/acq",
        "commands/acq",
        "node CPU %",
    ]
    return out + _table(header, rows)


def _sweep_names(section: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for point in section["points"].values():
        names += [n for n in point["impls"] if n not in names]
    return names


def _sweep_table(section: dict[str, Any], labels: dict[str, str]) -> list[str]:
    out = [
        f"**sweep**: 4 to 16 processes x {section['tasks_per_process']} tasks on one lock, "
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
    for name in _sweep_names(section):
        for count, point in section["points"].items():
            figures = _medians(point).get(name)
            if figures is None:
                continue
            percent = {"barging": lambda v: v * 100, "served": lambda v: v * 100}
            for row in _rows({name: figures}, labels, columns, percent):
                rows.append([row[0], int(count), *row[1:]])
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


def _sweep_chart(results: dict[str, Any], out_dir: Path) -> Path:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    section, labels = results["scenarios"]["sweep"], results["meta"]["labels"]
    counts = list(section["points"])
    panels = [
        ("commands_per_acquisition", "server commands per acquisition", True),
        ("acquisitions_per_s", "acquisitions/s", False),
        ("gap_p50_us", "handoff gap p50 (µs)", True),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.8), dpi=90, squeeze=False)
    for ax, (field, title, log_y) in zip(axes[0], panels, strict=True):
        for name in _sweep_names(section):
            xs, ys = [], []
            for count in counts:
                value = _medians(section["points"][count]).get(name, {}).get(field)
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

    def bars(ax: Any, medians: dict[str, dict[str, Any]], field: str, title: str) -> None:
        names = [n for n, f in medians.items() if field in f]
        values = [medians[n][field] for n in names]
        colors = ["tab:green" if n.startswith("aiolock") else "tab:gray" for n in names]
        ax.barh([labels.get(n, n) for n in names], values, color=colors)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        ax.tick_params(labelsize=8)

    if "uncontended" in scenarios:
        ax = next(axes_iter)
        bars(
            ax,
            _medians(scenarios["uncontended"]),
            "p50_over_ping",
            "uncontended: cycle p50 / PING p50",
        )
        ax.axvline(2.0, color="black", linestyle=":", label="floor 2.0")
        ax.axvline(2.3, color="tab:red", linestyle="--", label="target 2.3")
        ax.legend(fontsize=7)
    if "contended" in scenarios:
        section = scenarios["contended"]
        main = _main_level(section)
        bars(
            next(axes_iter),
            _medians(section["levels"][main]),
            "acquisitions_per_s",
            f"contended @{main} waiters: acquisitions/s",
        )
        ax = next(axes_iter)
        counts = list(section["levels"])
        for name in section["levels"][main]["impls"]:
            ys = [
                _medians(section["levels"][n]).get(name, {}).get("commands_per_acquisition")
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
        medians = _medians(scenarios["fanin"])
        bars(
            ax,
            {
                n: {"v": max(f.get("commands_per_s_waiting", 0), 0.1)}
                for n, f in medians.items()
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


def write(results: dict[str, Any], out_dir: Path) -> str:
    """Write ``latest.json``, ``latest.md`` and the charts into ``out_dir``; return the markdown."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "latest.json").write_text(json.dumps(results, indent=1, sort_keys=False) + "\n")
    text = markdown(results)
    charts(results, out_dir)
    (out_dir / "latest.md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/latest.json")
    data = json.loads(path.read_text())
    print(write(data, path.parent))
