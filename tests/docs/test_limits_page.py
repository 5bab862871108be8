"""docs/limits.md's coordinator memory table, held to the code: how many model-sized sets each
built-in merge policy's state holds, and so how many the coordinator's undo of that state copies
(vcasync/coordinator/_state_undo.py). The page said nothing of either: an operator sizing a machine
for fedbuff, diloco or median from it was short of one to eight models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from vcasync.coordinator._model_owner import ModelOwner
from vcasync.policy import build_policy
from vcasync.tensors import ModelState, Update

PAGE = Path(__file__).resolve().parents[2] / "docs" / "limits.md"
N = 1 << 12

#: (policy, buffer_size or None for the default) -> the most model-sized sets the undo holds over
#: 12 merges (the int64 counter aside), as the page says
SAID: dict[tuple[str, int | None], float] = {
    ("vcasgd", None): 0, ("fedasync", None): 0, ("fedbuff", None): 1, ("sync", None): 1,
    ("gate", None): 1, ("diloco", None): 1, ("diloco", 4): 2,
    ("median", None): 4, ("trimmed_mean", None): 4, ("median", 8): 7,
}


async def _undo_peak(name: str, params: dict[str, Any]) -> float:
    gen = torch.Generator().manual_seed(0)
    model = ModelState({"w": torch.randn(N, generator=gen), "n": torch.zeros((), dtype=torch.int64)}, 0)
    owner = ModelOwner(build_policy(name, params), model, max_retained_bytes=None)
    peak = 0
    for i in range(12):
        await owner.merge(Update({"w": torch.randn(N, generator=gen) * 0.01,
                                  "n": torch.ones((), dtype=torch.int64)}, unit_id=f"u{i}",
                                 base_version=owner.version, base=owner.versions.current.model))
        peak = max(peak, sum(c.saved.numel() * c.saved.element_size()
                             for c in owner._undo._copies.values()))
    return round(peak / (N * 4), 1)


@pytest.mark.parametrize(("name", "buffer_size"), sorted(SAID, key=str))
async def test_the_undo_copies_what_the_page_says(name: str, buffer_size: int | None) -> None:
    params = {} if buffer_size is None else {"buffer_size": buffer_size}
    assert await _undo_peak(name, params) == SAID[name, buffer_size]


def test_the_memory_table_has_the_policy_state_and_its_undo_copy_for_every_builtin() -> None:
    from vcasync.policy import available_policies

    text = PAGE.read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| (.+)$", text, re.M)}
    undo = rows["the policy state's undo copy"]
    state = rows["the merge policy's state"]
    assert "_state_undo.py" in undo
    builtins = {name for name, _ in SAID}
    assert builtins <= set(available_policies())
    for name in builtins:
        assert f"`{name}`" in undo, name
        assert f"`{name}`" in state, name
    assert "2 x state" in text            # the sizing rule counts the state twice
