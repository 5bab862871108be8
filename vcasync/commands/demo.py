"""``vcasync demo``: a coordinator and workers on a simulated spot market (see :mod:`vcasync.demo`)."""

from __future__ import annotations

import argparse

from ..cli import Command


def _configure(p: argparse.ArgumentParser) -> None:
    from ..demo.cli import configure

    configure(p)


def _run(a: argparse.Namespace) -> int:
    from ..demo.cli import run

    return run(a)


COMMAND = Command(name="demo", help="train a small CNN on worker processes a simulated spot market preempts",
                  configure=_configure, run=_run, handles_signals=True)
