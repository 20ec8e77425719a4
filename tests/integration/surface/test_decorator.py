"""``client.locked``: a coroutine function run under a lock named from its arguments."""

from __future__ import annotations

import asyncio

import pytest

import aiolock
from tests.helpers import eventually

pytestmark = pytest.mark.anyio


async def test_the_name_comes_from_positional_keyword_and_default_arguments(
    aiolock_client: aiolock.Client,
) -> None:
    seen: list[tuple[str, bool]] = []

    @aiolock_client.locked("orders:{order_id}:{region}", wait=1)
    async def ship(order_id: int, region: str = "eu") -> str:
        """Ship an order."""
        name = f"orders:{order_id}:{region}"
        seen.append((name, await aiolock_client.lock(name).is_held()))
        return name

    assert await ship(42) == "orders:42:eu"
    assert await ship(7, "us") == "orders:7:us"
    assert await ship(region="ap", order_id=1) == "orders:1:ap"
    assert seen == [("orders:42:eu", True), ("orders:7:us", True), ("orders:1:ap", True)]
    assert ship.__name__ == "ship"
    assert ship.__doc__ == "Ship an order."
    assert not await aiolock_client.lock("orders:42:eu").is_locked()


async def test_calls_for_one_name_are_serialized_and_a_timeout_propagates(
    aiolock_client: aiolock.Client,
) -> None:
    inside = peak = 0
    release = asyncio.Event()

    @aiolock_client.locked("job:{job}", wait=0.2)
    async def run(job: str, hold: bool = False) -> None:
        nonlocal inside, peak
        inside += 1
        peak = max(peak, inside)
        if hold:
            await release.wait()
        inside -= 1

    holder = asyncio.create_task(run("a", hold=True))
    await eventually(lambda: inside == 1, what="the first call holds the lock")
    with pytest.raises(aiolock.LockTimeoutError):
        await run("a")
    await run("b")  # another name: not blocked
    release.set()
    await holder
    assert peak == 2  # "a" held while "b" ran, never "a" twice


async def test_it_works_on_methods_with_attribute_placeholders(
    aiolock_client: aiolock.Client,
) -> None:
    class Account:
        def __init__(self, number: int) -> None:
            self.number = number

        @aiolock_client.locked("accounts:{self.number}")
        async def deposit(self, amount: int) -> int:
            assert await aiolock_client.lock(f"accounts:{self.number}").is_held()
            return amount

    assert await Account(9).deposit(5) == 5


def test_a_placeholder_that_names_no_parameter_is_refused_when_decorating() -> None:
    client = aiolock.Client.from_url("redis://127.0.0.1:1/0")
    with pytest.raises(ValueError, match="order_id"):

        @client.locked("orders:{order_id}")
        async def ship(order: int) -> None: ...

    with pytest.raises(ValueError, match="names no parameter"):

        @client.locked("orders:{}")
        async def positional(order: int) -> None: ...

    with pytest.raises(TypeError, match="coroutine"):
        client.locked("x")(lambda: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="wait"):
        client.locked("x", wait=-1)
    with pytest.raises(TypeError, match="name_template"):
        client.locked(3)  # type: ignore[arg-type]
