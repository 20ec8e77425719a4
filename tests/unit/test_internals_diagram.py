"""The acquire path's sequence diagram in ``docs/internals.md`` names code that exists.

Every ``<module>.py: <Name>[.<attribute>...]`` in the diagram is a module under ``aiolock/`` and
a class, function or method in it (as is every further ``Class.attribute`` on that line, after
that module), and every ``scripts/...lua`` a script: a rename that the diagram does not follow
fails here.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import aiolock

DOC = Path(__file__).resolve().parents[2] / "docs" / "internals.md"
PACKAGE = Path(aiolock.__file__).resolve().parent

# `_core/acquire.py: Acquiring.wait_for_grant`: a module path under aiolock/, and a dotted name.
CODE_NAME = re.compile(r"(?<![\w/.])((?:[\w]+/)*\w+\.py): ([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
MODULE = re.compile(r"(?<![\w/.])((?:[\w]+/)*\w+\.py)\b")
SCRIPT = re.compile(r"(?<![\w/.])(scripts/[\w/]+\.lua)\b")


def acquire_diagram(text: str) -> str:
    """The mermaid sequence diagram of the acquire path (the one that names the wait loop)."""
    blocks = re.findall(r"```mermaid\n(.*?)```", text, flags=re.DOTALL)
    found = [b for b in blocks if "sequenceDiagram" in b and "Acquiring.wait_for_grant" in b]
    assert len(found) == 1, "docs/internals.md has one acquire diagram"
    return str(found[0])


def resolve(module_path: str, dotted: str) -> object:
    """The object ``dotted`` names in the module at ``module_path`` (under ``aiolock/``)."""
    assert (PACKAGE / module_path).is_file(), f"no module aiolock/{module_path}"
    module = importlib.import_module("aiolock." + module_path.removesuffix(".py").replace("/", "."))
    found: object = module
    for part in dotted.split("."):
        assert hasattr(found, part), f"aiolock/{module_path} has no {dotted}"
        found = getattr(found, part)
        if found is not module and getattr(module, part, None) is found:
            # The first name is the module's own, not one it imports.
            home = getattr(found, "__module__", module.__name__)
            assert home == module.__name__, f"{part} is defined in {home}, not {module_path}"
    return found


# On one line, a module named, then names in it: ``acquire.py: Acquiring._left, Acquiring._send``.
TOKEN = re.compile(
    r"(?<![\w/.])(?P<module>(?:\w+/)*\w+\.py): |(?<![\w/.])(?P<name>[A-Z]\w*(?:\.[A-Za-z_]\w*)+)"
)


def names_in(diagram: str) -> list[tuple[str, str]]:
    """Each (module, name) the diagram names: the name right after a module, and any dotted
    name starting with a capital that follows it on its line."""
    found: list[tuple[str, str]] = []
    for line in diagram.splitlines():
        module = None
        for match in TOKEN.finditer(line):
            if match["module"] is not None:
                module = match["module"]
            elif module is not None:
                found.append((module, match["name"]))
    return sorted(set(found) | set(CODE_NAME.findall(diagram)))


def test_the_diagram_names_enough_code_to_be_checked() -> None:
    diagram = acquire_diagram(DOC.read_text())
    names = names_in(diagram)
    assert len(names) >= 25, names
    assert len(SCRIPT.findall(diagram)) >= 4


@pytest.mark.parametrize(
    ("module_path", "dotted"),
    names_in(acquire_diagram(DOC.read_text())),
    ids=lambda value: value,
)
def test_every_name_in_the_diagram_exists(module_path: str, dotted: str) -> None:
    found = resolve(module_path, dotted)
    assert callable(found) or isinstance(found, property), f"{dotted} is no class or function"


def test_every_module_and_script_in_the_diagram_exists() -> None:
    diagram = acquire_diagram(DOC.read_text())
    for path in MODULE.findall(diagram) + SCRIPT.findall(diagram):
        assert (PACKAGE / path).is_file(), f"no aiolock/{path}"


@pytest.mark.parametrize(
    ("module_path", "dotted"),
    [
        ("_core/acquire.py", "Acquiring.wait_for_grant_renamed"),
        ("_core/acquire_renamed.py", "Acquiring.wait_for_grant"),
        ("_core/holds.py", "PendingWork.wait_pending"),  # imported there, defined elsewhere
    ],
)
def test_a_wrong_name_fails(module_path: str, dotted: str) -> None:
    with pytest.raises(AssertionError):
        resolve(module_path, dotted)
