"""The Lua scripts, loaded once from package files and run by SHA with a NOSCRIPT fallback."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

__all__ = ["ACQUIRE", "FORCE_UNLOCK", "RELEASE", "RENEW", "Script", "run"]


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


async def run(redis: Redis, script: Script, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
    """Run ``script`` by SHA; on NOSCRIPT (a fresh or flushed server) send its source once."""
    try:
        return await redis.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        # EVAL caches the script, so the next EVALSHA on this server finds it.
        return await redis.eval(script.source, len(keys), *keys, *args)
