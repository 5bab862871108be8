"""The demo's trainer: any example workload (:mod:`vcasync.examples.workloads`) as a vcasync job.

    vcasync coordinator --model vcasync.examples.digits:model --unit-param 'workload="digits"' ...
    vcasync worker --trainer vcasync.demo.trainer:train ...

A unit trains ``unit.steps`` optimiser steps on its shard; the minibatch sequence is seeded by the root
unit id, so a remainder unit (``params["step_offset"]``) or a resumed lease continues the same sequence.
Unit ``params``: ``workload`` (``digits``; ``mnist5000``, ``tinylm``), ``lr`` (the workload's default),
``batch_size`` (the workload's), ``momentum`` (0.9, SGD workloads), ``checkpoint_every`` (10),
``min_step_s`` (0: a step takes at least this long, so a demo on a fast machine still has work in flight
for its spot market to preempt), and ``events_dir``: when set, the trainer appends one JSON line per
unit start/end/stop to ``<events_dir>/<pid>.jsonl`` (wall clock ``t`` and the process's CPU seconds
``cpu``), which the demo turns into its worker timeline.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..examples.cnn import shard_indices, unit_batches
from ..examples.workloads import get_workload
from ..trainer import TrainContext, TrainResult

__all__ = ["parse_event", "train"]


def _num(params: Mapping[str, object], name: str, default: float) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"unit param {name!r} must be a number, got {value!r}")
    return float(value)


def _log(events_dir: object, kind: str, unit_id: str, **extra: object) -> None:
    if not isinstance(events_dir, str) or not events_dir:
        return
    line = json.dumps({"t": time.time(), "cpu": time.process_time(), "pid": os.getpid(), "kind": kind,
                       "unit": unit_id, **extra})
    path = Path(events_dir) / f"{os.getpid()}.jsonl"
    with path.open("a") as f:
        f.write(line + "\n")


def parse_event(line: bytes | str) -> dict[str, Any] | None:
    """One line :func:`_log` wrote, or None for a line it did not (one cut by SIGKILL): the one
    reading of the events files, for the report (whole files) and the spot market (as written)."""
    try:
        ev = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return ev if isinstance(ev, dict) and isinstance(ev.get("pid"), int) else None


def train(ctx: TrainContext) -> TrainResult:
    """Train this unit's steps on its shard; checkpoint every few steps; stop early when told."""
    unit = ctx.unit
    params = unit.params
    work = get_workload(str(params.get("workload", params.get("dataset", "digits"))))
    lr = _num(params, "lr", work.lr)
    batch = int(_num(params, "batch_size", work.batch_size))
    momentum = _num(params, "momentum", 0.9)
    every = max(1, int(_num(params, "checkpoint_every", 10)))
    min_step_s = _num(params, "min_step_s", 0.0)
    events = params.get("events_dir")
    net = work.model()
    ctx.model.load_into(net)
    opt = work.optimizer(net.parameters(), lr, momentum)
    start = 0
    ck = ctx.load_checkpoint()
    if ck is not None:
        net.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        start = int(ck["step"])
    root = str(params.get("parent", unit.unit_id))
    _log(events, "unit_start", unit.unit_id, root=root, steps=unit.steps, start=start, resumed=ctx.resumed,
         base_version=ctx.base_version)
    offset = unit.step_offset
    seed = zlib.crc32(root.encode()) & 0x7FFFFFFF
    batches = unit_batches(shard_indices(work.num_train, unit.shard, unit.num_shards), offset + unit.steps,
                           batch, seed)[offset:]
    # the last step's loss, kept in the checkpoint: stopped again before a step after a resume, the
    # partial result still reports a finite loss (NaN is refused as a metric)
    loss_value = float(ck.get("loss", "nan")) if ck is not None else float("nan")
    net.train()
    for step in range(start, unit.steps):
        if ctx.should_stop:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step,
                                 "loss": loss_value})
            _log(events, "unit_stop", unit.unit_id, root=root, steps_done=step)
            return ctx.result(net, steps=step, samples=step * batch, loss=loss_value)
        began = time.monotonic()
        opt.zero_grad(set_to_none=True)
        loss = work.batch_loss(net, batches[step])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        loss_value = float(loss.detach())
        if min_step_s > 0:
            time.sleep(max(0.0, min_step_s - (time.monotonic() - began)))
        ctx.report_progress(step + 1, (step + 1) * batch, loss=loss_value)
        if (step + 1) % every == 0 and step + 1 < unit.steps:
            ctx.save_checkpoint({"model": net.state_dict(), "optimizer": opt.state_dict(), "step": step + 1,
                                 "loss": loss_value})
            _log(events, "checkpoint", unit.unit_id, root=root, steps_done=step + 1)
    _log(events, "unit_end", unit.unit_id, root=root, steps_done=unit.steps)
    return ctx.result(net, steps=unit.steps, samples=unit.steps * batch, loss=loss_value)
