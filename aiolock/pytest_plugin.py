"""Moved to :mod:`aiolock.testing.pytest_plugin` (the ``pytest11`` entry point loads it); the
names users import from here keep working.  The fixtures are not repeated here, so that a
conftest that names this module in ``pytest_plugins`` does not define them twice."""

from .testing.pytest_plugin import CLUSTER_URL_VARIABLE, URL_VARIABLE, ServerInfo

__all__ = ["CLUSTER_URL_VARIABLE", "URL_VARIABLE", "ServerInfo"]
