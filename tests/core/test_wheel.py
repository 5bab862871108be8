"""What a wheel carries: every package folder in pyproject's hand-written ``packages`` list, and no warning.

The list is explicit (``packages.find`` would pick up harness/, see test_testkit), so a new folder must be
added by hand. setuptools still ships data under a folder the list lacks, with a warning that a future
release will stop doing so; these tests catch the omission before that release does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from harness import ROOT

#: Repository folder -> the import name it installs as (pyproject's ``package-dir``).
ROOTS = {"vcasync": "vcasync", "backends": "vcasync.backends", "plugins": "vcasync.plugins"}
STATIC = "vcasync/server/status/static"


def _listed() -> set[str]:
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert isinstance(packages, list), packages
    return {str(p) for p in packages}


def _sources() -> dict[str, list[Path]]:
    """Import name -> the files (not caches) of every folder under the installed roots that holds any."""
    found: dict[str, list[Path]] = {}
    for folder, name in ROOTS.items():
        for path in sorted((ROOT / folder).rglob("*")):
            rel = path.relative_to(ROOT / folder)
            if not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc":
                continue
            package = ".".join((name, *rel.parent.parts))
            found.setdefault(package, []).append(path)
    return found


def _wheel_name(path: Path) -> str:
    """Where ``path`` (a repository file under an installed root) lands inside the wheel."""
    for folder, name in ROOTS.items():
        if path.is_relative_to(ROOT / folder):
            return "/".join((*name.split("."), *path.relative_to(ROOT / folder).parts))
    raise AssertionError(path)


def test_every_folder_with_files_is_a_listed_package_and_every_listed_one_exists() -> None:
    listed = _listed()
    assert set(_sources()) == listed
    assert STATIC.replace("/", ".") in listed


def test_the_wheel_carries_every_module_and_the_status_page_and_the_build_does_not_warn(
        tmp_path: Path) -> None:
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ROOTS:
        shutil.copytree(ROOT / folder, src / folder, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # setuptools' own backend, as pip would call it, offline; its warnings go to the captured output.
    code = "import sys\nfrom setuptools import build_meta\nprint(build_meta.build_wheel(sys.argv[1]))\n"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=src, capture_output=True,
                         text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    assert "absent from the `packages` configuration" not in log, log
    assert "recognizes" not in log, log     # "Python recognizes '...' as an importable package"
    # the license is an SPDX string (setuptools >= 77), not the table setuptools stops building in 2027
    assert "Deprecat" not in log, log

    (wheel,) = (tmp_path / "dist").glob("vcasync-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {_wheel_name(p) for files in _sources().values() for p in files}
    assert {n for n in expected if n.endswith(".py")} <= names
    assert {"app.css", "app.js", "favicon.svg", "index.html"} <= {
        n.rpartition("/")[2] for n in names if n.startswith(STATIC + "/")}
    assert expected <= names, sorted(expected - names)
    assert "vcasync/py.typed" in names
    (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
