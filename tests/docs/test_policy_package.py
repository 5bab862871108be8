"""The third-party policy package of docs/policies.md installs, registers through its entry point,
shows up in ``vcasync coordinator --help`` and passes the policy laws: what a reader who copies it gets."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync import available_policies, build_policy, policy_spec, unregister_policy
from vcasync.policy import refresh_policies
from vcasync.testing import check_policy

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples" / "policy-package"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package, installed by pip (a real build through its pyproject.toml) into a fresh target."""
    target = tmp_path_factory.mktemp("site")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
                          "--no-index", "--quiet", "--target", str(target), str(PACKAGE)],
                         capture_output=True, text=True, timeout=300, cwd=target)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list(target.glob("vcasync_damped-*.dist-info/entry_points.txt"))
    return target


@pytest.fixture
def on_path(installed: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(installed))
    refresh_policies()
    yield installed
    unregister_policy("damped")
    monkeypatch.undo()
    refresh_policies()


@pytest.mark.slow
def test_installed_policy_loads_through_its_entry_point_and_passes_the_laws(on_path: Path) -> None:
    assert "damped" in available_policies()
    spec = policy_spec("damped")
    assert spec.cls.__module__ == "vcasync_damped"
    assert Path(sys.modules["vcasync_damped"].__file__ or "").is_relative_to(on_path)   # the installed copy
    assert spec.defaults() == {"rate": 0.5}
    ran = check_policy(lambda: build_policy("damped", {"rate": 0.5}), max_examples=10)
    assert {"identity", "convex", "staleness_monotone", "counters"} <= set(ran)


@pytest.mark.slow
def test_installed_policy_is_listed_by_coordinator_help(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed), "COLUMNS": "100"}
    out = subprocess.run([sys.executable, "-m", "vcasync", "coordinator", "--help"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("merge policies installed", 1)[1].split("storage schemes", 1)[0]
    assert "damped" in listed


def test_without_the_package_the_policy_is_unknown() -> None:
    refresh_policies()
    assert "damped" not in available_policies()


def test_the_package_shown_in_the_docs_is_the_package_in_examples() -> None:
    """docs/policies.md prints the package's two files: they must be the files the test installs."""
    page = (ROOT / "docs" / "policies.md").read_text()
    for path in ("pyproject.toml", "src/vcasync_damped/__init__.py"):
        assert f"`examples/policy-package/{path}`:\n\n" in page
        text = (PACKAGE / path).read_text()
        assert f"```{'toml' if path.endswith('.toml') else 'python'}\n{text}```" in page, path
