"""The fused (span by span) kernels give the same bits as the whole-tensor formulas they replace,
for tensors many spans long with a ragged tail, in float32, float64 and the half types."""

from __future__ import annotations

import pytest
import torch

from plugins._kernels import FUSE, Workspace, axpy, decay_add, fused
from vcasync.policy import build_policy
from vcasync.tensors import ModelState, Update

N = 3 * FUSE + 1237   # several spans and a tail that is not a multiple of any vector width
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _t(seed: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, generator=g, dtype=torch.float64) * scale).to(dtype)


def _model(dtype: torch.dtype) -> ModelState:
    return ModelState({"w": _t(0, dtype), "small": _t(1, dtype)[:100].clone(),
                       "steps": torch.tensor(5)})


def _result(model: ModelState, seed: int, scale: float = 1e-2) -> dict[str, torch.Tensor]:
    return {n: (_t(seed, t.dtype, scale)[:t.numel()].reshape(t.shape).clone()
                if t.is_floating_point() else torch.tensor(1)) for n, t in model.items()}


def test_fused_spans_cover_the_tensor_once_in_order() -> None:
    a, b = torch.arange(N), torch.arange(N) * 2
    spans = list(fused(a, b))
    assert len(spans) == 4
    assert torch.equal(torch.cat([s[0] for s in spans]), a)
    assert torch.equal(torch.cat([s[1] for s in spans]), b)
    assert all(s[0].data_ptr() == a[i * FUSE:].data_ptr() for i, s in enumerate(spans))


def test_non_contiguous_tensors_come_whole() -> None:
    a = torch.zeros(FUSE + 10, 2).t()
    assert [s[0].shape for s in fused(a, a)] == [a.shape]


@pytest.mark.parametrize("dtype", DTYPES)
def test_vcasgd_delta_merge_is_bit_identical_to_the_whole_tensor_formula(dtype: torch.dtype) -> None:
    model, base = _model(dtype), _model(dtype)
    delta = _result(model, 7)
    expected = model["w"].clone().lerp_(base["w"], 0.5)
    axpy(expected, delta["w"], 0.5, Workspace())
    build_policy("vcasgd", {"alpha": 0.5}).merge(model, Update(delta, kind="delta", base=base), {"merged": 0})
    assert torch.equal(model["w"], expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["delta", "weights"])
def test_diloco_step_is_bit_identical_to_the_whole_tensor_formula(dtype: torch.dtype, kind: str) -> None:
    model = _model(dtype)
    x = _result(model, 9)
    if kind == "weights":
        x = {n: (model[n] + v if v.is_floating_point() else v) for n, v in x.items()}
    w, ws = model["w"].clone(), Workspace()
    d = x["w"] - w if kind == "weights" else x["w"]
    v = torch.full_like(w, 0.5)
    decay_add(v, d, 0.9)
    axpy(w, d, 0.7, ws)
    axpy(w, v, 0.7 * 0.9, ws)
    policy = build_policy("diloco", {"momentum": 0.9})  # the Nesterov step (default per result: 0)
    state = policy.init_state(model)
    state["velocity"]["w"].fill_(0.5)
    policy.merge(model, Update(x, kind=kind), state)  # type: ignore[arg-type]
    assert torch.equal(model["w"], w)
    assert torch.equal(state["velocity"]["w"], v)


@pytest.mark.parametrize("name", ["fedbuff", "sync"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_buffered_flush_is_bit_identical_and_clears_the_buffer(name: str, dtype: torch.dtype) -> None:
    model = _model(dtype)
    results = [_result(model, s) for s in (11, 12)]
    policy = build_policy(name, {"buffer_size": 2})
    state = policy.init_state(model)
    w, ws = model["w"].clone(), Workspace()
    if name == "fedbuff":
        buf = torch.zeros_like(w)
        for r in results:
            axpy(buf, r["w"], 1.0, ws)
        axpy(w, buf, 1.0 / 2, ws)
    else:
        mean = torch.zeros_like(w)
        for i, r in enumerate(results, 1):
            mean.lerp_(r["w"], 10 / (10 * i))
        w.add_(mean)
    for r in results:
        policy.merge(model, Update(r, kind="delta", samples=10), state)
    assert torch.equal(model["w"], w)
    key = "buffer" if name == "fedbuff" else "mean"
    assert not state[key]["w"].any()
