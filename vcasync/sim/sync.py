"""The reference: synchronous data-parallel SGD on the same machines, on demand, with no preemption.

Every step, each of the ``N`` workers computes a gradient on its own minibatch of ``b`` samples, the
gradients are averaged by a ring all-reduce, and all workers apply the same step: one SGD step on a
batch of ``N*b`` samples. The training is real (the signal's model and data, one persistent
optimiser); the time a step takes is the slowest worker's compute plus the all-reduce, because a
barrier waits for stragglers. It trains on the same number of samples as the asynchronous run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..examples.cnn import unit_batches
from .cost import ring_allreduce_s
from .fleet import MachineProfile
from .records import EvalPoint
from .signals import TrainingSignal

__all__ = ["SyncResult", "simulate_sync"]


@dataclass(frozen=True, slots=True)
class SyncResult:
    """The synchronous baseline's trajectory and timing."""

    workers: int
    steps: int
    step_s: float
    duration_s: float
    lr: float
    evals: list[EvalPoint]
    #: each worker's minibatch (a step trains on ``workers * batch_size`` samples)
    batch_size: int = 0


def simulate_sync(signal: TrainingSignal, fleet: Sequence[MachineProfile], *, total_samples: int,
                  batch_size: int, lr: float, momentum: float, sample_cost_s: float, model_bytes: int,
                  boot_s: float, eval_points: int, seed: int, stretch: float = 1.0) -> SyncResult:
    """Train synchronously on ``total_samples`` samples and evaluate ``eval_points`` times.

    ``stretch``: how much longer compute takes because the ranks share processors (:mod:`.cpu`).
    """
    n = len(fleet)
    big = n * batch_size
    steps = max(1, math.ceil(total_samples / big))
    compute_s = stretch * max(batch_size * sample_cost_s / m.speed for m in fleet)
    step_s = compute_s + ring_allreduce_s(model_bytes, n, [m.bandwidth_bps for m in fleet],
                                          fleet[0].latency_s)
    batches = unit_batches(np.arange(signal.num_train), steps, big, seed ^ 0x5EED)
    run = signal.session(signal.initial_model(seed).tensors, lr=lr, momentum=momentum)
    first = signal.evaluate(run.weights())
    evals = [EvalPoint(0.0, 0, 0, first.accuracy, first.loss)]
    every = max(1, steps // eval_points)
    done = 0
    while done < steps:
        k = min(every, steps - done)
        run.run(batches[done:done + k])
        done += k
        ev = signal.evaluate(run.weights())
        evals.append(EvalPoint(boot_s + done * step_s, done, done * big, ev.accuracy, ev.loss))
    return SyncResult(n, steps, step_s, boot_s + steps * step_s, lr, evals, batch_size)
