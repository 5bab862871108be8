"""Each built-in rule against a hand-computed example (values chosen to be exact in float32)."""

from __future__ import annotations

import math

import pytest
import torch

from vcasync.errors import ConfigError, SpecMismatchError, UpdateRejectedError, ValidationError
from vcasync.policy import MergePolicy, build_policy
from vcasync.tensors import ModelState, Update
from vcasync.wire import pack_tree


def model(*values: float, counter: int = 10, mask: tuple[bool, ...] = (True, False)) -> ModelState:
    return ModelState({"w": torch.tensor(values, dtype=torch.float32),
                       "bn.num_batches_tracked": torch.tensor(counter),
                       "mask": torch.tensor(mask)})


def delta(*values: float, counter: int = 10, mask: tuple[bool, ...] = (True, False),
          **kw: object) -> Update:
    """A delta for ``w``; the integer and bool tensors carry the worker's values."""
    tensors = {"w": torch.tensor(values, dtype=torch.float32),
               "bn.num_batches_tracked": torch.tensor(counter), "mask": torch.tensor(mask)}
    return Update(tensors, kind="delta", **kw)  # type: ignore[arg-type]


def weights(*values: float, counter: int = 10, mask: tuple[bool, ...] = (True, False),
            **kw: object) -> Update:
    u = delta(*values, counter=counter, mask=mask, **kw)
    u.kind = "weights"
    return u


def w(m: ModelState) -> list[float]:
    return m["w"].tolist()


def run(policy: MergePolicy, m: ModelState, *updates: Update) -> list[ModelState | None]:
    state = policy.init_state(m)
    return [policy.merge(m, u, state) for u in updates]


# --- vcasgd ---------------------------------------------------------------------------------


def test_vcasgd_constant_alpha_weights_and_delta() -> None:
    m = model(0.0, 4.0)
    run(build_policy("vcasgd", {"alpha": 0.75}), m, weights(4.0, 8.0))
    assert w(m) == [1.0, 5.0]  # 0.75 w + 0.25 w_c
    m = model(0.0, 4.0)
    run(build_policy("vcasgd", {"alpha": 0.75}), m, delta(2.0, 6.0, base=model(2.0, 2.0)))
    assert w(m) == [1.0, 5.0]  # w_c = base + d = [4, 8]


def test_vcasgd_schedule_over_progress() -> None:
    p = build_policy("vcasgd", {"alpha": 0.5, "schedule": "linear", "alpha_end": 0.9,
                                "horizon": 4})
    assert [p.alpha_at(k) for k in (0, 2, 4, 9)] == pytest.approx([0.5, 0.7, 0.9, 0.9])  # type: ignore[attr-defined]
    c = build_policy("vcasgd", {"alpha": 0.5, "schedule": "cosine", "alpha_end": 0.9,
                                "horizon": 4})
    assert [c.alpha_at(k) for k in (0, 2, 4)] == pytest.approx([0.5, 0.7, 0.9])  # type: ignore[attr-defined]
    m = model(0.0)
    ups = [weights(8.0), weights(8.0), weights(8.0)]
    run(p, m, *ups)
    # kept weights 0.5, 0.6, 0.7 in turn: 4, then 0.6*4 + 0.4*8 = 5.6, then 0.7*5.6 + 0.3*8 = 6.32
    assert w(m) == pytest.approx([6.32])


def test_vcasgd_alpha_as_function_of_staleness() -> None:
    p = build_policy("vcasgd", {"alpha": 0.5, "staleness": "hinge", "a": 1.0, "b": 1})
    assert p.result_weight(0, 1) == 0.5  # type: ignore[attr-defined]
    assert p.result_weight(0, 3) == pytest.approx(0.5 / 3)  # type: ignore[attr-defined]  # 1/(1*(3-1)+1)
    m = model(0.0)
    run(p, m, weights(6.0, staleness=3))
    assert w(m) == pytest.approx([1.0])


def test_vcasgd_delta_without_base_is_refused_and_changes_nothing() -> None:
    m = model(1.0, 2.0)
    p = build_policy("vcasgd")
    state = p.init_state(m)
    with pytest.raises(UpdateRejectedError) as info:
        p.merge(m, delta(1.0, 1.0), state)
    assert info.value.reason == "base_unavailable"
    assert w(m) == [1.0, 2.0]
    assert state == {"merged": 0}


# --- fedasync -------------------------------------------------------------------------------


