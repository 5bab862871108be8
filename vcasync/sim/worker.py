"""A simulated worker: the real lease / heartbeat / submit protocol against the real coordinator.

Only the machine is simulated: download and upload take ``latency + bytes / bandwidth`` of virtual
time, a training step takes ``batch * sample_cost_s / speed``; the model it trains and the result it
submits are real (real SGD on the signal, a real wire payload, the coordinator's real validation,
ledger and merge policy).

A preemption notice stops training at the next step: with ``on_notice="partial"`` the worker
uploads what it has (the coordinator merges it weighted by the steps done and requeues the rest),
with ``"abandon"`` it releases the lease. A kill (the notice ran out, or a hard preemption) cancels
the session wherever it is; :meth:`SimWorker.account_kill` books the work it loses.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..coordinator import Coordinator
from ..errors import LedgerError, NoWorkAvailableError, ValidationError, WireError, WorkerQuarantinedError
from ..examples.cnn import unit_batches
from ..ledger import LeaseGrant
from ..tensors import ModelSpec
from ..wire import aencode_payload, decode_payload
from .cpu import CpuShare, MergeQueue
from .fleet import MachineProfile
from .records import Recorder
from .signals import TrainingSignal

__all__ = ["ModelCache", "SimWorker", "Workload"]


@dataclass(frozen=True, slots=True)
class Workload:
    """The resolved training parameters every simulated worker shares."""

    batch_size: int
    lr: float
    momentum: float
    sample_cost_s: float
    unit_cpu_s: float
    model_bytes: int
    boot_s: float
    heartbeat_s: float
    idle_poll_s: float
    on_notice: str
    seed: int
    shards: tuple[np.ndarray, ...]


class ModelCache:
    """Decoded model versions fetched from the coordinator's real model payload, shared by workers."""

    def __init__(self, coordinator: Coordinator, spec: ModelSpec, keep: int) -> None:
        self._coord = coordinator
        self._spec = spec
        self._keep = max(2, keep)
        self._cache: dict[int, dict[str, torch.Tensor]] = {}

    async def get(self, version: int) -> dict[str, torch.Tensor]:
        hit = self._cache.get(version)
        if hit is not None:
            return hit
        payload = await decode_payload(self._coord.model_payload(version), spec=self._spec,
                                       expected_kind="model")
        self._cache[version] = payload.tensors
        for old in [v for v in self._cache if v < version - self._keep]:
            del self._cache[old]
        return payload.tensors


