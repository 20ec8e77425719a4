"""``python -m aiolock ...``: the command line, see :mod:`aiolock._cli`."""

from ._cli import main

raise SystemExit(main())