def test_fedasync_staleness_functions() -> None:
    poly = build_policy("fedasync", {"alpha": 0.5, "staleness": "polynomial", "a": 1.0})
    hinge = build_policy("fedasync", {"alpha": 0.5, "staleness": "hinge", "a": 10.0, "b": 4})
    const = build_policy("fedasync", {"alpha": 0.5, "staleness": "constant"})
    assert [poly.result_weight(t) for t in (0, 1, 3)] == [0.5, 0.25, 0.125]  # type: ignore[attr-defined]
    assert [hinge.result_weight(t) for t in (4, 5)] == pytest.approx([0.5, 0.5 / 11])  # type: ignore[attr-defined]
    assert const.result_weight(100) == 0.5  # type: ignore[attr-defined]
    m = model(0.0, 8.0)
    run(poly, m, weights(8.0, 0.0, staleness=1))
    assert w(m) == [2.0, 6.0]  # weight 0.25


# --- fedbuff --------------------------------------------------------------------------------


def test_fedbuff_buffers_k_weighted_deltas_then_applies_the_mean() -> None:
    p = build_policy("fedbuff", {"buffer_size": 2, "server_lr": 1.0, "staleness": "polynomial",
                                 "a": 1.0})
    m = model(1.0, counter=10)
    outs = run(p, m, delta(4.0, counter=12, staleness=0), delta(8.0, counter=11, staleness=1))
    assert outs[0] is None
    assert outs[1] is m
    assert w(m) == [1.0 + (4.0 + 0.5 * 8.0) / 2]
    assert m["bn.num_batches_tracked"].item() == 10 + 12 + 11  # every buffered increment, unscaled


def test_fedbuff_weights_become_deltas_and_server_lr_scales() -> None:
    p = build_policy("fedbuff", {"buffer_size": 2, "server_lr": 0.5, "staleness": "constant"})
    m = model(2.0)
    run(p, m, weights(6.0), delta(4.0))
    assert w(m) == [2.0 + 0.5 * (4.0 + 4.0) / 2]


# --- diloco ---------------------------------------------------------------------------------


def test_diloco_nesterov_outer_step_per_result() -> None:
    p = build_policy("diloco", {"lr": 0.5, "momentum": 0.5})
    m = model(1.0)
    state = p.init_state(m)
    p.merge(m, delta(2.0), state)
    # g = -2; m = -2; w = 1 - 0.5 (g + 0.5 m) = 1 + 1.5
    assert w(m) == [2.5]
    assert state["velocity"]["w"].tolist() == [2.0]  # the state keeps v = -m
    p.merge(m, weights(4.5), state)  # d = 4.5 - 2.5 = 2: m = -3; w = 2.5 + 0.5 (2 + 1.5)
    assert w(m) == [4.25]
    assert state["velocity"]["w"].tolist() == [3.0]


def test_diloco_converts_a_state_that_kept_the_momentum() -> None:
    # A checkpoint written before the state kept v = -m holds "momentum"; the next merge goes on
    # from it exactly as the old code would have (m = -2 as in the test above: w = 4.25).
    p = build_policy("diloco", {"lr": 0.5, "momentum": 0.5})
    m = model(2.5)
    state = p.init_state(m)
    del state["velocity"]
    state["momentum"] = {"w": torch.tensor([-2.0])}
    p.merge(m, weights(4.5), state)
    assert w(m) == [4.25]
    assert "momentum" not in state
    assert state["velocity"]["w"].tolist() == [3.0]


def test_diloco_defaults_plain_momentum_and_buffering() -> None:
    p = build_policy("diloco", {"buffer_size": 2})
    assert (p.lr, p.momentum, p.nesterov) == (0.7, 0.9, True)  # type: ignore[attr-defined]
    m = model(1.0)
    run(build_policy("diloco", {"lr": 0.5, "momentum": 0.5, "nesterov": False}), m, delta(2.0))
    assert w(m) == [2.0]  # m = -2; w = 1 - 0.5 m
    m = model(1.0)
    outs = run(build_policy("diloco", {"lr": 0.5, "momentum": 0.5, "buffer_size": 2}), m,
               delta(1.0), delta(3.0))
    assert outs[0] is None
    assert w(m) == [2.5]


