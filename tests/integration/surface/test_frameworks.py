"""The seed scenario served by FastAPI and aiohttp: in process, and for real in a server process.

A crowd of 100 concurrent joins of a group limited to 5: exactly 5 join (201), none fails (no
5xx), the others are told the group is full (409) or, had the lock stayed busy, 423 Locked.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from fastapi import Body, FastAPI, Query
from pydantic import BaseModel, Field
from redis.asyncio import Redis

import aiolock
from aiolock.aiohttp import CLIENT_KEY
from aiolock.fastapi import held_lock, held_permit, lock_timeout_handler
from aiolock.testing.embedded import free_port
from aiolock.testing.pytest_plugin import ServerInfo

from ._apps import (
    LIMIT,
    check_crowd,
    crowd,
    http_crowd,
    load_example,
    python,
    served,
    uvicorn_serving,
)

pytestmark = pytest.mark.anyio

fastapi_app = load_example("fastapi_app")
aiohttp_app = load_example("aiohttp_app")

# At module level: FastAPI resolves the (postponed) annotations in the module's namespace.
OrderLock = Annotated[aiolock.LockGuard[int], held_lock("orders:{order_id}", wait=0, lease=5)]
# Waits far longer than any test: a request that waited for it would never answer in time.
PayLock = Annotated[aiolock.LockGuard[int], held_lock("orders:{order_id}", wait=600)]
FairLock = Annotated[aiolock.LockGuard[int], held_lock("queue:{name}", wait=0, kind="fair")]
ReportPermit = Annotated[aiolock.Permit, held_permit("reports:{name}", 2, wait=0)]


@pytest.fixture
async def group(redis: Redis) -> AsyncIterator[str]:
    """A fresh group id; its members set is deleted afterwards."""
    group_id = f"test-{uuid.uuid4().hex[:12]}"
    yield group_id
    await redis.delete(f"groups:{group_id}:members")


@pytest.fixture
def lock_wait() -> float:
    """The apps' ``wait`` for a group's lock: ample for 100 joins (a test may parametrize it)."""
    return 5.0


@pytest.fixture
async def fastapi_http(
    aiolock_server: ServerInfo, lock_wait: float
) -> AsyncIterator[httpx.AsyncClient]:
    """The example FastAPI app in process, its lifespan running, behind httpx's ASGI transport."""
    app: FastAPI = fastapi_app.create_app(aiolock_server.url, wait=lock_wait)
    async with app.router.lifespan_context(app):
        client: aiolock.Client = app.state.aiolock_client
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http
    assert client.closed


@pytest.fixture
async def aiohttp_http(
    aiolock_server: ServerInfo, lock_wait: float
) -> AsyncIterator[TestClient[Any, Any]]:
    """The example aiohttp app in process (its cleanup_ctx running) behind aiohttp's TestClient."""
    app = aiohttp_app.create_app(aiolock_server.url, wait=lock_wait)
    async with TestClient(TestServer(app)) as http:
        client = app[CLIENT_KEY]
        yield http
    assert client.closed


# --- in process ---------------------------------------------------------------------------------


async def test_fastapi_crowd(fastapi_http: httpx.AsyncClient, redis: Redis, group: str) -> None:
    async def join(user: str) -> int:
        reply = await fastapi_http.post(f"/groups/{group}/join", json={"user": user})
        return reply.status_code

    statuses = await crowd(join)
    check_crowd(statuses)
    assert statuses[409] == 100 - LIMIT  # nobody waited 5 s for the lock
    assert await redis.scard(f"groups:{group}:members") == LIMIT
    listed = (await fastapi_http.get(f"/groups/{group}")).json()
    assert len(listed["members"]) == LIMIT
    again = await fastapi_http.post(f"/groups/{group}/join", json={"user": listed["members"][0]})
    assert (again.status_code, again.json()["members"]) == (200, LIMIT)
    full = await fastapi_http.post(f"/groups/{group}/join", json={"user": "late"})
    assert full.status_code == 409
    assert full.json() == {"detail": f"group {group!r} is full ({LIMIT} members)"}


