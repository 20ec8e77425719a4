"""The command line: ``aiolock ...`` and ``python -m aiolock ...``.

Subcommands: ``demo`` (the seeds' scenario, :mod:`aiolock._demo`), ``server`` (an embedded
server in the foreground), ``inspect NAME`` (a lock's holders, leases, fencing counter and
waiters), ``list [PATTERN]`` (every lock held or waited for, of every kind, whose name
matches) and ``unlock NAME --force`` (its kind's ``force_unlock()``, after a confirmation).
Exit codes: 0 done, 1 nothing to do (the lock was not held, the confirmation was refused),
2 usage error, 3 cannot connect; a closed stdout is not an error.  See ``docs/cli.md`` for
the user's guide.

Built on :mod:`argparse`, not click or typer: five subcommands with a handful of options each
is what argparse does well (subparsers, ``--help``, exit code 2 for usage errors), and the
package's runtime dependencies stay ``redis[hiredis]`` and ``anyio``.  A library would add a
dependency (or an extra, and a CLI that works only with it) for colours and nicer help, which
an operator's tool that is run now and then does not need.
"""

from ._main import main as main

__all__ = ["main"]
