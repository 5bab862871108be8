"""Misusing the public API gets a typed error that names the fix, when the object is built: never a
bare ``AttributeError`` on first use, and never a bad storage root found at the first write."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from vcasync import Coordinator, CoordinatorConfig, ModelState, build_policy, make_units, open_storage
from vcasync.errors import ConfigError, VCAsyncError


def _state() -> ModelState:
    torch.manual_seed(0)
    return ModelState.from_module(nn.Linear(3, 2))


def _coordinator(**kwargs: object) -> Coordinator:
    args: dict[str, object] = {"model": _state(), "units": make_units(2), "policy": build_policy("vcasgd"),
                               "storage": None, "config": CoordinatorConfig(durability="none")}
    args.update(kwargs)
    model, units = args.pop("model"), args.pop("units")
    return Coordinator(model, units, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "fix"), [
    ({"model": nn.Linear(3, 2)}, "ModelState.from_module"),
    ({"model": {"w": torch.zeros(2)}}, "must be a vcasync.ModelState"),
    ({"units": 4}, "make_units"),
    ({"units": ["e0-s0"]}, "WorkUnit objects"),
    ({"storage": "file:///tmp/run"}, "open_storage(url)"),
    ({"storage": Path("/tmp/run")}, "open_storage(url)"),
    ({"storage": object()}, "must implement vcasync.Storage"),
    ({"storage": type("NoPutStream", (), {"put_stream": None})()},
     "got a NoPutStream, which lacks url, get, put, exists, stat, list, delete, open_read, put_stream"),
    ({"policy": "vcasgd"}, "build_policy(name)"),
    ({"config": {"durability": "none"}}, "CoordinatorConfig"),
    ({"clock": 0.0}, "clock must be a callable"),
])
def test_a_coordinator_built_wrong_says_how_to_fix_it(kwargs: dict[str, object], fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        _coordinator(**kwargs)
    assert fix in str(info.value)
    assert isinstance(info.value, VCAsyncError)     # one except clause catches every misuse


def test_a_coordinator_takes_units_from_any_iterable() -> None:
    coord = _coordinator(units=iter(make_units(3)))
    assert coord.status()["phase"] == "new"


@pytest.mark.parametrize(("tensors", "version", "fix"), [
    ({"w": 3.0}, 0, "torch.tensor(3.0)"),
    ({"w": [1.0, 2.0]}, 0, "not a torch.Tensor"),
    ({1: torch.zeros(1)}, 0, "names must be non-empty str"),
    (nn.Linear(3, 2), 0, "ModelState.from_module"),
    ([torch.zeros(1)], 0, "a mapping of name -> torch.Tensor"),
    ({"w": torch.zeros(1)}, -1, ">= 0"),
    ({"w": torch.zeros(1)}, "3", "must be an int"),
    ({"w": torch.zeros(1)}, True, "must be an int"),
])
def test_a_model_state_built_wrong_says_how_to_fix_it(tensors: object, version: object, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelState(tensors, version)  # type: ignore[arg-type]
    assert fix in str(info.value)


def test_from_module_wants_a_module() -> None:
    with pytest.raises(ConfigError, match="ModelState\\(tensors\\)"):
        ModelState.from_module({"w": torch.zeros(1)})  # type: ignore[arg-type]


def _sparse_buffer() -> nn.Module:
    m = nn.Linear(2, 2)
    m.register_buffer("adj", torch.eye(3).to_sparse())
    return m


@pytest.mark.parametrize(("build", "fix"), [
    (_sparse_buffer, "tensor 'adj' is torch.sparse_coo (not dense)"),
    (lambda: nn.Linear(3, 3, device="meta"), "tensor 'weight' is on the meta device"),
], ids=["sparse", "meta"])
def test_from_module_names_a_tensor_it_cannot_copy(build: Callable[[], nn.Module], fix: str) -> None:
    # found by a new-user probe: torch's own "unsupported memory format option Contiguous" (a
    # sparse buffer) or "Cannot copy out of meta tensor" (a meta module), naming no tensor
    with pytest.raises(ConfigError) as info:
        ModelState.from_module(build())
    assert fix in str(info.value)


@pytest.mark.parametrize("url", [None, 3, b"file:///tmp/x", ""])
def test_open_storage_wants_a_url_or_a_path(url: object) -> None:
    with pytest.raises(ConfigError, match="storage URL"):
        open_storage(url)  # type: ignore[arg-type]


async def test_open_storage_takes_a_path(tmp_path: Path) -> None:
    async with open_storage(tmp_path / "store") as st:
        await st.put("a", b"1")
    assert (tmp_path / "store" / "a").read_bytes() == b"1"


@pytest.mark.parametrize("below", ["", "/sub/dir"])
def test_a_file_url_naming_a_regular_file_is_refused_when_opened(tmp_path: Path, below: str) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("not a directory")
    with pytest.raises(ConfigError, match="not a directory") as info:
        open_storage(f"file://{target}{below}")
    assert str(target) in str(info.value)
    assert target.read_text() == "not a directory"


def test_a_missing_root_is_fine_until_written(tmp_path: Path) -> None:
    open_storage(f"file://{tmp_path}/does/not/exist/yet")
    assert not (tmp_path / "does").exists()
