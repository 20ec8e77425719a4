"""From a results JSON to the report: ``latest.md`` (the target checks, :mod:`benchmarks.targets`,
and the tables, :mod:`benchmarks.tables`) and the PNG charts (:mod:`benchmarks.charts`).

``python benchmarks/report.py benchmarks/results/latest.json`` redraws them without rerunning.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: import the package from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.charts import charts
from benchmarks.tables import markdown

__all__ = ["write"]


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