async def test_aiohttp_crowd(aiohttp_http: TestClient[Any, Any], redis: Redis, group: str) -> None:
    async def join(user: str) -> int:
        async with aiohttp_http.post(f"/groups/{group}/join", json={"user": user}) as reply:
            return reply.status

    statuses = await crowd(join)
    check_crowd(statuses)
    assert statuses[409] == 100 - LIMIT
    assert await redis.scard(f"groups:{group}:members") == LIMIT
    async with aiohttp_http.get(f"/groups/{group}") as reply:
        members = (await reply.json())["members"]
    assert len(members) == LIMIT
    async with aiohttp_http.post(f"/groups/{group}/join", json={"user": members[0]}) as reply:
        assert (reply.status, (await reply.json())["members"]) == (200, LIMIT)
    async with aiohttp_http.post(f"/groups/{group}/join", json={"user": "late"}) as reply:
        assert reply.status == 409
        assert await reply.json() == {"detail": f"group {group!r} is full ({LIMIT} members)"}
    async with aiohttp_http.post(f"/groups/{group}/join", data=b"not json") as reply:
        assert reply.status == 400


@pytest.mark.parametrize("lock_wait", [0.3])
async def test_fastapi_busy_lock_answers_423(
    fastapi_http: httpx.AsyncClient, aiolock_server: ServerInfo, group: str
) -> None:
    async with aiolock.Client.from_url(aiolock_server.url) as other:  # the app's key prefix
        async with other.lock(f"groups:{group}").acquire(wait=1):
            reply = await fastapi_http.post(f"/groups/{group}/join", json={"user": "alice"})
    assert reply.status_code == 423
    assert reply.json() == {
        "detail": f"could not acquire lock 'groups:{group}' within 0.3s",
    }
    reply = await fastapi_http.post(f"/groups/{group}/join", json={"user": "alice"})
    assert reply.status_code == 201


@pytest.mark.parametrize("lock_wait", [0.3])
async def test_aiohttp_busy_lock_answers_423(
    aiohttp_http: TestClient[Any, Any], aiolock_server: ServerInfo, group: str
) -> None:
    async with aiolock.Client.from_url(aiolock_server.url) as other:
        async with other.lock(f"groups:{group}").acquire(wait=1):
            async with aiohttp_http.post(f"/groups/{group}/join", json={"user": "al"}) as reply:
                assert reply.status == 423
                detail = (await reply.json())["detail"]
    assert detail == f"could not acquire lock 'groups:{group}' within 0.3s"
    async with aiohttp_http.post(f"/groups/{group}/join", json={"user": "al"}) as reply:
        assert reply.status == 201


# --- the glue on its own ------------------------------------------------------------------------


async def test_fastapi_dependency_holds_the_lock_in_the_handlers_task(
    aiolock_client: aiolock.Client,
) -> None:
    app = FastAPI()
    app.state.aiolock_client = aiolock_client
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)

    @app.post("/orders/{order_id}")
    async def pay(order_id: int, guard: OrderLock) -> dict[str, Any]:
        lock = aiolock_client.lock(f"orders:{order_id}")
        assert guard.fencing_token > 0
        return {"held": await lock.is_held(), "count": await lock.hold_count()}

    @app.post("/broken/{order_id}", dependencies=[held_lock("orders:{missing}")])
    async def broken(order_id: int) -> None: ...

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        reply = await http.post("/orders/7")
        assert reply.json() == {"held": True, "count": 1}  # the handler's task owns the hold
        assert not await aiolock_client.lock("orders:7").is_locked()  # released before the reply
        with pytest.raises(LookupError, match=r"no path parameter \['missing'\]"):
            await http.post("/broken/7")


async def test_aiohttp_decorator_holds_the_lock_in_the_handlers_task(
    aiolock_client: aiolock.Client,
) -> None:
    from aiolock.aiohttp import held_lock as aiohttp_held_lock
    from aiolock.aiohttp import lock_timeout_middleware

    app = web.Application(middlewares=[lock_timeout_middleware])
    app[CLIENT_KEY] = aiolock_client

    @aiohttp_held_lock("orders:{order_id}", wait=0, lease=5)
    async def pay(request: web.Request) -> web.Response:
        lock = aiolock_client.lock(f"orders:{request.match_info['order_id']}")
        return web.json_response({"held": await lock.is_held(), "count": await lock.hold_count()})

    app.router.add_post("/orders/{order_id}", pay)
    async with TestClient(TestServer(app)) as http:
        async with http.post("/orders/7") as reply:
            assert await reply.json() == {"held": True, "count": 1}
        assert not await aiolock_client.lock("orders:7").is_locked()
        async with aiolock_client.lock("orders:7").acquire(wait=1):  # another task holds it
            async with http.post("/orders/7") as reply:
                assert reply.status == 423


