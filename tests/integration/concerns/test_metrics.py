"""OpenTelemetry metrics and log context, read back from the SDK's in-memory reader."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk import metrics as sdk_metrics
from opentelemetry.sdk.metrics import export
from redis.asyncio import Redis

import aiolock
from aiolock._core.metrics import _WAIT_BUCKETS, KIND, METER
from aiolock.testing.pytest_plugin import ServerInfo
from tests.helpers import eventually, keys_of

pytestmark = pytest.mark.anyio

MakeClient = Callable[..., aiolock.Client]
Values = dict[tuple[str, str], float]

COUNTERS = ("aiolock.acquisitions", "aiolock.timeouts", "aiolock.losses", "aiolock.renewals")
WAIT = "aiolock.wait.duration"
HELD = "aiolock.held"


class Meter:
    """The ``aiolock`` meter's data so far, as ``{(instrument, kind): value}``.

    Counters give their (cumulative) sum, the histogram its count (``sums`` its sum).
    """

    def __init__(self, reader: export.InMemoryMetricReader) -> None:
        self.reader = reader

    def metrics(self) -> list[export.Metric]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            if scope.scope.name == METER
            for metric in scope.metrics
        ]

    def values(self, *, sums: bool = False) -> Values:
        values: Values = {}
        for metric in self.metrics():
            for point in metric.data.data_points:
                kind = str((point.attributes or {})[KIND])
                if isinstance(point, export.HistogramDataPoint):
                    values[(metric.name, kind)] = point.sum if sums else point.count
                else:
                    assert isinstance(point, export.NumberDataPoint)
                    values[(metric.name, kind)] = point.value
        return values

    def since(self, before: Values, *, sums: bool = False) -> Values:
        """What changed since ``before`` (entries that did not change are left out)."""
        now = self.values(sums=sums)
        changed = {key: value - before.get(key, 0) for key, value in now.items()}
        return {key: value for key, value in changed.items() if value}


@pytest.fixture(scope="session")
def meter_reader() -> Iterator[export.InMemoryMetricReader]:
    """The process' global meter provider (it can be set once): an SDK one with a reader."""
    reader = export.InMemoryMetricReader()
    provider = sdk_metrics.MeterProvider(metric_readers=[reader])
    otel_metrics.set_meter_provider(provider)
    if otel_metrics.get_meter_provider() is not provider:
        pytest.skip("another global meter provider was set first")
    yield reader
    provider.shutdown()


@pytest.fixture
def meter(meter_reader: export.InMemoryMetricReader) -> Iterator[Meter]:
    """The meter, and a check after the test (its clients closed) that nothing is held."""
    meter = Meter(meter_reader)
    before = meter.values()
    yield meter
    assert not {key: n for key, n in meter.since(before).items() if key[0] == HELD}


def held(meter: Meter, before: Values) -> dict[str, float]:
    return {kind: n for (name, kind), n in meter.since(before).items() if name == HELD}


async def test_the_six_instruments(meter: Meter, make_client: MakeClient) -> None:
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock("instruments")
    with pytest.raises(aiolock.LockLostError):
        async with lock.acquire():
            await eventually(lambda: lock.statistics().renewals >= 1, what="a renewal")
            assert not await asyncio.create_task(lock.try_lock(wait=0))  # a timeout
            assert await lock.force_unlock()  # its own hold: lost at once
    shapes = {}
    for metric in meter.metrics():
        data = metric.data
        if isinstance(data, export.Histogram):
            shape = "histogram"
            assert all(tuple(p.explicit_bounds) == _WAIT_BUCKETS for p in data.data_points)
        else:
            assert isinstance(data, export.Sum)
            shape = "counter" if data.is_monotonic else "up-down counter"
        shapes[metric.name] = (shape, metric.unit)
        for point in data.data_points:
            assert set(point.attributes or {}) == {KIND}  # never a name
    assert shapes == {
        "aiolock.acquisitions": ("counter", "{acquisition}"),
        "aiolock.timeouts": ("counter", "{timeout}"),
        "aiolock.losses": ("counter", "{loss}"),
        "aiolock.renewals": ("counter", "{renewal}"),
        WAIT: ("histogram", "s"),
        HELD: ("up-down counter", "{hold}"),
    }
    collected = meter.reader.get_metrics_data()
    assert collected is not None
    scopes = {
        s.scope.name: s.scope.version for r in collected.resource_metrics for s in r.scope_metrics
    }
    assert scopes[METER] == aiolock.__version__


