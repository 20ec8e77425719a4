"""``python -m aiolock demo``: the seed scenario, see :mod:`aiolock._demo`."""

from ._demo import main

raise SystemExit(main())
