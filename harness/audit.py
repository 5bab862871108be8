"""After a chaos run: what the durable state and the journal say happened, checked against every claim.

:func:`audit` recovers the run the way a restarted coordinator would (newest complete snapshot plus
the journal after it), lets that coordinator write a last snapshot, and then reads, from storage
only, never from logs:

- the final ledger: every unit must be done, by exactly one accepted lease;
- the journal: one entry per handled result, numbered without gaps, no lease journaled twice;
- the model: its version must equal the number of accepted results (each merge makes exactly one
  version in journal mode, so a result merged twice shows), it must be finite;
- every snapshot manifest: versions never go backwards as snapshots go forward;
- every receipt a worker recorded as ``accepted`` or ``duplicate``: the ledger must hold the same
  lease as accepted, at the same version, and the journal its entry (else it is *lost*);
- the versions an observer saw over the run: never decreasing, never above the final one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vcasync.checkpoint import CheckpointStore
from vcasync.coordinator import Coordinator, CoordinatorConfig
from vcasync.coordinator._journal import ENTRY_INLINE, ENTRY_REF, Journal
from vcasync.ledger import Ledger, UnitState
from vcasync.ledger._units import Receipt, WorkUnit
from vcasync.policy import MergePolicy
from vcasync.storage import Storage
from vcasync.tensors import ModelState
from vcasync.wire import decode_payload

__all__ = ["AuditReport", "audit"]


@dataclass(slots=True)
class AuditReport:
    """Counts and the first few offending items of each check."""

    units_total: int = 0
    units_done: int = 0
    remainders: int = 0
    parked: dict[str, str] = field(default_factory=dict)
    open_units: list[str] = field(default_factory=list)
    accepted_results: int = 0
    rejected_results: int = 0
    version_start: int = 0
    version_final: int = 0
    journal_entries: int = 0
    double_merges: int = 0
    results_acknowledged: int = 0
    results_lost: int = 0
    snapshots: int = 0
    versions_monotonic: bool = True
    model_finite: bool = True
    accuracy: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (not self.problems and self.double_merges == 0 and self.results_lost == 0
                and self.versions_monotonic and self.model_finite and not self.parked
                and not self.open_units)

    def note(self, problem: str) -> None:
        if len(self.problems) < 100:
            self.problems.append(problem)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "units_total": self.units_total, "units_done": self.units_done,
                "remainders": self.remainders, "parked": len(self.parked),
                "open_units": len(self.open_units), "accepted_results": self.accepted_results,
                "rejected_results": self.rejected_results, "version_start": self.version_start,
                "version_final": self.version_final, "journal_entries": self.journal_entries,
                "double_merges": self.double_merges, "results_acknowledged": self.results_acknowledged,
                "results_lost": self.results_lost, "snapshots": self.snapshots,
                "versions_monotonic": self.versions_monotonic, "model_finite": self.model_finite,
                "accuracy": self.accuracy, "problems": self.problems[:20]}


async def audit(storage: Storage, *, model: ModelState, units: Sequence[WorkUnit], policy: MergePolicy,
                config: CoordinatorConfig, receipts: Mapping[str, Sequence[Receipt]],
                observed_versions: Sequence[int] = (),
                evaluate: Callable[[ModelState], float] | None = None,
                one_version_per_merge: bool = True) -> AuditReport:
    """Check a finished run on ``storage`` (see the module docstring). ``receipts``: per worker (any
    name), the receipts it recorded, in order. ``one_version_per_merge``: the policy makes a new
    version from every accepted result (true of every built-in but the buffering ones, ``fedbuff``
    and ``sync``); then versions are counted against results."""
    rep = AuditReport(version_start=model.version)
    async with Coordinator(model, units, policy=policy, storage=storage, config=config) as coord:
        final = coord.model()
    journal = Journal(storage, config=config.journal_config(), spec=model.spec)
    await journal.open()
    rec = await journal.load_snapshot()
    if rec is None:
        rep.note("no snapshot on the storage")
        return rep
    if rec.version != final.version:
        rep.note(f"the last snapshot is version {rec.version}, the recovered model {final.version}")
    rep.version_final = final.version
    rep.model_finite = all(bool(t.isfinite().all()) for t in final.tensors.values()
                           if t.is_floating_point())
    if evaluate is not None and rep.model_finite:
        rep.accuracy = float(evaluate(final))
    accepted = _check_ledger(rep, rec.ledger, one_version_per_merge)
    await _check_journal(rep, storage, config, accepted)
    await _check_snapshots(rep, storage, config)
    _check_receipts(rep, receipts, accepted, one_version_per_merge)
    _check_observed(rep, observed_versions)
    return rep


def _check_ledger(rep: AuditReport, ledger: Mapping[str, Any],
                  one_version_per_merge: bool) -> dict[str, Receipt]:
    """Units and leases of the final ledger; returns the accepted receipts by lease id."""
    accepted: dict[str, Receipt] = {}
    per_unit: Counter[str] = Counter()
    versions: Counter[int] = Counter()
    led = Ledger.restore(ledger, clock=lambda: 0.0)     # whatever the snapshot's format
    for r in led.receipts():
        if r.status == "accepted":
            accepted[r.lease_id] = r
            per_unit[r.unit_id] += 1
            versions[r.version] += 1
        elif r.status == "rejected":
            rep.rejected_results += 1
    rep.accepted_results = len(accepted)
    for unit_id, n in per_unit.items():
        if n > 1:
            rep.double_merges += n - 1
            rep.note(f"unit {unit_id} has {n} accepted results")
    for version, n in versions.items():
        if n > 1 and one_version_per_merge:
            rep.note(f"{n} accepted results claim model version {version}")
    parked = led.parked()
    for unit, state in led.units():
        rep.units_total += 1
        rep.remainders += "~" in unit.unit_id
        if state is UnitState.DONE:
            rep.units_done += 1
        elif state is UnitState.PARKED:
            rep.parked[unit.unit_id] = parked[unit.unit_id]
        else:
            rep.open_units.append(unit.unit_id)
    merges = rep.version_final - rep.version_start
    if one_version_per_merge and merges != rep.accepted_results:
        rep.double_merges += max(0, merges - rep.accepted_results)
        rep.note(f"the model moved {merges} versions for {rep.accepted_results} accepted results")
    return accepted


async def _check_journal(rep: AuditReport, storage: Storage, config: CoordinatorConfig,
                         accepted: Mapping[str, Receipt]) -> None:
    prefix = f"{config.state_prefix.strip('/')}/journal/"
    keys = sorted([k async for k in storage.list(prefix)])
    seqs = [int(k.rsplit("/", 1)[1]) for k in keys]
    if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        rep.note(f"the journal has gaps: {len(seqs)} entries between {seqs[0]} and {seqs[-1]}")
    rep.journal_entries = len(keys)
    seen: Counter[str] = Counter()
    for key in keys:
        payload = await decode_payload(storage.open_read(key), limits=config.limits)
        if payload.kind not in (ENTRY_INLINE, ENTRY_REF):
            rep.note(f"journal entry {key} is a {payload.kind[:40]!r} payload")
        elif payload.meta.get("type") == "result":
            seen[str(payload.meta["lease_id"])] += 1
    for lease_id, n in seen.items():
        if n > 1:
            rep.double_merges += n - 1
            rep.note(f"lease {lease_id} is journaled {n} times")
    complete = bool(seqs) and seqs[0] == 1
    if complete:
        for lease_id in accepted:
            if lease_id not in seen:
                rep.note(f"accepted lease {lease_id} has no journal entry")


async def _check_snapshots(rep: AuditReport, storage: Storage, config: CoordinatorConfig) -> None:
    store = CheckpointStore(storage, f"{config.state_prefix.strip('/')}/snapshots")
    last_version = -1
    for step in await store.steps():
        manifest = await store.load(step)
        version = int(manifest.meta["version"])
        rep.snapshots += 1
        if version < last_version:
            rep.versions_monotonic = False
            rep.note(f"snapshot {step} is version {version}, after one at {last_version}")
        last_version = max(last_version, version)


def _check_receipts(rep: AuditReport, receipts: Mapping[str, Sequence[Receipt]],
                    accepted: Mapping[str, Receipt], one_version_per_merge: bool) -> None:
    told: dict[str, tuple[str, Receipt]] = {}
    for who, items in receipts.items():
        for r in items:
            if r.status in ("accepted", "duplicate"):
                told.setdefault(r.lease_id, (who, r))
    rep.results_acknowledged = len(told)
    by_version: defaultdict[int, set[str]] = defaultdict(set)
    for lease_id, (who, r) in told.items():
        held = accepted.get(lease_id)
        by_version[r.version].add(lease_id)
        if held is None:
            rep.results_lost += 1
            rep.note(f"{who} was told lease {lease_id} ({r.unit_id}) was {r.status} at v{r.version}; "
                     "the durable state does not have it")
        elif held.version != r.version or held.unit_id != r.unit_id:
            rep.results_lost += 1
            rep.note(f"{who} was told lease {lease_id} merged as v{r.version} of {r.unit_id}; the "
                     f"ledger says v{held.version} of {held.unit_id}")
    for version, leases in by_version.items():
        if len(leases) > 1 and one_version_per_merge:
            rep.note(f"workers were told {len(leases)} different results made version {version}")


def _check_observed(rep: AuditReport, observed: Sequence[int]) -> None:
    last = -math.inf
    for v in observed:
        if v < last:
            rep.versions_monotonic = False
            rep.note(f"an observer saw version {v} after {last}")
            break
        last = v
    if observed and max(observed) > rep.version_final:
        rep.versions_monotonic = False
        rep.note(f"an observer saw version {max(observed)}, above the final {rep.version_final}")
