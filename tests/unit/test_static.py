"""The quality gates run with the suite: ruff and mypy --strict are clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False
    )


def test_ruff_is_clean() -> None:
    result = run(sys.executable, "-m", "ruff", "check", "aiolock", "tests", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean() -> None:
    result = run(sys.executable, "-m", "mypy", "--strict", "aiolock", "examples", "tests")
    assert result.returncode == 0, result.stdout + result.stderr
