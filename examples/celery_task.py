"""A Celery task that must not run twice at once for one customer, whatever the worker, pool
or host: the blocking client, ``aiolock.sync``, over the same locks as the async one.

Work:   REDIS_URL=redis://127.0.0.1:6379/0 celery -A celery_task worker --pool prefork
        (run from examples/; the threads pool works too: the owner is the calling thread)
Demo:   python examples/celery_task.py [REDIS_URL]   (default: an embedded server) runs the
        task in 8 threads of this process for 2 customers and prints what happened.
Needs:  pip install 'aiolock-redis[embedded]' celery
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from celery import Celery

import aiolock
import aiolock.sync

URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("celery_task", broker=URL)
# One client per process: a prefork pool's children are forked after it is made, and each
# starts afresh on its first call (its own loop thread and connections).
locks = aiolock.sync.Client.from_url(URL)
inside: dict[int, int] = {}
seen = threading.Lock()


def rebuild_report(customer_id: int) -> str:
    """Rebuild one customer's report; two runs for one customer never overlap."""
    try:
        with locks.lock(f"reports:{customer_id}").acquire(wait=30) as guard:
            with seen:
                inside[customer_id] = inside.get(customer_id, 0) + 1
                alone = inside[customer_id] == 1
            time.sleep(0.01)  # the work (a query, a render, an upload...)
            with seen:
                inside[customer_id] -= 1
            return f"customer {customer_id}: token {guard.fencing_token}, alone: {alone}"
    except aiolock.LockTimeoutError:
        return f"customer {customer_id}: busy for 30 s, try later"


# The task: ``rebuild_report_task.delay(42)`` queues a run for a worker.
rebuild_report_task = app.task(name="reports.rebuild")(rebuild_report)


def main() -> None:
    # The task's function, called here as a worker's pool threads would (no broker needed).
    with ThreadPoolExecutor(8) as pool:
        for line in pool.map(rebuild_report, [1, 2] * 4):
            print(line)
    locks.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        locks = aiolock.sync.Client.from_url(sys.argv[1])
        main()
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            locks = aiolock.sync.Client.from_url(server.url)
            main()
