"""No pickle on any network path, proved two ways: no module of the package imports a pickle-family
deserializer or calls ``torch.load`` without ``weights_only=True``; and a full training cycle (join,
lease, download, train with a checkpoint, upload, merge, journal, snapshot, a coordinator restart
that recovers from storage) runs with every unpickling entry point rigged to fail."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import vcasync
from vcasync.examples import digits
from vcasync.retry import RetryPolicy
from vcasync.trainer import TrainContext, TrainResult
from vcasync.worker import Worker, WorkerConfig

from .conftest import SECRET, serving

ROOT = Path(vcasync.__file__).resolve().parent
BANNED_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib",
                  "copyreg"}


def _sources() -> list[Path]:
    roots = [ROOT, ROOT / "backends", ROOT / "plugins"]
    files = {p.resolve() for r in roots if r.exists() for p in r.rglob("*.py")}
    assert len(files) > 30, "the package sources were not found"
    return sorted(files)


def _unsafe(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in BANNED_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            found.append(f"from {node.module}")
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            kw = {k.arg: ast.unparse(k.value) for k in node.keywords}
            torch_load = name.endswith("torch.load") or (name == "load" and "weights_only" in kw)
            if torch_load and kw.get("weights_only") != "True":
                found.append(f"{name}(weights_only={kw.get('weights_only')}) line {node.lineno}")
            if name.endswith(("np.load", "numpy.load")) and kw.get("allow_pickle") not in (None, "False"):
                found.append(f"{name}(allow_pickle=...) line {node.lineno}")
            if name.endswith(("read_pickle", "loads")) and "pickle" in name:
                found.append(f"{name} line {node.lineno}")
    return found


def test_no_module_imports_a_pickle_deserializer_or_loads_torch_unsafely() -> None:
    problems = {str(p.relative_to(ROOT.parent)): bad for p in _sources()
                if (bad := _unsafe(ast.parse(p.read_text(), str(p))))}
    assert problems == {}


def test_the_scan_catches_what_it_is_for() -> None:
    bad = ("import pickle\nfrom dill import loads\nimport torch\ntorch.load(f)\n"
           "torch.load(f, weights_only=False)\n")
    assert len(_unsafe(ast.parse(bad))) == 4
    assert _unsafe(ast.parse("import torch\ntorch.load(f, weights_only=True)\n")) == []


def _trainer_with_checkpoints(ctx: TrainContext) -> TrainResult:
    result = digits.train(ctx)
    ctx.save_checkpoint({"step": result.steps, "weights": torch.ones(3)})
    assert ctx.load_checkpoint() is not None            # torch.load(weights_only=True): allowed
    return result


async def test_a_training_cycle_never_unpickles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def refuse(name: str) -> Any:
        def hook(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            raise AssertionError(f"{name} called on a vcasync path")
        return hook

    for name in ("loads", "load", "_loads", "_load"):
        monkeypatch.setattr(pickle, name, refuse(f"pickle.{name}"))
    class RefusingUnpickler(pickle.Unpickler):
        def load(self) -> Any:
            calls.append("pickle.Unpickler.load")
            raise AssertionError("pickle.Unpickler.load called on a vcasync path")

    monkeypatch.setattr(pickle, "Unpickler", RefusingUnpickler)
    real_load = torch.load

    def guarded_load(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("weights_only") is not True:
            calls.append("torch.load without weights_only=True")
            raise AssertionError("torch.load without weights_only=True")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", guarded_load)
    cfg = WorkerConfig(backoff=RetryPolicy(base_delay_s=0.02, max_delay_s=0.2))
    async with serving(tmp_path, units=3, steps=10) as (coord, server, _):
        report = await Worker(server.url, _trainer_with_checkpoints, state_dir=tmp_path / "w",
                              join_secret=SECRET, config=cfg).run()
        assert report.reason == "finished"
        assert report.results_accepted == 3
        version = coord.version
    # A restart recovers the snapshot and the journal from storage; a worker sees the run finished.
    async with serving(tmp_path, units=3, steps=10) as (coord, server, _):
        assert coord.version == version
        report = await Worker(server.url, _trainer_with_checkpoints, state_dir=tmp_path / "w2",
                              join_secret=SECRET, config=cfg).run()
        assert report.reason == "finished"
    assert calls == []
