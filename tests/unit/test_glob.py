"""``aiolock list``'s glob on lock names: Redis's ``MATCH`` rules, matched on the decoded name."""

from __future__ import annotations

import pytest

from aiolock._cli._list import glob_regex


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("*", "anything at all", True),
        ("*", "two\nlines", True),
        ("orders:*", "orders:42", True),
        ("orders:*", "order:42", False),
        ("a?c", "abc", True),
        ("a?c", "ac", False),
        ("[ab]x", "bx", True),
        ("[ab]x", "cx", False),
        ("[^ab]x", "bx", False),
        ("[!ab]x", "cx", True),
        ("[a-c]", "b", True),
        ("[c-a]", "b", True),  # a reversed range, as Redis reads it
        ("[a-c]", "d", False),
        ("\\*", "*", True),
        ("\\*", "a", False),
        ("[*?]", "?", True),
        ("[\\]]", "]", True),
        ("[]", "a", False),
        ("[", "[", True),  # never closed: itself
        ("a[b", "a[b", True),
        ("{x}", "{x}", True),  # braces are plain characters in a name
        ("%7B*", "{x}", False),  # ... and never their escaped form in the key
        ("%7B*", "%7Bx", True),
        ("*.", "a.", True),  # regex characters are plain too
        ("*.", "ab", False),
    ],
)
def test_glob(pattern: str, name: str, matches: bool) -> None:
    assert bool(glob_regex(pattern).fullmatch(name)) is matches
