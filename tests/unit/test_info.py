"""Reading a server's ``INFO server`` reply (the release path asks it after a resend)."""

from __future__ import annotations

from aiolock._redis.info import uptime_of

REPLY = "# Server\r\nredis_version:7.2.4\r\nuptime_in_seconds:5025\r\nuptime_in_days:0\r\n"


def test_the_uptime_is_read_from_text_or_bytes() -> None:
    assert uptime_of(REPLY) == 5025
    assert uptime_of(REPLY.encode()) == 5025


def test_a_reply_without_the_line_tells_nothing() -> None:
    assert uptime_of("# Server\r\nredis_version:7.2.4\r\n") is None
    assert uptime_of(b"") is None
