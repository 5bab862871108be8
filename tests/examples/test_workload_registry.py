"""The workloads the demo's processes, its DDP baseline and the simulator all train (one definition).

Each has a validation split held out of its training data (for choosing learning rates) and a test
split that neither training nor the choice ever sees.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vcasync.errors import ConfigError
from vcasync.examples.cnn import load_dataset
from vcasync.examples.workloads import WORKLOADS, get_workload

pytest.importorskip("sklearn", reason="digits ships in scikit-learn (vcasync[demo])")


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}


def test_digits_has_disjoint_train_validation_and_test_splits() -> None:
    work = get_workload("digits")
    full = load_dataset("digits")
    x_val, _ = work._data.held_out["validation"]  # type: ignore[attr-defined]
    x_test, _ = work._data.held_out["test"]  # type: ignore[attr-defined]
    assert work.num_train + len(x_val) == full.num_train
    assert len(x_test) == 360
    train = _rows(work._data.x_train)  # type: ignore[attr-defined]
    assert not train & _rows(x_val)
    assert not train & _rows(x_test)


def test_a_batch_trains_and_both_splits_score() -> None:
    work = get_workload("digits")
    torch.manual_seed(0)
    net = work.model()
    opt = work.optimizer(net.parameters(), 0.05)
    before = work.evaluate(net, "validation")
    idx = np.arange(work.num_train)
    rng = np.random.default_rng(0)
    work.train_steps(net, opt, [rng.choice(idx, 32) for _ in range(60)])
    after = work.evaluate(net, "validation")
    assert after.loss < before.loss
    assert work.quality(after) == after.accuracy
    assert 0 <= work.evaluate(net, "test").accuracy <= 1


def test_the_model_factory_the_coordinator_loads_is_the_workloads() -> None:
    from vcasync.demo import trainer  # noqa: F401  (the trainer reads workloads by name)
    from vcasync.examples import digits

    for name in ("digits",):
        work = get_workload(name)
        module, fn = work.model_ref.split(":")
        assert module == "vcasync.examples.digits"
        assert fn == "model"
        torch.manual_seed(7)
        a = work.model().state_dict()
        torch.manual_seed(7)
        b = digits.model().state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_unknown_workload_and_split_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="unknown workload 'imagenet'"):
        get_workload("imagenet")
    with pytest.raises(ConfigError, match="split"):
        get_workload("digits").evaluate(get_workload("digits").model(), "train")
    assert set(WORKLOADS) == {"digits", "mnist5000", "tinylm"}
    assert get_workload("tinylm").metric == "loss"