async def _wait_or(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` of virtual time; True at once if ``event`` fires first."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def _chunks(it: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in it:
        yield chunk


class SimWorker:
    """One machine session of one slot: join, then lease-train-submit until stopped."""

    def __init__(self, coordinator: Coordinator, signal: TrainingSignal, models: ModelCache,
                 work: Workload, profile: MachineProfile, rec: Recorder, cpu: CpuShare | None = None,
                 merges: MergeQueue | None = None) -> None:
        self._coord = coordinator
        self._signal = signal
        self._models = models
        self._work = work
        self._profile = profile
        self._rec = rec
        self._cpu = cpu if cpu is not None else CpuShare()
        self._merges = merges if merges is not None else MergeQueue()
        self._loop = asyncio.get_running_loop()
        # What the session holds right now, for accounting a kill.
        self._phase = "idle"
        self._phase_t0 = 0.0
        self._unit_t0 = 0.0   # when the current unit's work began (its download), for lost time
        self._steps_done = 0
        self._step_s = self.step_s

    @property
    def step_s(self) -> float:
        """One step's compute alone on this machine (before processor sharing)."""
        return self._work.batch_size * self._work.sample_cost_s / self._profile.speed

    def _now(self) -> float:
        return self._loop.time()

    def _event(self, kind: str, detail: str = "") -> None:
        self._rec.event(self._now(), self._profile.slot, kind, detail)

    async def run(self, notice: asyncio.Event, boot_s: float | None = None) -> None:
        """Boot (``boot_s``, default the workload's), join, and work until the run finishes or a
        notice stops the session."""
        await asyncio.sleep(self._work.boot_s if boot_s is None else boot_s)
        worker_id = await self._coord.join(f"slot-{self._profile.slot}",
                                           {"speed": self._profile.speed, "simulated": True})
        while not notice.is_set():
            try:
                grant = await self._coord.lease(worker_id)
            except WorkerQuarantinedError as exc:  # the real worker stops with that message; so does this one
                self._event("quarantined", str(exc))
                return
            except NoWorkAvailableError as exc:
                if exc.finished:
                    return
                await _wait_or(notice, max(exc.retry_after, self._work.idle_poll_s))
                continue
            self._rec.leases += 1
            self._event("lease", grant.unit.unit_id)
            await self._unit(worker_id, grant, notice)

    def account_kill(self) -> None:
        """Book the work a kill loses (called by the engine after cancelling the session)."""
        steps = self._steps_done
        if self._phase == "train":
            steps += int((self._now() - self._phase_t0) // self._step_s)
        if self._phase in ("train", "upload") and steps:
            samples = steps * self._work.batch_size
            self._rec.samples_trained += samples
            self._rec.samples_lost_preempted += samples
            self._rec.lost_spans.append((self._unit_t0, self._now()))
        self._phase = "idle"

    async def _compute(self, cpu_s: float) -> None:
        """``cpu_s`` of this machine's CPU outside training, shared like training (none: no time)."""
        if cpu_s <= 0:
            return
        self._cpu.running += 1
        try:
            await asyncio.sleep(cpu_s / self._profile.speed * self._cpu.stretch())
        finally:
            self._cpu.running -= 1

    def _batches(self, grant: LeaseGrant) -> list[np.ndarray]:
        unit = grant.unit
        root = str(unit.params.get("parent", unit.unit_id))
        offset = unit.step_offset
        seed = (self._work.seed * 1_000_003 + zlib.crc32(root.encode())) & 0x7FFFFFFF
        full = unit_batches(self._work.shards[unit.shard % len(self._work.shards)], offset + unit.steps,
                            self._work.batch_size, seed)
        return full[offset:]

    async def _unit(self, worker_id: str, grant: LeaseGrant, notice: asyncio.Event) -> None:
        self._phase, self._steps_done, self._unit_t0 = "download", 0, self._now()
        await asyncio.sleep(self._profile.transfer_s(self._work.model_bytes))
        try:
            base = await self._models.get(grant.base_version)
        except LedgerError:  # that version is gone: give the unit back and lease again
            await self._coord.release(worker_id, grant.lease_id, "base version gone")
            self._phase = "idle"
            return
        steps_total = grant.unit.steps
        hb = max(self.step_s, min(grant.heartbeat_interval_s, self._work.heartbeat_s))
        per_beat = max(1, math.floor(hb / self.step_s))
        noticed = False
        self._cpu.running += 1
        try:
            while self._steps_done < steps_total:
                n = min(steps_total - self._steps_done, per_beat)
                self._phase, self._phase_t0 = "train", self._now()
                self._step_s = self.step_s * self._cpu.stretch()
                if await _wait_or(notice, n * self._step_s):
                    self._steps_done += int((self._now() - self._phase_t0) // self._step_s)
                    noticed = True
                    break
                self._steps_done += n
                if self._steps_done < steps_total:
                    try:
                        await self._coord.heartbeat(worker_id, grant.lease_id, self._steps_done)
                    except LedgerError as exc:  # expired or taken away: the work is lost
                        self._lose(exc.__class__.__name__, expired=True)
                        return
        finally:
            self._cpu.running -= 1
        self._phase = "upload"
        done = self._steps_done
        samples = done * self._work.batch_size
        if done == 0 or (noticed and self._work.on_notice == "abandon"):
            self._lose("abandoned", expired=False)
            await self._coord.release(worker_id, grant.lease_id, "preempted")
            return
        weights, _ = self._signal.train(base, self._batches(grant), lr=self._work.lr,
                                        momentum=self._work.momentum, steps_limit=done)
        delta = {k: weights[k] - base[k] for k in base}
        await self._compute(self._work.unit_cpu_s)  # encode, upload, lease, download, decode
        await asyncio.sleep(self._profile.transfer_s(self._work.model_bytes))
        partial = done < steps_total
        meta: Mapping[str, object] = {
            "lease_id": grant.lease_id, "base_version": grant.base_version, "kind": "delta",
            "samples": samples, "steps": done, "partial": partial, "metrics": {}}
        self._rec.samples_trained += samples
        self._phase = "idle"
        await self._merges.serve()  # the coordinator merges one result at a time
        try:
            receipt = await self._coord.submit(worker_id, grant.lease_id,
                                               _chunks(aencode_payload("result", meta, delta)))
        except (LedgerError, ValidationError, WireError) as exc:
            self._rec.receipts["error"] += 1
            self._rec.reject_reasons[type(exc).__name__] += 1
            self._rec.samples_rejected += samples
            self._event("rejected", type(exc).__name__)
            return
        self._rec.receipts[receipt.status] += 1
        if receipt.status == "accepted":
            self._rec.samples_merged += samples
            self._rec.merged_at.setdefault(receipt.version, (self._now(), self._rec.samples_merged))
            if partial:
                self._rec.partial_results += 1
            tag = " partial" if partial else ""
            self._event("result", f"{grant.unit.unit_id} v{receipt.version}{tag}")
        elif receipt.status == "duplicate":
            self._rec.samples_duplicate += samples
        else:
            self._rec.samples_rejected += samples
            self._rec.reject_reasons[receipt.reason or "rejected"] += 1
            self._event("rejected", receipt.reason or "")

    def _lose(self, why: str, *, expired: bool) -> None:
        samples = self._steps_done * self._work.batch_size
        self._rec.samples_trained += samples
        if expired:
            self._rec.samples_expired += samples
        else:
            self._rec.samples_lost_preempted += samples
            if samples:
                self._rec.lost_spans.append((self._unit_t0, self._now()))
        self._event("lost", why)
        self._phase, self._steps_done = "idle", 0
