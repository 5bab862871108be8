"""Strict JSON for what a command prints or writes: a NaN or infinite figure becomes null and is
named, never ``NaN``/``Infinity`` (Python's default), which strict readers (jq, JavaScript) refuse."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["strict_json"]


def _finite_or_null(obj: Any, path: str, found: list[str]) -> Any:
    """``obj`` with every NaN or infinite float replaced by None, the JSON path of each added to ``found``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        found.append(f"{path} ({obj!r})")
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_null(v, f"{path}.{k}" if path else str(k), found) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite_or_null(v, f"{path}[{i}]", found) for i, v in enumerate(obj)]
    return obj


def strict_json(report: Any, **kwargs: Any) -> str:
    """``report`` as strict JSON (``allow_nan=False``): a figure that is NaN or infinite (a loss
    that diverged, say) is written as null and named, with its value, in ``non_finite`` (added to a
    top-level object; a top-level list or value is only made finite)."""
    found: list[str] = []
    safe = _finite_or_null(report, "", found)
    if found and isinstance(safe, dict):
        safe["non_finite"] = {"fields": found, "why": "not a finite number, so written as null"}
    return json.dumps(safe, allow_nan=False, default=str, **kwargs)
