"""What a client tells the outside about its locks: OpenTelemetry metrics and log context.

**Metrics** (the ``otel`` extra, ``opentelemetry-api``): every client records to the meter
``aiolock`` of the *global* meter provider, obtained once per process when the first client is
made (``opentelemetry.metrics.get_meter("aiolock", version)``).  The API hands out a proxy
meter until an SDK provider is set, so a provider set later is still used; with the API alone
every recording is a no-op.  Without the API nothing is imported, and the client holds
``None`` instead of a :class:`Metrics`: one ``None`` check per event is the whole cost.

=========================  ===============  ===========================================
instrument                 kind             recorded
=========================  ===============  ===========================================
``aiolock.acquisitions``   counter          a fresh (non-reentrant) hold is granted
``aiolock.timeouts``       counter          an acquire's ``wait`` ran out
``aiolock.losses``         counter          a hold is lost (expired, forced, taken)
``aiolock.renewals``       counter          a watchdog renewal of one hold landed
``aiolock.wait.duration``  histogram (s)    a fresh hold: seconds from the call to it
``aiolock.held``           up-down counter  +1 at a fresh hold, -1 when it ends
=========================  ===============  ===========================================

The one attribute is ``aiolock.kind`` (``lock``, ``fair``, ``spin``, ``rw-read``,
``rw-write``, ``semaphore``); lock names are unbounded, so they are never attributes.  Each
event is recorded at the one place that also counts it for ``statistics()``, so the two
cannot disagree.

**Traces** (the same extra): a span ``aiolock.acquire`` per acquire call (a ``MultiLock``'s and
a ``RedLock``'s too, kinds ``multi`` and ``redlock``) on the tracer
``aiolock`` of the global tracer provider, with the attributes ``aiolock.kind``,
``aiolock.outcome`` (``granted``, ``timeout``, ``cancelled`` or ``error``), ``aiolock.wait``
(seconds the call took) and ``aiolock.reentrant`` (a granted call re-entered a hold the owner
had), and ``aiolock.name`` only for a client made with ``trace_names=True`` (names are
unbounded: a tracing backend may index attributes).  While no provider that may record is
set (the API alone, or a no-op provider) an acquire makes no span at all: its context
manager costs the caller some 15 µs even when nothing records.  A provider set after the
client was made is used within a second.  When a hold is lost, an event
``aiolock.lost`` goes on the span current then if it is recording (the holder's own code
found the loss: a transaction, a release), else on the span that was current when the hold
was granted (the holder's operation, while it lasts): a timer or the watchdog finds most
losses, in a context of their own.

**Logging**: the records the library logs about one lock carry :func:`lock_extra` as
``extra``: the attributes ``aiolock_name``, ``aiolock_owner`` and ``aiolock_kind``.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..errors import LockTimeoutError

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.trace import Tracer

    from .holds import Hold

__all__ = [
    "KIND",
    "METER",
    "TRACER",
    "Metrics",
    "Tracing",
    "lock_extra",
    "metrics",
    "traced",
    "tracing",
]

METER: Final = "aiolock"
TRACER: Final = "aiolock"
KIND: Final = "aiolock.kind"
ACQUIRE_SPAN: Final = "aiolock.acquire"
LOST_EVENT: Final = "aiolock.lost"

_T = TypeVar("_T")

# How long (s) the answer "no tracer provider is set" is kept before OpenTelemetry is asked again.
_ASK_AGAIN: Final = 1.0

# Lock waits run from a round trip (well under a millisecond) to minutes: the SDK's default
# boundaries are made for milliseconds, so the histogram advises its own, in seconds.
_WAIT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


class Metrics:
    """The client's instruments on one meter; one method per event, each taking the kind."""

    __slots__ = (
        "_acquisitions",
        "_attributes",
        "_held",
        "_losses",
        "_renewals",
        "_timeouts",
        "_wait",
    )

    def __init__(self, meter: Meter) -> None:
        self._acquisitions = meter.create_counter(
            "aiolock.acquisitions", unit="{acquisition}", description="Fresh holds granted."
        )
        self._timeouts = meter.create_counter(
            "aiolock.timeouts", unit="{timeout}", description="Acquires whose wait ran out."
        )
        self._losses = meter.create_counter(
            "aiolock.losses", unit="{loss}", description="Holds lost while held."
        )
        self._renewals = meter.create_counter(
            "aiolock.renewals", unit="{renewal}", description="Watchdog renewals of a hold."
        )
        self._wait = meter.create_histogram(
            "aiolock.wait.duration",
            unit="s",
            description="Seconds from an acquire call to its fresh hold.",
            explicit_bucket_boundaries_advisory=_WAIT_BUCKETS,
        )
        self._held = meter.create_up_down_counter(
            "aiolock.held", unit="{hold}", description="Holds the client has now."
        )
        # One attribute mapping per kind, made once: a recording allocates nothing.
        self._attributes: dict[str, Mapping[str, str]] = {}

    def _kind(self, kind: str) -> Mapping[str, str]:
        attributes = self._attributes.get(kind)
        if attributes is None:
            attributes = self._attributes[kind] = {KIND: kind}
        return attributes

    def acquired(self, kind: str, waited: float) -> None:
        """A fresh hold, ``waited`` seconds after its acquire call began."""
        attributes = self._kind(kind)
        self._acquisitions.add(1, attributes)
        self._wait.record(waited, attributes)
        self._held.add(1, attributes)

    def ended(self, kind: str) -> None:
        """A hold left the client's registry (released, lost, dropped, the client closed)."""
        self._held.add(-1, self._kind(kind))

    def lost(self, kind: str) -> None:
        self._losses.add(1, self._kind(kind))

    def renewed(self, kind: str) -> None:
        self._renewals.add(1, self._kind(kind))

    def timed_out(self, kind: str) -> None:
        self._timeouts.add(1, self._kind(kind))


