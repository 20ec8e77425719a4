"""The seed scenario as an aiohttp service: users join a group limited to 5 members.

    POST /groups/{group_id}/join   JSON body {"user": "alice"}
        201 {"group", "user", "members"}   joined
        200 {"group", "user", "members"}   already a member (a retried join is harmless)
        400 {"detail": "..."}              no JSON object with a non-empty "user" string
        409 {"detail": "..."}              the group is full: final, do not retry
        423 {"detail": "..."}              the group's lock stayed busy for `wait` s: retry later
    GET /groups/{group_id}         200 {"group", "members": [...]}

The members live in a Redis set; each join checks the size and adds under the per-group lock
"groups:{group_id}", so exactly 5 join however many processes and hosts serve the requests.

Serve:  REDIS_URL=redis://127.0.0.1:6379/0 python examples/aiohttp_app.py --serve --port 8080
        (without REDIS_URL: an embedded server, started and stopped with the app)
Demo:   python examples/aiohttp_app.py [REDIS_URL]   (default: an embedded server) starts the
        app on a free loopback port, sends 100 concurrent joins, prints the outcome.
Needs:  pip install 'aiolock-redis[aiohttp,embedded]'
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web

from aiolock.aiohttp import client_context, get_client, held_lock, lock_timeout_middleware
from aiolock.testing.embedded import EmbeddedServer

LIMIT = 5


def members_key(group_id: str) -> str:
    return f"groups:{group_id}:members"


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def running(server: EmbeddedServer) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry that runs an embedded server for the app's lifetime."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        with server:
            yield

    return context


async def read_user(request: web.Request) -> str:
    try:
        body: Any = await request.json()
    except ValueError:
        body = None
    user = body.get("user") if isinstance(body, dict) else None
    if not isinstance(user, str) or not 0 < len(user) <= 200:
        raise web.HTTPBadRequest(
            text='{"detail": "expected a JSON object with a non-empty \\"user\\" string"}',
            content_type="application/json",
        )
    return user


def create_app(
    redis_url: str | None = None, *, wait: float = 5.0, lease: float = 3.0
) -> web.Application:
    """The service; ``redis_url`` defaults to ``REDIS_URL``, then to an embedded server."""
    app = web.Application(middlewares=[lock_timeout_middleware])  # LockTimeoutError -> 423
    url = redis_url or os.environ.get("REDIS_URL")
    if not url:
        server = EmbeddedServer()  # its port is chosen now; it starts with the app
        app.cleanup_ctx.append(running(server))
        url = server.url
    app.cleanup_ctx.append(client_context(url))  # app[CLIENT_KEY], closed at cleanup

    @held_lock("groups:{group_id}", wait=wait, lease=lease)
    async def join(request: web.Request) -> web.Response:
        group_id, user = request.match_info["group_id"], await read_user(request)
        redis, key = get_client(request).redis, members_key(group_id)
        status = 201
        if await redis.sismember(key, user):
            status = 200
        elif (size := await redis.scard(key)) >= LIMIT:
            detail = f"group {group_id!r} is full ({size} members)"
            return web.json_response({"detail": detail}, status=409)
        else:
            await redis.sadd(key, user)
        members = await redis.scard(key)
        return web.json_response(
            {"group": group_id, "user": user, "members": members}, status=status
        )

    async def group(request: web.Request) -> web.Response:
        group_id = request.match_info["group_id"]
        members = await get_client(request).redis.smembers(members_key(group_id))
        return web.json_response({"group": group_id, "members": sorted(text(m) for m in members)})

    app.router.add_post("/groups/{group_id}/join", join)
    app.router.add_get("/groups/{group_id}", group)
    return app


async def demo(url: str, users: int = 100) -> int:
    """Serve on a free loopback port, send ``users`` concurrent joins, print what happened."""
    runner = web.AppRunner(create_app(url))
    await runner.setup()  # runs the cleanup_ctx startups: the client exists from here on
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        group = f"demo-{uuid.uuid4().hex[:8]}"
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:

            async def join(user: str) -> int:
                async with http.post(f"/groups/{group}/join", json={"user": user}) as reply:
                    return reply.status

            statuses = Counter(await asyncio.gather(*(join(f"user-{i}") for i in range(users))))
            async with http.get(f"/groups/{group}") as reply:
                members = (await reply.json())["members"]
    finally:
        await runner.cleanup()
    print(f"{users} concurrent POST /groups/{group}/join (limit {LIMIT}):")
    for status, meaning in ((201, "joined"), (409, "full"), (423, "lock busy")):
        print(f"  {status} {meaning:10} {statuses.pop(status, 0):4}")
    for status, count in sorted(statuses.items()):
        print(f"  {status} unexpected {count:4}")
    print(f"members in Redis: {len(members)}")
    return 0 if len(members) == LIMIT and not statuses else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="users join a group limited to 5 members")
    parser.add_argument("url", nargs="?", help="demo against this Redis URL")
    parser.add_argument("--serve", action="store_true", help="serve until SIGINT or SIGTERM")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    if args.serve:
        web.run_app(create_app(args.url), host=args.host, port=args.port)
        return 0
    if args.url:
        return asyncio.run(demo(args.url))
    with EmbeddedServer() as embedded:
        return asyncio.run(demo(embedded.url))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
