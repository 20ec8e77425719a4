"""aiohttp glue: the client in ``cleanup_ctx``, a handler held under a lock, 423 on a timeout.

Install with ``pip install 'aiolock-redis[aiohttp]'``::

    app = web.Application(middlewares=[lock_timeout_middleware])
    app.cleanup_ctx.append(client_context(os.environ["REDIS_URL"]))

    @routes.post("/orders/{order_id}/pay")
    @held_lock("orders:{order_id}", wait=2)
    async def pay(request: web.Request) -> web.Response:
        ...  # runs while this request holds the lock "orders:<order_id>"

``held_lock(..., kind="fair")`` holds a fair lock instead (``"spin"``, ``"read"`` and
``"write"`` too), and :func:`held_permit` a semaphore's permit.

aiohttp has no validation before the handler: a decorated handler checks its request (its
body, say) under the lock.  To refuse a malformed request without waiting for the lock, check
it first and then take the lock in the handler, with :func:`get_client`.

A lock that cannot be had within ``wait`` answers ``423 Locked`` (the resource is locked by
someone else; a retry may succeed), which keeps it apart from the ``409 Conflict`` an app uses
for its own state conflicts, and from the 5xx of a failing server.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

try:
    from aiohttp import web
    from aiohttp.typedefs import Handler
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "aiolock.aiohttp needs aiohttp: pip install 'aiolock-redis[aiohttp]'"
    ) from exc

from ._core.names import NameTemplate
from ._glue import HeldKind, check_kind, check_permits, hold_lock, hold_permit
from .client import Client
from .errors import LockTimeoutError

__all__ = [
    "CLIENT_KEY",
    "LOCKED_STATUS",
    "client_context",
    "get_client",
    "held_lock",
    "held_permit",
    "lock_timeout_middleware",
]

CLIENT_KEY = web.AppKey("aiolock_client", Client)
"""Where :func:`client_context` keeps the client: ``app[CLIENT_KEY]``."""

LOCKED_STATUS = 423
"""The status of a response to a request whose lock could not be had in time: 423 Locked."""


def client_context(url: str, **options: Any) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry: ``Client.from_url(url, **options)`` at startup, closed at cleanup.

    The client is kept in ``app[CLIENT_KEY]``; handlers reach it with :func:`get_client`.
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        async with Client.from_url(url, **options) as client:
            app[CLIENT_KEY] = client
            yield

    return context


def get_client(request: web.Request) -> Client:
    """The :class:`aiolock.Client` that :func:`client_context` made for the request's app.

    :raises RuntimeError: when the app (or a parent app) has no client under ``CLIENT_KEY``.
    """
    client = request.config_dict.get(CLIENT_KEY)
    if client is None:
        raise RuntimeError(
            "no aiolock.Client: append aiolock.aiohttp.client_context(url) to app.cleanup_ctx"
        )
    return client


def held_lock(
    name_template: str,
    *,
    wait: float | None = None,
    lease: float | None = None,
    kind: HeldKind = "lock",
) -> Callable[[Handler], Handler]:
    """A handler decorator: the handler runs holding lock ``name``.

    The name is ``name_template.format(**request.match_info)``, e.g. ``"orders:{order_id}"``; a
    placeholder that the route does not define raises :class:`LookupError` at the request.
    ``kind`` picks the lock: ``"lock"`` (``client.lock(name)``), ``"fair"``
    (``client.fair_lock``), ``"spin"`` (``client.spin_lock``), ``"read"`` or ``"write"``
    (``client.rw_lock(name).read_lock()`` or ``.write_lock()``).
    :class:`aiolock.LockTimeoutError` propagates when ``wait`` runs out (see
    :func:`lock_timeout_middleware`); :class:`aiolock.LockLostError` does when the lease was
    lost while the handler ran, so its work is never reported as a success.  ``wait``,
    ``lease`` and ``kind`` are checked here, at once.
    """
    template = NameTemplate(name_template, wait, lease)
    factory = check_kind(kind)
    return _held(template, lambda client, name: hold_lock(template, factory, client, name))


def held_permit(
    name_template: str, permits: int, *, wait: float | None = None, lease: float | None = None
) -> Callable[[Handler], Handler]:
    """A handler decorator: the handler runs holding a permit of ``client.semaphore(name,
    permits)``, so that at most ``permits`` requests (across every process and host) run it at
    once, per name; the others wait up to ``wait`` and then get 423.  As :func:`held_lock`
    otherwise; ``permits``, ``wait`` and ``lease`` are checked here, at once.
    """
    template = NameTemplate(name_template, wait, lease)
    count = check_permits(permits)
    return _held(template, lambda client, name: hold_permit(template, count, client, name))


def _held(
    template: NameTemplate, hold: Callable[[Client, str], AbstractAsyncContextManager[Any]]
) -> Callable[[Handler], Handler]:
    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapper(request: web.Request) -> web.StreamResponse:
            name = template.name(request.match_info, request.path)
            async with hold(get_client(request), name):
                return await handler(request)

        return wrapper

    return decorate


@web.middleware
async def lock_timeout_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A middleware: :class:`aiolock.LockTimeoutError` becomes ``423 {"detail": ...}``."""
    try:
        return await handler(request)
    except LockTimeoutError as exc:
        return web.json_response({"detail": str(exc)}, status=LOCKED_STATUS)
