"""The simulator's language-model signal: :mod:`vcasync.examples.tinylm` trained for real.

A "sample" is one 64-byte window of the training bytes; sample ``i`` starts at byte ``i x CONTEXT``
(non-overlapping windows), so the simulator's index batches, shards and the synchronous baseline all
work unchanged. Local training is AdamW at the given learning rate (``momentum`` is not used: the
example's trainer is AdamW too). Evaluation is the mean next-byte loss over 2,048 evenly spread
validation windows; ``accuracy`` is reported as ``exp(-loss)`` (the per-byte geometric-mean
likelihood), which rises as the loss falls, so the simulator's accuracy-based target machinery orders
runs correctly while the headline figure for this workload is the relative loss gap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..examples import tinylm
from ..examples.cnn import Dataset, Evaluation
from .signals import LocalTraining, SignalDefaults, TrainingSignal

__all__ = ["EVAL_WINDOWS", "LMSignal", "lm_signal"]

#: Held-out windows scored per evaluation (131,072 predicted bytes).
EVAL_WINDOWS = 2048


class _LMTraining:
    def __init__(self, module: nn.Module, tokens: torch.Tensor, lr: float) -> None:
        self._module = module
        self._tokens = tokens
        self._opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)

    def run(self, batches: Sequence[np.ndarray]) -> int:
        self._module.train()
        for ix in batches:
            starts = torch.as_tensor(np.asarray(ix), dtype=torch.long) * tinylm.CONTEXT
            x, y = tinylm.windows(self._tokens, starts)
            self._opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(self._module(x).reshape(-1, 256), y.reshape(-1))
            loss.backward()  # type: ignore[no-untyped-call]
            self._opt.step()
        return len(batches)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self._module.state_dict().items()}


class LMSignal(TrainingSignal):
    """Windows of the standard library's source as samples; see the module docstring."""

    def __init__(self) -> None:
        tokens = tinylm.load_split("train")
        windows = (len(tokens) - tinylm.CONTEXT - 1) // tinylm.CONTEXT
        # The Dataset carries the bytes; y_train only gives the sample count (one per window).
        data = Dataset("tinylm", tokens, torch.zeros(windows, dtype=torch.long),
                       tinylm.load_split("validation"), torch.zeros(0, dtype=torch.long), 256)
        defaults = SignalDefaults(lr=0.002, batch_size=16, sample_cost_s=1.0)
        super().__init__("tinylm", data, tinylm.model, defaults)

    def session(self, tensors: Mapping[str, torch.Tensor], *, lr: float,
                momentum: float = 0.9) -> LocalTraining:
        module = self._make_model()
        module.load_state_dict(dict(tensors))
        return _LMTraining(module, self.data.x_train, lr)

    def evaluate(self, tensors: Mapping[str, torch.Tensor]) -> Evaluation:
        self._module.load_state_dict(dict(tensors))
        loss = tinylm.evaluate(self._module, count=EVAL_WINDOWS)
        return Evaluation(math.exp(-loss) if math.isfinite(loss) else 0.0, loss)


def lm_signal() -> TrainingSignal:
    return LMSignal()
