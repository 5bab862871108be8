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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


BENCHES: dict[str, Bench] = {
    "codec": Bench(["--sizes", "25m,100m"], ["--sizes", "25m", "--reps", "3"],
                   "encode + decode of a ResNet-50 state dict against memcpy, bare zstandard and a "
                   "CRC-32 floor (checksum + copy + checksum, no vcasync code), warm buffers"),
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
                 "and durable aiohttp POSTs and raw TCP"),
    "modelsize": Bench([], ["--quick"],
                       "ingest time and coordinator RSS from 10 MB to the largest model memory allows"),
    "ledger": Bench([], ["--quick"],
                    "a long run's ledger snapshot: its capture on the event loop, packing and reading "
                    "back, against msgpack alone and the row format coordinators wrote before"),
    "convergence": Bench([], ["--quick"],
                         "cost to target of VC-ASGD on preempted spot workers against DDP on on-demand "
                         "machines: real processes, their calibrated replays and simulated fleets",
                         unmeasured="The figures docs/headline.md quotes come from earlier runs whose "
                                    "`--json` output was not saved: they are not repeated here"),
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
    "e2e": ["headline_durability", "e2e_vs_raw_post", "e2e_vs_durable_post"],
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
    "chaos": ["worker_kills", "coordinator_kills", "results_lost", "double_merges", "hostile_inputs",
              "hostile_accepted"],
}


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
    whether tracked files differ from it (``dirty``: the figures are of code no commit holds)."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
            "dirty": None if status is None else bool(status),
            "load_average_at_start": None if load is None else round(load, 2)}


def run_bench(name: str, quick: bool) -> dict[str, Any]:
    """Run one bench with ``--json``; its last output line, with how, when and where it was run."""
    bench = BENCHES[name]
    cmd = [sys.executable, "-m", f"bench.{name}", *(bench.quick if quick else bench.default), "--json"]
    measured = provenance()
    where = machine()
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench.{name} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {"command": "python -m " + " ".join([f"bench.{name}", *cmd[3:]]), "quick": quick,
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


def load_results(directory: Path = RESULTS, root: Path = ROOT
                 ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(legacy machine, {bench: saved result})`` from ``directory`` (and the benches' own
    ``published`` files under ``root``); a missing bench is not measured. ``machine.json`` is the
    one machine record ``--run`` kept for all benches before each result carried its own."""
    mfile = directory / "machine.json"
    mach = json.loads(mfile.read_text()) if mfile.exists() else {}
    saved: dict[str, dict[str, Any]] = {}
    for name, bench in BENCHES.items():
        candidates = []
        if (directory / f"{name}.json").exists():
            candidates.append(json.loads((directory / f"{name}.json").read_text()))
        if bench.published and (root / bench.published).exists():
            candidates.append(_from_published(name, json.loads((root / bench.published).read_text())))
        best = _pick(candidates)
        if best is not None:
            saved[name] = best
    return mach, saved


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) for v in value):
        return f"{value[1]:.4g} ({value[0]:.4g}-{value[2]:.4g})"
    text = json.dumps(value) if not isinstance(value, str) else value
    if len(text) > 200:
        return f"({type(value).__name__} of {len(value)}: in the saved JSON)"
    return text.replace("|", "\\|")


def spread_of(figs: dict[str, Any], name: str) -> tuple[Any, Any] | None:
    """``(min, max)`` of a figure over its repetitions or seeds, wherever its bench keeps them:
    ``NAME_spread`` or ``BASE_spread_SIZE`` (``[min, median, max]``), ``NAME_min``/``NAME_max``,
    or ``spread[NAME]["values"]``."""
    base, _, size = name.rpartition("_")
    for key in (f"{name}_spread", f"{base}_spread_{size}"):
        value = figs.get(key)
        if isinstance(value, list) and len(value) == 3:
            return value[0], value[2]
    if f"{name}_min" in figs and f"{name}_max" in figs:
        return figs[f"{name}_min"], figs[f"{name}_max"]
    nested = figs.get("spread")
    values = nested.get(name, {}).get("values") if isinstance(nested, dict) else None
    if values:
        finite = [v for v in values if isinstance(v, int | float)]
        if len(finite) > 1:
            return min(finite), max(finite)
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
        "Where a bench repeats, a headline ratio is shown as `median (min-max)` over its "
        "repetitions; failed or timed-out iterations are counted (`failed`), never dropped. "
        "The machine is shared: the spread says how much that moved a figure.",
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
    lines += ["", "## Figures issue 18 asks for", "", "| bench | figure | value |", "|---|---|---|"]
    for bench, names in ISSUE_18.items():
        result = saved.get(bench, {})
        figs = result.get("figures", {})
        for n in names:
            value = figs.get(n)
            shown = "not measured" if value is None else _cell(value)
            if value is None and n in (figs.get("reasons") or {}):
                why = str(figs["reasons"][n]).replace("|", "\\|")     # the why, whole
                shown = why if why.startswith("not measured") else f"{shown}: {why}"
            between = spread_of(figs, n) if value is not None else None
            if between is not None:
                shown += f" ({_cell(between[0])}-{_cell(between[1])})"
            if result.get("quick"):
                shown += " (quick)"
            if n in (result.get("caveats") or {}):
                shown += f" (caveat: {result['caveats'][n]})"
            lines.append(f"| `{bench}` | `{n}` | {shown} |")
    for bench, spec in BENCHES.items():
        lines += ["", f"## `bench.{bench}`", "", spec.what[0].upper() + spec.what[1:] + ".", ""]
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
        lines += [f"| `{k}` | {_cell(v)} |" for k, v in result["figures"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--run", action="store_true", help="run the benches first and save their figures")
    p.add_argument("--quick", action="store_true", help="with --run: quick sizes (the page says so)")
    p.add_argument("--only", default=",".join(BENCHES), help="with --run: comma list of benches")
    p.add_argument("--results", type=Path, default=RESULTS, help="where results are saved and read")
    p.add_argument("--page", type=Path, default=PAGE, help="the page to write")
    a = p.parse_args(argv)
    if a.run:
        names = [n for n in a.only.split(",") if n]
        unknown = [n for n in names if n not in BENCHES]
        if unknown:
            p.error(f"--only: unknown bench(es) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
        a.results.mkdir(parents=True, exist_ok=True)
        for name in names:
            print(f"running bench.{name} ...", flush=True)
            (a.results / f"{name}.json").write_text(json.dumps(run_bench(name, a.quick), indent=1) + "\n")
    a.page.write_text(render(*load_results(a.results)))
    print(f"wrote {a.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
