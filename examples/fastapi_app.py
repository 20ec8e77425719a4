"""The seed scenario as a FastAPI service: users join a group limited to 5 members.

    POST /groups/{group_id}/join   JSON body {"user": "alice"}
        201 {"group", "user", "members"}   joined
        200 {"group", "user", "members"}   already a member (a retried join is harmless)
        409 {"detail": "..."}              the group is full: final, do not retry
        423 {"detail": "..."}              the group's lock stayed busy for `wait` s: retry later
    GET /groups/{group_id}         200 {"group", "members": [...]}

The members live in a Redis set; each join checks the size and adds under the per-group lock
"groups:{group_id}", so exactly 5 join however many workers and hosts serve the requests.

Serve:  REDIS_URL=redis://127.0.0.1:6379/0 uvicorn --app-dir examples fastapi_app:app --workers 2
        (without REDIS_URL each worker starts an embedded server of its own: use one worker)
Demo:   python examples/fastapi_app.py [REDIS_URL]   (default: an embedded server) starts the
        app on a free loopback port, sends 100 concurrent joins with httpx, prints the outcome.
Needs:  pip install 'aiolock-redis[fastapi,embedded]' uvicorn httpx
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Response
from pydantic import BaseModel, Field

import aiolock
from aiolock.fastapi import get_client, held_lock, lock_timeout_handler
from aiolock.testing.embedded import EmbeddedServer

LIMIT = 5

ClientDep = Annotated[aiolock.Client, Depends(get_client)]


class JoinRequest(BaseModel):
    user: str = Field(min_length=1, max_length=200)


class Membership(BaseModel):
    group: str
    user: str
    members: int


class Group(BaseModel):
    group: str
    members: list[str]


def members_key(group_id: str) -> str:
    return f"groups:{group_id}:members"


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def create_app(redis_url: str | None = None, *, wait: float = 5.0, lease: float = 3.0) -> FastAPI:
    """The service; ``redis_url`` defaults to ``REDIS_URL``, then to an embedded server."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            url = redis_url or os.environ.get("REDIS_URL")
            if not url:
                url = stack.enter_context(EmbeddedServer()).url
            app.state.aiolock_client = await stack.enter_async_context(aiolock.Client.from_url(url))
            yield

    app = FastAPI(lifespan=lifespan)
    app.add_exception_handler(aiolock.LockTimeoutError, lock_timeout_handler)

    @app.post(
        "/groups/{group_id}/join",
        status_code=201,
        # Held from before the handler runs until it returns; 423 when `wait` runs out.
        dependencies=[held_lock("groups:{group_id}", wait=wait, lease=lease)],
        responses={200: {"model": Membership}, 409: {}, 423: {}},
    )
    async def join(
        group_id: str, body: JoinRequest, client: ClientDep, response: Response
    ) -> Membership:
        redis, key = client.redis, members_key(group_id)
        if await redis.sismember(key, body.user):
            response.status_code = 200
        elif (size := await redis.scard(key)) >= LIMIT:
            raise HTTPException(409, f"group {group_id!r} is full ({size} members)")
        else:
            await redis.sadd(key, body.user)
        return Membership(group=group_id, user=body.user, members=await redis.scard(key))

    @app.get("/groups/{group_id}")
    async def group(group_id: str, client: ClientDep) -> Group:
        members = await client.redis.smembers(members_key(group_id))
        return Group(group=group_id, members=sorted(text(m) for m in members))

    return app


app = create_app()


async def demo(url: str, users: int = 100) -> int:
    """Serve on a free loopback port, send ``users`` concurrent joins, print what happened."""
    server = uvicorn.Server(uvicorn.Config(create_app(url), log_level="warning"))
    with socket.create_server(("127.0.0.1", 0)) as sock:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:  # the lifespan ran and the socket listens
            if serving.done():
                serving.result()
                return 1
            await asyncio.sleep(0.01)
        try:
            base = f"http://127.0.0.1:{sock.getsockname()[1]}"
            group = f"demo-{uuid.uuid4().hex[:8]}"
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                replies = await asyncio.gather(
                    *(
                        http.post(f"/groups/{group}/join", json={"user": f"user-{i}"})
                        for i in range(users)
                    )
                )
                members = (await http.get(f"/groups/{group}")).json()["members"]
        finally:
            server.should_exit = True
            await serving
    statuses = Counter(reply.status_code for reply in replies)
    print(f"{users} concurrent POST /groups/{group}/join (limit {LIMIT}):")
    for status, meaning in ((201, "joined"), (409, "full"), (423, "lock busy")):
        print(f"  {status} {meaning:10} {statuses.pop(status, 0):4}")
    for status, count in sorted(statuses.items()):
        print(f"  {status} unexpected {count:4}")
    print(f"members in Redis: {len(members)}")
    return 0 if len(members) == LIMIT and not statuses else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(asyncio.run(demo(sys.argv[1])))
    with EmbeddedServer() as embedded:
        sys.exit(asyncio.run(demo(embedded.url)))
