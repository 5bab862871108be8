"""A trainer that forgets to return its result (``return None``): a bug in the trainer's code."""

from __future__ import annotations

from vcasync.trainer import TrainContext


def train(ctx: TrainContext) -> None:
    ctx.report_progress(1)
