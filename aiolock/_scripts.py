"""The Lua scripts, loaded once from package files (``_calls`` runs them by SHA).

They live in ``scripts/<kind>/<operation>.lua``, each opening with its KEYS, ARGV and returns.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

__all__ = ["LOCK_ACQUIRE", "LOCK_FORCE", "LOCK_RELEASE", "LOCK_RENEW", "Script"]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, kind: str, operation: str) -> Script:
        path = resources.files(__package__).joinpath("scripts", kind, f"{operation}.lua")
        source = path.read_text("utf-8")
        return cls(f"{kind}/{operation}", source, hashlib.sha1(source.encode()).hexdigest())


LOCK_ACQUIRE = Script.load("lock", "acquire")
LOCK_RELEASE = Script.load("lock", "release")
LOCK_RENEW = Script.load("lock", "renew")
LOCK_FORCE = Script.load("lock", "force")
