"""Key naming: one Cluster hash slot per lock, and no two names sharing keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiolock._core.keys import LockKeys, hash_tag


def slot_tag(key: str) -> str:
    """The part of ``key`` that Redis Cluster hashes (its CLUSTER KEYSLOT rule)."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def test_layout() -> None:
    keys = LockKeys.build("aiolock", "orders:42")
    assert keys.lock == "aiolock:{orders:42}"
    assert keys.meta == "aiolock:{orders:42}:meta"
    assert keys.channel == "aiolock:{orders:42}:released"


@given(st.text(min_size=1))
def test_one_slot_per_lock(name: str) -> None:
    keys = LockKeys.build("aiolock", name)
    tags = {slot_tag(keys.lock), slot_tag(keys.meta), slot_tag(keys.channel)}
    assert len(tags) == 1
    assert "{" not in hash_tag(name)[1:-1]
    assert "}" not in hash_tag(name)[1:-1]


@given(st.text(min_size=1), st.text(min_size=1))
def test_distinct_names_never_share_keys(a: str, b: str) -> None:
    if a != b:
        assert hash_tag(a) != hash_tag(b)


def test_braces_and_percent_are_escaped() -> None:
    assert hash_tag("a{b}c") == "{a%7Bb%7Dc}"
    assert hash_tag("%7B") == "{%257B}"
    assert hash_tag("{") != hash_tag("%7B")
