"""Task identities: unique for the client's life, and forgotten once the task is done (no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from aiolock._core.owners import Owners

pytestmark = pytest.mark.anyio


async def test_each_task_gets_its_own_identity_and_it_is_forgotten_when_done() -> None:
    owners = Owners("client-id")

    async def identity() -> tuple[str, str]:
        task = asyncio.current_task()
        assert task is not None
        return owners.of_task(task), owners.current(None)[0]

    tasks = [asyncio.create_task(identity()) for _ in range(100)]
    pairs = [await task for task in tasks]
    assert all(first == second for first, second in pairs)  # stable within a task
    assert len({first for first, _ in pairs}) == 100  # never reused
    assert all(first.startswith("client-id:t") for first, _ in pairs)
    await asyncio.sleep(0)  # one loop pass: the last task's done callbacks have run
    assert len(owners) == 0  # forgotten when done, though the tasks still exist


def test_explicit_and_task_owners_never_mix() -> None:
    owners = Owners("c")
    assert owners.explicit("t1") == "c:x:t1"
    assert owners.current("job")[0] == "c:x:job"
    assert owners.next_request() < owners.next_request()


async def test_a_task_acting_for_a_thread_owns_nothing_itself() -> None:
    owners = Owners("c")
    thread = owners.of_thread(7)
    assert thread == "c:h7"

    async def acting() -> tuple[tuple[str, object], object]:
        return owners.current(None), owners.holder_task()

    task = asyncio.create_task(acting())
    owners.act_for(task, thread)
    (owner, holder_task), semaphore_task = await task
    assert (owner, holder_task, semaphore_task) == ("c:h7", None, None)  # holds outlive the task
    assert len(owners) == 0  # no task id was made for it
    await asyncio.sleep(0)
    plain = asyncio.create_task(acting())
    (owner, holder_task), _ = await plain
    assert owner.startswith("c:t")  # the acting ended with its task
    assert holder_task is plain
    # The thread form never equals a task's or an explicit owner's id.
    assert {owners.of_thread(1), owners.explicit("h1"), "c:t1"} == {"c:h1", "c:x:h1", "c:t1"}