async def test_each_kind_is_the_one_attribute(meter: Meter, aiolock_client: aiolock.Client) -> None:
    client = aiolock_client
    rw = client.rw_lock("rw")
    locks = [
        ("lock", client.lock("plain")),
        ("fair", client.fair_lock("fair")),
        ("spin", client.spin_lock("spin")),
        ("rw-read", rw.read_lock()),
        ("rw-write", rw.write_lock()),
    ]
    for kind, lock in locks:
        before = meter.values()
        async with lock:
            async with lock:  # a re-entry: not a fresh hold
                assert held(meter, before) == {kind: 1}
        assert meter.since(before) == {
            ("aiolock.acquisitions", kind): 1,
            (WAIT, kind): 1,
        }
        assert lock.statistics().acquisitions == 1
    before = meter.values()
    semaphore = client.semaphore("pool", 2)
    async with semaphore.acquire(), semaphore.acquire():  # two permits: two holds
        assert held(meter, before) == {"semaphore": 2}
    assert meter.since(before) == {
        ("aiolock.acquisitions", "semaphore"): 2,
        (WAIT, "semaphore"): 2,
    }


async def test_timeouts_of_every_wait(meter: Meter, make_client: MakeClient) -> None:
    holder, other = make_client(), make_client()
    before = meter.values()
    async with holder.lock("busy"), holder.semaphore("one", 1).acquire():
        assert not await other.lock("busy").try_lock(wait=0)
        assert not await other.lock("busy").try_lock(wait=0.05)
        with pytest.raises(aiolock.LockTimeoutError):
            async with other.lock("busy").acquire(wait=0.05):
                pass
        assert await other.semaphore("one", 1).try_acquire(wait=0.05) is None
        # Parts are taken in key order: "a-free" first, then "busy" times out.
        multi = aiolock.MultiLock(other.lock("busy"), other.lock("a-free"))
        assert not await multi.try_lock(wait=0.05)
    changed = meter.since(before)
    assert changed.pop(("aiolock.timeouts", "lock")) == 4
    assert changed.pop(("aiolock.timeouts", "semaphore")) == 1
    # The holder's two holds, and the part the MultiLock took and gave back.
    assert changed == {
        ("aiolock.acquisitions", "lock"): 2,
        (WAIT, "lock"): 2,
        ("aiolock.acquisitions", "semaphore"): 1,
        (WAIT, "semaphore"): 1,
    }


async def test_wait_duration_spans_the_wait(meter: Meter, make_client: MakeClient) -> None:
    holder, waiter = make_client(), make_client()
    queued = waiter.lock("queue", owner="waiter")
    loop = asyncio.get_running_loop()
    before, sums = meter.values(), meter.values(sums=True)
    started_at = loop.time()
    async with holder.lock("queue"):
        waiting = asyncio.create_task(queued.lock())
        await eventually(lambda: queued.statistics().waiters == 1, what="the waiter parked")
        parked_at = loop.time()
        await eventually(lambda: loop.time() > parked_at + 0.05, what="a measurable wait")
        released_at = loop.time()
    await waiting
    granted_at = loop.time()
    await queued.unlock()
    assert meter.since(before)[(WAIT, "lock")] == 2  # the holder's, and the waiter's
    waited = meter.since(sums, sums=True)[(WAIT, "lock")]
    # The waiter waited at least from parked to released; neither waited past its grant.
    assert released_at - parked_at <= waited <= 2 * (granted_at - started_at)


