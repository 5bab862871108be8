"""The short chaos run (CI): a real coordinator and 8 real worker processes train the digits example
while workers get SIGTERM and SIGKILL, the coordinator is SIGKILLed at each kind of moment, and its
storage fails and slows calls. ``python -m bench.chaos`` runs the long version.

Checked from the durable state, the journal and the workers' receipt logs (not from logs): every unit
merged exactly once, no acknowledged result lost, versions monotonic, the model finite and within
``TOLERANCE`` of the accuracy of the same units merged undisturbed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.chaos import DEFAULT_FAULTS, JOIN_SECRET, PAUSE_KINDS, ChaosConfig, run_chaos
from harness.chaos_driver import reference_accuracy

#: Accuracy points the disturbed run may lose against the undisturbed reference (360 test images:
#: one point is 3.6 images; asynchronous merging with staleness alone costs about one).
TOLERANCE = 0.05

CI = ChaosConfig(workers=8, worker_kills=12, shards=8, epochs=5, steps=40,
                 coordinator_kills=("merge", "snapshot", "upload", "journal", "random"),
                 kill_interval_s=2.0, storage_faults=DEFAULT_FAULTS, timeout_s=420.0, seed=7)


@pytest.mark.slow
async def test_a_fleet_survives_worker_and_coordinator_kills_and_storage_faults(tmp_path: Path) -> None:
    res = await run_chaos(CI, tmp_path / "run")
    undisturbed = await asyncio.to_thread(reference_accuracy, CI, tmp_path / "reference")
    detail = res.as_dict()
    assert res.finished, detail

    # every kind of kill happened
    # Kills are paced to the run's progress; on a machine fast enough to finish before the last ones,
    # a few may be left out (bench.chaos reports the exact count), never many.
    assert res.total_worker_kills >= CI.worker_kills * 3 // 4, detail
    assert res.worker_kills["sigterm"] >= 1, detail
    assert res.worker_kills["sigkill"] >= 1, detail
    kinds = [k["kind"] for k in res.coordinator_kills]
    # The notes say why a kill was postponed: as one string, which pytest shows whole (any other
    # object, the detail dict or a tuple of the notes, is cut to 240 characters of its repr).
    assert sorted(kinds) == sorted(CI.coordinator_kills), "\n".join([f"kills made: {kinds}",
                                                                     *res.notes[-10:]])
    for kill in res.coordinator_kills:
        assert kill["verified"], kill          # the process was provably at that moment
        if kill["kind"] in PAUSE_KINDS:
            assert kill["occurrence"] >= 1

    # what the durable state says
    audit = res.audit
    assert audit is not None
    assert audit.problems == [], audit.problems
    assert audit.units_done == audit.units_total >= CI.units_total
    assert not audit.parked
    assert not audit.open_units
    assert audit.double_merges == 0
    assert audit.results_lost == 0
    # Most receipts reach a worker's log (a worker killed between the answer and its fsync re-sends
    # its spooled result after the restart and records the duplicate receipt, unless the run ended).
    assert audit.results_acknowledged >= audit.accepted_results // 2
    assert audit.accepted_results == audit.version_final - audit.version_start
    assert audit.versions_monotonic
    assert len(res.observed) > 3
    assert audit.model_finite
    assert audit.accuracy is not None
    assert audit.accuracy >= undisturbed - TOLERANCE, (audit.accuracy, undisturbed)

    # Every process's log across the run: no join secret, no worker token, not even half of one.
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "run" / "logs").glob("*.log"))
    assert "result for lease" in logs
    assert "coordinator listening" in logs
    tokens = [json.loads(p.read_text())["token"]
              for p in (tmp_path / "run" / "workers").glob("w*/identity.json")]
    assert len(tokens) == CI.workers
    for secret in (JOIN_SECRET, *tokens, *(t.split("_", 2)[2] for t in tokens)):
        assert secret not in logs
