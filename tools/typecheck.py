"""Run ``mypy --strict`` on vcasync, vcasync.backends, vcasync.plugins and the test harness.

mypy cannot follow setuptools' ``package-dir`` mapping (backends/ and plugins/ install as
``vcasync.backends`` and ``vcasync.plugins``), so this builds a link tree with the installed layout
under ``.typecheck/`` and checks ``-p vcasync`` from there; the repository's ``harness/`` (not
installed, imported by the tests and bench/) is linked beside it and checked as ``-p harness``.
Extra arguments go to mypy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_tree() -> Path:
    tree = ROOT / ".typecheck"
    shutil.rmtree(tree, ignore_errors=True)
    pkg = tree / "vcasync"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "vcasync").iterdir():
        if entry.name == "__pycache__":
            continue
        (pkg / entry.name).symlink_to(entry)
    (pkg / "backends").symlink_to(ROOT / "backends")
    (pkg / "plugins").symlink_to(ROOT / "plugins")
    (tree / "harness").symlink_to(ROOT / "harness")
    return tree


def main() -> int:
    tree = build_tree()
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
           "-p", "vcasync", "-p", "harness", *sys.argv[1:]]
    return subprocess.call(cmd, cwd=tree, env={**os.environ, "MYPYPATH": ""})


if __name__ == "__main__":
    raise SystemExit(main())
