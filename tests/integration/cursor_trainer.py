"""A model whose integer buffer is not a counter: a cursor that wraps around (it goes down)."""

from __future__ import annotations

import torch

from vcasync.trainer import TrainContext, TrainResult


class Cursor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.register_buffer("cursor", torch.tensor(5))


def model() -> Cursor:
    return Cursor()


def train(ctx: TrainContext) -> TrainResult:
    net = Cursor()
    ctx.model.load_into(net)
    for step in range(ctx.unit.steps):
        net.cursor = (net.cursor + 3) % 7          # 5 -> 1: down
        ctx.report_progress(step + 1, 1)
    return ctx.result(net)
