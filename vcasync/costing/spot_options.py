"""``--spot-trace FILE`` / ``--spot-walk SIGMA`` / ``--spot-walk-step S``: a moving spot price, by option.

One definition of the options, their checks and their refusals for every command that prices a fleet
(``vcasync demo``, ``vcasync simulate``): :func:`add_spot_path_options` adds them to a parser,
:func:`spot_path_from_options` reads them into a :mod:`vcasync.costing.market` path before anything
runs (a bad file or figure is a :class:`~vcasync.errors.ConfigError` that names its option), and
:func:`spot_path_record` / :func:`spot_path_text` are what a report records and prints of the path.

A path's ``t_s`` is seconds from the run's start on the command's own clock: the wall clock for the
demo, the virtual clock for the simulator. Only the default step of the walk differs between them (a
demo runs for minutes, a simulated run for hours), so each command passes its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .market import MIN_WALK_STEP_S, SpotTrace, SpotWalk

__all__ = ["add_spot_path_options", "spot_path_from_options", "spot_path_record", "spot_path_text"]


def add_spot_path_options(p: argparse._ActionsContainer, *, default_step_s: float,
                          start: str = "the run's start", seconds: str = "seconds",
                          baseline: str = "DDP") -> None:
    """Add the three options to ``p`` (a parser or an argument group). ``start``: what a trace's
    ``t_s`` counts from; ``seconds``: the clock's seconds (``"virtual seconds"`` in a simulation);
    ``baseline``: the side that stays on demand; ``default_step_s``: --spot-walk-step's default, as
    :func:`spot_path_from_options` is given it."""
    spot = p.add_mutually_exclusive_group()
    spot.add_argument("--spot-trace", type=Path, metavar="FILE",
                      help="price the fleet's workers on a spot price that moves during the run: a CSV "
                           f"file with a header t_s,spot_per_h ({seconds} from {start}, absolute "
                           "$/h), each price holding until the next row's time; the list spot price "
                           f"is not used ({baseline} stays on demand)")
    spot.add_argument("--spot-walk", type=float, metavar="SIGMA",
                      help="instead, the list spot price times a random walk seeded by --seed: one "
                           f"log-normal step of spread SIGMA (>= 0) every --spot-walk-step {seconds}, "
                           "kept within 0.5-2x the list price")
    p.add_argument("--spot-walk-step", type=float, metavar="SECONDS",
                   help=f"{seconds} between the steps of --spot-walk (default {default_step_s:g}; "
                        f"at least {MIN_WALK_STEP_S:g})")


def spot_path_from_options(a: argparse.Namespace, *, default_step_s: float) -> SpotTrace | SpotWalk | None:
    """--spot-trace or --spot-walk as a :mod:`vcasync.costing.market` path (None: the fixed list
    price), read and checked before anything starts; a bad one names its option. ``a`` also holds
    the command's ``--spot-price`` (refused beside a trace, which replaces the list price) and
    ``--seed`` (the walk's seed)."""
    if a.spot_walk_step is not None and a.spot_walk is None:
        raise ConfigError("--spot-walk-step sets the step of --spot-walk SIGMA; give --spot-walk too")
    if a.spot_trace is not None:
        if a.spot_price is not None:
            raise ConfigError("--spot-trace gives the workers' spot price over the run and --spot-price "
                              "a fixed one: give one of them")
        try:
            return SpotTrace.from_csv(a.spot_trace)
        except ConfigError as exc:
            raise ConfigError(f"--spot-trace: {exc}") from None
    if a.spot_walk is not None:
        step = default_step_s if a.spot_walk_step is None else a.spot_walk_step
        try:
            return SpotWalk(seed=a.seed, step_s=step, sigma=a.spot_walk)
        except ConfigError as exc:
            # the walk's own checks, said in the options' names (SpotWalk.sigma is --spot-walk)
            raise ConfigError(str(exc).replace("SpotWalk.sigma", "--spot-walk SIGMA")
                              .replace("SpotWalk.step_s", "--spot-walk-step")) from None
    return None


def spot_path_record(path: SpotTrace | SpotWalk | None, list_per_h: float) -> dict[str, Any]:
    """Which spot price the fleet's workers were priced at, for a report: the table's fixed rate
    (``kind`` ``fixed``), or the path's :meth:`~vcasync.costing.market.SpotTrace.as_dict`."""
    if path is None:
        return {"kind": "fixed", "spot_per_h": list_per_h}
    return path.as_dict()


def spot_path_text(rec: dict[str, Any] | None, *, start: str = "the run's start",
                   seconds: str = "s") -> str | None:
    """A report's :func:`spot_path_record` in words (None for the fixed list price, which the
    prices line gives); ``start`` and ``seconds`` name the clock as the options' help does."""
    if rec is None or rec["kind"] == "fixed":
        return None
    if rec["kind"] == "trace":
        return (f"trace {rec['source']} ({rec['rows']} row(s) of $/h from {start}, "
                f"in place of the list spot price)")
    return (f"random walk (seed {rec['seed']}, sigma {rec['sigma']:g} per {rec['step_s']:g}-{seconds} step, "
            f"within {rec['low']:g}-{rec['high']:g}x the list spot price)")
