"""The Celery app that ``test_celery.py`` runs in a worker: a task that must not overlap per
key records when it entered and left its critical section, in Redis.

``REDIS_URL`` names the broker and the lock server; ``AIOLOCK_TEST_PREFIX`` the locks' key
prefix and where the intervals are recorded.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

import aiolock.sync

URL = os.environ["REDIS_URL"]
PREFIX = os.environ["AIOLOCK_TEST_PREFIX"]

app = Celery("aiolock_test", broker=URL)
app.conf.worker_hijack_root_logger = False
app.conf.broker_connection_retry_on_startup = True

locks = aiolock.sync.Client.from_url(URL, key_prefix=PREFIX)
records = redis.Redis.from_url(URL)
# Used in the worker's main process before the prefork pool forks its children: each child
# must start afresh (its own loop thread and connections), holding none of this one's locks.
locks.lock("warm-up").try_lock(0)
locks.lock("warm-up").unlock()


def critical(key: str, number: int) -> None:
    with locks.lock(f"job:{key}").acquire(wait=120) as guard:
        inside = records.incr(f"{PREFIX}:inside:{key}")
        entered = time.monotonic_ns()
        time.sleep(0.002)  # the work: other tasks of the key must wait meanwhile
        left = time.monotonic_ns()
        records.decr(f"{PREFIX}:inside:{key}")
        records.rpush(
            f"{PREFIX}:intervals:{key}",
            f"{entered} {left} {inside} {guard.fencing_token} {os.getpid()} {number}",
        )
    records.incr(f"{PREFIX}:done")


app.task(name="aiolock_test.critical")(critical)
