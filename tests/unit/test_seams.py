"""The package's seams: no module reaches into another's underscore names, no import circle.

A private name is a module's own business; code elsewhere asks through a declared interface
(a kind's internal names without an underscore, a module function), so that a module can
change inside without reading every module that uses it.  redis-py's privates are read in one
module only, ``aiolock/_redis/redispy.py``, which its own test guards.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "aiolock"
# Module aliases whose attributes are public names spelled with an underscore by convention.
MODULE_ALIASES = {"_scripts", "_logging"}


def own_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, attributes it assigns, slots."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries
    return names


def reaches(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mine = own_names(tree)
    if path.name == "redispy.py":
        return []  # the one module that reads redis-py's privates
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or name.startswith("__") or name in mine:
            continue
        receiver = node.value
        if isinstance(receiver, ast.Name) and receiver.id in {"self", "cls", *MODULE_ALIASES}:
            continue
        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .{name}")
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports when it runs (TYPE_CHECKING blocks aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(sub)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for sub in ast.walk(node)
    }
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level and id(node) not in typing_only:
            base = package[: len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def test_no_module_reaches_into_another_modules_privates() -> None:
    found = [use for path in sorted(PACKAGE.rglob("*.py")) for use in reaches(path)]
    assert found == [], "declare a target instead of reaching in:\n" + "\n".join(found)


def test_no_import_circle() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path): path for path in paths}
    # A package's __init__ imports its modules to re-export them: not a dependency circle.
    graph = {
        name: {target for target in runtime_imports(path) if target in modules and target != name}
        for name, path in modules.items()
        if path.name != "__init__.py"
    }
    circles: list[str] = []

    def visit(name: str, stack: list[str]) -> None:
        for target in graph.get(name, ()):
            if target in stack:
                circles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif len(stack) < 12:
                visit(target, [*stack, target])

    for name in graph:
        visit(name, [name])
    assert circles == [], "import circles:\n" + "\n".join(sorted(set(circles)))


def imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, for running or for typing alike."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            found.add(".".join(base + ([node.module] if node.module else [])))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found.update(name for name in names if name.split(".")[0] == "aiolock")
    return found


def test_the_transport_knows_no_kind() -> None:
    """``aiolock/_redis/`` carries calls and messages: it imports nothing but itself, the
    script loader and the errors, so no kind's message format can creep into it (a kind that
    reads its messages subclasses :class:`~aiolock._redis.pubsub.Entry` in its own package)."""
    allowed = {"aiolock._redis", "aiolock._scripts", "aiolock.errors"}
    found = [
        f"{path.relative_to(PACKAGE.parent)} imports {target}"
        for path in sorted((PACKAGE / "_redis").rglob("*.py"))
        for target in sorted(imports(path))
        if not any(target == ok or target.startswith(ok + ".") for ok in allowed)
    ]
    assert found == []