class Payment(BaseModel):
    amount: int = Field(gt=0)


def payment_app(client: aiolock.Client) -> FastAPI:
    """``/orders/{id}/pay`` under a lock that waits 600 s, ``/orders/{id}/try`` under the same
    lock with no wait, ``/plain/{id}/pay`` with the same parameters and no lock."""
    app = FastAPI()
    app.state.aiolock_client = client
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)

    @app.post("/orders/{order_id}/pay")
    async def pay(
        order_id: int,
        payment: Payment,
        guard: PayLock,
        currency: Literal["EUR", "USD"] = Query("EUR"),
    ) -> dict[str, Any]:
        return {"order": order_id, "paid": payment.amount, "token": guard.fencing_token}

    @app.post("/orders/{order_id}/try", dependencies=[held_lock("orders:{order_id}", wait=0)])
    async def try_pay(order_id: int, payment: Payment) -> dict[str, int]:
        return {"order": order_id}

    @app.post("/plain/{order_id}/pay")
    async def plain(
        order_id: int, payment: Payment, currency: Literal["EUR", "USD"] = Query("EUR")
    ) -> dict[str, int]:
        return {"order": order_id}

    return app


async def test_fastapi_answers_422_at_once_while_another_client_holds_the_lock(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    """A malformed request is refused before the lock is asked for: held by another client for
    the whole test, a lock whose ``wait`` is 600 s would keep it past the 60 s bound."""
    other = make_client()
    app = payment_app(aiolock_client)
    async with (
        uvicorn_serving(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=60) as http,
    ):
        async with other.lock("orders:7").acquire():
            malformed: list[tuple[str, Any]] = [
                ("/orders/7/pay", {"amount": 0}),  # fails the model's check
                ("/orders/7/pay", {"paid": 5}),  # a required field missing
                ("/orders/7/pay", None),  # no body at all
                ("/orders/7/pay", [1, 2]),  # not an object
                ("/orders/7/pay?currency=GBP", {"amount": 5}),  # a query parameter
            ]
            for path, body in malformed:
                reply = await asyncio.wait_for(http.post(path, json=body), 60)
                assert reply.status_code == 422, (path, body, reply.text)
                # FastAPI's own answer, as from the route without a lock.
                unlocked = await http.post(path.replace("/orders/", "/plain/"), json=body)
                assert reply.json() == unlocked.json()
            # The lock is held: a valid request is not refused by the check, and waits.
            reply = await http.post("/orders/7/try", json={"amount": 5})
            assert reply.status_code == 423
        reply = await http.post("/orders/7/pay?currency=USD", json={"amount": 5})
        assert reply.status_code == 200
        assert reply.json()["paid"] == 5
    assert not await aiolock_client.lock("orders:7").is_locked()


async def test_fastapi_checks_an_embedded_body_as_fastapi_does(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    # One body parameter declared Body(embed=True): the JSON object has it under its name.
    app = FastAPI()
    app.state.aiolock_client = aiolock_client
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)

    @app.post("/orders/{order_id}/pay", dependencies=[held_lock("orders:{order_id}", wait=0)])
    async def pay(order_id: int, payment: Annotated[Payment, Body(embed=True)]) -> dict[str, int]:
        return {"order": order_id, "paid": payment.amount}

    async with (
        uvicorn_serving(app) as base_url,
        httpx.AsyncClient(base_url=base_url, timeout=60) as http,
    ):
        reply = await http.post("/orders/7/pay", json={"payment": {"amount": 5}})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"order": 7, "paid": 5}
        reply = await http.post("/orders/7/pay", json={"amount": 5})  # not embedded
        assert reply.status_code == 422
        async with make_client().lock("orders:7").acquire():  # refused before the lock
            reply = await http.post("/orders/7/pay", json={"payment": {"amount": 0}})
            assert reply.status_code == 422