@functools.cache
def metrics() -> Metrics | None:
    """The process' recorder on the global meter provider; ``None`` without opentelemetry."""
    try:
        from opentelemetry.metrics import get_meter
    except ImportError:
        return None
    from .. import __version__

    return Metrics(get_meter(METER, __version__))


class Tracing:
    """A client's spans (see the module docstring); ``names``: its ``trace_names`` option."""

    __slots__ = ("_answer", "_names", "_provider", "_proxy", "_silent", "_tracer")

    def __init__(self, tracer: Tracer, names: bool) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._names = names
        self._provider = trace.get_tracer_provider
        self._proxy = trace.ProxyTracerProvider
        self._silent = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        # (recording, until when it holds by time.monotonic()): one tuple, so that a thread
        # never reads one field of an answer and the other of the next.
        self._answer = (False, 0.0)

    def recording(self) -> bool:
        """Whether a tracer provider is set that may record (the API alone, or a no-op
        provider, hands out spans that record nothing): only then is an acquire worth a span,
        which costs some 15 µs of the caller's CPU even unrecorded.

        While none is set, OpenTelemetry is asked again once a second (asking reads
        ``os.environ``: a cost on every acquire), so a provider set after the client was made
        is used from then on.  Once one is set the answer is final: the global provider can be
        set once per process.  From any thread (two threads may both ask; each stores a whole
        answer)."""
        recording, until = self._answer
        now = time.monotonic()
        if now < until:
            return recording
        provider = self._provider()
        recording = not isinstance(provider, self._silent)
        final = not isinstance(provider, self._proxy)
        self._answer = (recording, math.inf if final else now + _ASK_AGAIN)
        return recording

    async def acquire(
        self,
        work: Awaitable[_T],
        kind: str,
        name: str,
        holds_of: Callable[[_T], Sequence[Hold]],
    ) -> _T:
        """Await one acquire call ``work`` in an ``aiolock.acquire`` span.

        ``holds_of(result)``: the holds a call that returned ``result`` holds (none: the wait
        ran out; a composite's: its parts), read at once, in the calling task.
        """
        from opentelemetry.trace import StatusCode, get_current_span

        holder_span = get_current_span()
        attributes: dict[str, Any] = {KIND: kind}
        if self._names:
            attributes["aiolock.name"] = name
        loop = asyncio.get_running_loop()
        started = loop.time()
        with self._tracer.start_as_current_span(
            ACQUIRE_SPAN,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            outcome = "error"
            try:
                result = await work
            except asyncio.CancelledError:
                outcome = "cancelled"
                raise
            except LockTimeoutError:
                outcome = "timeout"
                raise
            except BaseException as exc:
                span.record_exception(exc)
                span.set_status(StatusCode.ERROR, type(exc).__name__)
                raise
            else:
                holds = holds_of(result)
                outcome = "granted" if holds else "timeout"
                if holds:
                    span.set_attribute("aiolock.reentrant", any(h.count > 1 for h in holds))
                for hold in holds:
                    if hold.span is None:
                        hold.span = holder_span
            finally:
                span.set_attribute("aiolock.outcome", outcome)
                span.set_attribute("aiolock.wait", loop.time() - started)
            return result

    def lost(self, hold: Hold) -> None:
        """Put an ``aiolock.lost`` event on the span of whoever finds out (see the module
        docstring)."""
        from opentelemetry.trace import get_current_span

        span = get_current_span()
        if not span.is_recording() and hold.span is not None:
            span = hold.span
        attributes: dict[str, Any] = {
            KIND: hold.kind,
            "aiolock.fencing_token": hold.token,
            "aiolock.reason": hold.lost_reason or "",
        }
        if self._names:
            attributes["aiolock.name"] = hold.name
        span.add_event(LOST_EVENT, attributes)


def traced(
    tracing: Tracing | None,
    work: Coroutine[Any, Any, _T],
    kind: str,
    name: str,
    holds_of: Callable[[_T], Sequence[Hold]],
) -> Coroutine[Any, Any, _T]:
    """``work``, one acquire call, in an ``aiolock.acquire`` span (:meth:`Tracing.acquire`)
    when the client traces and a tracer provider may record; else ``work`` itself, at no
    cost.  Every kind's acquire calls, a composite's included, go through here."""
    if tracing is None or not tracing.recording():
        return work
    span = tracing.acquire(work, kind, name, holds_of)
    # A span that never starts (its task cancelled first) never awaits work: close it then,
    # or Python warns that it was never awaited.
    weakref.finalize(span, work.close)
    return span


@functools.cache
def _tracer() -> Tracer | None:
    try:
        from opentelemetry.trace import get_tracer
    except ImportError:
        return None
    from .. import __version__

    return get_tracer(TRACER, __version__)


def tracing(names: bool) -> Tracing | None:
    """A client's spans on the global tracer provider; ``None`` without opentelemetry."""
    tracer = _tracer()
    return None if tracer is None else Tracing(tracer, names)


def lock_extra(kind: str, name: str, owner: str) -> dict[str, str]:
    """The ``extra`` of a log record about one lock: its name, owner and kind."""
    return {"aiolock_name": name, "aiolock_owner": owner, "aiolock_kind": kind}
