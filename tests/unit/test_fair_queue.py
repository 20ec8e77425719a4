"""A member of the fair lock's queue, read as ``scripts/fair/_queue.lua`` writes it (no server)."""

from __future__ import annotations

import pytest

from aiolock.fair.queue import Member, parse_member


def test_a_member_reads_as_the_scripts_write_it() -> None:
    member = parse_member("2000 7 5000 1700000000123 0a1b2c:t3")
    assert member == Member(2000, 7, 5000, 1700000000123, "0a1b2c:t3")


def test_an_owner_with_spaces_is_read_whole() -> None:
    member = parse_member("1 2 3 4 0a1b2c:x:a b  c")
    assert member is not None
    assert member.owner == "0a1b2c:x:a b  c"


@pytest.mark.parametrize("member", ["", "1 2 3 0a1b2c", "1 2 x 4 0a1b2c", "-1 2 3 4 0a1b2c"])
def test_a_member_of_another_shape_reads_as_none(member: str) -> None:
    assert parse_member(member) is None