async def test_fastapi_fair_lock_and_permit(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client]
) -> None:
    app = FastAPI()
    app.state.aiolock_client = aiolock_client
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)
    semaphore = aiolock_client.semaphore("reports:daily", 2)

    @app.post("/fair/{name}")
    async def fair(name: str, guard: FairLock) -> dict[str, Any]:
        return {
            "fair": await aiolock_client.fair_lock(f"queue:{name}").is_held(),
            "plain": await aiolock_client.lock(f"queue:{name}").is_locked(),
            "token": guard.fencing_token,
        }

    @app.post("/reports/{name}")
    async def report(name: str, permit: ReportPermit) -> dict[str, Any]:
        return {"permit": permit.id, "available": await semaphore.available()}

    other = make_client()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        reply = await http.post("/fair/jobs")
        assert reply.json() == {"fair": True, "plain": False, "token": reply.json()["token"]}
        assert not await aiolock_client.fair_lock("queue:jobs").is_locked()  # released
        async with other.fair_lock("queue:jobs").acquire():
            assert (await http.post("/fair/jobs")).status_code == 423

        theirs = other.semaphore("reports:daily", 2)
        first = await theirs.try_acquire(wait=0)
        reply = await http.post("/reports/daily")  # one permit left: it takes it
        assert reply.status_code == 200
        assert reply.json()["available"] == 0
        second = await theirs.try_acquire(wait=0)
        assert first is not None
        assert second is not None
        reply = await http.post("/reports/daily")  # none left
        assert reply.status_code == 423
        await first.release()
        await second.release()
    assert await semaphore.available() == 2


@pytest.mark.parametrize("kind", ["lock", "fair", "spin", "read", "write"])
async def test_aiohttp_kinds_and_permit(
    aiolock_client: aiolock.Client, make_client: Callable[..., aiolock.Client], kind: str
) -> None:
    from aiolock.aiohttp import held_lock as aiohttp_held_lock
    from aiolock.aiohttp import held_permit as aiohttp_held_permit
    from aiolock.aiohttp import lock_timeout_middleware

    def lock_of(client: aiolock.Client, name: str) -> Any:
        if kind in ("read", "write"):
            rw = client.rw_lock(name)
            return rw.read_lock() if kind == "read" else rw.write_lock()
        return {"lock": client.lock, "fair": client.fair_lock, "spin": client.spin_lock}[kind](name)

    app = web.Application(middlewares=[lock_timeout_middleware])
    app[CLIENT_KEY] = aiolock_client
    semaphore = aiolock_client.semaphore("reports:daily", 2)

    @aiohttp_held_lock("jobs:{name}", wait=0, kind=kind)  # type: ignore[arg-type]
    async def job(request: web.Request) -> web.Response:
        held = await lock_of(aiolock_client, f"jobs:{request.match_info['name']}").is_held()
        return web.json_response({"held": held})

    @aiohttp_held_permit("reports:{name}", 2, wait=0)
    async def report(request: web.Request) -> web.Response:
        return web.json_response({"available": await semaphore.available()})

    app.router.add_post("/jobs/{name}", job)
    app.router.add_post("/reports/{name}", report)
    other = make_client()
    async with TestClient(TestServer(app)) as http:
        async with http.post("/jobs/a") as reply:
            assert await reply.json() == {"held": True}
        assert not await lock_of(aiolock_client, "jobs:a").is_locked()
        # Held by another client (a writer keeps out readers and writers alike).
        theirs = (
            other.rw_lock("jobs:a").write_lock() if kind == "read" else lock_of(other, "jobs:a")
        )
        async with theirs.acquire():
            async with http.post("/jobs/a") as reply:
                assert reply.status == 423

        permits = other.semaphore("reports:daily", 2)
        first = await permits.try_acquire(wait=0)
        async with http.post("/reports/daily") as reply:
            assert await reply.json() == {"available": 0}
        second = await permits.try_acquire(wait=0)
        async with http.post("/reports/daily") as reply:
            assert reply.status == 423
        for permit in (first, second):
            assert permit is not None
            await permit.release()


async def test_glue_without_a_client_says_how_to_set_it(caplog: pytest.LogCaptureFixture) -> None:
    from aiolock.aiohttp import held_lock as aiohttp_held_lock

    app = FastAPI()

    @app.post("/orders/{order_id}", dependencies=[held_lock("orders:{order_id}")])
    async def pay(order_id: int) -> None: ...

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        with pytest.raises(RuntimeError, match=r"set app\.state\.aiolock_client"):
            await http.post("/orders/7")

    aio = web.Application()

    @aiohttp_held_lock("orders:{order_id}")
    async def aio_pay(request: web.Request) -> web.Response:
        raise AssertionError("not reached")

    aio.router.add_post("/orders/{order_id}", aio_pay)
    async with TestClient(TestServer(aio)) as client:
        async with client.post("/orders/7") as reply:
            assert reply.status == 500
    assert "append aiolock.aiohttp.client_context(url) to app.cleanup_ctx" in caplog.text


