"""A third-party policy, packaged and installed the way a user would, found by its entry point.

The test writes a tiny project (pyproject.toml with a ``vcasync.policies`` entry point), installs it
with pip into a folder of its own (no network: ``--no-index --no-deps --no-build-isolation``), puts
that folder on ``sys.path``, and then uses only public API: the registry discovers the policy
through ``importlib.metadata``, ``build_policy`` builds it and ``check_policy`` holds it to the laws
it claims. Everything is removed afterwards.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.errors import PluginValidationError
from vcasync.policy import available_policies, build_policy, refresh_policies, unregister_policy
from vcasync.testing import check_policy

POLICY_SOURCE = '''
"""Halfway: move the model half of the way to each result (a toy third-party policy)."""

from __future__ import annotations

from typing import ClassVar

import torch

from vcasync.policy import PolicyState
from vcasync.tensors import ModelState, Update


class Halfway:
    """w <- w + rate (w_c - w), with w_c = base + d for deltas; integers add the increment,
    bools take the worker's value."""

    name: ClassVar[str] = "halfway"
    needs_base: ClassVar[bool] = True
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex"})

    def __init__(self, rate: float = 0.5) -> None:
        self.rate = rate

    def init_state(self, model: ModelState) -> PolicyState:
        return {"merged": 0}

    def merge(self, model: ModelState, update: Update, state: PolicyState) -> ModelState:
        for name, w in model.items():
            x = update.tensors[name]
            if w.dtype == torch.bool:
                w.copy_(x)
            elif not w.is_floating_point():
                w.add_(x)
            elif update.kind == "weights":
                w.lerp_(x, self.rate)
            else:
                assert update.base is not None
                w.lerp_(update.base[name], self.rate).add_(x, alpha=self.rate)
        state["merged"] += 1
        return model


class Broken:
    """Has no merge method."""

    name: ClassVar[str] = "broken_policy"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset()

    def init_state(self, model: ModelState) -> PolicyState:
        return {}
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=70"]
build-backend = "setuptools.build_meta"

[project]
name = "halfway-policy"
version = "1.0"
dependencies = ["vcasync"]

[project.entry-points."vcasync.policies"]
halfway = "halfway_policy:Halfway"
broken_policy = "halfway_policy:Broken"
missing_dep = "halfway_policy_extra:Nothing"
fails_at_import = "halfway_boom:Thing"
no_such_class = "halfway_policy:NoSuchClass"
vcasgd = "halfway_policy:Halfway"

[tool.setuptools]
py-modules = ["halfway_policy", "halfway_boom"]
'''


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    (project / "halfway_policy.py").write_text(POLICY_SOURCE)
    (project / "halfway_boom.py").write_text('raise RuntimeError("halfway_boom cannot start")\n')
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(target), str(project)],
        check=True, capture_output=True, timeout=300, cwd=tmp_path)
    assert any(target.glob("halfway_policy-1.0.dist-info/entry_points.txt"))
    assert "halfway" not in available_policies()
    monkeypatch.syspath_prepend(str(target))
    importlib.invalidate_caches()
    refresh_policies()
    try:
        yield target
    finally:
        for name in ("halfway", "broken_policy", "missing_dep", "fails_at_import", "no_such_class",
                     "vcasgd"):
            unregister_policy(name)
        sys.modules.pop("halfway_policy", None)
        sys.modules.pop("halfway_boom", None)
        monkeypatch.undo()
        importlib.invalidate_caches()
        refresh_policies()


def test_installed_policy_is_discovered_built_and_lawful(installed: Path) -> None:
    assert {"halfway", "broken_policy", "missing_dep"} <= set(available_policies())
    policy = build_policy("halfway", {"rate": 0.25})
    assert type(policy).__module__ == "halfway_policy"
    assert policy.rate == 0.25  # type: ignore[attr-defined]
    ran = check_policy(lambda: build_policy("halfway", {"rate": 0.25}), max_examples=15)
    assert ran == ["contract", "convex", "counters", "deterministic", "finite", "identity",
                   "inputs_unchanged", "state_roundtrip"]


def test_installed_broken_policies_fail_with_their_name(installed: Path) -> None:
    with pytest.raises(PluginValidationError, match="plugin 'broken_policy': missing method 'merge'"):
        build_policy("broken_policy")
    with pytest.raises(PluginValidationError, match="plugin 'missing_dep': cannot import"):
        build_policy("missing_dep")


def test_a_plugin_that_cannot_load_is_a_config_error_naming_it(installed: Path) -> None:
    # Its module raising something else than ImportError, or its entry point naming an object
    # the module does not have, used to escape as that exception: `vcasync coordinator --policy
    # NAME` died with a traceback and exit status 1 instead of a configuration error (2).
    with pytest.raises(PluginValidationError) as info:
        build_policy("fails_at_import")
    assert str(info.value) == ("plugin 'fails_at_import': cannot load halfway_boom:Thing: "
                               "RuntimeError: halfway_boom cannot start")
    with pytest.raises(PluginValidationError) as info:
        build_policy("no_such_class")
    assert "plugin 'no_such_class': cannot load halfway_policy:NoSuchClass: AttributeError" in str(
        info.value)
    assert "NoSuchClass" in str(info.value)


def test_a_name_two_installed_packages_provide_is_refused_naming_both(installed: Path) -> None:
    # Both vcasync and halfway-policy declare "vcasgd": which one loaded depended on the order
    # importlib.metadata found the packages in (here the built-in, silently ignoring the plugin).
    unregister_policy("vcasgd")          # forget a copy an earlier test loaded (the entry point stays)
    with pytest.raises(PluginValidationError) as info:
        build_policy("vcasgd")
    message = str(info.value)
    assert message.startswith("plugin 'vcasgd': 2 installed packages provide it under this name")
    assert "vcasync (vcasync.plugins.vcasgd:VCASGD)" in message
    assert "halfway-policy (halfway_policy:Halfway)" in message


def test_discovery_is_cleaned_up() -> None:
    refresh_policies()
    assert "halfway" not in available_policies()
