"""The gate on a real model whose results drift as it trains: results of the digits CNN trained
from successive versions, fed through ``gate`` in front of ``fedbuff`` and ``fedasync`` as one
worker at a time sends them. Until 2026-12-08 the gate pooled every accepted result, learnt its
bounds from the ten results on version 0 (norms 1.2-1.4) and refused every result on version 1
(norms 3.3-3.7) of ``fedbuff`` as a ``norm_outlier``: 10 of 40 accepted, the run locked out."""

from __future__ import annotations

import torch
from torch import nn

from vcasync.errors import UpdateRejectedError
from vcasync.examples.digits import load_split
from vcasync.examples.digits import model as digits_model
from vcasync.policy import MergePolicy, PolicyState, build_policy
from vcasync.tensors import ModelState, Update
from vcasync.wire import pack_tree

Outcome = tuple[int, str]  # (base version, "merged" or the refusal's reason)


def _train(base: ModelState, seed: int, steps: int = 20) -> dict[str, torch.Tensor]:
    """The delta of ``steps`` SGD steps (the digits example's settings) from ``base``."""
    net = digits_model()
    net.load_state_dict(dict(base))
    x, y = load_split("train")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(steps):
        idx = torch.randint(len(y), (32,), generator=gen)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach() - base[k] for k, v in net.state_dict().items()}


def _feed(policy: MergePolicy, n: int) -> tuple[list[Outcome], ModelState, PolicyState, int]:
    torch.manual_seed(0)
    model = ModelState.from_module(digits_model())
    state, version, outcomes = policy.init_state(model), 0, []
    for i in range(n):
        base = model.clone()
        update = Update(_train(base, 1000 + i), base_version=version, base=base, worker_id="w")
        try:
            if policy.merge(model, update, state) is not None:
                version += 1
            outcomes.append((update.base_version, "merged"))
        except UpdateRejectedError as exc:
            outcomes.append((update.base_version, exc.reason))
    return outcomes, model, state, version


def _refused(policy: MergePolicy, model: ModelState, state: PolicyState, version: int,
             tensors: dict[str, torch.Tensor]) -> str:
    before, packed = model.clone(), pack_tree(state)
    try:
        policy.merge(model, Update(tensors, base_version=version, base=model.clone()), state)
    except UpdateRejectedError as exc:
        assert model.equal(before)
        assert pack_tree(state) == packed
        return exc.reason
    return "merged"


def _outliers_are_refused(policy: MergePolicy, model: ModelState, state: PolicyState,
                          version: int, *, flipped_too: bool = True) -> None:
    honest = _train(model, 7)
    huge = {k: v * 100 if v.is_floating_point() else v for k, v in honest.items()}
    flipped = {k: -v if v.is_floating_point() else v for k, v in honest.items()}
    assert _refused(policy, model, state, version, huge) == "norm_outlier"
    if flipped_too:
        assert _refused(policy, model, state, version, flipped) == "direction_outlier"


def test_gate_on_fedbuff_follows_the_drift_and_still_refuses_outliers() -> None:
    gate = build_policy("gate", {"inner": "fedbuff"})
    outcomes, model, state, version = _feed(gate, 40)
    merged = [v for v, o in outcomes if o == "merged"]
    assert version >= 3, outcomes                          # locked at version 1 before
    assert len(merged) >= 36, outcomes                     # 10 of 40 before
    assert {1, 2} <= set(merged), outcomes
    assert set(state["versions"]) <= {str(v) for v in range(version + 1)}
    _outliers_are_refused(gate, model, state, version)


def test_gate_on_fedasync_follows_the_drift_and_still_refuses_outliers() -> None:
    gate = build_policy("gate", {"inner": "fedasync"})
    outcomes, model, state, version = _feed(gate, 25)
    assert sum(o == "merged" for _, o in outcomes) >= 23, outcomes
    assert len(state["versions"]) == 16 < version          # older versions are dropped
    # a version per result is judged by the running statistics, as before 2026-12-08: one
    # worker's successive results here vary in direction (their running cosine spread is wide),
    # so a sign-flipped one of honest size passes them; where honest results agree in direction
    # it is refused (tests/security/test_defence.py), and min_cosine refuses it always
    _outliers_are_refused(gate, model, state, version, flipped_too=False)


def test_a_state_saved_before_the_per_version_statistics_loads_and_keeps_its_reference() -> None:
    ref = torch.tensor([1.0, 0.0, 0.0])

    def old_state(gate: MergePolicy, model: ModelState) -> PolicyState:
        state = gate.init_state(model)
        del state["versions"]
        state.update({"accepted": 9, "cos_seen": 8, "norm_mean": 1.0, "norm_var": 0.0,
                      "cos_mean": 0.9, "cos_var": 0.0, "ref": {"w": ref}, "ref_sq": 1.0})
        return state

    # behind a buffering policy the running bounds (mean 1, no spread) no longer judge a result
    gate = build_policy("gate", {"inner": "fedbuff", "warmup": 1})
    model = ModelState({"w": torch.zeros(3)})
    state = old_state(gate, model)
    gate.merge(model, Update({"w": torch.tensor([3.0, 0.0, 0.0])}, base=model.clone()), state)
    assert state["accepted"] == 10
    assert state["ref"]["w"] is ref
    assert state["versions"]["0"]["n"] == 1
    # behind a version per result they still do, as they did before
    gate = build_policy("gate", {"inner": "vcasgd", "warmup": 1})
    state = old_state(gate, model)
    assert _refused(gate, model, state, 0, {"w": torch.tensor([3.0, 0.0, 0.0])}) == "norm_outlier"
    gate.merge(model, Update({"w": torch.tensor([1.0, 0.0, 0.0])}, base=model.clone()), state)
    assert state["versions"]["0"]["n"] == 1
