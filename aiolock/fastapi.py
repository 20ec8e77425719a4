"""FastAPI glue: hold a lock named from path parameters for a handler; answer a timeout with 423.

Install with ``pip install 'aiolock-redis[fastapi]'``.  The app makes one :class:`aiolock.Client`
in its lifespan and keeps it in ``app.state.aiolock_client`` (or yields it as the lifespan state
``{"aiolock_client": client}``)::

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with aiolock.Client.from_url(os.environ["REDIS_URL"]) as client:
            app.state.aiolock_client = client
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)

    OrderLock = Annotated[aiolock.LockGuard[int], held_lock("orders:{order_id}", wait=2)]

    @app.post("/orders/{order_id}/pay")
    async def pay(order_id: int, guard: OrderLock) -> Receipt:
        ...  # runs while this request holds the lock "orders:<order_id>"

A lock that cannot be had within ``wait`` answers ``423 Locked`` (the resource is locked by
someone else; a retry may succeed), which keeps it apart from the ``409 Conflict`` an app uses
for its own state conflicts, and from the 5xx of a failing server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

try:
    from fastapi import Depends, Request
    from fastapi.responses import JSONResponse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiolock.fastapi needs FastAPI: pip install 'aiolock-redis[fastapi]'"
    ) from exc

from ._core.names import NameTemplate
from .client import Client
from .errors import LockTimeoutError
from .lock import LockGuard

__all__ = ["LOCKED_STATUS", "STATE_KEY", "get_client", "held_lock", "lock_timeout_handler"]


#: The attribute of ``request.state`` (lifespan state) or ``app.state`` that holds the client.
STATE_KEY = "aiolock_client"

#: The status of a response to a request whose lock could not be had in time: 423 Locked.
LOCKED_STATUS = 423


def get_client(request: Request) -> Client:
    """The app's :class:`aiolock.Client` (a dependency): lifespan state first, then ``app.state``.

    :raises RuntimeError: when the lifespan did not put a client in either place.
    """
    for state in (request.state, request.app.state):
        client = getattr(state, STATE_KEY, None)
        if isinstance(client, Client):
            return client
    raise RuntimeError(
        f"no aiolock.Client: set app.state.{STATE_KEY} in the app's lifespan "
        f"(or yield {{{STATE_KEY!r}: client}} as its state)"
    )


def held_lock(name_template: str, *, wait: float | None = None, lease: float | None = None) -> Any:
    """A dependency that holds ``client.lock(name)`` while the handler runs; it yields the guard.

    The name is ``name_template.format(**request.path_params)``, e.g. ``"orders:{order_id}"``.
    The lock is taken before the handler runs (FastAPI has read the body by then) and released
    as soon as the handler returns or raises, before the response is sent, in the task that
    took it.  :class:`aiolock.LockTimeoutError` propagates when ``wait`` runs out (see
    :func:`lock_timeout_handler`); :class:`aiolock.LockLostError` does when the lease was lost
    while the handler ran, so its work is never reported as a success.

    Use it as a parameter, ``guard: Annotated[LockGuard, held_lock(...)]``, or in a route's
    ``dependencies=[held_lock(...)]``.  ``wait`` and ``lease`` are checked here, at once.
    """
    template = NameTemplate(name_template, wait, lease)

    async def hold(request: Request) -> AsyncIterator[LockGuard[int]]:
        name = template.name(request.path_params, request.url.path)
        async with template.acquire(get_client(request).lock(name)) as guard:
            yield guard

    # scope="function": released when the handler is done, not after the response is sent.
    return Depends(hold, scope="function")


async def lock_timeout_handler(request: Request, exc: Exception) -> JSONResponse:
    """An exception handler: :class:`aiolock.LockTimeoutError` becomes ``423 {"detail": ...}``.

    Install it with ``app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)``.
    """
    if not isinstance(exc, LockTimeoutError):
        raise exc
    return JSONResponse({"detail": str(exc)}, status_code=LOCKED_STATUS)
