"""``vcasync simulate``: run the fleet simulator from the command line.

Registered in the ``vcasync`` command by :mod:`vcasync.commands.simulate` (:func:`configure` adds
the arguments, :func:`run` runs). Prints a readable table, or with ``--json`` one JSON object (last
line); ``--plot PATH`` writes a PNG.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .._json import strict_json
from ..coerce import argument_number
from ..costing.params import parse_params
from ..costing.prices import DEFAULT_COORDINATOR_INSTANCE, DEFAULT_INSTANCE, PriceTable
from ..costing.spot_options import add_spot_path_options, spot_path_from_options
from ..errors import ConfigError
from .config import MAX_EPOCHS, MAX_LOCAL_STEPS, SimConfig
from .fleet import MAX_WORKERS, FleetConfig, NoPreemption, PoissonPreemption, PreemptionModel, TracePreemption

__all__ = ["DEFAULT_WALK_STEP_S", "HELP", "build_config", "configure", "number", "parse_params", "run"]

HELP = "simulate a preemptible fleet on a virtual clock (real coordinator and policy)"

#: --spot-walk's default step: a simulated run lasts hours of virtual time, so the walk steps hourly,
#: as a real spot market moves at the fastest (the demo's runs last minutes: its default is 10 s).
DEFAULT_WALK_STEP_S = 3600.0


#: The argparse type of every numeric flag (:func:`vcasync.coerce.argument_number`): ``--model-mb nan``
#: was a ValueError traceback, ``--slow-factor inf`` a ZeroDivisionError, ``--restart-delay-s inf``
#: a run that never ended, and ``--workers 2**40`` one that never started.
number = argument_number


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``vcasync simulate``'s arguments to ``p``."""
    g = p.add_argument_group("workload")
    g.add_argument("--signal", default="surrogate",
                   help="surrogate | digits | mnist5000 | tinylm (default surrogate)")
    g.add_argument("--policy", default="vcasgd", help="merge policy name (default vcasgd)")
    g.add_argument("--policy-param", action="append", metavar="KEY=VALUE", help="policy parameter (repeat)")
    g.add_argument("--epochs", type=number(int, 1, high=MAX_EPOCHS), default=5,
                   help=f"passes over the training set (default 5, at most {MAX_EPOCHS:,})")
    g.add_argument("--shards", type=number(int, 1))
    g.add_argument("--local-steps", type=number(int, 1, high=MAX_LOCAL_STEPS),
                   help=f"steps per work unit (default: one pass over a shard; at most {MAX_LOCAL_STEPS:,}, "
                        "each step is really trained)")
    g.add_argument("--batch-size", type=number(int, 1))
    g.add_argument("--lr", type=number(float, 0, strict=True),
                   help="the workers' learning rate (default: the signal's base rate x sqrt(workers))")
    g.add_argument("--momentum", type=number(float, 0, high=1, high_strict=True), default=0.9)
    g.add_argument("--sync-lr", type=number(float, 0, strict=True),
                   help="learning rate of the synchronous baseline (default: base rate x sqrt(workers))")
    g.add_argument("--sync-batch-size", type=number(int, 1),
                   help="the synchronous baseline's minibatch per worker (default: --batch-size); at many "
                        "workers a smaller one gives it more, smaller steps, as a user of DDP would")
    g.add_argument("--sample-cost-s", type=number(float, 0, strict=True),
                   help="virtual seconds per training sample on a reference machine")
    g.add_argument("--model-mb", type=number(float, 0),
                   help="model size for transfer times (default: real size)")
    g.add_argument("--max-staleness", type=number(int, 0),
                   help="versions a result may lag (default 2 x workers)")
    f = p.add_argument_group("fleet")
    f.add_argument("--workers", type=number(int, 1, high=MAX_WORKERS), default=8,
                   help=f"worker slots (default 8, at most {MAX_WORKERS:,})")
    f.add_argument("--identical", action="store_true",
                   help="identical reference machines on both sides: only the spot discount and the "
                        "preemptions differ (refused beside the speed and bandwidth spread flags)")
    f.add_argument("--speed-sigma", type=number(float, 0),
                   help="sigma of the machines' log-normal speeds around 1 (default 0.25)")
    f.add_argument("--slow-fraction", type=number(float, 0, high=1),
                   help="fraction of machines slower on top, stragglers (default 0.1)")
    f.add_argument("--slow-factor", type=number(float, 1),
                   help="how many times slower a straggler is (default 3)")
    f.add_argument("--bandwidth-mbps", type=number(float, 0, strict=True), nargs=2, metavar=("MIN", "MAX"),
                   help="machines' link speeds, log-uniform between MIN and MAX (default 100 2000)")
    f.add_argument("--preemption-rate", type=number(float, 0),
                   help="Poisson preemptions per worker-hour (default 0.3: 30%% of workers per hour)")
    f.add_argument("--restart-delay-s", type=number(float, 0),
                   help="Poisson: mean delay before a preempted slot's machine is back (default 120)")
    f.add_argument("--notice-s", type=number(float, 0),
                   help="Poisson: notice before a preemption (default 30)")
    f.add_argument("--hard-fraction", type=number(float, 0, high=1),
                   help="Poisson: fraction of preemptions with no notice (default 0.1)")
    f.add_argument("--trace", type=Path,
                   help="CSV of outages (worker,down_s,up_s[,notice_s]) replacing the Poisson model "
                        "(refused beside its flags); a fleet larger than the trace's workers replays it "
                        "again: slot k takes trace worker k mod W's outages (the report says how many); "
                        "a bad row is refused naming its line and field (exit status 2)")
    f.add_argument("--on-notice", choices=("partial", "abandon"), default="partial")
    c = p.add_argument_group("prices")
    c.add_argument("--instance", default=DEFAULT_INSTANCE)
    c.add_argument("--coordinator-instance", default=DEFAULT_COORDINATOR_INSTANCE)
    c.add_argument("--on-demand-price", type=float, help="override the instance's on-demand $/h")
    c.add_argument("--spot-price", type=float, help="override the instance's spot $/h")
    c.add_argument("--price-table", type=Path, metavar="FILE",
                   help="price rows replacing the built-in table (JSON, TOML or CSV, as --prices)")
    c.add_argument("--prices", type=Path, metavar="FILE",
                   help="JSON, TOML or CSV price rows that add to / replace rows of the table")
    c.add_argument("--list-prices", action="store_true", help="print the price table and exit")
    add_spot_path_options(c, default_step_s=DEFAULT_WALK_STEP_S,
                          start="the run's start on the simulated clock", seconds="virtual seconds",
                          baseline="the synchronous baseline")
    o = p.add_argument_group("output")
    o.add_argument("--target-accuracy", type=number(float, 0, strict=True, high=1),
                   help="the accuracy both sides are priced to (default: the synchronous baseline's final "
                        "accuracy less 0.5 point); a signal judged by loss (tinylm) takes its target from "
                        "the baseline's final loss + 1 %%")
    o.add_argument("--no-sync", action="store_true", help="skip the synchronous on-demand baseline")
    o.add_argument("--seed", type=int, default=0)   # SimConfig says [0, 2**32)
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.add_argument("--plot", type=Path, help="write a PNG plot here")