@pytest.mark.parametrize("extra", ["fastapi", "aiohttp"])
def test_missing_framework_names_the_extra(extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, extra, None)  # import fastapi/aiohttp now fails
    monkeypatch.delitem(sys.modules, f"aiolock.{extra}")  # restored after the test
    with pytest.raises(ImportError, match=rf"pip install 'aiolock-redis\[{extra}\]'"):
        importlib.import_module(f"aiolock.{extra}")


def test_glue_public_names() -> None:
    import aiolock.aiohttp
    import aiolock.fastapi

    assert aiolock.fastapi.__all__ == [
        "LOCKED_STATUS", "STATE_KEY", "get_client", "held_lock", "held_permit",
        "lock_timeout_handler",
    ]  # fmt: skip
    assert aiolock.aiohttp.__all__ == [
        "CLIENT_KEY", "LOCKED_STATUS", "client_context", "get_client", "held_lock",
        "held_permit", "lock_timeout_middleware",
    ]  # fmt: skip
    assert aiolock.fastapi.LOCKED_STATUS == aiolock.aiohttp.LOCKED_STATUS == 423


@pytest.mark.parametrize("module", ["aiolock.fastapi", "aiolock.aiohttp"])
def test_glue_checks_arguments_at_once(module: str) -> None:
    held = importlib.import_module(module).held_lock
    with pytest.raises(ValueError, match="name_template"):
        held("")
    with pytest.raises(ValueError, match="wait"):
        held("orders:{order_id}", wait=-1)
    with pytest.raises(ValueError, match="lease"):
        held("orders:{order_id}", lease=0)
    with pytest.raises(ValueError, match="kind"):
        held("orders:{order_id}", kind="semaphore")
    permit = importlib.import_module(module).held_permit
    with pytest.raises(ValueError, match="permits"):
        permit("reports", 0)
    with pytest.raises(TypeError, match="permits"):
        permit("reports", True)
    with pytest.raises(ValueError, match="wait"):
        permit("reports", 2, wait=-1)


# --- served for real ----------------------------------------------------------------------------


async def test_fastapi_under_uvicorn_with_two_workers(
    aiolock_server: ServerInfo, redis: Redis, group: str
) -> None:
    port = free_port()
    argv = python(
        "-m", "uvicorn", "--app-dir", "examples", "fastapi_app:app",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--no-access-log",
    )  # fmt: skip
    async with served(
        argv, port=port, redis_url=aiolock_server.url, stop=signal.SIGINT,
        ready_path=f"/groups/{group}",
    ) as run:  # fmt: skip
        statuses = await http_crowd(run.base_url, group)
    check_crowd(statuses)
    assert await redis.scard(f"groups:{group}:members") == LIMIT
    assert run.process.returncode == 0, run.stderr
    assert run.stderr.count("Application shutdown complete.") == 2, run.stderr  # both workers
    # uvicorn's supervisor leaves its listening socket to the interpreter's exit (uvicorn's own
    # leak, not the app's); every other line must be uvicorn's INFO log.
    leak = re.compile(rf"unclosed <socket\.socket fd=\d+, .*laddr=\('127\.0\.0\.1', {port}\)>")
    noise = [
        line
        for line in run.stderr.splitlines()
        if not line.startswith("INFO:")
        and not leak.search(line)
        and line != "ResourceWarning: Enable tracemalloc to get the object allocation traceback"
    ]
    assert not noise, run.stderr


async def test_aiohttp_under_its_runner(
    aiolock_server: ServerInfo, redis: Redis, group: str
) -> None:
    port = free_port()
    argv = python("examples/aiohttp_app.py", "--serve", "--port", str(port))
    async with served(
        argv, port=port, redis_url=aiolock_server.url, stop=signal.SIGTERM,
        ready_path=f"/groups/{group}",
    ) as run:  # fmt: skip
        statuses = await http_crowd(run.base_url, group)
    check_crowd(statuses)
    assert await redis.scard(f"groups:{group}:members") == LIMIT
    assert run.process.returncode == 0, run.stderr
    assert run.stderr == ""  # no warning, no traceback, no unclosed client or connection
    assert f"Running on http://127.0.0.1:{port}" in run.stdout
