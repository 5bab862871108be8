"""Run a coroutine on uvloop when it is installed, on plain asyncio otherwise.

The CLI and the benchmarks start their event loop here, so the choice is made in one place and a
caller can force either loop (``use_uvloop=False`` for debugging, ``True`` to insist).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["loop_factory", "run", "uvloop_available"]

T = TypeVar("T")


def uvloop_available() -> bool:
    """True when the ``uvloop`` package can be imported."""
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(use_uvloop: bool | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory for new event loops: uvloop's when wanted and installed, asyncio's otherwise.

    ``use_uvloop=None`` picks uvloop when it is installed; ``True`` raises :class:`ConfigError`
    when it is not; ``False`` always returns asyncio's default loop.
    """
    if use_uvloop is False or (use_uvloop is None and not uvloop_available()):
        return asyncio.new_event_loop
    if not uvloop_available():
        raise ConfigError("uvloop was requested but is not installed: pip install uvloop")
    import uvloop

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None, debug: bool | None = None) -> T:
    """Run ``main`` to completion on a fresh loop chosen by :func:`loop_factory`."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop), debug=debug) as runner:
        return runner.run(main)
