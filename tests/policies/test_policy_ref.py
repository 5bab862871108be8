"""``vcasync coordinator --policy module:Class``: a policy of one's own without a package, imported as
``--model`` is, validated as an installed policy is, registered under its ``name`` (which the run
records). Each way it can be wrong is a ConfigError naming the reference."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.commands._policy_ref import resolve_policy_name
from vcasync.commands.coordinator import _overrides, _policy
from vcasync.errors import ConfigError, PluginValidationError
from vcasync.policy import available_policies, unregister_policy
from vcasync.runconfig import load_run_config

POLICY = '''
from typing import ClassVar


class Half:
    """Halfway to each result."""

    name: ClassVar[str] = "{name}"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, rate: float = 0.5) -> None:
        self.rate = rate

    def init_state(self, model):
        return {{}}

    def merge(self, model, update, state):
        return model


def factory():
    return Half


class NoMerge:
    name: ClassVar[str] = "no_merge"
    needs_base: ClassVar[bool] = False
    claims: ClassVar[frozenset[str]] = frozenset()

    def init_state(self, model):
        return {{}}
'''


@pytest.fixture
def app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """An app dir with a module ``pol_<test>`` holding the policies above; forgotten afterwards."""
    module = f"pol_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(POLICY.format(name=f"half_{module}"))
    before = set(available_policies())
    yield tmp_path
    for name in set(available_policies()) - before:
        unregister_policy(name)
    sys.modules.pop(module, None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def module_of(app: Path) -> str:
    return next(app.glob("pol_*.py")).stem


def test_a_name_is_left_as_it_is(app: Path) -> None:
    assert resolve_policy_name("vcasgd", app_dir=app) == "vcasgd"
    assert resolve_policy_name(None, app_dir=app) is None


def test_module_class_is_registered_under_its_name_and_builds_with_params(app: Path) -> None:
    mod = module_of(app)
    args = argparse.Namespace(**{**vars(_blank()), "policy": f"{mod}:Half", "policy_param": ["rate=0.25"],
                                 "model": "vcasync.examples.digits:model"})
    cfg = load_run_config(None, _overrides(args))
    policy, params = _policy(cfg, app)
    assert policy.name == f"half_{mod}"                 # what the run records
    assert params == {"rate": 0.25}
    assert policy.rate == 0.25                          # type: ignore[attr-defined]
    # the same reference again (a restart) is the same registered class, not a clash
    assert resolve_policy_name(f"{mod}:Half", app_dir=app) == f"half_{mod}"


@pytest.mark.parametrize(("attr", "message"), [
    ("Nope", "has no attribute 'Nope'"),
    ("factory", "is a function, not a class"),
    ("NoMerge", "missing method 'merge'"),
])
def test_a_reference_that_is_no_policy_class_is_a_config_error(app: Path, attr: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_policy_name(f"{module_of(app)}:{attr}", app_dir=app)


def test_a_module_that_does_not_import_is_named(app: Path) -> None:
    with pytest.raises(ConfigError, match=r"policy 'no_such_module_xyz:Half': cannot import "
                                          r"'no_such_module_xyz'"):
        resolve_policy_name("no_such_module_xyz:Half", app_dir=app)


def test_the_name_of_an_installed_policy_is_not_taken(app: Path) -> None:
    (app / "clash_mod.py").write_text(POLICY.format(name="vcasgd"))
    try:
        with pytest.raises(ConfigError, match=r"is named 'vcasgd', the name of another registered policy "
                                              r"\(vcasync.plugins.*\): give your class a name of its own"):
            resolve_policy_name("clash_mod:Half", app_dir=app)
    finally:
        sys.modules.pop("clash_mod", None)


@pytest.mark.parametrize("name", ["", "a:b", " padded"])
def test_a_class_name_that_is_no_plain_name_is_refused(app: Path, name: str) -> None:
    (app / "badname_mod.py").write_text(POLICY.format(name=name))
    try:
        with pytest.raises(ConfigError, match="its class attribute 'name' must be the policy's name"):
            resolve_policy_name("badname_mod:Half", app_dir=app)
    finally:
        sys.modules.pop("badname_mod", None)


def test_a_validation_failure_is_a_plugin_validation_error(app: Path) -> None:
    with pytest.raises(PluginValidationError):
        resolve_policy_name(f"{module_of(app)}:NoMerge", app_dir=app)


def _blank() -> argparse.Namespace:
    from vcasync.commands.coordinator import _configure

    parser = argparse.ArgumentParser()
    _configure(parser)
    return parser.parse_args([])
