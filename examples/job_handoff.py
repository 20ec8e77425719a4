"""An explicit owner: a web handler takes the lock, a worker task finishes the job and releases.

Run: python examples/job_handoff.py [REDIS_URL]   (default: an embedded server)
"""

from __future__ import annotations

import asyncio
import sys

import aiolock


async def main(url: str) -> None:
    async with aiolock.Client.from_url(url) as client:
        jobs: asyncio.Queue[str] = asyncio.Queue()

        async def handle_request(job_id: str) -> None:
            lock = client.lock(f"job:{job_id}", owner=job_id)
            if not await lock.try_lock(wait=0):
                print(f"job {job_id} is already running")
                return
            await jobs.put(job_id)  # the worker owns the lock from here on

        async def worker() -> None:
            job_id = await jobs.get()
            lock = client.lock(f"job:{job_id}", owner=job_id)
            try:
                print(f"worker runs job {job_id}; held: {await lock.is_held()}")
            finally:
                await lock.unlock()

        await handle_request("17")
        await handle_request("17")  # refused: the job's lock is held
        await worker()
        print("lock after the job:", await client.lock("job:17").is_locked())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(main(sys.argv[1]))
    else:
        from aiolock.testing.embedded import EmbeddedServer

        with EmbeddedServer() as server:
            asyncio.run(main(server.url))
