"""An acquire makes a span only while a tracer provider that may record is set."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

# In a process of its own: the global tracer provider can be set once per process, and the
# traces tests set one for the whole session.
_SCRIPT = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from aiolock._core.metrics import tracing

spans = tracing(False)
assert spans is not None
print(spans.recording())
trace.set_tracer_provider(trace.NoOpTracerProvider())
print(spans.recording())
"""

_SET_LATER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from aiolock._core.metrics import tracing

spans = tracing(False)
trace.set_tracer_provider(TracerProvider())
print(spans.recording())
"""

# Asked once before a provider is set, then again until the answer changes: within a second.
_ASKED_BEFORE = """
import time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from aiolock._core.metrics import tracing

spans = tracing(False)
print(spans.recording())
trace.set_tracer_provider(TracerProvider())
set_at = time.monotonic()
while not spans.recording():
    assert time.monotonic() - set_at < 5, "the provider set later was never used"
    time.sleep(0.01)
print(spans.recording(), time.monotonic() - set_at < 3)  # a second, and slack
"""


def _run(script: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()


def test_no_span_with_the_api_alone_or_a_no_op_provider() -> None:
    assert _run(_SCRIPT) == ["False", "False"]


def test_a_provider_set_after_the_client_was_made_is_used() -> None:
    assert _run(_SET_LATER) == ["True"]


def test_a_provider_set_after_the_first_question_is_used_within_a_second() -> None:
    assert _run(_ASKED_BEFORE) == ["False", "True", "True"]
