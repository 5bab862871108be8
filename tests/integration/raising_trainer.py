"""A trainer that always raises: the failing machine of the parked-units tests (issue 13)."""

from __future__ import annotations

from vcasync.trainer import TrainContext, TrainResult


def train(ctx: TrainContext) -> TrainResult:
    raise RuntimeError(f"boom on {ctx.unit.unit_id}")
