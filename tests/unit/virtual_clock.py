"""An event loop whose clock jumps to its next timer instead of waiting for it.

As ``trio.testing.MockClock(autojump_threshold=0)``: when no callback is ready and no I/O has
arrived, the loop's time moves on to the next scheduled timer at once.  A settlement that backs
off for seconds, a lease that runs out, a resend window that closes: each takes no wall time,
and happens in the order the code scheduled it.  For tests without a server (a real socket's
reply does not come sooner because the clock jumped).

A test uses it by overriding anyio's backend fixture::

    @pytest.fixture
    def anyio_backend() -> tuple[str, dict[str, object]]:
        return "asyncio", {"loop_factory": VirtualClockLoop}
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

__all__ = ["VirtualClockLoop"]

# How long (wall time) a loop with nothing scheduled waits for real I/O before it calls the test
# stuck: nothing could ever wake it.
_STUCK_AFTER = 10.0


class _Jumping(selectors.BaseSelector):
    """A selector that polls, and moves its loop's clock by the time it was asked to wait."""

    def __init__(self, loop: VirtualClockLoop) -> None:
        self._inner = selectors.DefaultSelector()
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self._inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only another thread could wake the loop
            ready = self._inner.select(_STUCK_AFTER)
            if not ready:
                raise RuntimeError("nothing is scheduled and nothing can wake the loop")
            return ready
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Any:
        return self._inner.get_map()


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock, starting at 0 (see the module docstring)."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_Jumping(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (the loop does it itself when it would wait)."""
        self._now += seconds