def _prices(args: argparse.Namespace) -> PriceTable:
    table = PriceTable()
    if args.price_table is not None:   # read and checked as a --prices file is, then replaces the table
        table = PriceTable.from_file(args.price_table)
    if args.prices is not None:
        table = table.merged(PriceTable.from_file(args.prices))
    if args.on_demand_price is not None or args.spot_price is not None:
        table = table.with_override(args.instance, on_demand_per_h=args.on_demand_price,
                                    spot_per_h=args.spot_price)
    return table


#: The Poisson model's flags and their defaults (None in argparse, so a --trace beside one is seen).
POISSON_FLAGS: dict[str, float] = {"preemption_rate": 0.3, "restart_delay_s": 120.0, "notice_s": 30.0,
                                   "hard_fraction": 0.1}


def _preemption(args: argparse.Namespace) -> PreemptionModel:
    given = [f"--{k.replace('_', '-')}" for k in POISSON_FLAGS if getattr(args, k, None) is not None]
    if args.trace is not None:
        if given:   # the trace replaced them without a word (its rows carry their own notice)
            raise ConfigError(f"--trace replays its own outages, so {', '.join(given)} would be "
                              "ignored: give --trace or the Poisson flags, not both")
        return TracePreemption.from_csv(args.trace)
    p = {k: d if getattr(args, k, None) is None else getattr(args, k) for k, d in POISSON_FLAGS.items()}
    if p["preemption_rate"] == 0:
        return NoPreemption()
    # a negative or NaN rate is refused by PoissonPreemption
    return PoissonPreemption(p["preemption_rate"], restart_delay_s=p["restart_delay_s"],
                             notice_s=p["notice_s"], hard_fraction=p["hard_fraction"])


