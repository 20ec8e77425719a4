"""The CI-mode chaos runs, as tests: ``python -m tests.chaos.run`` in a subprocess, on one server
and on a Cluster (``--cluster``: slot moves and a primary killed).

The seed is random unless ``AIOLOCK_CHAOS_SEED`` is set; the run prints it for replay.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_chaos_ci_mode() -> None:
    _chaos()


@pytest.mark.slow
def test_chaos_cluster_ci_mode() -> None:
    """About 22 s: 3 workers x 20 tasks for 12 s on 3 primaries with a replica each."""
    _chaos("--cluster")


def _chaos(*options: str) -> None:
    seed = os.environ.get("AIOLOCK_CHAOS_SEED") or str(random.randrange(1 << 32))
    command = [sys.executable, "-m", "tests.chaos.run", "--seed", seed, *options]
    run = subprocess.run(
        command, check=False, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    print(run.stdout)
    assert run.returncode == 0, f"chaos run failed (seed {seed}):\n{run.stdout}\n{run.stderr}"
