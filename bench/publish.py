"""Publish the benchmark figures: ``docs/benchmarks.md``, rendered from saved ``--json`` outputs.

    python -m bench.publish                # render the page from bench/results/*.json
    python -m bench.publish --run --quick  # run every bench (quick sizes) first, save, render
    python -m bench.publish --run          # the same at default sizes (each bench <= 20 min)
    python -m bench.publish --run --only codec,merge

``--run`` runs each bench as ``python -m bench.NAME --json`` in its own process, keeps its last
output line in ``bench/results/NAME.json`` (with the command and its configuration), and records the
machine it ran on (CPU model, cores, memory, Python and torch versions) in
``bench/results/machine.json``. The render reads only those files, so it is deterministic: a test
checks the committed page is what the saved figures render to, and that every figure issue 18 asks
for is on it (as "not measured" when its bench has not been run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"

#: bench name -> (extra arguments at default size, with --quick, what the headline compares against)
BENCHES: dict[str, tuple[list[str], list[str], str]] = {
    "codec": (["--sizes", "25m,100m"], ["--sizes", "25m", "--reps", "3"],
              "encode + decode of a ResNet-50 state dict against memcpy, bare zstandard and a "
              "CRC-32 floor (checksum + copy + checksum, no vcasync code), warm buffers"),
    "merge": ([], ["--quick"],
              "each built-in policy merging one result, against memcpy and against its traffic "
              "floor (memcpy time x model-sized streams / 2), warm, 1 torch thread"),
    "scale": ([], ["--workers", "10000", "--rounds", "1"],
              "simulated workers leasing and heartbeating: pooled, one connection each, TLS; "
              "against a bare aiohttp handler under the same load"),
    "e2e": ([], ["--quick"],
            "worker upload -> acknowledged -> merged, loopback, separate processes, against raw "
            "and durable aiohttp POSTs and raw TCP"),
    "modelsize": ([], ["--quick"],
                  "ingest time and coordinator RSS from 10 MB to the largest model memory allows"),
    "ledger": ([], ["--quick"],
               "a long run's ledger snapshot: its capture on the event loop, packing and reading "
               "back, against msgpack alone and the row format coordinators wrote before"),
}

#: Every figure issue 18 names, by bench: each appears on the page, measured or not.
ISSUE_18: dict[str, list[str]] = {
    "e2e": ["headline_durability", "e2e_vs_raw_post", "e2e_vs_durable_post"],
    "codec": ["raw_vs_memcpy_25m", "zstd_vs_library"],
    "merge": [f"{p}_vs_floor" for p in ("vcasgd", "fedasync", "fedbuff", "diloco", "median",
                                        "trimmed_mean", "gate", "sync")],
    "scale": ["p99_ms_10k_conn", "p99_ms_10k_tls", "failed_10k", "bytes_per_worker_10k",
              "heartbeats_vs_bare_aiohttp"],
    "modelsize": ["ingest_linearity", "rss_multiple_max"],
}


def machine() -> dict[str, Any]:
    """Where the figures were measured."""
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
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "python": platform.python_version(), "torch": torch.__version__,
            "os": f"{platform.system()} {platform.release()}",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_average_at_start": None if load is None else round(load, 2)}


def run_bench(name: str, quick: bool) -> dict[str, Any]:
    """Run one bench with ``--json``; its last output line, with how it was run."""
    default, fast, _ = BENCHES[name]
    cmd = [sys.executable, "-m", f"bench.{name}", *(fast if quick else default), "--json"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench.{name} failed ({out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {"command": "python -m " + " ".join([f"bench.{name}", *cmd[3:]]),
            "seconds": round(time.monotonic() - t0, 1), "figures": figures}


def load_results(directory: Path = RESULTS) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``(machine, {bench: saved result})`` from ``directory`` (missing files: not measured)."""
    mfile = directory / "machine.json"
    mach = json.loads(mfile.read_text()) if mfile.exists() else {}
    saved = {name: json.loads((directory / f"{name}.json").read_text())
             for name in BENCHES if (directory / f"{name}.json").exists()}
    return mach, saved


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int | float) for v in value):
        return f"{value[1]:.4g} ({value[0]:.4g}-{value[2]:.4g})"
    text = json.dumps(value) if not isinstance(value, str) else value
    return text.replace("|", "\\|")


def render(mach: dict[str, Any], saved: dict[str, dict[str, Any]]) -> str:
    """The page, from the saved figures alone (same input, same bytes)."""
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench.publish` from the `--json` output of each benchmark "
        "(saved in `bench/results/`); never edited by hand. Regenerate with "
        "`python -m bench.publish --run --quick` (or `--run` for the default sizes).",
        "",
        "Every figure is a ratio against a reference measured in the same run, on the same data. "
        "Where a bench repeats, a headline ratio is shown as `median (min-max)` over its "
        "repetitions; failed or timed-out iterations are counted (`failed`), never dropped. "
        "The machine is shared: the spread says how much that moved a figure.",
        "",
        "## Machine",
        "",
    ]
    if mach:
        lines += ["| | |", "|---|---|"]
        lines += [f"| {k.replace('_', ' ')} | {_cell(v)} |" for k, v in mach.items()]
    else:
        lines.append("Not recorded: no bench has been run with `--run`.")
    lines += ["", "## Figures issue 18 asks for", "", "| bench | figure | value |", "|---|---|---|"]
    for bench, names in ISSUE_18.items():
        figs = saved.get(bench, {}).get("figures", {})
        for n in names:
            value = figs.get(n)
            spread = figs.get(f"{n}_spread")
            shown = "not measured" if value is None else _cell(value)
            if spread is not None:
                shown += f" ({_cell(spread[0])}-{_cell(spread[2])})"
            lines.append(f"| `{bench}` | `{n}` | {shown} |")
    for bench, (_, _, what) in BENCHES.items():
        lines += ["", f"## `bench.{bench}`", "", what[0].upper() + what[1:] + ".", ""]
        result = saved.get(bench)
        if result is None:
            lines.append(f"Not measured: run `python -m bench.publish --run --only {bench}`.")
            continue
        lines += [f"Command: `{result['command']}` ({result['seconds']} s).", "",
                  "| figure | value |", "|---|---|"]
        lines += [f"| `{k}` | {_cell(v)} |" for k, v in result["figures"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--run", action="store_true", help="run the benches first and save their figures")
    p.add_argument("--quick", action="store_true", help="with --run: quick sizes")
    p.add_argument("--only", default=",".join(BENCHES), help="with --run: comma list of benches")
    a = p.parse_args(argv)
    if a.run:
        names = [n for n in a.only.split(",") if n]
        unknown = [n for n in names if n not in BENCHES]
        if unknown:
            raise SystemExit(f"unknown bench(es) {unknown}; known: {sorted(BENCHES)}")
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "machine.json").write_text(json.dumps(machine(), indent=1) + "\n")
        for name in names:
            if not (ROOT / "bench" / f"{name}.py").exists():
                print(f"bench.{name}: not in this tree, skipped")
                continue
            print(f"running bench.{name} ...", flush=True)
            (RESULTS / f"{name}.json").write_text(json.dumps(run_bench(name, a.quick), indent=1) + "\n")
    PAGE.write_text(render(*load_results()))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
