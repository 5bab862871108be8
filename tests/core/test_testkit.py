"""The public test kit (``vcasync.testing``) and the repository's own harness (``harness/``) stay apart.

The kit is installed and imported by users; it uses only public vcasync API. The chaos, hostile,
fuzz, probe and fleet harness drives the coordinator's internals and lives outside the package: no
installed module imports it, and a wheel does not carry it.
"""

from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import CHAOS_COORDINATOR, ROOT, harness_env

#: The modules of the public kit (documented on docs/testing.md and in the API reference).
KIT = {"__init__", "_emulator_main", "emulators", "faults", "laws", "policy_run", "storage", "strategies",
       "suite"}
#: What moved out of vcasync.testing into harness/ and must not come back into the package.
HARNESS = {"audit", "chaos", "chaos_coordinator", "chaos_driver", "fleet", "fuzz", "hooks", "hostile",
           "hostile_payloads", "probe", "tls"}
#: The folders that install as vcasync (backends/ and plugins/ as vcasync.backends, .plugins).
INSTALLED = ("vcasync", "backends", "plugins")


def _imports(path: Path, package: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, imported names) of every import in ``path``, a module of ``package``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            yield node.lineno, module, [a.name for a in node.names]


def _package_of(path: Path, root: Path, name: str) -> str:
    """The package a relative import in ``path`` starts from (its folder, ``__init__`` or not)."""
    return ".".join([name, *path.relative_to(root).parts[:-1]])


def harness_imports(root: Path) -> list[str]:
    """Every import of the ``harness`` package in the installed folders under ``root``."""
    found = []
    for folder, name in zip(INSTALLED, ("vcasync", "vcasync.backends", "vcasync.plugins"), strict=True):
        for path in sorted((root / folder).rglob("*.py")):
            for line, module, _ in _imports(path, _package_of(path, root / folder, name)):
                if module == "harness" or module.startswith("harness."):
                    found.append(f"{path.relative_to(root)}:{line}: imports {module}")
    return found


def private_kit_imports(root: Path) -> list[str]:
    """Every import in the kit of a vcasync name outside a public module's ``__all__``."""
    found = []
    kit = root / "vcasync" / "testing"
    for path in sorted(kit.glob("*.py")):
        for line, module, names in _imports(path, "vcasync.testing"):
            outside = module != "vcasync" and not module.startswith("vcasync.")
            if outside or module.startswith("vcasync.testing"):
                continue
            where = f"{path.relative_to(root)}:{line}"
            if any(part.startswith("_") for part in module.split(".")):
                found.append(f"{where}: imports the private module {module}")
                continue
            public = set(getattr(importlib.import_module(module), "__all__", ()))
            found += [f"{where}: {module}.{n} is not in its __all__" for n in names if n not in public]
    return found


def test_the_installed_package_never_imports_the_harness() -> None:
    assert harness_imports(ROOT) == []


def test_the_check_sees_a_harness_import(tmp_path: Path) -> None:
    for folder in INSTALLED:
        (tmp_path / folder).mkdir()
    (tmp_path / "vcasync" / "commands").mkdir()
    (tmp_path / "vcasync" / "commands" / "coordinator.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.hooks import ChaosHooks\n")
    (tmp_path / "plugins" / "p.py").write_text("import harness\n")
    assert harness_imports(tmp_path) == [
        "vcasync/commands/coordinator.py:3: imports harness.hooks",
        "plugins/p.py:1: imports harness",
    ]


def test_the_public_kit_imports_only_public_api() -> None:
    assert private_kit_imports(ROOT) == []


def test_the_check_sees_a_private_import(tmp_path: Path) -> None:
    kit = tmp_path / "vcasync" / "testing"
    kit.mkdir(parents=True)
    (kit / "bad.py").write_text("from .._spawn import module_command\n"
                                "from vcasync.storage import Storage, DEFAULT_CHUNK_SIZE_NOT_EXPORTED\n"
                                "from .faults import FaultPlan\n")
    assert private_kit_imports(tmp_path) == [
        "vcasync/testing/bad.py:1: imports the private module vcasync._spawn",
        "vcasync/testing/bad.py:2: vcasync.storage.DEFAULT_CHUNK_SIZE_NOT_EXPORTED is not in its __all__",
    ]


def test_the_kit_holds_the_kit_and_the_harness_holds_the_rest() -> None:
    assert {p.stem for p in (ROOT / "vcasync" / "testing").glob("*.py")} == KIT
    assert {p.stem for p in (ROOT / "harness").glob("*.py")} == HARNESS | {"__init__"}


def test_packaging_lists_only_vcasync_packages() -> None:
    import tomllib

    # An explicit list (automatic discovery, a ``packages.find`` table, would pick up harness/).
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert isinstance(packages, list), packages
    assert all(p == "vcasync" or p.startswith("vcasync.") for p in packages), packages


def test_a_child_finds_the_harness_only_through_harness_env(tmp_path: Path) -> None:
    cmd = [sys.executable, "-P", "-c", f"import {CHAOS_COORDINATOR.rpartition('.')[0]}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    assert subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True).returncode != 0
    subprocess.run(cmd, cwd=tmp_path, env=harness_env(env), check=True)
    assert harness_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == os.pathsep.join([str(ROOT), "/x"])


@pytest.mark.slow
def test_the_wheel_carries_the_kit_and_not_the_harness(tmp_path: Path) -> None:
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for folder in (*INSTALLED, "harness"):
        shutil.copytree(ROOT / folder, src / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, cwd=tmp_path, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("vcasync-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in names if n.startswith("harness/")]
    assert {f"vcasync/testing/{m}.py" for m in KIT} <= names
    assert not {f"vcasync/testing/{m}.py" for m in HARNESS} & names


def test_the_testkit_extra_installs_what_the_kit_imports_and_not_the_repositorys_suite() -> None:
    # Found by a tester: docs/testing.md sent plugin authors to the `test` extra, "hypothesis,
    # pytest, pytest-asyncio, and the storage emulators", which is vcasync's own suite's and also
    # installs Ray, Playwright, mkdocs and kubernetes-validate.
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    kit = {canonicalize_name(Requirement(r).name) for r in optional["testkit"]}
    core = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    # the top-level modules the kit imports -> the distribution that provides each
    provides = {"hypothesis": "hypothesis", "pytest": "pytest", "gcp_storage_emulator":
                "gcp-storage-emulator", "moto": "moto", "werkzeug": "moto",   # moto[server] brings it
                "torch": "torch", "numpy": "numpy"}
    imported = set()
    for path in sorted((ROOT / "vcasync" / "testing").glob("*.py")):
        for _, module, _ in _imports(path, "vcasync.testing"):
            top = module.split(".")[0]
            if top and top != "vcasync" and top not in sys.stdlib_module_names:
                imported.add(top)
    assert imported <= set(provides), f"map these to their distributions: {imported - set(provides)}"
    assert {provides[m] for m in imported} <= kit | core
    # the storage suite runs on pytest-asyncio; the emulators are of use with the backends for them
    assert {"pytest-asyncio", "aiobotocore", "gcloud-aio-storage"} <= kit
    assert not kit & {"ray", "playwright", "mkdocs-material", "kubernetes-validate"}
    assert "vcasync[testkit]" in optional["test"]
    assert 'pip install "vcasync[testkit]"' in (ROOT / "docs" / "testing.md").read_text()
