"""``key=value`` command-line parameters (``--policy-param``), shared by ``vcasync simulate`` and ``demo``."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError

__all__ = ["parse_params"]


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs; values are JSON when they parse as JSON (numbers, true, lists), else strings."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--policy-param wants key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out