def test_diloco_defaults_per_result_damp_the_rate_by_staleness_without_momentum() -> None:
    # Until 2026-12-08 the defaults took Nesterov (0.7, 0.9) per result and diverged; now per
    # result the rate is lr / (1 + staleness) and the momentum 0; given parameters act as before.
    p = build_policy("diloco")
    assert (p.lr, p.momentum, p.staleness) == (0.7, 0.0, "polynomial")  # type: ignore[attr-defined]
    m = model(1.0)
    run(p, m, delta(2.0), delta(2.0, staleness=3))
    assert w(m) == pytest.approx([1.0 + 0.7 * 2.0 + 0.7 / 4 * 2.0])
    buffered = build_policy("diloco", {"buffer_size": 3})
    assert (buffered.momentum, buffered.staleness) == (0.9, "constant")  # type: ignore[attr-defined]
    given = build_policy("diloco", {"momentum": 0.5})
    assert given.staleness == "constant"  # type: ignore[attr-defined]
    m = model(1.0)
    run(given, m, delta(2.0, staleness=3))
    assert w(m) == pytest.approx([1.0 + 0.7 * (2.0 + 0.5 * 2.0)])
    with pytest.raises(ConfigError, match="buffer_size 1"):
        build_policy("diloco", {"buffer_size": 2, "staleness": "polynomial"})


# --- robust ---------------------------------------------------------------------------------


def test_median_odd_and_even() -> None:
    m = model(0.0, 0.0)
    outs = run(build_policy("median", {"buffer_size": 3}), m,
               delta(1.0, -5.0, counter=3), delta(100.0, 7.0, counter=10**9), delta(3.0, 6.0, counter=2))
    assert outs[:2] == [None, None]
    assert w(m) == [3.0, 6.0]
    # counters count every result, outliers too: bounded influence is about the float tensors
    assert m["bn.num_batches_tracked"].item() == 10 + 3 + 10**9 + 2
    m = model(0.0)
    run(build_policy("median", {"buffer_size": 4}), m, delta(1.0), delta(2.0), delta(10.0),
        delta(100.0))
    assert w(m) == [6.0]


def test_trimmed_mean_drops_the_extremes() -> None:
    p = build_policy("trimmed_mean", {"buffer_size": 5, "beta": 0.2})
    assert p.max_outliers == 1  # type: ignore[attr-defined]
    m = model(10.0)
    run(p, m, delta(-100.0), delta(1.0), delta(2.0), delta(3.0), delta(1e30))
    assert w(m) == [12.0]
    m = model(10.0)
    run(build_policy("trimmed_mean", {"buffer_size": 3, "beta": 0.0, "lr": 0.5}), m,
        weights(11.0), weights(13.0), weights(15.0))
    assert w(m) == [11.5]  # deltas 1, 3, 5 against the model: mean 3, half a step


def test_robust_bools_take_the_last_buffered_value() -> None:
    m = model(0.0, mask=(False, False))
    run(build_policy("median", {"buffer_size": 3}), m, delta(0.0, mask=(True, True)),
        delta(0.0, mask=(False, True)), delta(0.0, mask=(True, False)))
    assert m["mask"].tolist() == [True, False]


# --- sync -----------------------------------------------------------------------------------


def test_sync_weighs_by_samples() -> None:
    m = model(1.0, counter=5)
    outs = run(build_policy("sync", {"buffer_size": 2}), m, delta(4.0, samples=1, counter=7),
               weights(9.0, samples=3, counter=6))
    assert outs[0] is None
    assert w(m) == [1.0 + (4.0 * 1 + 8.0 * 3) / 4]
    assert m["bn.num_batches_tracked"].item() == 5 + 7 + 6  # the round's increments, summed


def test_sync_zero_samples() -> None:
    m = model(0.0)
    run(build_policy("sync", {"buffer_size": 2}), m, delta(4.0, samples=0), delta(8.0, samples=0))
    assert w(m) == [6.0]  # no result has samples: all weigh the same
    m = model(0.0)
    run(build_policy("sync", {"buffer_size": 3}), m, delta(4.0, samples=0), delta(8.0, samples=2),
        delta(100.0, samples=0))
    assert w(m) == [8.0]  # zero-sample results weigh nothing


# --- gate -----------------------------------------------------------------------------------


def _gate(**params: object) -> tuple[MergePolicy, ModelState, dict[str, object]]:
    p = build_policy("gate", {"inner": "fedbuff", "inner_params": {"buffer_size": 1,
                              "staleness": "constant"}, "warmup": 2, **params})
    m = model(0.0, 0.0)
    return p, m, p.init_state(m)


