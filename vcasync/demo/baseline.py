"""The demo's reference: synchronous data-parallel training of the same model on the same samples.

With ``N`` workers of batch ``b``, each step averages ``N`` minibatch gradients, which is one SGD step
on a batch of ``N*b`` samples. This one-process version is the arithmetic reference that the real
baseline, :mod:`vcasync.demo.ddp` (``N`` processes, torch.distributed), is tested against; its wall
time leaves out process start-up, so it is not what the demo compares costs with.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..examples.cnn import unit_batches
from ..examples.workloads import Workload

__all__ = ["BaselineResult", "sync_sgd"]


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """Accuracy points ``(wall_s, samples, accuracy, loss)`` and the final figures."""

    workers: int
    batch_size: int
    lr: float
    steps: int
    samples: int
    wall_s: float
    points: list[tuple[float, int, float, float]]

    @property
    def final_accuracy(self) -> float:
        return self.points[-1][2]


def sync_sgd(work: Workload, *, workers: int, batch_size: int, samples: int, lr: float, momentum: float,
             seed: int, eval_points: int = 20) -> BaselineResult:
    """Train a fresh model (seeded like the demo's) synchronously on ``samples`` samples, in one process."""
    import torch

    torch.manual_seed(seed)
    net = work.model()
    big = workers * batch_size
    steps = max(1, math.ceil(samples / big))
    batches = unit_batches(np.arange(work.num_train), steps, big, seed ^ 0x5EED)
    opt = work.optimizer(net.parameters(), lr, momentum)
    first = work.evaluate(net, "test")
    points = [(0.0, 0, first.accuracy, first.loss)]
    every = max(1, steps // eval_points)
    t0 = time.perf_counter()
    spent = 0.0
    for step, idx in enumerate(batches, start=1):
        work.train_steps(net, opt, [idx])
        if step % every == 0 or step == steps:
            spent += time.perf_counter() - t0
            ev = work.evaluate(net, "test")
            points.append((spent, step * big, ev.accuracy, ev.loss))
            t0 = time.perf_counter()
    return BaselineResult(workers, batch_size, lr, steps, steps * big, spent, points)
