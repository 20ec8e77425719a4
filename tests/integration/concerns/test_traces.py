"""OpenTelemetry traces: an ``aiolock.acquire`` span per acquire call and an ``aiolock.lost``
event, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import aiolock
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import eventually, held_by_another_task

pytestmark = pytest.mark.anyio

MakeClient = Callable[..., aiolock.Client]


class _WhileATestLooks(SimpleSpanProcessor):
    """Exports only while a test of this module looks: the global provider lives for the whole
    session, and the other tests' spans must not pile up in memory."""

    looking = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.looking:
            super().on_end(span)


@pytest.fixture(scope="session")
def session_tracing() -> Iterator[tuple[InMemorySpanExporter, _WhileATestLooks]]:
    """The process' global tracer provider (it can be set once): an SDK one that keeps spans."""
    exporter = InMemorySpanExporter()
    processor = _WhileATestLooks(exporter)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:
        pytest.skip("another global tracer provider was set first")
    yield exporter, processor
    provider.shutdown()


@pytest.fixture
def exporter(
    session_tracing: tuple[InMemorySpanExporter, _WhileATestLooks],
) -> Iterator[InMemorySpanExporter]:
    """The spans ended during the test."""
    exporter, processor = session_tracing
    exporter.clear()
    processor.looking = True
    try:
        yield exporter
    finally:
        processor.looking = False
        exporter.clear()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Callable[[], list[ReadableSpan]]:
    """The ``aiolock.acquire`` spans ended during the test so far."""

    def acquires() -> list[ReadableSpan]:
        return [span for span in exporter.get_finished_spans() if span.name == "aiolock.acquire"]

    return acquires


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


tracer = trace.get_tracer("tests")


async def test_a_granted_acquire_is_a_child_span_of_the_callers(
    aiolock_client: aiolock.Client, spans: Callable[[], list[ReadableSpan]]
) -> None:
    lock = aiolock_client.lock("orders:42")
    with tracer.start_as_current_span("handle request") as request:
        async with lock.acquire(wait=5):
            pass
    (span,) = spans()
    found = attributes(span)
    assert found.pop("aiolock.wait") >= 0
    assert found == {
        "aiolock.kind": "lock",
        "aiolock.outcome": "granted",
        "aiolock.reentrant": False,
    }  # no name: names are unbounded
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.status.status_code is StatusCode.UNSET


async def test_names_only_when_the_client_asks(
    make_client: MakeClient, aiolock_server: ServerInfo, spans: Callable[[], list[ReadableSpan]]
) -> None:
    client = make_client(trace_names=True)
    async with client.lock("orders:42").acquire(wait=5):
        pass
    (span,) = spans()
    assert attributes(span)["aiolock.name"] == "orders:42"
    with pytest.raises(TypeError, match="trace_names"):
        aiolock.Client.from_url(aiolock_server.url, trace_names="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trace_names"):
        aiolock.Client(client.redis, trace_names=1)  # type: ignore[arg-type]


async def test_a_reentrant_acquire_says_so(
    aiolock_client: aiolock.Client, spans: Callable[[], list[ReadableSpan]]
) -> None:
    lock = aiolock_client.lock("nested")
    async with lock.acquire(wait=5):
        assert await lock.try_lock()
        await lock.unlock()
    outer, inner = spans()  # a span ends when its call returns
    assert attributes(outer)["aiolock.reentrant"] is False
    assert attributes(inner)["aiolock.reentrant"] is True


async def test_timeouts_cancellations_and_errors(
    aiolock_client: aiolock.Client, spans: Callable[[], list[ReadableSpan]]
) -> None:
    lock = aiolock_client.lock("busy")
    async with held_by_another_task(aiolock_client.lock("busy")):
        assert not await lock.try_lock(wait=0)  # one try
        with pytest.raises(aiolock.LockTimeoutError):
            async with lock.acquire(wait=0.05):
                pass
        waiter = asyncio.create_task(lock.lock())
        await eventually(lambda: lock.statistics().waiters == 1, what="a parked waiter")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    rw = aiolock_client.rw_lock("no-upgrade")
    async with rw.read_lock().acquire(wait=5):
        with pytest.raises(aiolock.LockError):
            await rw.write_lock().try_lock(wait=1)  # an upgrade: refused
    outcomes = [(attributes(s)["aiolock.kind"], attributes(s)["aiolock.outcome"]) for s in spans()]
    assert outcomes == [  # in the order the spans ended
        ("lock", "granted"),  # the other task's
        ("lock", "timeout"),
        ("lock", "timeout"),
        ("lock", "cancelled"),
        ("rw-read", "granted"),
        ("rw-write", "error"),
    ]
    error = next(s for s in spans() if attributes(s)["aiolock.outcome"] == "error")
    assert error.status.status_code is StatusCode.ERROR
    assert [event.name for event in error.events] == ["exception"]
    for span in spans():  # reentrant or fresh is said of the calls that got the lock
        assert ("aiolock.reentrant" in attributes(span)) is (
            attributes(span)["aiolock.outcome"] == "granted"
        )


