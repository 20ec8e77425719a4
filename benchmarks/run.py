"""Run the benchmarks: ``python benchmarks/run.py [SCENARIO|all]`` (``--help`` lists them).

Starts its own server (embedded Valkey by default, ``--server redis`` for ``redis-server`` from
PATH) unless ``--url`` names one, runs every available implementation side by side with the
order rotated per repeat, and writes ``latest.json``, ``latest.md``, ``summary.png`` and
``sweep.png`` into ``benchmarks/results/`` (``benchmarks/results/quick/`` with ``--quick``).  A
full run also refreshes the results section of ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

import aiolock
from aiolock.testing.embedded import EmbeddedServer
from benchmarks import impls, report
from benchmarks.scenarios import (
    cluster,
    contended,
    fanin,
    floor,
    rtt,
    shared,
    sweep,
    uncontended,
)
from benchmarks.scenarios import names as many_names
from benchmarks.scenarios import sync as threads
from benchmarks.stats import ServerProbe

HERE = Path(__file__).resolve().parent
SCENARIOS = (
    "rtt",
    "floor",
    "uncontended",
    "contended",
    "sweep",
    "shared",
    "fanin",
    "names",
    "sync",
)
# Not in ``all``: it starts a 3-primary cluster of its own (``--server`` picks the binary).
EXTRA = ("cluster",)
_README_START, _README_END = "<!-- results:start -->", "<!-- results:end -->"


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores ({platform.system()} {platform.release()})"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", nargs="?", default="all", choices=(*SCENARIOS, *EXTRA, "all"))
    parser.add_argument("--server", choices=("valkey", "redis"), default="valkey")
    parser.add_argument("--url", help="use this server instead of starting one (loopback!)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    parser.add_argument(
        "--impls",
        help="comma-separated subset of: "
        + ", ".join([*impls.IMPLS, *impls.SHARED])
        + " (the last four run in `shared` only); `cluster` takes aiolock, redispy-0.001 and "
        + "its floors: "
        + ", ".join(cluster.FLOORS),
    )
    parser.add_argument(
        "--rate",
        type=float,
        help="cluster: the acquisitions/s of its paced runs (default: 3/4 of the slowest "
        "implementation's free-running rate; 0: no paced runs)",
    )
    parser.add_argument("--out", type=Path, help="results directory")
    args = parser.parse_args(argv)
    if args.rate is not None and args.rate < 0:
        parser.error("--rate must be 0 or more")
    if args.quick and "--repeats" not in (argv if argv is not None else sys.argv):
        args.repeats = 1
    return args


def _run_scenarios(args: argparse.Namespace, url: str, names: list[str]) -> dict[str, Any]:
    chosen_impls = args.impls.split(",") if args.impls else None
    shared_names = [
        *names,
        *(n for n in impls.available_shared() if chosen_impls is None or n in chosen_impls),
    ]
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "rtt": lambda: rtt.run(url, repeats=args.repeats, quick=args.quick),
        "floor": lambda: floor.run(url, repeats=args.repeats, quick=args.quick),
        "uncontended": lambda: uncontended.run(url, names, repeats=args.repeats, quick=args.quick),
        "contended": lambda: contended.run(url, names, repeats=args.repeats, quick=args.quick),
        "sweep": lambda: sweep.run(url, names, repeats=args.repeats, quick=args.quick),
        "shared": lambda: shared.run(url, shared_names, repeats=args.repeats, quick=args.quick),
        "fanin": lambda: fanin.run(url, names, repeats=args.repeats, quick=args.quick),
        "names": lambda: many_names.run(url, names, repeats=args.repeats, quick=args.quick),
        "sync": lambda: threads.run(url, repeats=args.repeats, quick=args.quick),
        "cluster": lambda: cluster.run(
            args.server, chosen_impls, repeats=args.repeats, quick=args.quick, rate=args.rate
        ),
    }
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    results = {}
    for scenario in chosen:
        started = time.perf_counter()
        print(f"[bench] {scenario} ...", file=sys.stderr, flush=True)
        results[scenario] = runners[scenario]()
        results[scenario]["elapsed_s"] = round(time.perf_counter() - started, 1)
        print(f"[bench] {scenario} done in {results[scenario]['elapsed_s']}s", file=sys.stderr)
    return results


def _update_readme(text: str) -> None:
    readme = HERE / "README.md"
    if not readme.exists():
        return
    content = readme.read_text()
    start, end = content.find(_README_START), content.find(_README_END)
    if start < 0 or end < start:
        return
    images = "\n".join(
        f"![{name}](results/{name}.png)"
        for name in ("summary", "sweep")
        if (HERE / "results" / f"{name}.png").exists()
    )
    body = f"{_README_START}\n{text}\n\n{images}\n{_README_END}"
    readme.write_text(content[:start] + body + content[end + len(_README_END) :])


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    names = impls.available()
    if args.impls:
        names = [n for n in args.impls.split(",") if n in names]
    out_dir = args.out or (HERE / "results" / "quick" if args.quick else HERE / "results")
    server = None
    if args.url is None:
        server = EmbeddedServer(binary=args.server)
        server.start()
    url = args.url or server.url  # type: ignore[union-attr]
    try:
        probe = ServerProbe(url)
        info = probe.server_info()
        probe.close()
        scenarios = _run_scenarios(args, url, names)
    finally:
        if server is not None:
            server.stop()
    previous = out_dir / "latest.json"
    merged: dict[str, Any] = {}
    kept_meta: dict[str, Any] = {}
    date = time.strftime("%Y-%m-%d %H:%M %Z")
    if args.scenario != "all" and previous.exists():
        # A partial run replaces its scenarios' tables only: the header stays the full run's,
        # and says which scenarios were run again, when.
        earlier = json.loads(previous.read_text())
        merged, kept_meta = earlier.get("scenarios", {}), earlier.get("meta", {})
    results = {
        "meta": {
            "date": date,
            "machine": _machine(),
            "server": f"{info['name']} {info['version']}"
            + (" (embedded)" if server is not None else f" at {args.url}"),
            "python": platform.python_version(),
            "redis_py": redis.__version__,
            "aiolock": aiolock.__version__,
            "repeats": args.repeats,
            "quick": args.quick,
            "implementations": names,
            "labels": {name: cls.label for name, cls in {**impls.IMPLS, **impls.SHARED}.items()},
            "connection_pool": impls.POOL_SIZE,
        },
        "scenarios": {**merged, **scenarios},
    }
    if kept_meta:
        reruns = {**kept_meta.get("reruns", {})}
        how = results["meta"]
        rerun = f"{date}, {how['server']}, aiolock {how['aiolock']}, medians of {args.repeats}"
        rerun += ", quick" if args.quick else ""
        reruns.update({name: rerun for name in scenarios})
        results["meta"] = {**kept_meta, "reruns": reruns}
    text = report.write(results, out_dir)
    if not args.quick and args.out is None:
        _update_readme(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
