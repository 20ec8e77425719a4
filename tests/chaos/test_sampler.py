"""The key sampler reads back the resource of each lock's main key, and of no other key."""

from __future__ import annotations

import pytest

from aiolock._core.keys import LockKeys, alive_of, fence_of

from .run import NAMES, PREFIX
from .sampler import resource_of


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    ("segment", "kind"),
    [(None, "lock"), ("fair", "fair"), ("spin", "spin"), ("rw", "rw"), ("semaphore", "semaphore")],
)
@pytest.mark.parametrize("cluster", [False, True])
def test_a_main_key_names_its_resource(
    name: str, segment: str | None, kind: str, cluster: bool
) -> None:
    keys = LockKeys.build(PREFIX, name, segment, cluster=cluster)
    assert resource_of(PREFIX, keys.lock) == (kind, name)
    assert resource_of(PREFIX, keys.meta) is None
    assert resource_of(PREFIX, f"{keys.lock}:ql") is None


@pytest.mark.parametrize("name", NAMES)
def test_a_redlock_servers_lock_is_its_own_resource(name: str) -> None:
    assert resource_of(PREFIX, LockKeys.build(f"{PREFIX}-redlock2", name).lock) == (
        "redlock2",
        name,
    )
    assert resource_of(PREFIX, LockKeys.build(f"{PREFIX}-redlock1", name, "fair").lock) is None


def test_counters_alive_keys_and_latches_are_no_resource() -> None:
    assert resource_of(PREFIX, fence_of(PREFIX)) is None
    assert resource_of(PREFIX, fence_of(PREFIX, LockKeys.build(PREFIX, "x").lock)) is None
    assert resource_of(PREFIX, alive_of(PREFIX) + "client") is None
    assert resource_of(PREFIX, LockKeys.build(PREFIX, "x", "latch").lock) is None
