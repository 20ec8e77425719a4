"""The scripts' sharded variants: what a Cluster with sharded pub/sub runs."""

from __future__ import annotations

import re

from aiolock import _scripts
from aiolock._scripts import Script, sharded

SCRIPTS = [value for value in vars(_scripts).values() if isinstance(value, Script)]
PUBLISH = re.compile(r"\bPUBLISH\b")


def test_every_publish_becomes_a_spublish() -> None:
    publishing = [script for script in SCRIPTS if "redis.call('PUBLISH'" in script.source]
    assert {script.name for script in publishing} >= {"lock/release", "fair/release"}
    for script in publishing:
        variant = sharded(script)
        assert not PUBLISH.search(variant.source.replace("SPUBLISH", "")), script.name
        assert variant.source.count("SPUBLISH") == script.source.count("PUBLISH")
        assert variant.sha != script.sha
        assert variant.name == script.name


def test_every_publish_is_written_the_one_way_the_variant_knows() -> None:
    """A publish written any other way would stay classic on a sharded Cluster."""
    for script in SCRIPTS:
        assert "SPUBLISH" not in script.source, script.name
        published = len(PUBLISH.findall(script.source))
        assert published == script.source.count("redis.call('PUBLISH', "), script.name


def test_a_script_that_publishes_nothing_is_its_own_variant() -> None:
    quiet = [script for script in SCRIPTS if "PUBLISH" not in script.source]
    assert quiet
    for script in quiet:
        assert sharded(script) is script