async def test_renewals_match_the_statistics(meter: Meter, make_client: MakeClient) -> None:
    client = make_client(watchdog_timeout=0.3)
    lock, reader = client.lock("renewed"), client.rw_lock("renewed-rw").read_lock()
    before = meter.values()
    async with lock, reader:
        await eventually(lambda: reader.statistics().renewals >= 2, what="2 renewals")
    changed = meter.since(before)
    assert changed[("aiolock.renewals", "lock")] == lock.statistics().renewals >= 2
    assert changed[("aiolock.renewals", "rw-read")] == reader.statistics().renewals


async def test_a_loss_is_counted_logged_and_no_longer_held(
    meter: Meter, make_client: MakeClient, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(watchdog_timeout=0.3)
    lock = client.lock("deleted", owner="job-17")
    before = meter.values()
    with caplog.at_level(logging.WARNING, logger="aiolock.lock"):
        with pytest.raises(aiolock.LockLostError):
            async with lock.acquire() as guard:
                assert held(meter, before) == {"lock": 1}
                await redis.delete(keys_of(lock).lock)  # the lease ends under the holder
                await eventually(lambda: guard.lost, what="the watchdog reports the loss")
                assert held(meter, before) == {}
    changed = meter.since(before)
    assert changed[("aiolock.losses", "lock")] == lock.statistics().losses == 1
    [record] = [r for r in caplog.records if "lost" in r.getMessage()]
    assert record.aiolock_name == "deleted"  # type: ignore[attr-defined]
    assert record.aiolock_owner == f"{client.id}:x:job-17"  # type: ignore[attr-defined]
    assert record.aiolock_kind == "lock"  # type: ignore[attr-defined]


async def test_a_fixed_lease_permit_running_out_is_a_loss(
    meter: Meter, aiolock_client: aiolock.Client
) -> None:
    before = meter.values()
    permit = await aiolock_client.semaphore("leased", 1).try_acquire(lease=0.05)
    assert permit is not None
    await eventually(lambda: permit.lost, what="the permit's lease ran out")
    assert meter.since(before) == {
        ("aiolock.acquisitions", "semaphore"): 1,
        (WAIT, "semaphore"): 1,
        ("aiolock.losses", "semaphore"): 1,
    }


async def test_closing_the_client_ends_its_holds(meter: Meter, make_client: MakeClient) -> None:
    client = make_client()
    before = meter.values()
    await client.lock("left-held").lock()
    await client.fair_lock("left-held").lock()
    assert held(meter, before) == {"lock": 1, "fair": 1}
    await client.aclose()
    assert held(meter, before) == {}


def test_without_opentelemetry_nothing_is_imported(aiolock_server: ServerInfo) -> None:
    """With the import blocked, aiolock works, records nothing, and only tries it once."""
    script = textwrap.dedent(
        """
        import asyncio, sys

        class Block:
            def __init__(self):
                self.importers = []

            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] != "opentelemetry":
                    return None
                frame = sys._getframe(1)
                while frame.f_code.co_filename.startswith("<frozen"):
                    frame = frame.f_back
                self.importers.append(frame.f_code.co_filename)
                raise ImportError(f"{name} is blocked")

        block = Block()
        sys.meta_path.insert(0, block)
        import aiolock, aiolock._core.metrics

        async def main():
            async with aiolock.Client.from_url(sys.argv[1], key_prefix="no-otel") as client:
                assert client._services.metrics is None
                assert client._services.tracing is None
                async with client.lock("x") as guard:
                    assert not guard.lost
                assert client.lock("x").statistics().acquisitions == 1

        asyncio.run(main())
        assert not [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
        ours = [path for path in block.importers if "aiolock" in path]
        assert set(ours) == {aiolock._core.metrics.__file__}, ours  # metrics and traces
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, aiolock_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