#: The fleet's spread flags, each a :class:`FleetConfig` field of the same name.
_SPREAD_FLAGS = (("speed_sigma", "--speed-sigma"), ("slow_fraction", "--slow-fraction"),
                 ("slow_factor", "--slow-factor"))


def build_config(args: argparse.Namespace) -> SimConfig:
    preemption = _preemption(args)
    spread: dict[str, float] = {name: getattr(args, name) for name, _ in _SPREAD_FLAGS
                                if getattr(args, name) is not None}
    if args.bandwidth_mbps is not None:
        lo, hi = args.bandwidth_mbps
        spread.update(bandwidth_min_bps=lo * 1e6, bandwidth_max_bps=hi * 1e6)
    if args.identical:
        # they were ignored without a word: a user asking for identical machines with a spread
        # got identical machines and believed the figures were the spread's
        given = [flag for name, flag in (*_SPREAD_FLAGS, ("bandwidth_mbps", "--bandwidth-mbps"))
                 if getattr(args, name) is not None]
        if given:
            raise ConfigError(f"--identical makes every machine the reference machine: "
                              f"{', '.join(given)} cannot go with it (leave out --identical for a "
                              "heterogeneous fleet)")
        fleet = FleetConfig.identical(args.workers)
    else:
        fleet = FleetConfig(workers=args.workers, **spread)
    return SimConfig(
        signal=args.signal, policy=args.policy, policy_params=parse_params(args.policy_param), fleet=fleet,
        preemption=preemption, epochs=args.epochs, shards=args.shards, local_steps=args.local_steps,
        batch_size=args.batch_size, lr=args.lr, momentum=args.momentum, sample_cost_s=args.sample_cost_s,
        model_bytes=None if args.model_mb is None else int(args.model_mb * 1e6),
        max_staleness=args.max_staleness, on_notice=args.on_notice, instance=args.instance,
        coordinator_instance=args.coordinator_instance, prices=_prices(args),
        spot_path=spot_path_from_options(args, default_step_s=DEFAULT_WALK_STEP_S),
        target_accuracy=args.target_accuracy, sync_baseline=not args.no_sync, sync_lr=args.sync_lr,
        sync_batch_size=args.sync_batch_size,
        seed=args.seed)


def _check_plot(path: Path) -> None:
    """Refuse before the run a ``--plot`` that could not be written as named (found after it, the
    run's figures ended in a traceback, or the image went elsewhere): no file name, a directory, a
    missing or read-only directory, an image format matplotlib does not write, or no matplotlib."""
    import importlib.util

    from .._paths import check_output_file

    path = check_output_file(path, "--plot", kind="image file", example="saving.png")
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot needs matplotlib: pip install 'vcasync[demo]'")
    from matplotlib.figure import Figure

    formats = Figure().canvas.get_supported_filetypes()
    if path.suffix.lstrip(".").lower() not in formats:
        raise ConfigError(f"--plot {path}: the file name must end in an image format matplotlib "
                          f"writes ({', '.join('.' + f for f in sorted(formats))})")


def run(args: argparse.Namespace) -> int:
    from ..exit_codes import ExitCode

    try:
        if args.list_prices:
            table = _prices(args)
            rows = [table[k].as_dict() for k in table]
            # the columns padded to the longest row's (the instance alone was: longer names pushed
            # their row's region and prices right of the others')
            names = [f"{r['provider']}:{r['instance']}" for r in rows]
            key = max(map(len, names))
            region = max(len(str(r["region"])) for r in rows)
            print(strict_json(rows, indent=1) if args.json else "\n".join(
                f"{name:<{key}} {r['region']!s:<{region}} "
                f"on-demand ${r['on_demand_per_h']}/h"
                f"  spot ${r['spot_per_h']}/h  ({r['source']}, as of {r['as_of']}"
                f"{', approximate' if r['approximate'] else ''})"
                for name, r in zip(names, rows, strict=True)))
            return ExitCode.OK
        config = build_config(args)
        if args.plot is not None:
            _check_plot(args.plot)
        from .engine import Simulation
        from .report import plot_summary, render_text, summarize

        summary = summarize(Simulation(config).run())
    except ConfigError as exc:
        print(f"vcasync simulate: {exc}", file=sys.stderr)
        return ExitCode.CONFIG
    if args.plot is not None:
        plot_summary(summary, args.plot)
    if args.json:
        print(strict_json(summary))
    else:
        print(render_text(summary))
        if args.plot is not None:
            print(f"plot: {args.plot}")
    if summary["units_parked"]:
        return ExitCode.PARKED
    return ExitCode.OK if summary["finished"] else ExitCode.INCOMPLETE
