"""Key naming: one Cluster hash slot per lock, and no two names sharing keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiolock._core.keys import KeyParts, LockKeys, alive_of, fence_of, hash_tag, parts_of


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


@given(
    st.text(min_size=1),
    st.sampled_from([None, "fair", "spin", "rw", "semaphore", "latch"]),
    st.sampled_from(["", ":meta", ":readers", ":ql", ":c:3e6c", ":marks"]),
    st.booleans(),
)
def test_a_key_reads_back_into_its_kind_and_name(
    name: str, kind: str | None, suffix: str, cluster: bool
) -> None:
    """``aiolock list`` decodes keys: exactly, whatever the name (braces, colons, ``%``)."""
    keys = LockKeys.build("aio:lock", name, kind, cluster=cluster)
    assert parts_of("aio:lock", keys.lock + suffix) == KeyParts(kind, name, suffix)


def test_keys_that_no_lock_owns_read_back_as_none() -> None:
    prefix = "aiolock"
    for key in (
        fence_of(prefix),
        fence_of(prefix, "aiolock:{x}"),  # a Cluster slot's counter
        alive_of(prefix) + "3e6c",
        alive_of(prefix, "aiolock:{x}") + "3e6c",
        "aiolock:{}",  # no name
        "aiolock:{%7}",  # an escape hash_tag never writes
        "aiolock:{%7b}",
        "aiolock:{x",  # no closing brace
        "aiolock:fair:x",
        "other:{x}",
        "aiolockx:{x}",
    ):
        assert parts_of(prefix, key) is None, key
