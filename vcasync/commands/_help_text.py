"""Plain-text lists for ``--help``: argparse prints epilogs as they are, so they are wrapped here."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

__all__ = ["wrap_list"]


def wrap_list(title: str, items: Sequence[str], width: int = 96) -> str:
    """``title`` then ``items``, comma-separated and indented, wrapped at ``width``; one trailing newline."""
    body = textwrap.wrap(", ".join(items) or "(none)", width, initial_indent="  ", subsequent_indent="  ",
                         break_on_hyphens=False, break_long_words=False)
    return "\n".join([title, *body]) + "\n"
