"""The gate's sums: ``dot2`` against a float64 reference, its overflow cases, and ``r.r`` carried in
the state from merge to merge against a fresh sum (and recomputed for a state that lacks it)."""

from __future__ import annotations

import math

import pytest
import torch

from plugins._kernels import DOT_BLOCK, ROW, Workspace, dot2, sumsq
from vcasync.errors import UpdateRejectedError
from vcasync.policy import build_policy
from vcasync.tensors import ModelState, Update

N = DOT_BLOCK + 3 * ROW + 777   # more than one block, and a last row shorter than the rest


def _t(seed: int, dtype: torch.dtype, n: int = N, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("minus", [False, True])
def test_dot2_matches_a_float64_reference(dtype: torch.dtype, minus: bool) -> None:
    x, r, m = _t(1, dtype), _t(2, dtype), _t(3, dtype)
    d = x.double() - (m.double() if minus else 0.0)
    if minus and dtype != torch.float64:  # the kernel forms x - m in float32
        d = (x.float() - m.float()).double()
    dd, dr = dot2(x, r, Workspace(), x_minus=m if minus else None)
    assert dd == pytest.approx(float(d @ d), rel=1e-5)
    assert dr == pytest.approx(float(d @ r.double()), rel=1e-4, abs=1e-3)
    assert sumsq(r) == pytest.approx(float(r.double() @ r.double()), rel=1e-5)


def test_dot2_of_non_contiguous_and_2d_tensors() -> None:
    x = _t(4, torch.float32, 2 * N).view(N, 2).t()
    r = _t(5, torch.float32, 2 * N).view(2, N)
    dd, dr = dot2(x, r, Workspace())
    assert dd == pytest.approx(float(x.double().pow(2).sum()), rel=1e-5)
    assert dr == pytest.approx(float((x.double() * r.double()).sum()), rel=1e-4, abs=1e-3)


def test_rows_that_overflow_both_ways_give_nan_not_an_error() -> None:
    # One row's products overflow to +inf, another's to -inf: an exact sum of the row sums would
    # refuse inf + -inf (math.fsum raises); the sums come back non-finite instead.
    x = torch.full((2 * ROW,), 3e38)
    r = torch.cat([torch.full((ROW,), 3e38), torch.full((ROW,), -3e38)])
    dd, dr = dot2(x, r, Workspace())
    assert math.isinf(dd)
    assert math.isnan(dr)


def _gate_run(dtype: torch.dtype, drop_ref_sq_at: int | None = None) -> tuple[list[object], dict]:
    gate = build_policy("gate", {"inner": "vcasgd", "warmup": 2, "z": 2.0})
    model = ModelState({"w": _t(0, dtype), "b": _t(1, dtype, 300), "n": torch.tensor(1)})
    state = gate.init_state(model)
    outcomes: list[object] = []
    for i in range(12):
        scale = 5.0 if i == 7 else 1e-2  # one outlier the gate refuses
        tensors = {"w": _t(10 + i, dtype, scale=scale) + _t(99, dtype, scale=1e-2),
                   "b": _t(40 + i, dtype, 300, scale=1e-2), "n": torch.tensor(1)}
        if i == drop_ref_sq_at:
            del state["ref_sq"]  # as in a checkpoint written before the gate kept it
        try:
            gate.merge(model, Update(tensors, kind="delta", base=model.clone()), state)
            outcomes.append("merged")
        except UpdateRejectedError as exc:
            outcomes.append(exc.reason)
        fresh = math.fsum(sumsq(r) for r in state["ref"].values())
        assert state["ref_sq"] == pytest.approx(fresh, rel=1e-5 if dtype == torch.float32 else 1e-3)
    return outcomes, state


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_carried_reference_norm_tracks_a_fresh_sum(dtype: torch.dtype) -> None:
    outcomes, state = _gate_run(dtype)
    assert outcomes == ["merged"] * 7 + ["norm_outlier"] + ["merged"] * 4
    assert state["accepted"] == 11


def test_a_state_without_the_carried_norm_is_measured_afresh_with_the_same_decisions() -> None:
    assert _gate_run(torch.float32, drop_ref_sq_at=5)[0] == _gate_run(torch.float32)[0]
