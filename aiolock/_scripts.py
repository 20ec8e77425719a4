"""The Lua scripts, loaded once from package files (``_calls`` runs them by SHA)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

__all__ = ["ACQUIRE", "FORCE_UNLOCK", "RELEASE", "RENEW", "Script"]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> Script:
        source = resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text("utf-8")
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


ACQUIRE = Script.load("acquire")
RELEASE = Script.load("release")
RENEW = Script.load("renew")
FORCE_UNLOCK = Script.load("force_unlock")
