"""Every route under hostile input (hypothesis): each answer a 4xx with a JSON reason, the model, the
ledger, the journal and the coordinator's memory unchanged, and it keeps serving. A few thousand
inputs here; ``python -m bench.chaos`` sends 100,000."""

from __future__ import annotations

import pytest

from harness import hostile_payloads as HP
from harness.fuzz import FuzzReport, fuzz, slow_loris
from harness.hostile import FAMILIES
from harness.probe import PAYLOAD

MiB = 1 << 20
PER_FAMILY = {"auth": 400, "join": 300, "control": 400, "path": 400, "result": 800, "replay": 50,
              "headers": 60}


def test_hostile_inputs_are_refused_and_change_nothing(target) -> None:
    proc, probe, ctx = target
    before = proc.memory()
    report = FuzzReport()
    for family in FAMILIES:
        fuzz(probe, ctx, examples=PER_FAMILY[family], families=(family,), report=report, seed=11)
    after = proc.memory()
    assert report.problems == [], report.problems[:10]
    assert report.state_changes == [], report.state_changes
    assert report.accepted == 0
    assert report.total >= 2000
    assert set(report.tried) == set(FAMILIES)
    assert report.duplicates >= 1                # the owner's replay: the same receipt, nothing new
    for family in FAMILIES:
        assert report.refused[family] + (report.duplicates if family == "replay" else 0) \
            == report.tried[family], family
    # A bomb or an overflowing shape never allocated what it declared: memory stays put.
    assert after["peak"] - before["peak"] < 64 * MiB, (before, after)
    assert after["rss"] - before["rss"] < 64 * MiB, (before, after)


def test_it_keeps_serving_honest_workers(target) -> None:
    _proc, probe, ctx = target
    assert probe.request("GET", "/healthz").status == 200
    lease = ctx.spare_leases[0]
    body = HP.valid_result(ctx.model, lease.lease_id, lease.base_version, steps=lease.steps)
    r = probe.request("PUT", f"/v1/leases/{lease.lease_id}/result", body=body,
                      headers={"Authorization": f"Bearer {ctx.attacker}", "Content-Type": PAYLOAD})
    assert r.status == 200
    assert r.message()["status"] == "accepted"
    ctx.spare_leases.pop(0)


@pytest.mark.slow
def test_slow_loris_is_cut_off_while_honest_workers_are_served(target) -> None:
    proc, probe, ctx = target
    report = slow_loris(proc.port, ctx, per_kind=2, trickle_s=0.5, duration_s=15.0)
    assert report.honest_failed == [], report.honest_failed
    assert report.honest_ok >= 10
    # Two stalled uploads held both decode slots; the honest one waited for the first cut-off only.
    assert report.honest_upload_s is not None
    assert report.honest_upload_s < 3.0 + 5.0
    cut = {k: v for k, v in report.answers.items() if k.startswith(("control", "upload"))}
    assert sum(v for k, v in cut.items() if k.endswith(":408")) >= 4, report.answers
    # Headers trickled in a byte at a time never finish: the connection is closed at idle_timeout_s.
    assert report.answers["headers:closed"] == 2, report.answers
    assert probe.request("GET", "/healthz").status == 200