async def test_the_wait_is_the_time_the_call_took(
    aiolock_client: aiolock.Client, spans: Callable[[], list[ReadableSpan]]
) -> None:
    lock = aiolock_client.lock("queue", owner="waiter")  # released by the test task
    loop = asyncio.get_running_loop()
    async with held_by_another_task(aiolock_client.lock("queue")):
        started = loop.time()
        waiter = asyncio.create_task(lock.try_lock(wait=5))
        await eventually(lambda: lock.statistics().waiters == 1, what="a parked waiter")
    assert await waiter
    took = loop.time() - started
    await lock.unlock()
    waited = attributes(spans()[-1])
    assert waited["aiolock.outcome"] == "granted"
    assert 0 < waited["aiolock.wait"] <= took


async def test_every_kind_is_traced(
    aiolock_client: aiolock.Client, spans: Callable[[], list[ReadableSpan]]
) -> None:
    client = aiolock_client
    rw = client.rw_lock("rw")
    for lock in (client.lock("l"), client.fair_lock("f"), client.spin_lock("s")):
        async with lock.acquire(wait=5):
            pass
    async with rw.read_lock().acquire(wait=5):
        pass
    async with rw.write_lock().acquire(wait=5):
        pass
    async with client.semaphore("sem", 2).acquire(wait=5):
        pass
    assert await client.semaphore("sem", 1).try_acquire(wait=0) is not None
    kinds = [attributes(span)["aiolock.kind"] for span in spans()]
    assert kinds == ["lock", "fair", "spin", "rw-read", "rw-write", "semaphore", "semaphore"]
    assert all(attributes(span)["aiolock.outcome"] == "granted" for span in spans())


async def test_a_loss_the_holder_finds_is_an_event_on_its_span(
    aiolock_client: aiolock.Client,
    make_client: MakeClient,
    exporter: InMemorySpanExporter,
) -> None:
    lock = aiolock_client.lock("taken")
    with tracer.start_as_current_span("job"):
        with pytest.raises(aiolock.LockLostError):
            async with lock.acquire(wait=5) as guard:
                assert await make_client().lock("taken").force_unlock()  # nobody tells it
                with tracer.start_as_current_span("write"), pytest.raises(aiolock.LockLostError):
                    async with guard.transaction() as tx:
                        tx.set("x", 1)
    (write,) = [s for s in exporter.get_finished_spans() if s.name == "write"]
    (event,) = write.events
    assert event.name == "aiolock.lost"
    assert dict(event.attributes or {}) == {
        "aiolock.kind": "lock",
        "aiolock.fencing_token": guard.fencing_token,
        "aiolock.reason": "a transaction found it gone (expired, forced or taken)",
    }


async def test_a_loss_a_timer_finds_is_an_event_on_the_holders_span(
    aiolock_client: aiolock.Client, exporter: InMemorySpanExporter
) -> None:
    lock = aiolock_client.lock("expires")
    with tracer.start_as_current_span("job"):
        with pytest.raises(aiolock.LockLostError):
            async with lock.acquire(wait=5, lease=0.05) as guard:
                await eventually(lambda: guard.lost, what="the lease ran out")
    (job,) = [s for s in exporter.get_finished_spans() if s.name == "job"]
    assert [event.name for event in job.events] == ["aiolock.lost"]
    assert dict(job.events[0].attributes or {})["aiolock.reason"] == (
        "its lease ran out while it was held"
    )


async def test_a_multilock_and_a_redlock_acquire_are_one_span_each(
    aiolock_client: aiolock.Client,
    make_client: MakeClient,
    spans: Callable[[], list[ReadableSpan]],
) -> None:
    """A composite's acquire call is one span (its parts' attempts have none): granted, or
    timed out when a part is held elsewhere (by a task whose own acquire has its span)."""
    client = aiolock_client
    multi = aiolock.MultiLock(client.lock("m1"), client.fair_lock("m2"))
    servers = [client, *(make_client(key_prefix=f"{client.key_prefix}-{i}") for i in (2, 3))]
    redlock = aiolock.RedLock(servers, "r")  # three "servers": key prefixes of one
    with tracer.start_as_current_span("job") as job:
        async with multi.acquire(wait=5):
            pass
        async with redlock.acquire(wait=5):
            pass
        async with held_by_another_task(client.lock("m2x")):
            blocked = aiolock.MultiLock(client.lock("m1"), client.lock("m2x"))
            assert not await blocked.try_lock(wait=0.05)
    composite = [s for s in spans() if attributes(s)["aiolock.kind"] in ("multi", "redlock")]
    assert len(spans()) == len(composite) + 1  # and the holder's: the parts' tries have none
    found = [attributes(span) for span in composite]
    assert [(a["aiolock.kind"], a["aiolock.outcome"]) for a in found] == [
        ("multi", "granted"),
        ("redlock", "granted"),
        ("multi", "timeout"),
    ]
    assert [a.get("aiolock.reentrant") for a in found] == [False, False, None]
    assert all(
        span.parent is not None and span.parent.span_id == job.get_span_context().span_id
        for span in composite
    )


async def test_a_multilock_parts_loss_is_an_event_on_the_holders_span(
    aiolock_client: aiolock.Client, exporter: InMemorySpanExporter
) -> None:
    client = aiolock_client
    multi = aiolock.MultiLock(client.lock("ma"), client.lock("mb"))
    with tracer.start_as_current_span("job"):
        with pytest.raises(aiolock.LockLostError):
            async with multi.acquire(wait=5, lease=0.05) as guard:
                await eventually(lambda: guard.lost, what="a part's lease ran out")
    (job,) = [s for s in exporter.get_finished_spans() if s.name == "job"]
    assert "aiolock.lost" in [event.name for event in job.events]
