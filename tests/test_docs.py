"""The documentation: the site builds under ``mkdocs build --strict``, and no link leaves the repo.

The strict build fails on a broken page link or anchor and on a reference (mkdocstrings) that
no longer resolves, so a renamed public name or a broken docstring fails here, not on a
reader's screen.  The link check keeps README.md and the pages self-contained: every link is
relative and names a file of the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import aiolock
import aiolock.aiohttp
import aiolock.fastapi

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
# [text](target), ![alt](target), [text]: target, and <scheme:...> autolinks.
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def prose(path: Path) -> str:
    """The Markdown of ``path`` without code blocks and code spans (URLs there are examples)."""
    return CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))


def links(path: Path) -> list[str]:
    text = prose(path)
    found = INLINE.findall(text) + REFERENCE.findall(text) + AUTOLINK.findall(text)
    return [target for target in found if not target.startswith("#")]


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_links_stay_in_the_repository(path: Path) -> None:
    assert path.is_file(), path
    bad = []
    for target in links(path):
        file = target.split("#", 1)[0]
        if re.match(r"[a-z][a-z0-9+.-]*:", file, re.IGNORECASE) or file.startswith(("/", "~")):
            bad.append(f"{target}: not a relative link")
            continue
        resolved = (path.parent / file).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not resolved.exists():
            bad.append(f"{target}: no such file")
    assert not bad, f"{path.name}: {bad}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_no_bare_web_addresses(path: Path) -> None:
    """A bare URL in the text is a link on GitHub and PyPI: none may point outside the repo."""
    assert not re.findall(r"https?://\S+", prose(path)), path.name


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
    result = subprocess.run(
        [*command, "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

    # Every public name has its entry in the reference.
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    expected = [f"aiolock.{name}" for name in aiolock.__all__] + [
        "aiolock.testing.embedded.EmbeddedServer",
        "aiolock.testing.pytest_plugin.aiolock_server",
        "aiolock.testing.pytest_plugin.aiolock_client",
        *(f"aiolock.fastapi.{name}" for name in aiolock.fastapi.__all__),
        *(f"aiolock.aiohttp.{name}" for name in aiolock.aiohttp.__all__),
    ]
    anchors = set(re.findall(r'id="(aiolock[\w.]*)"', reference))
    missing = [
        name
        for name in expected
        if name not in anchors and name.replace("aiolock.", "aiolock.errors.", 1) not in anchors
    ]
    assert not missing, f"add these to docs/reference.md: {missing}"
    # Every page of the docs folder is in the navigation.
    nav = (site / "index.html").read_text(encoding="utf-8")
    for page in PAGES:
        if page.stem != "index":
            assert f'href="{page.stem}/"' in nav, f"{page.name} is not in mkdocs.yml's nav"
