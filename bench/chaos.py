"""The long hardening run: chaos, hostile input and load, measured (``python -m bench.chaos``).

Sections (``--only`` picks some):

``chaos``  a coordinator and 8 worker processes train the digits example while workers get
           ``--worker-kills`` SIGTERMs and SIGKILLs and the coordinator is SIGKILLed mid-merge,
           mid-snapshot, mid-upload, after a journal write and at random (``harness.chaos``),
           with storage faults; then the audit of its durable state. The *same fleet undisturbed*
           (no kills, no faults) runs in the same invocation as the accuracy reference.
``fuzz``   ``--inputs`` hostile inputs over every route (``harness.hostile``) against a
           coordinator process, and a slow-loris attack.
``load``   ``bench.load``: 10,000 simulated workers heartbeating while results are merged.

``--json`` prints one JSON object on the last line: ``worker_kills``, ``coordinator_kills``,
``results_lost``, ``double_merges``, ``hostile_inputs``, ``hostile_accepted`` first, then the rest.
A long run saves its figures to ``--results`` (default ``docs/reliability.json``, the published
figures); a ``--quick`` run saves them only where ``--results`` says (it overwrote the published
long-run figures before). ``--write-docs`` renders ``docs/RELIABILITY.md`` from that file (after
running, or alone with ``--only none``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.chaos import DEFAULT_FAULTS, ChaosConfig, run_chaos
from harness.fuzz import FuzzReport, fuzz, slow_loris
from harness.hostile import FAMILIES, prepare
from harness.probe import CoordinatorProcess, HttpProbe

from . import load as load_bench
from ._reliability import render
from ._stats import add_quick, non_negative_int, one_of, parse_args, positive_int
from .publish import provenance

ROOT = Path(__file__).resolve().parents[1]
#: Share of the hostile inputs per family (replays have six distinct cases: they end after those).
SHARES = {"result": 0.41, "auth": 0.14, "control": 0.14, "path": 0.14, "join": 0.12, "headers": 0.05,
          "replay": 0.01}
FUZZ_SECRET = "bench-hostile-join-secret-0123456789"


def chaos_config(a: argparse.Namespace) -> ChaosConfig:
    if a.quick:
        return ChaosConfig(workers=8, worker_kills=a.worker_kills, shards=8, epochs=5, steps=40,
                           kill_interval_s=2.0, storage_faults=DEFAULT_FAULTS, seed=a.seed,
                           timeout_s=600.0)
    return ChaosConfig(workers=8, worker_kills=a.worker_kills, shards=8, epochs=12, steps=60,
                       coordinator_kills=("merge", "snapshot", "upload", "journal", "random",
                                          "merge", "snapshot", "upload"),
                       kill_interval_s=1.2, storage_faults=DEFAULT_FAULTS, seed=a.seed, timeout_s=1500.0)


def section_chaos(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    cfg = chaos_config(a)
    t0 = time.perf_counter()
    res = asyncio.run(run_chaos(cfg, work / "chaos"))
    chaos_s = time.perf_counter() - t0
    ref = asyncio.run(run_chaos(cfg.undisturbed(), work / "undisturbed"))
    audit, ref_audit = res.audit, ref.audit
    if audit is None or ref_audit is None:
        raise RuntimeError("a chaos run came back without its audit")
    out: dict[str, Any] = {
        "worker_kills": res.total_worker_kills,
        "worker_sigterm": res.worker_kills["sigterm"], "worker_sigkill": res.worker_kills["sigkill"],
        "sigterm_escalated": res.worker_kills["escalated"], "sigterm_clean_exits": res.sigterm_clean_exits,
        "coordinator_kills": len(res.coordinator_kills),
        "coordinator_kill_moments": [k["kind"] for k in res.coordinator_kills],
        "coordinator_kills_verified": sum(bool(k.get("verified")) for k in res.coordinator_kills),
        "coordinator_restarts": res.coordinator_starts - 1,
        "coordinator_crashes": len(res.coordinator_crashes),
        "coordinator_crash_causes": [n for n in res.notes if n.startswith("coordinator exited")][:10],
        "results_lost": audit.results_lost, "double_merges": audit.double_merges,
        "results_acknowledged": audit.results_acknowledged, "accepted_results": audit.accepted_results,
        "rejected_results": audit.rejected_results, "units": audit.units_total,
        "units_done": audit.units_done, "remainder_units": audit.remainders,
        "parked_units": len(audit.parked), "journal_entries": audit.journal_entries,
        "snapshots": audit.snapshots, "versions_monotonic": audit.versions_monotonic,
        "model_finite": audit.model_finite, "audit_ok": audit.ok, "audit_problems": audit.problems[:10],
        "accuracy": audit.accuracy, "accuracy_undisturbed": ref_audit.accuracy,
        "accuracy_gap": (ref_audit.accuracy or 0.0) - (audit.accuracy or 0.0),
        "chaos_seconds": round(chaos_s, 1), "undisturbed_seconds": round(ref.seconds, 1),
        "storage_faults": cfg.storage_faults, "workers": cfg.workers,
        "undisturbed_audit_ok": ref_audit.ok,
    }
    return out


def section_fuzz(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    inputs = a.inputs
    table = {"model": {"factory": "vcasync.examples.digits:model"},
             "units": {"shards": 4, "epochs": 4, "steps": 20},
             "storage": {"url": f"file://{work / 'fuzz' / 'store'}"},
             "coordinator": {"durability": "journal", "lease_timeout_s": 7200.0},
             "server": {"body_idle_timeout_s": 3.0, "upload_rate_grace_s": 2.0, "upload_rate_window_s": 2.0,
                        "min_upload_bytes_per_s": 4096.0, "idle_timeout_s": 4.0, "access_log": False}}
    report = FuzzReport()
    with CoordinatorProcess(work / "fuzz", table, join_secret=FUZZ_SECRET) as proc, \
            HttpProbe("127.0.0.1", proc.port) as probe:
        ctx = prepare(probe, FUZZ_SECRET, spare=3)
        before = proc.memory()
        for family in FAMILIES:
            fuzz(probe, ctx, examples=max(10, int(inputs * SHARES[family])), families=(family,),
                 report=report, seed=a.seed, check_every=500)
        after_fuzz = proc.memory()
        loris = slow_loris(proc.port, ctx, per_kind=2, trickle_s=0.5, duration_s=15.0)
        alive = probe.request("GET", "/healthz").status == 200
        after = proc.memory()
    slow_inputs = loris.connections
    return {"hostile_inputs": report.total + slow_inputs, "hostile_accepted": report.accepted,
            "hostile_refused": sum(report.refused.values()), "hostile_duplicates": report.duplicates,
            "hostile_by_family": dict(report.tried), "hostile_answers": dict(report.answers),
            "hostile_problems": report.problems[:10], "state_changes": report.state_changes[:10],
            "fuzz_seconds": round(report.seconds, 1), "fuzz_inputs_per_s": report.total / report.seconds,
            "rss_before_mib": before["rss"] / 2**20, "rss_after_mib": after["rss"] / 2**20,
            "peak_rss_growth_mib": (after_fuzz["peak"] - before["peak"]) / 2**20,
            "slow_loris_connections": loris.connections, "slow_loris_cut_off": loris.cut_off,
            "slow_loris_answers": dict(loris.answers), "slow_loris_honest_ok": loris.honest_ok,
            "slow_loris_honest_failed": len(loris.honest_failed),
            "slow_loris_honest_upload_s": loris.honest_upload_s, "serving_after": alive}


def section_load(a: argparse.Namespace) -> dict[str, Any]:
    n, interval, rounds = (1000, 2.0, 2) if a.quick else (10_000, 10.0, 3)
    r = load_bench.load(n, interval, rounds, 256, 4, 100_000, 3.0)
    return {"load_workers": r["workers"], "load_requests": r["requests"], "load_p50_ms": r["p50_ms"],
            "load_p99_ms": r["p99_ms"], "load_heartbeat_p99_ms": r["heartbeat_p99_ms"],
            "load_merges": r["merges"], "load_merges_per_s": r["merges_per_s"],
            "load_leases_expired": r["leases_expired"], "load_bytes_per_worker": r["bytes_per_worker"],
            "load_errors": sum(r["errors"].values()) + sum(r["submit_errors"].values()),
            "load_interval_s": interval, "load_lease_timeout_s": 3.0 * interval}


FIRST = ("worker_kills", "coordinator_kills", "results_lost", "double_merges", "hostile_inputs",
         "hostile_accepted")


def _table(fig: dict[str, Any]) -> None:
    rows = [("worker kills (SIGTERM / SIGKILL)", "worker_kills", "worker_sigterm", "worker_sigkill"),
            ("coordinator SIGKILLs (verified)", "coordinator_kills", "coordinator_kills_verified", None),
            ("results acknowledged / lost", "results_acknowledged", "results_lost", None),
            ("double merges", "double_merges", None, None),
            ("accuracy chaos / undisturbed", "accuracy", "accuracy_undisturbed", None),
            ("hostile inputs / accepted", "hostile_inputs", "hostile_accepted", None),
            ("load: workers / p99 ms / expired", "load_workers", "load_p99_ms", "load_leases_expired")]
    for label, *keys in rows:
        vals = [fig.get(k) for k in keys if k is not None]
        if all(v is None for v in vals):
            continue
        shown = " / ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in vals)
        print(f"  {label:<36} {shown}")


QUICK: dict[str, Any] = {"worker_kills": 12, "inputs": 3000}
SECTIONS = ("chaos", "fuzz", "load", "none")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_quick(p, QUICK, "the CI sizes (a few minutes)")
    p.add_argument("--only", type=one_of(SECTIONS), default="chaos,fuzz,load",
                   help="sections, comma-separated ('none': none)")
    p.add_argument("--worker-kills", type=non_negative_int, default=100, help="default 100")
    p.add_argument("--inputs", type=positive_int, default=100_000, help="hostile inputs (default 100,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", type=Path, default=None,
                   help="where the figures are saved (default docs/reliability.json for a long run; "
                        "a --quick run is saved only when this is given)")
    p.add_argument("--write-docs", action="store_true", help="render docs/RELIABILITY.md from --results")
    p.add_argument("--json", action="store_true")
    return parse_args(p, argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    published = ROOT / "docs" / "reliability.json"
    save_to = a.results if a.results is not None else (None if a.quick else published)
    a.results = a.results if a.results is not None else published    # what --write-docs reads
    sections = {s for s in a.only.split(",") if s and s != "none"}
    fig: dict[str, Any] = {}
    if sections:
        started = time.perf_counter()
        code = {k: v for k, v in provenance().items() if k in ("commit", "dirty")}   # what is measured
        with tempfile.TemporaryDirectory(prefix="vcasync-chaos-") as tmp:
            work = Path(tmp)
            if "chaos" in sections:
                fig.update(section_chaos(a, work))
            if "fuzz" in sections:
                fig.update(section_fuzz(a, work))
        if "load" in sections:
            fig.update(section_load(a))
        fig.update({"mode": "quick" if a.quick else "long", "sections": sorted(sections),
                    "total_seconds": round(time.perf_counter() - started, 1),
                    "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
                    **code,
                    "seed": a.seed})
        ordered = {**{k: fig[k] for k in FIRST if k in fig}, **fig}
        if save_to is not None:
            save_to.parent.mkdir(parents=True, exist_ok=True)
            save_to.write_text(json.dumps(ordered, indent=1, default=str) + "\n")
        where = (f"in {save_to}" if save_to is not None
                 else "not saved (--quick; --results PATH saves them)")
        print(f"hardening run ({ordered['mode']}, {ordered['total_seconds']}s), figures {where}")
        _table(ordered)
        fig = ordered
    if a.write_docs:
        saved = json.loads(a.results.read_text())
        target = ROOT / "docs" / "RELIABILITY.md"
        target.write_text(render(saved, a.results.relative_to(ROOT) if a.results.is_relative_to(ROOT)
                                 else a.results))
        print(f"wrote {target}")
    if a.json and fig:
        print(json.dumps(fig, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
