"""Render ``docs/RELIABILITY.md`` from the figures ``python -m bench.chaos`` saved (never by hand)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _v(fig: dict[str, Any], key: str, fmt: str = "{}") -> str:
    value = fig.get(key)
    if value is None:
        return "not measured"
    return fmt.format(value)


def _other_exits(fig: dict[str, Any]) -> str:
    """The SIGTERMed workers neither counted clean nor escalated: they exited with another status
    within the grace period (the README promises 0), so the table must not hide them."""
    other = fig["worker_sigterm"] - fig["sigterm_clean_exits"] - fig["sigterm_escalated"]
    return f", **{other}** exited within it with a status other than 0" if other else ""


def _chaos(fig: dict[str, Any]) -> list[str]:
    if "worker_kills" not in fig:
        return ["The chaos section was not part of the last run."]
    moments = ", ".join(fig.get("coordinator_kill_moments", []))
    return [
        f"A coordinator and {fig['workers']} worker processes (the real `vcasync coordinator` and "
        "`vcasync worker` commands) trained the digits example while they were killed. Storage faults "
        f"were injected all along (`{fig['storage_faults']}`: writes failed before or after they "
        "happened, a share of all calls was slowed).",
        "",
        "| | |", "|---|---|",
        f"| worker kills survived | **{fig['worker_kills']}** ({fig['worker_sigterm']} SIGTERM with a "
        f"grace period, {fig['worker_sigkill']} SIGKILL; {fig['sigterm_clean_exits']} preempted workers "
        f"saved and exited cleanly, {fig['sigterm_escalated']} overran the grace and were SIGKILLed"
        f"{_other_exits(fig)}) |",
        f"| coordinator SIGKILLs | **{fig['coordinator_kills']}** ({moments}); "
        f"{fig['coordinator_kills_verified']} provably at that moment |",
        f"| coordinator restarts | {fig['coordinator_restarts']} (of which {fig['coordinator_crashes']} "
        "after it exited by itself, see below) |",
        f"| results acknowledged to workers | {fig['results_acknowledged']} |",
        f"| acknowledged results lost | **{fig['results_lost']}** |",
        f"| double merges | **{fig['double_merges']}** |",
        f"| work units | {fig['units']} ({fig['remainder_units']} remainders of partial results), "
        f"{fig['units_done']} merged exactly once, {fig['parked_units']} parked |",
        f"| journal entries / snapshots audited | {fig['journal_entries']} / {fig['snapshots']} |",
        f"| versions monotonic | {fig['versions_monotonic']} |",
        f"| final model finite | {fig['model_finite']} |",
        f"| test accuracy, chaos / undisturbed fleet | {_v(fig, 'accuracy', '{:.4f}')} / "
        f"{_v(fig, 'accuracy_undisturbed', '{:.4f}')} (gap {_v(fig, 'accuracy_gap', '{:+.4f}')}) |",
        f"| wall time, chaos / undisturbed | {fig['chaos_seconds']} s / {fig['undisturbed_seconds']} s |",
        "",
        "Checked after the run from the durable state alone (`harness.audit`): the run is "
        "recovered as a restarted coordinator would recover it; every unit of the final ledger must be "
        "done by exactly one accepted lease; the journal must be numbered without gaps and hold each "
        "lease at most once; the model version must equal the number of accepted results (a double "
        "merge would add a version); snapshot versions never go back; every receipt a worker recorded "
        "(`receipts.jsonl`, fsynced) as accepted must be in the ledger at the same version and in the "
        "journal, else it counts as lost; the versions an observer polled never went back.",
    ] + (["", "Why the coordinator exited by itself (the last line of its log; it was restarted and "
          "recovered): " + "; ".join(f"`{c}`" for c in fig["coordinator_crash_causes"])]
         if fig.get("coordinator_crash_causes") else []) \
      + (["", f"Audit problems: {fig['audit_problems']}"] if fig.get("audit_problems") else [])


def _fuzz(fig: dict[str, Any]) -> list[str]:
    if "hostile_inputs" not in fig:
        return ["The hostile-input section was not part of the last run."]
    fam = ", ".join(f"{k} {v:,}" for k, v in sorted(fig.get("hostile_by_family", {}).items()))
    answers = ", ".join(f"{k}: {v:,}" for k, v in sorted(fig.get("hostile_answers", {}).items()))
    return [
        "| | |", "|---|---|",
        f"| hostile inputs tried | **{fig['hostile_inputs']:,}** ({fam}; plus "
        f"{fig['slow_loris_connections']} slow-loris connections) |",
        f"| refused with a 4xx and a JSON reason | {fig['hostile_refused']:,} "
        f"(and {fig['hostile_duplicates']} owner replays answered with the first receipt) |",
        f"| accepted, or changed the model / ledger / journal | **{fig['hostile_accepted']}** |",
        f"| answers | {answers} |",
        f"| coordinator memory | {fig['rss_before_mib']:.0f} MiB before, {fig['rss_after_mib']:.0f} MiB "
        f"after; peak grew {fig['peak_rss_growth_mib']:.1f} MiB |",
        f"| slow-loris | {fig['slow_loris_cut_off']} of {fig['slow_loris_connections']} trickling "
        f"connections cut off ({fig['slow_loris_answers']}); {fig['slow_loris_honest_ok']} honest "
        f"heartbeats answered meanwhile, {fig['slow_loris_honest_failed']} failed; an honest upload "
        f"waited {_v(fig, 'slow_loris_honest_upload_s', '{:.1f}')} s |",
        f"| still serving afterwards | {fig['serving_after']} |",
        f"| rate | {fig['fuzz_inputs_per_s']:.0f} inputs/s |",
        "",
        "Families (`harness.hostile`, hypothesis strategies): bad credentials on every "
        "protected route (none, malformed, forged, tampered, foreign, the join secret); wrong join "
        "credentials; random, truncated, mistyped, oversized and wrong-kind control bodies; unknown, "
        "overlong and other workers' lease ids, bad model versions, unknown routes and methods; "
        "results that are random, truncated, byte-flipped, padded, or valid but for one field "
        "(metadata, a tensor's name, shape or dtype, NaN/Inf), with declared shapes that overflow, "
        "dtypes and codecs outside the allow-lists, lying counts, a 4 GiB header, zstd decompression "
        "bombs; replays to other workers' and closed leases; oversized and too many headers. Every "
        "answer is checked, and the coordinator's model digest, ledger counts, journal position and "
        "merge count are compared every 500 inputs and at the end.",
    ] + (["", f"Problems: {fig['hostile_problems']} {fig['state_changes']}"]
         if fig.get("hostile_problems") or fig.get("state_changes") else [])


def _load(fig: dict[str, Any]) -> list[str]:
    if "load_workers" not in fig:
        return ["The load section was not part of the last run."]
    return [
        "| | |", "|---|---|",
        f"| simulated workers | **{fig['load_workers']:,}**, heartbeat every {fig['load_interval_s']:g} s, "
        f"lease timeout {fig['load_lease_timeout_s']:g} s |",
        f"| lease + heartbeat latency | p50 {fig['load_p50_ms']:.2f} ms, "
        f"p99 **{fig['load_p99_ms']:.2f} ms** |",
        f"| results merged meanwhile | {fig['load_merges']:,} ({fig['load_merges_per_s']:.0f}/s, "
        "100,000-parameter deltas) |",
        f"| leases expired wrongly | **{fig['load_leases_expired']}** |",
        f"| failed requests | {fig['load_errors']} |",
        f"| coordinator memory per worker | {fig['load_bytes_per_worker']:,.0f} bytes (retained model "
        "versions included) |",
    ]


def render(fig: dict[str, Any], source: Path | str) -> str:
    lines = [
        "# Reliability",
        "",
        f"Generated by `python -m bench.chaos --write-docs` from `{source}`, the figures of the last "
        f"run ({fig.get('mode', '?')} mode, {fig.get('date', '?')}, {fig.get('machine', '?')}, "
        f"{fig.get('total_seconds', '?')} s, seed {fig.get('seed', '?')}). Do not edit by hand: "
        "re-run it.",
        "",
        "## Kills survived, nothing lost",
        "",
        *_chaos(fig),
        "",
        "## Hostile input",
        "",
        *_fuzz(fig),
        "",
        "## Load held",
        "",
        *_load(fig),
        "",
        "## Limits of these figures, and known gaps",
        "",
        "- One seed, one run, on a shared 2-core machine; worker kills are paced to the run's progress "
        "(the machine's speed varies), coordinator kills spread over 10-70 % of it.",
        "- The mid-upload coordinator kill is made while the chaos driver, acting as one more worker, "
        "has sent half of a real result: a real worker's 156 KB upload is over before a kill can land.",
        "- Injected storage faults are given as rates (above); they happen inside the coordinator "
        "process, which is SIGKILLed, so they are not counted.",
        "- A storage write that fails while the coordinator starts (its run record, its first "
        "snapshot) ended the process with exit 1 in runs taken before start-up was retried; restarted, "
        "it recovered. Start-up now retries a transient fault as a whole, five times (see "
        "[Runs](runs.md#transient-faults-while-starting)); one that outlasts them still exits, and a "
        "restart recovers.",
        "- After a coordinator restart, a delta based on a version older than the recovered snapshot is "
        "refused (`base_unavailable`) even within `max_staleness`: that unit is trained again (not counted "
        "against the worker; the refusal closes the lease, so nothing is resent as full weights; see "
        "[Limits](limits.md)).",
        "- A slow-loris that trickles its *headers* gets no answer: its connection is closed once it "
        "has not finished a request head for `idle_timeout_s` (75 s by default, 4 s in this run; "
        "aiohttp's keep-alive timeout, armed at connect). Trickling bodies are cut off with 408 "
        "(`body_idle_timeout_s`, `min_upload_bytes_per_s`).",
        "",
        "## Re-run",
        "",
        "```sh",
        "python -m bench.chaos --json --write-docs             # the long run (about 15 minutes here)",
        "python -m bench.chaos --quick --json                  # the CI sizes",
        "pytest tests/chaos tests/hostile tests/security       # the same checks, shorter, in CI",
        "```",
        "",
    ]
    return "\n".join(lines)
