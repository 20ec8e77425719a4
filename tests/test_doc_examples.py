"""The documentation's code runs: every Python block marked runnable, against a real server.

A fenced ``python`` block of README.md or docs/*.md whose line above is ``<!-- runnable -->``
runs as it stands, each in a fresh interpreter (top-level ``await`` allowed, as in ``python -m
asyncio``), with the docs' URL, ``redis://127.0.0.1:6379/0``, pointed at the session's server
(a database of its own, emptied before each block).  A block marked ``<!-- runnable: pytest
-->`` is a test file: it runs under pytest in a subprocess with ``AIOLOCK_REDIS_URL`` naming
that server, so aiolock's own pytest plugin serves its fixtures as in a user's project.  An
HTML comment renders as nothing in MkDocs and on GitHub, so the marker costs the reader
nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis as redis_py

from aiolock.testing.pytest_plugin import ServerInfo

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS_URL = "redis://127.0.0.1:6379/0"
DATABASE = 9  # the blocks' own database: their keys never meet the other tests'
MARKER = re.compile(r"^<!--\s*runnable(?::\s*(\w+))?\s*-->$")
FENCE = re.compile(r"^```(\S*)")
# Fewer runnable blocks than this means the markers stopped being found, not that the docs
# shrank: the test must never pass by running nothing.
FLOOR = 30


@dataclass(frozen=True)
class Block:
    """One fenced code block: where it is, its language, its marker (``None``: unmarked)."""

    path: Path
    line: int
    language: str
    mode: str | None
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` at the top level (not indented), with their markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = MARKER.match(lines[i - 1].strip()) if i else None
        mode = (marker.group(1) or "asyncio") if marker else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(path, i + 1, fence.group(1), mode, code))
        i = end + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]
RUNNABLE = [block for block in ALL if block.mode is not None]


def test_enough_blocks_are_runnable() -> None:
    assert len(RUNNABLE) >= FLOOR, [block.name for block in RUNNABLE]
    wrong = [block.name for block in RUNNABLE if block.language != "python"]
    assert not wrong, f"only python blocks can be marked runnable: {wrong}"
    modes = {block.mode for block in RUNNABLE}
    assert modes <= {"asyncio", "pytest"}, modes


# Each block runs in an interpreter of its own, so what one sets up for the process (a
# metrics provider, a log handler, a running loop) neither leaks into the tests nor into the
# next block.  Top-level ``await`` is compiled as ``python -m asyncio`` compiles it.
RUNNER = """
import ast, asyncio, inspect, sys
path = sys.argv[1]
with open(path, encoding="utf-8") as file:
    code = compile(file.read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
if code.co_flags & inspect.CO_COROUTINE:
    async def main():
        await eval(code, namespace)
    asyncio.run(main())
else:
    exec(code, namespace)
"""


def _database_url(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{DATABASE}"))


def _environment(server_url: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "AIOLOCK_REDIS_URL": _database_url(server_url), "PYTHONPATH": path}


def run_block(block: Block, server_url: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run ``block`` alone on the server's database for the docs, emptied first."""
    url = _database_url(server_url)
    with redis_py.Redis.from_url(url) as redis:
        redis.flushdb()
    name = re.sub(r"\W", "_", block.name) + ".py"
    (folder / name).write_text(block.code.replace(DOCS_URL, url), encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-c", RUNNER, name],
        cwd=folder,
        env=_environment(server_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_block_that_raises_fails(aiolock_server: ServerInfo, tmp_path: Path) -> None:
    """The runner itself: an exception in a block fails it, and top-level await runs."""
    broken = Block(ROOT / "README.md", 0, "python", "asyncio", "raise LookupError('x')\n")
    result = run_block(broken, aiolock_server.url, tmp_path)
    assert result.returncode != 0
    assert "LookupError" in result.stderr
    awaiting = Block(
        ROOT / "README.md", 1, "python", "asyncio", "import asyncio\nawait asyncio.sleep(0)\n"
    )
    assert run_block(awaiting, aiolock_server.url, tmp_path).returncode == 0


@pytest.mark.parametrize(
    "block", [b for b in RUNNABLE if b.mode == "asyncio"], ids=lambda b: b.name
)
def test_the_block_runs(block: Block, aiolock_server: ServerInfo, tmp_path: Path) -> None:
    result = run_block(block, aiolock_server.url, tmp_path)
    assert result.returncode == 0, f"{block.name}\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.mode == "pytest"], ids=lambda b: b.name)
def test_the_test_block_passes(block: Block, aiolock_server: ServerInfo, tmp_path: Path) -> None:
    (tmp_path / "test_example.py").write_text(block.code, encoding="utf-8")
    url = _database_url(aiolock_server.url)
    with redis_py.Redis.from_url(url) as redis:
        redis.flushdb()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        env=_environment(aiolock_server.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b[1-9]\d* passed\b", result.stdout), result.stdout
