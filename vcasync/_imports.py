"""Resolve ``pkg.module:attribute`` references given on the command line or in a config file."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = ["import_object", "split_ref"]


def split_ref(ref: object, *, what: str) -> tuple[str, str]:
    """``(module, attribute)`` of a ``"pkg.mod:name"`` reference, checked for its shape only (nothing
    is imported: where it is imported may be another machine); a :class:`ConfigError` otherwise."""
    mod_name, sep, attr = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if not (sep and mod_name and attr):
        raise ConfigError(f"{what} must look like 'package.module:function', got {ref!r}")
    return mod_name, attr


def import_object(ref: str, *, what: str, app_dir: Path | None = None) -> Any:
    """The object ``ref`` (``"pkg.mod:name"`` or ``"pkg.mod:obj.attr"``) names.

    ``app_dir`` (default: none) is put first on ``sys.path`` so a project's own modules are found when
    ``vcasync`` runs as an installed console script, as uvicorn and gunicorn do. Every failure is a
    :class:`ConfigError` naming ``what`` the reference was for.
    """
    mod_name, attr = split_ref(ref, what=what)
    if app_dir is not None:
        if not app_dir.is_dir():
            # a typo'd --app-dir was passed over in silence: an installed copy of the module was
            # imported instead of the project's own, or "cannot import" named no directory
            raise ConfigError(f"{what} {ref!r}: the app dir {str(app_dir)!r} (--app-dir) is not a "
                              "directory; name the directory that holds the module")
        path = str(app_dir.resolve())
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{what} {ref!r}: cannot import {mod_name!r}: {exc}") from exc
    except Exception as exc:    # the module's own code failed as it ran (or does not parse)
        raise ConfigError(f"{what} {ref!r}: importing {mod_name!r} raised {type(exc).__name__}: "
                          f"{exc}{_where(exc)}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{what} {ref!r}: module {mod_name!r} has no attribute {attr!r}") from exc
    if not callable(obj):
        raise ConfigError(f"{what} {ref!r} is not callable")
    return obj


def _where(exc: BaseException) -> str:
    """`` (at FILE:LINE)``, the innermost place ``exc`` was raised (a syntax error's own place)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