def test_gate_passes_normal_results_and_refuses_outliers_without_changing_anything() -> None:
    p, m, state = _gate()
    assert p.needs_base is False
    assert p.claims == {"identity", "staleness_monotone"}
    for d in [(1.0, 1.0), (1.0, 1.2), (1.1, 1.0)]:
        p.merge(m, delta(*d), state)
    assert w(m) == pytest.approx([3.1, 3.2])
    assert state["accepted"] == 3
    assert state["cos_seen"] == 2
    before, packed = m.clone(), pack_tree(state)
    for bad, reason in [(delta(30.0, 30.0), "norm_outlier"),
                        (delta(-1.0, -1.1), "direction_outlier"),
                        (delta(math.nan, 1.0), "non_finite"),
                        (delta(math.inf, 1.0), "non_finite"),
                        (delta(3e38, 3e38), "norm_outlier")]:
        with pytest.raises(UpdateRejectedError) as info:
            p.merge(m, bad, state)
        assert info.value.reason == reason
        assert m.equal(before)
        assert pack_tree(state) == packed
    p.merge(m, delta(1.1, 1.0), state)
    assert state["accepted"] == 4


def test_gate_absolute_limits_apply_during_warmup() -> None:
    p, m, state = _gate(max_norm=1.0, min_cosine=0.0)
    with pytest.raises(UpdateRejectedError, match="max_norm"):
        p.merge(m, delta(1.0, 1.0), state)
    p.merge(m, delta(0.5, 0.5), state)
    with pytest.raises(UpdateRejectedError, match="min_cosine"):
        p.merge(m, delta(-0.5, -0.4), state)


def test_gate_inherits_needs_base_and_measures_weights_against_the_base() -> None:
    p = build_policy("gate", {"inner": "vcasgd", "warmup": 1})
    assert p.needs_base is True
    m = model(10.0, 10.0)
    state = p.init_state(m)
    norm, cos = p.measure(m, weights(13.0, 14.0, base=model(10.0, 10.0)), state["ref"])  # type: ignore[attr-defined]
    assert norm == 5.0
    assert cos is None


# --- shared rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vcasgd", "fedasync", "fedbuff", "diloco", "median",
                                  "trimmed_mean", "gate", "sync"])
def test_integers_count_and_bools_take_the_last_value(name: str) -> None:
    p = build_policy(name, {"buffer_size": 1} if name in ("fedbuff", "median", "trimmed_mean",
                                                          "sync", "diloco") else {})
    m = model(0.0, counter=10, mask=(True, False))
    state = p.init_state(m)
    out = p.merge(m, delta(1.0, counter=3, mask=(False, True), base=model(0.0)), state)
    assert out is m
    assert m["bn.num_batches_tracked"].dtype == torch.int64
    assert m["bn.num_batches_tracked"].item() == 13  # the model's 10 plus the increment, unweighted
    assert m["mask"].tolist() == [False, True]
    p.merge(m, weights(0.0, counter=2, mask=(False, False), base=model(0.0), staleness=5), state)
    assert m["bn.num_batches_tracked"].item() == 15  # a stale result's steps count all the same
    assert m["mask"].tolist() == [False, False]


@pytest.mark.parametrize("name", ["vcasgd", "fedbuff", "median", "sync", "diloco", "gate"])
def test_mismatched_updates_are_refused_before_anything_changes(name: str) -> None:
    p = build_policy(name)
    m = model(1.0, 2.0)
    state = p.init_state(m)
    bad = Update({"w": torch.zeros(3)}, base=m.clone())
    with pytest.raises(SpecMismatchError):
        p.merge(m, bad, state)
    wrong_dtype = delta(1.0, 2.0, base=m.clone())
    wrong_dtype.tensors["w"] = wrong_dtype.tensors["w"].double()
    with pytest.raises(SpecMismatchError, match="float64"):
        p.merge(m, wrong_dtype, state)
    odd = delta(1.0, 2.0, base=m.clone())
    odd.kind = "gradient"  # type: ignore[assignment]
    with pytest.raises(ValidationError, match="kind"):
        p.merge(m, odd, state)
    assert w(m) == [1.0, 2.0]


def test_non_contiguous_model_tensors_are_updated_in_place() -> None:
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    for name in ("vcasgd", "diloco", "median", "fedbuff"):
        t = base.clone().t()  # a transposed view: not contiguous
        m = ModelState({"w": t})
        p = build_policy(name, {"buffer_size": 1} if name != "vcasgd" else {"alpha": 0.5})
        out = p.merge(m, Update({"w": torch.ones(3, 2)}, base=m.clone()), p.init_state(m))
        assert out is not None
        assert out["w"] is t
        assert not torch.equal(t, base.t()), name
