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

``held_lock(..., kind="fair")`` holds a fair lock instead (``"spin"``, ``"read"`` and
``"write"`` too), and :func:`held_permit` a semaphore's permit.

A lock that cannot be had within ``wait`` answers ``423 Locked`` (the resource is locked by
someone else; a retry may succeed), which keeps it apart from the ``409 Conflict`` an app uses
for its own state conflicts, and from the 5xx of a failing server.

FastAPI calls a handler's dependencies before it validates the handler's own parameters and
body, so the dependencies here check those first, with FastAPI's own validators, and answer
an invalid request with FastAPI's ``422`` at once, without taking the lock (or waiting for it).
"""

from __future__ import annotations

import email.message
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

from pydantic_core import PydanticUndefined

try:
    from fastapi import Depends, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.params import Form
    from fastapi.responses import JSONResponse
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiolock.fastapi needs FastAPI: pip install 'aiolock-redis[fastapi]'"
    ) from exc
try:  # the validators FastAPI runs after the dependencies (see _refuse_invalid)
    from fastapi.dependencies.models import Dependant
    from fastapi.dependencies.utils import request_body_to_args, request_params_to_args
except ImportError as exc:  # pragma: no cover - a FastAPI that moved them
    raise ImportError(
        "aiolock.fastapi validates a request before it takes the lock with FastAPI's "
        "request_params_to_args and request_body_to_args (fastapi.dependencies.utils), which "
        "this FastAPI does not have"
    ) from exc

from ._core.names import NameTemplate
from ._glue import HeldKind, check_kind, check_permits, hold_lock, hold_permit
from .client import Client
from .errors import LockTimeoutError
from .lock import LockGuard
from .semaphore import Permit

__all__ = [
    "LOCKED_STATUS",
    "STATE_KEY",
    "get_client",
    "held_lock",
    "held_permit",
    "lock_timeout_handler",
]


STATE_KEY = "aiolock_client"
"""The attribute of ``request.state`` (lifespan state) or ``app.state`` that holds the client."""

LOCKED_STATUS = 423
"""The status of a response to a request whose lock could not be had in time: 423 Locked."""


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


def held_lock(
    name_template: str,
    *,
    wait: float | None = None,
    lease: float | None = None,
    kind: HeldKind = "lock",
) -> Any:
    """A dependency that holds lock ``name`` while the handler runs; it yields the guard.

    The name is ``name_template.format(**request.path_params)``, e.g. ``"orders:{order_id}"``;
    ``kind`` picks the lock: ``"lock"`` (``client.lock(name)``), ``"fair"``
    (``client.fair_lock``), ``"spin"`` (``client.spin_lock``), ``"read"`` or ``"write"``
    (``client.rw_lock(name).read_lock()`` or ``.write_lock()``).  The handler's own
    parameters and JSON body are validated first: an invalid request gets FastAPI's 422 at
    once, without the lock.  The lock is taken before the handler runs and released as soon as
    the handler returns or raises, before the response is sent, in the task that took it.
    :class:`aiolock.LockTimeoutError` propagates when ``wait`` runs out (see
    :func:`lock_timeout_handler`); :class:`aiolock.LockLostError` does when the lease was lost
    while the handler ran, so its work is never reported as a success.

    Use it as a parameter, ``guard: Annotated[LockGuard, held_lock(...)]``, or in a route's
    ``dependencies=[held_lock(...)]``.  ``wait``, ``lease`` and ``kind`` are checked here, at
    once.
    """
    template = NameTemplate(name_template, wait, lease)
    factory = check_kind(kind)
    return _held(template, lambda client, name: hold_lock(template, factory, client, name))


def held_permit(
    name_template: str, permits: int, *, wait: float | None = None, lease: float | None = None
) -> Any:
    """A dependency that holds a permit of ``client.semaphore(name, permits)`` while the
    handler runs; it yields the :class:`aiolock.Permit`.

    As :func:`held_lock` otherwise: at most ``permits`` requests (across every worker and
    host) run the handler at once, per name; the others wait up to ``wait`` and then get 423.
    ``Annotated[aiolock.Permit, held_permit("reports", 4, wait=1)]``.  ``permits``, ``wait``
    and ``lease`` are checked here, at once.
    """
    template = NameTemplate(name_template, wait, lease)
    count = check_permits(permits)
    return _held(template, lambda client, name: hold_permit(template, count, client, name))


def _held(
    template: NameTemplate,
    hold: Callable[[Client, str], AbstractAsyncContextManager[LockGuard[int] | Permit]],
) -> Any:
    async def holding(request: Request) -> AsyncIterator[LockGuard[int] | Permit]:
        await _refuse_invalid(request)
        name = template.name(request.path_params, request.url.path)
        async with hold(get_client(request), name) as held:
            yield held

    # scope="function": released when the handler is done, not after the response is sent.
    return Depends(holding, scope="function")


async def _refuse_invalid(request: Request) -> None:
    """Raise the :class:`~fastapi.exceptions.RequestValidationError` that FastAPI would raise
    for the handler's own parameters and JSON body, had it validated them first.

    FastAPI runs the dependencies before it validates the handler's parameters, so a
    dependency that waits for a lock would keep a malformed request waiting, and answer 423
    where 422 is due.  The same validators run here, on what FastAPI read (the path, query,
    headers, cookies, and the body it decoded as JSON).  A body that the handler shares with
    another dependency, a form, or one sent without a JSON content type is left to FastAPI,
    which checks it after the lock is taken, as it checks the parameters of other
    dependencies.
    """
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if not isinstance(dependant, Dependant):  # not a FastAPI route: nothing to check against
        return
    errors: list[Any] = []
    for fields, received in (
        (dependant.path_params, request.path_params),
        (dependant.query_params, request.query_params),
        (dependant.header_params, request.headers),
        (dependant.cookie_params, request.cookies),
    ):
        errors += request_params_to_args(fields, received)[1]
    body = await _json_body(request, dependant)
    if body is not _UNREAD:
        # Embedded as FastAPI decides it for the route: several body fields, or one declared
        # Body(embed=True) (forms are left to FastAPI).  Older releases trust this flag alone.
        fields = dependant.body_params
        embed = len({field.name for field in fields}) > 1 or bool(
            getattr(fields[0].field_info, "embed", None)
        )
        found = await request_body_to_args(
            body_fields=fields, received_body=body, embed_body_fields=embed
        )
        errors += found[1]
    if errors:
        unread = body is _UNREAD or body is PydanticUndefined
        raise RequestValidationError(errors, body=None if unread else body)


_UNREAD: Final = object()  # a body left to FastAPI's own check


async def _json_body(request: Request, dependant: Dependant) -> Any:
    """The handler's body as FastAPI passes it to its validators (decoded JSON, or nothing
    for an empty one), or :data:`_UNREAD` where this check leaves it to FastAPI."""
    fields = dependant.body_params
    if not fields or any(isinstance(field.field_info, Form) for field in fields):
        return _UNREAD
    if _body_params(dependant) != len(fields):  # shared with a dependency: embedded together
        return _UNREAD
    if not await request.body():
        return PydanticUndefined  # FastAPI's "no body": a required one is missing
    content_type = request.headers.get("content-type")
    if not content_type:
        return _UNREAD
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() != "application" or not (
        subtype == "json" or subtype.endswith("+json")
    ):
        return _UNREAD
    try:
        return await request.json()  # decoded once: Starlette keeps FastAPI's result
    except ValueError:  # pragma: no cover - FastAPI answered malformed JSON before this
        return _UNREAD


def _body_params(dependant: Dependant) -> int:
    """The body parameters of ``dependant`` and of every dependency below it."""
    return len(dependant.body_params) + sum(map(_body_params, dependant.dependencies))


async def lock_timeout_handler(request: Request, exc: Exception) -> JSONResponse:
    """An exception handler: :class:`aiolock.LockTimeoutError` becomes ``423 {"detail": ...}``.

    Install it with ``app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)``.
    """
    if not isinstance(exc, LockTimeoutError):
        raise exc
    return JSONResponse({"detail": str(exc)}, status_code=LOCKED_STATUS)
