"""The examples run against the test server, so they never go stale."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from aiolock.testing.pytest_plugin import ServerInfo

EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.py"))
# The framework glue modules are public too (behind the fastapi and aiohttp extras).
PUBLIC_MODULES = (
    "aiolock",
    "aiolock.sync",
    "aiolock.testing.embedded",
    "aiolock.fastapi",
    "aiolock.aiohttp",
)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path: Path, aiolock_server: ServerInfo) -> None:
    run = subprocess.run(
        [sys.executable, str(path), aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip()


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_import_only_public_names(path: Path) -> None:
    import aiolock
    import aiolock.sync

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "aiolock"
        ):
            assert node.attr in [*aiolock.__all__, "sync"], f"{path.name}: aiolock.{node.attr}"
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and ast.unparse(node.value) == "aiolock.sync"
        ):
            assert node.attr in aiolock.sync.__all__, f"{path.name}: aiolock.sync.{node.attr}"
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aiolock"):
            assert node.module in PUBLIC_MODULES, f"{path.name}: {node.module}"


def test_fencing_example_rejects_the_stale_writer(aiolock_server: ServerInfo) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "fencing.py"), aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "new holder wrote: True - stale holder wrote: False" in run.stdout, run.stdout
    assert "learns it lost the lock" in run.stdout


def test_stale_holder_example_has_its_write_refused(aiolock_server: ServerInfo) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "stale_holder.py"), aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stale holder's write was refused" in run.stdout, run.stdout
    assert "members: ['added by the new holder']" in run.stdout, run.stdout


def test_celery_example_never_runs_a_customer_twice_at_once(aiolock_server: ServerInfo) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "celery_task.py"), aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("alone: True") == 8, run.stdout


def test_flask_example_admits_exactly_5(aiolock_server: ServerInfo) -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES[0].parent / "flask_app.py"), aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "joined: 5, refused (full): 95, busy: 0" in run.stdout, run.stdout
