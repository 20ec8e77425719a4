"""MkDocs hook: render the Sphinx roles of aiolock's reST docstrings as code, linked if known.

mkdocstrings renders the docstrings' text as Markdown, so ``:class:`~aiolock.AsyncRLock``` would
show the role itself.  After rendering, each role becomes its target in code, wrapped in an
optional cross-reference that mkdocs-autorefs resolves when the target is documented; and the
``::`` that introduces a reST literal block (rendered as a code block already) becomes ``:``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|exc|obj|data):<code>(~?)([\w.]+)</code>")
_LITERAL = re.compile(r"(?:<p>::</p>|::(</p>))(\s*<pre>)")


def _replace(match: re.Match[str]) -> str:
    short, target = match.groups()
    shown = target.rsplit(".", 1)[-1] if short else target
    return f'<autoref identifier="{target}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    return _LITERAL.sub(lambda m: (":" + m[1] if m[1] else "") + m[2], _ROLE.sub(_replace, html))
