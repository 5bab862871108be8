"""``vcasync simulate``: the fleet simulator (see :mod:`vcasync.sim`)."""

from __future__ import annotations

import argparse

from ..cli import Command


def _configure(p: argparse.ArgumentParser) -> None:
    from ..sim.cli import configure

    configure(p)


def _run(a: argparse.Namespace) -> int:
    from ..sim.cli import run

    return run(a)


COMMAND = Command(name="simulate", help="simulate a preemptible fleet on a virtual clock: time, cost, saving",
                  configure=_configure, run=_run)
