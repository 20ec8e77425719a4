"""The seed scenario as a Flask app under gunicorn: users join a group limited to 5 members.

    POST /groups/<group_id>/join   JSON body {"user": "alice"}
        201 {"group", "user", "members"}   joined
        200 {"group", "user", "members"}   already a member
        409 {"detail": "..."}              the group is full
        423 {"detail": "..."}              the group's lock stayed busy: retry later
    GET /groups/<group_id>         200 {"group", "members": [...]}

Each join checks the size and adds under the lock "groups:<group_id>", the add through
``guard.transaction()`` (it lands only while the lock is held), so exactly 5 join however many
workers, threads and hosts serve the requests.  The views are plain functions: the blocking
client, ``aiolock.sync``, makes the calling thread the owner.

Serve:  REDIS_URL=redis://127.0.0.1:6379/0 gunicorn --chdir examples flask_app:app \
            --workers 2 --threads 4           (or --workers 2 --preload: forked sync workers)
Demo:   python examples/flask_app.py [REDIS_URL]   (default: an embedded server) sends 100
        concurrent joins through Flask's test client from 16 threads and prints the outcome.
Needs:  pip install 'aiolock-redis[embedded]' flask gunicorn
"""

from __future__ import annotations

import os
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import redis
from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue

import aiolock
import aiolock.sync

LIMIT = 5
URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

app = Flask(__name__)
# One client per process, made at import: under gunicorn --preload the workers fork after
# it, and each starts afresh on its first call (its own loop thread and connections).
locks = aiolock.sync.Client.from_url(URL)
store = redis.Redis.from_url(URL, decode_responses=True)


def members_key(group_id: str) -> str:
    # In the lock's hash slot, as a transaction on a Redis Cluster needs.
    return f"{locks.lock(f'groups:{group_id}').hash_tag}:members"


@app.post("/groups/<group_id>/join")
def join(group_id: str) -> ResponseReturnValue:
    user = str((request.get_json(silent=True) or {}).get("user", ""))
    if not user:
        return jsonify(detail="a JSON body with a non-empty 'user' is needed"), 400
    lock = locks.lock(f"groups:{group_id}")
    members = members_key(group_id)
    try:
        with lock.acquire(wait=5, lease=3) as guard:
            if store.sismember(members, user):
                return jsonify(group=group_id, user=user, members=store.scard(members)), 200
            if store.scard(members) >= LIMIT:
                return jsonify(detail=f"group {group_id} is full"), 409
            with guard.transaction() as tx:
                tx.sadd(members, user)
                tx.scard(members)
            return jsonify(group=group_id, user=user, members=tx.results[1]), 201
    except aiolock.LockTimeoutError:
        return jsonify(detail=f"group {group_id} is busy: retry later"), 423


@app.get("/groups/<group_id>")
def group(group_id: str) -> ResponseReturnValue:
    return jsonify(group=group_id, members=sorted(store.smembers(members_key(group_id))))


def main() -> None:
    group_id = f"demo-{uuid.uuid4().hex[:8]}"
    test_client = app.test_client()

    def one(number: int) -> int:
        response = test_client.post(f"/groups/{group_id}/join", json={"user": f"user-{number}"})
        return response.status_code

    with ThreadPoolExecutor(16) as pool:
        outcomes = Counter(pool.map(one, range(100)))
    print(f"joined: {outcomes[201]}, refused (full): {outcomes[409]}, busy: {outcomes[423]}")
    print("members:", test_client.get(f"/groups/{group_id}").get_json()["members"])
    locks.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:  # the URL given replaces REDIS_URL: rebuild the clients on it
        URL = sys.argv[1]
        locks = aiolock.sync.Client.from_url(URL)
        store = redis.Redis.from_url(URL, decode_responses=True)
        main()
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            URL = server.url
            locks = aiolock.sync.Client.from_url(URL)
            store = redis.Redis.from_url(URL, decode_responses=True)
            main()
