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


def test_every_minibatch_has_the_batch_size_even_from_fewer_samples() -> None:
    # found by QA: a minibatch larger than what it was drawn from came out short, where every
    # count (samples trained and merged, samples to target, the synchronous baseline's samples)
    # says steps x batch: 64 workers x 32 on digits' 1,437 training images gave DDP steps of 2,048,
    # 2,048, 1,652, then 1,437 each; `vcasync simulate --shards 5000` units of 12, 6, 6 counted 32
    from vcasync.examples.cnn import unit_batches

    for n, batch in ((1437, 2048), (6, 32), (1, 4), (100, 100)):
        batches = unit_batches(np.arange(n), 40, batch, seed=5)
        assert [len(b) for b in batches] == [batch] * 40, (n, batch)
        drawn = np.concatenate(batches)
        counts = np.bincount(drawn, minlength=n)
        assert counts.max() - counts.min() <= 1 + batch // n   # passes over the indices, as before

    assert unit_batches(np.arange(0), 0, 32, seed=5) == []
    with pytest.raises(ConfigError, match="no samples"):      # never a loop without end
        unit_batches(np.arange(0), 1, 32, seed=5)

    # where the indices hold a batch, the draws are what they were (the saved runs' batches)
    def before(indices: np.ndarray, steps: int, batch: int, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out, order, pos = [], rng.permutation(indices), 0
        for _ in range(steps):
            if pos + batch > len(order):
                order, pos = np.concatenate([order[pos:], rng.permutation(indices)]), 0
            out.append(order[pos:pos + batch])
            pos += batch
        return out

    for n, batch in ((1437, 512), (180, 32), (32, 32)):
        now, then = unit_batches(np.arange(n), 50, batch, 7), before(np.arange(n), 50, batch, 7)
        assert all(np.array_equal(a, b) for a, b in zip(now, then, strict=True))
